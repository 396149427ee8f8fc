"""Three races in the serving router (``scheduler.serving``), each driven step by step on the
router's own asyncio loop: the real router, coordinator and tasks; scripted instances (NOT
models) whose requests wait on gates the test opens.

* A stopped attempt (preemption, or its instance taken down) is acted on at once, not at
  the watcher's next wake-up (up to 1 s later), even while its backend request is slow to
  notice the cancel. "At once" is counted in turns of the event loop that never sleep, so
  nothing here is a timing: the watcher's wake-up is a real-time timer these turns cannot
  reach.
* An attempt started on an instance that goes down before its task exists is handed back
  and runs elsewhere: no request reaches the dead instance, no query sees an error, and its
  tenant is charged once.
* A call whose query is cancelled in that same gap is never sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agentflow.llm.base import LLMRequest, SamplingParams
from agentflow.llm.scripted import ScriptedBackend
from agentflow.scheduler import Coordinator, InstanceSpec, ScheduledRouter
from agentflow.scheduler.call import CallState
from agentflow.workflow import ManualClock
from agentflow.workflow.router import LLMCall
from tests.scheduler.utils import FixedLengths, chain_run

pytestmark = pytest.mark.timeout(60)

TURNS = 200  # loop turns without sleeping: far less than the watcher's 1 s wake-up


class Gated(ScriptedBackend):
    """A request whose prompt has a gate waits for it to open; a cancelled one ends only
    once ``let_go`` is set (a client that notices a cancel late). Not a model."""

    def __init__(self, name: str):
        super().__init__(lambda r: "x", name=name)
        self.gates: dict[str, asyncio.Event] = {}
        self.let_go = asyncio.Event()
        self.lingering = 0
        self.listener: Any = None
        self.seen: list[str] = []  # prompts of the requests that reached it, in order

    def watch_health(self, listener: Any) -> None:  # the router hears of its death here
        self.listener = listener

    async def generate(self, request: Any, on_progress: Any = None) -> Any:
        self.seen.append(request.prompt)
        gate = self.gates.get(request.prompt)
        try:
            if gate is not None:
                await gate.wait()
            return await super().generate(request, on_progress)
        except asyncio.CancelledError:
            self.lingering += 1
            await self.let_go.wait()
            self.lingering -= 1
            raise

    def prompts(self) -> list[str]:
        return list(self.seen)


def _call(router: ScheduledRouter, name: str, stage: str, cls: str,
          tenant: str | None = None) -> LLMCall:
    run = chain_run(name, 0.0, [stage])
    run.query.slo_s, run.query.slo_class, run.query.tenant = None, cls, tenant
    router.start_query(run.query, run)
    request = LLMRequest(prompt=name, params=SamplingParams(max_tokens=8), stage=stage,
                         query_id=name)
    return LLMCall(request=request, run=run, node=run.node(f"{name}.0"))


async def _turns(condition: Any, turns: int = TURNS) -> bool:
    """Whether ``condition`` holds within ``turns`` turns of the loop (none sleeps)."""
    for _ in range(turns):
        if condition():
            return True
        await asyncio.sleep(0)
    return bool(condition())


async def _until(condition: Any) -> None:
    """Wait for an observed state (generous: a loaded machine is slower, never wrong)."""
    for _ in range(20_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("state never reached")


async def _stopped_attempt(stop: str) -> None:
    names = ["a"] if stop == "preempt" else ["a", "b"]
    c = Coordinator([InstanceSpec(n, max_inflight=1) for n in names], clock=ManualClock(),
                    policy="flowsage", preemption="class",
                    length_model=FixedLengths({"b": 100, "i": 10}))
    backends = {n: Gated(n) for n in names}
    router = ScheduledRouter(c, dict(backends), revive_after_s=None)
    a = backends["a"]
    a.gates["batch"] = asyncio.Event()  # the batch call's first run waits: it is running
    batch = asyncio.ensure_future(router.submit(_call(router, "batch", "b", "batch")))
    await _until(lambda: a.prompts() == ["batch"])
    (sc,) = c.queries["batch"].calls
    assert sc.state == CallState.RUNNING and sc.instance == "a"
    del a.gates["batch"]  # only that first run waits; the redo is not held
    page = None
    if stop == "preempt":  # a page call takes the only slot: the batch attempt is stopped
        page = asyncio.ensure_future(router.submit(_call(router, "page", "i", "interactive")))
        await _until(lambda: sc.preemptions == 1)
        redo_on = a
    else:  # a's process is gone: its running calls move to b
        a.listener("its process died")
        redo_on = backends["b"]
    # the stopped request lingers, but the router moves on at once: the batch call's redo
    # reaches an instance (after the page call on ``a``; at once on ``b``)
    assert await _turns(lambda: redo_on.prompts().count("batch") == (1 + (redo_on is a)))
    assert a.lingering == 1
    a.let_go.set()
    outcome = await batch
    assert outcome.instance == ("a" if stop == "preempt" else "b")
    if page is not None:
        assert (await page).instance == "a"
    assert router.counts["timeout", "a"] == router.counts["stalled", "a"] == 0


@pytest.mark.parametrize("stop", ["preempt", "instance_down"])
def test_a_stopped_attempt_is_acted_on_at_once(stop: str) -> None:
    asyncio.run(_stopped_attempt(stop))


class OnceAfterDone:
    """A coordinator observer (as the server's decision timer is one) that runs ``action``
    once, right after a call ending has made room for the next one: between the
    coordinator's StartCall for that call and the call's task. That is the race: a death a
    health watch notices, or a page user leaving, lands in any loop step."""

    def __init__(self, action: Callable[[], None]):
        self.action = action
        self.fired = False

    def event_started(self, event: str) -> None:
        pass

    def event_finished(self, event: str, decisions: list[Any]) -> None:
        if event == "on_call_done" and not self.fired and decisions:
            self.fired = True
            self.action()


async def _start_on_a_dying_instance(max_attempts: int) -> None:
    c = Coordinator([InstanceSpec(n, max_inflight=1) for n in ("a", "b")],
                    clock=ManualClock(), policy="flowsage",  # fair shares: charges
                    length_model=FixedLengths({"s": 10}), max_attempts=max_attempts)
    backends = {n: Gated(n) for n in ("a", "b")}
    router = ScheduledRouter(c, dict(backends), revive_after_s=None)
    for b in backends.values():
        for name in ("first-a", "first-b"):
            b.gates[name] = asyncio.Event()
    tasks = {name: asyncio.ensure_future(router.submit(_call(router, name, "s", "standard",
                                                             tenant="t")))
             for name in ("first-a", "first-b", "next")}
    await _until(lambda: sum(len(b.seen) for b in backends.values()) == 2)
    (nxt,) = c.queries["next"].calls
    assert nxt.state == CallState.WAITING  # both slots are taken; it waits in one queue
    here = nxt.instance
    assert here is not None
    other = "b" if here == "a" else "a"
    (first_here,) = backends[here].seen
    c.add_observer(OnceAfterDone(lambda: backends[here].listener("its process died")))
    charge = c.fairness.virtual_time(nxt.query)
    backends[here].gates[first_here].set()  # its call ends: ``next`` gets the slot, which dies
    await _until(lambda: not c.queues[here].up)
    await _until(lambda: nxt.state == CallState.WAITING and nxt.instance == other)
    assert backends[here].prompts() == [first_here]  # nothing reached the dead instance
    for gate in backends[other].gates.values():
        gate.set()
    outcome = await tasks["next"]
    assert outcome.instance == other
    assert backends[other].prompts().count("next") == 1
    assert [f["instance"] for f in outcome.failed_attempts] == [here]  # the timeline says so
    assert router.counts["retried", here] == 1
    assert nxt.attempts == 0  # nothing was sent: it used none of its attempts
    # its tenant paid for the run on ``other`` only: the start on the dead instance was
    # charged at admission and refunded when the call was handed back
    assert c.fairness.virtual_time(nxt.query) == pytest.approx(
        charge + c.expected_s(nxt, other))
    assert c.expected_s(nxt, other) > 0
    for t in tasks.values():
        await t


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_an_attempt_started_on_an_instance_that_just_went_down_runs_elsewhere(
        max_attempts: int) -> None:
    # with one attempt allowed too: the request never left, so the call is not failed for
    # an instance that never saw it (review finding)
    asyncio.run(_start_on_a_dying_instance(max_attempts))


async def _start_a_cancelled_call() -> None:
    c = Coordinator([InstanceSpec("a", max_inflight=1)], clock=ManualClock(),
                    policy="flowsage", length_model=FixedLengths({"s": 10}))
    a = Gated("a")
    router = ScheduledRouter(c, {"a": a}, revive_after_s=None)
    a.gates["first"] = asyncio.Event()
    first = asyncio.ensure_future(router.submit(_call(router, "first", "s", "standard")))
    await _until(lambda: a.prompts() == ["first"])
    nxt = asyncio.ensure_future(router.submit(_call(router, "next", "s", "standard")))
    await _until(lambda: "next" in c.queries and len(c.queries["next"].calls) == 1)
    (sc,) = c.queries["next"].calls
    assert sc.state == CallState.WAITING
    c.add_observer(OnceAfterDone(lambda: router.cancel_query("next")))
    a.gates["first"].set()  # ``first`` ends: ``next`` is started, and its query cancelled
    await first
    with pytest.raises(asyncio.CancelledError):
        await nxt
    assert sc.state == CallState.CANCELLED
    assert a.prompts() == ["first"]  # the cancelled call never reached the instance
    assert not c.queues["a"].running  # and holds no slot there


def test_a_call_whose_query_is_cancelled_before_its_task_exists_is_never_sent() -> None:
    asyncio.run(_start_a_cancelled_call())
