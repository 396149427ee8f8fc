"""A query cancelled from outside (its client went away, ``cancel_query``) while its call's
attempt is being stopped (``scheduler.preemption``) or moved off a dying instance must end:
the router's ``submit`` re-raises the cancel and the call leaves the coordinator. The
router used to tell such a cancel from its own cancel of the backend request with
``asyncio.Task.cancelling()``, which Python 3.10 (``requires-python >= 3.10``) lacks, so
there it swallowed the cancel and waited, with the call still queued, for a start that
would run a cancelled query. Run this file under 3.10 too. The instances are scripted (NOT
models); the router, coordinator and their asyncio tasks are the real ones.
"""

from __future__ import annotations

import asyncio

import pytest

from agentflow.llm.base import LLMRequest, SamplingParams
from agentflow.llm.scripted import Hold, ScriptedBackend
from agentflow.scheduler import Coordinator, InstanceSpec, ScheduledRouter
from agentflow.scheduler.call import CallState, ScheduledCall
from agentflow.workflow import ManualClock
from agentflow.workflow.router import LLMCall
from tests.scheduler.utils import FixedLengths, chain_run

pytestmark = pytest.mark.timeout(60)


def _batch_call(router: ScheduledRouter) -> LLMCall:
    run = chain_run("batch", 0.0, ["b"])
    run.query.slo_s, run.query.slo_class = None, "batch"
    router.start_query(run.query, run)
    node = run.node("batch.0")
    request = LLMRequest(prompt="a long batch question", params=SamplingParams(max_tokens=8),
                         stage="b", query_id="batch")
    return LLMCall(request=request, run=run, node=node)


async def _until(condition) -> None:
    """Yield to the loop until ``condition`` holds (an observed state, not a timing)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("state never reached")


async def _cancel_while(stop: str) -> tuple[bool, ScheduledCall, Coordinator]:
    """The batch call runs (held) on instance ``a``; in one step of the loop the router
    stops its attempt (``stop``: a preemption, or ``a`` taken down) and the query's own task
    is cancelled. Returns whether that task ended cancelled, the call, the coordinator."""
    names = ["a"] if stop == "preempt" else ["a", "b"]
    c = Coordinator([InstanceSpec(n, max_inflight=1) for n in names], clock=ManualClock(),
                    policy="flowsage", preemption="class",
                    length_model=FixedLengths({"b": 100, "i": 10}))
    hold = Hold()
    router = ScheduledRouter(c, {n: ScriptedBackend(lambda r: "x", name=n, hold=hold)
                                 for n in names}, revive_after_s=None)
    task = asyncio.ensure_future(router.submit(_batch_call(router)))
    await _until(lambda: hold.waiting == 1)
    (batch,) = c.queries["batch"].calls
    assert batch.state == CallState.RUNNING and batch.instance == "a"
    if stop == "preempt":  # a page call takes the slot: the batch attempt is stopped
        c.on_query_arrival("page", deadline=None, run=chain_run("page", 0.0, ["i"]),
                           slo_class="interactive")
        _, decisions = c.on_call_ready("page", stage="i", node_id="page.0", prompt_tokens=0)
        router._apply(decisions)
        assert batch.preemptions == 1
    else:  # the instance is known to be gone: its running calls move
        router._take_down("a", "its process died")
    task.cancel()  # ... and the query is cancelled from outside, in the same step
    done, _ = await asyncio.wait({task}, timeout=10)
    ended = bool(done) and task.cancelled()
    if not done:
        task.cancel()  # (the bug) leave nothing behind
        await asyncio.wait({task}, timeout=10)
    hold.release()
    return ended, batch, c


@pytest.mark.parametrize("stop", ["preempt", "instance_down"])
def test_an_outer_cancel_during_a_stopped_attempt_ends_the_call(stop: str) -> None:
    ended, batch, c = asyncio.run(_cancel_while(stop))
    assert ended  # submit re-raised the cancel instead of waiting for another start
    assert batch.state == CallState.CANCELLED  # it left the coordinator ...
    for queue in c.queues.values():  # ... and no queue holds a ghost of it to start later
        assert batch not in queue.waiting and batch not in queue.running
