"""Preemption in serving, what the operator sees: an attempt stopped for a better class
(``scheduler.preemption: class``) is a ``preempted`` count per instance and class on
/metrics (real uvicorn on loopback), never a timeout, stall or failure — even when its
backend request takes its time to end (a client that notices a cancel late) and the
attempt's deadline passes meanwhile. The instance is scripted (NOT a model); the router's
clock is a manual one, moved by the page call, so "past its deadline" is counted, not timed.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig, InstanceConfig, SchedulerConfig  # noqa: E402
from agentflow.llm.scripted import Hold, ScriptedBackend  # noqa: E402
from agentflow.scheduler import ScheduledRouter, build_coordinator  # noqa: E402
from agentflow.scheduler.health import HealthState  # noqa: E402
from agentflow.scheduler.setup import scheduler_settings  # noqa: E402
from agentflow.server.testing import LiveServer  # noqa: E402
from agentflow.workflow.clock import ManualClock  # noqa: E402
from tests.utils import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(120)

BATCH_Q, PAGE_Q = "How many stores are there in total?", "Count the stores."
LONG_S = 1e6  # what the page call takes on the manual clock: past any call's deadline


class LateToLetGo(ScriptedBackend):
    """A cancelled request ends only once the test lets it go (``let_go``), as behind a
    client that notices a cancel late; the first page call moves the router's manual clock
    by ``LONG_S``, so the stopped batch attempt is still unwinding long past its deadline."""

    def __init__(self, clock: ManualClock, **kwargs: Any):
        super().__init__({"extract_keywords": "stores"}, default="SELECT count(*) FROM stores",
                         name="cpu-0", **kwargs)
        self.clock = clock
        self.let_go = threading.Event()
        self.lingered = 0
        self._moved_clock = False

    async def generate(self, request: Any, on_progress: Any = None) -> Any:
        if PAGE_Q in request.prompt and not self._moved_clock:
            self._moved_clock = True
            self.clock.advance(LONG_S)
        try:
            return await super().generate(request, on_progress)
        except asyncio.CancelledError:
            self.lingered += 1
            while not self.let_go.is_set():
                await asyncio.sleep(0.01)
            raise


def test_a_stopped_attempt_is_a_preemption_on_metrics_never_a_timeout() -> None:
    config = AgentFlowConfig(fewshot=None, pipeline="single",
                             instances=[InstanceConfig(name="cpu-0", max_inflight=1)],
                             scheduler=SchedulerConfig(policy="flowsage", preemption="class"))
    clock = ManualClock()
    backend = LateToLetGo(clock)
    hold = Hold(lambda r: BATCH_Q in r.prompt)
    backend.hold = hold
    coordinator = build_coordinator(config.instances, clock=clock,
                                    **scheduler_settings(config.scheduler))
    router = ScheduledRouter(coordinator, {"cpu-0": backend})
    with AgentFlow(config, backends={"cpu-0": backend}, router=router) as af, \
            LiveServer({}, {}, agentflow=af) as live:
        batch = af.submit(BATCH_Q, db="bookshop", slo_class="batch")
        hold.wait_held(1)  # the batch call holds the only slot
        page = af.ask(PAGE_Q, db="bookshop", slo_class="interactive")
        assert page.status == "done"
        assert backend.lingered == 1  # the batch request was cancelled and is unwinding
        # its call was admitted again once the page query was done: the router moved on to
        # the redo while the stopped request still lingered, LONG_S past its deadline
        wait_until(lambda: hold.arrived == 2, what="the batch call's redo at the gate")
        assert router.counts["timeout", "cpu-0"] == router.counts["stalled", "cpu-0"] == 0
        assert router.counts["retried", "cpu-0"] == router.counts["error", "cpu-0"] == 0
        assert router.health.state("cpu-0") == HealthState.HEALTHY
        assert router.counts["preempted", "cpu-0"] == 1
        assert dict(router.preempted) == {("cpu-0", "batch"): 1}
        text = httpx.get(f"{live.url}/metrics", timeout=30).text
        assert 'agentflow_llm_call_preemptions_total{instance="cpu-0",slo_class="batch"} 1.0' \
            in text
        assert 'agentflow_llm_call_preemptions_total{instance="cpu-0",slo_class="interactive"}' \
            ' 0.0' in text
        assert 'agentflow_llm_call_timeouts_total{instance="cpu-0",kind="deadline"} 0.0' in text
        backend.let_go.set()
        hold.release()
        answer = batch.result(timeout=60)
        text = httpx.get(f"{live.url}/metrics", timeout=30).text
    assert answer.status == "done" and answer.rows == [[12]]
    assert not any(c.get("failed_attempts") for s in answer.stages for c in s["llm_calls"])
    assert 'agentflow_llm_call_failures_total{instance="cpu-0"}' not in text
    assert 'agentflow_llm_call_timeouts_total{instance="cpu-0",kind="stalled"} 0.0' in text
