"""``/metrics`` labels SLO classes only with the classes the server is configured with, so
what a client sends cannot grow it without bound (each label value is a time series kept for
the process's life). Over real HTTP on loopback (uvicorn); the instance is scripted (NOT a
model). A request naming an unknown class is refused before it counts anywhere; a class
name that reaches the counters by another way (a router driven from Python, a class table
changed while running) is counted as ``unknown``, one series for all such names."""

from __future__ import annotations

from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.prometheus import UNKNOWN_CLASS, class_label  # noqa: E402
from agentflow.server.testing import LiveServer, metric_sum  # noqa: E402
from tests.server.utils import error_of  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SQL = "SELECT count(*) FROM stores"


def script(request: Any) -> str:
    return "stores" if request.stage == "extract_keywords" else SQL


def _series(text: str) -> set[str]:
    return {line.rsplit(" ", 1)[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_class_labels_are_the_configured_classes_whatever_clients_send() -> None:
    config = AgentFlowConfig(fewshot=None, pipeline="single")
    backend = ScriptedBackend(script, name="cpu-0")
    with AgentFlow(config, backends={"cpu-0": backend}) as af, \
            LiveServer({}, {}, agentflow=af) as live:
        url = f"{live.url}/v1/queries"
        body = {"question": "How many stores are there?", "db": "bookshop"}
        ok = httpx.post(url, json={**body, "slo_class": "batch"}, timeout=60)
        assert ok.status_code == 200 and ok.json()["status"] == "done"
        first = httpx.post(url, json={**body, "slo_class": "made-up-0"}, timeout=60)
        before = httpx.get(f"{live.url}/metrics", timeout=30).text
        # a client sending a new class name each time: refused, each the same one error
        for i in range(1, 6):
            r = httpx.post(url, json={**body, "slo_class": f"made-up-{i}"}, timeout=60)
            assert r.status_code == 400 and error_of(r)["code"] == "unknown_slo_class"
        assert first.status_code == 400
        after = httpx.get(f"{live.url}/metrics", timeout=30).text
        assert "made-up" not in after
        assert _series(after) == _series(before)  # no series more: only counts moved
        assert metric_sum(after, "agentflow_http_errors_total", code="unknown_slo_class") == 6
        assert metric_sum(after, "agentflow_class_query_latency_seconds_count",
                          slo_class="batch") == 1
        # class names that reach the counters another way all land in one series
        router = af.router
        router.preempted["cpu-0", "renamed-1"] += 1
        router.preempted["cpu-0", "renamed-2"] += 2
        router.preempted["cpu-0", "batch"] += 1
        handle = af.submit("How many stores are there?", db="bookshop", slo_class="batch")
        answer = handle.result(timeout=60)
        handle.slo_class = "renamed-3"  # as if its class left the table meanwhile
        live.service.metrics.observe_answer(handle, answer)
        text = httpx.get(f"{live.url}/metrics", timeout=30).text
    assert "renamed" not in text
    assert metric_sum(text, "agentflow_llm_call_preemptions_total", instance="cpu-0",
                      slo_class=UNKNOWN_CLASS) == 3
    assert metric_sum(text, "agentflow_llm_call_preemptions_total", instance="cpu-0",
                      slo_class="batch") == 1
    assert metric_sum(text, "agentflow_class_query_latency_seconds_count",
                      slo_class=UNKNOWN_CLASS) == 1
    # the HTTP query still counts under its class (the one submitted from Python reached
    # the metrics only through the observe above)
    assert metric_sum(text, "agentflow_class_query_latency_seconds_count",
                      slo_class="batch") == 1


def test_a_query_without_a_class_is_labelled_with_the_default_class() -> None:
    assert class_label(None, {"standard", "batch"}) == "standard"
    assert class_label("batch", {"standard", "batch"}) == "batch"
    assert class_label("gold", {"standard", "batch"}) == UNKNOWN_CLASS


def test_no_class_may_take_the_label_of_unconfigured_ones() -> None:
    # a configured class named like the shared label would be counted with every name the
    # server does not know: the configuration is refused with a reason instead
    from pydantic import ValidationError

    from agentflow.slo_classes import SloClass
    with pytest.raises(ValidationError, match="reserved"):
        SloClass(name=UNKNOWN_CLASS, rank=1)
    assert SloClass(name="unknown-ish", rank=1).name == "unknown-ish"
