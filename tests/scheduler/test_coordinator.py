"""Coordinator mechanics: capacity, priorities, overload, cancellation, failures."""

from __future__ import annotations

import pytest

from agentflow.scheduler import CallState, FailCall, QueryRejected, StartCall
from agentflow.scheduler.classes import queue_rank
from tests.scheduler.utils import coordinator, occupy


def test_admission_respects_capacity_and_hands_out_increasing_priorities() -> None:
    c = coordinator("least_loaded+fcfs", {"s": 1}, max_inflight=2)
    c.on_query_arrival("q", deadline=None)
    results = [c.on_call_ready("q", stage="s", node_id=f"n{i}", prompt_tokens=0)
               for i in range(4)]
    started = [d for _, ds in results for d in ds if isinstance(d, StartCall)]
    assert [d.call.node_id for d in started] == ["n0", "n1"]
    # the engine is told the queue's rank (fcfs: when the call became ready; all at 0 here,
    # so equal, and the engine keeps its arrival order between equals)
    assert started[0].priority == started[1].priority == queue_rank(started[0].call, 0.0)
    assert [x.node_id for x in c.queues["fast"].ordered_waiting(0.0, c)] == ["n2", "n3"]
    c.clock.advance(1.0)
    later, _ = c.on_call_ready("q", stage="s", node_id="n4", prompt_tokens=0)
    decisions = c.on_call_done(results[0][0], output_tokens=1)
    assert [(d.call.node_id, d.priority) for d in decisions] == [("n2", started[0].priority)]
    assert queue_rank(later, 1.0) > started[0].priority  # ready later: after, in the engine


def test_kv_budget_holds_back_calls_that_would_not_fit() -> None:
    c = coordinator("least_loaded+fcfs", {"s": 10}, max_inflight=8)
    c.queues["fast"].spec = type(c.queues["fast"].spec)("fast", max_inflight=8,
                                                        kv_token_budget=250)
    c.on_query_arrival("q", deadline=None)
    started = [d for i in range(3)
               for d in c.on_call_ready("q", stage="s", node_id=f"n{i}", prompt_tokens=90)[1]]
    assert len(started) == 2  # 2 x (90 + 10) = 200 <= 250; a third would need 300


def test_overload_rejects_new_queries_with_a_reason() -> None:
    c = coordinator("vllm", {"s": 1}, max_waiting_calls=2, max_active_queries=3)
    occupy(c)
    c.on_query_arrival("q", deadline=None)
    c.on_call_ready("q", stage="s", node_id="a", prompt_tokens=0)
    c.on_call_ready("q", stage="s", node_id="b", prompt_tokens=0)
    with pytest.raises(QueryRejected, match="2 LLM calls waiting") as info:
        c.on_query_arrival("q2", deadline=None)
    assert info.value.retry_after_s >= 1.0
    c2 = coordinator("vllm", {"s": 1}, max_active_queries=1)
    c2.on_query_arrival("a", deadline=None)
    with pytest.raises(QueryRejected, match="1 queries in progress"):
        c2.on_query_arrival("b", deadline=None)


def test_cancel_removes_the_query_everywhere_and_frees_capacity() -> None:
    c = coordinator("least_loaded+fcfs", {"s": 1}, slow=True)
    c.on_query_arrival("doomed", deadline=None)
    c.on_query_arrival("other", deadline=None)
    d1, _ = c.on_call_ready("doomed", stage="s", node_id="a", prompt_tokens=0)  # runs on fast
    d2, _ = c.on_call_ready("doomed", stage="s", node_id="b", prompt_tokens=0)  # runs on slow
    d3, _ = c.on_call_ready("doomed", stage="s", node_id="c", prompt_tokens=0)  # waits
    o1, _ = c.on_call_ready("other", stage="s", node_id="x", prompt_tokens=0)  # waits
    running, decisions = c.cancel_query("doomed")
    assert set(running) == {d1, d2}
    assert d3.state == CallState.CANCELLED and o1.state == CallState.RUNNING
    assert [d.call for d in decisions] == [o1]
    assert c.waiting_calls == 0 and "doomed" not in c.queries


def test_instance_down_moves_waiting_calls_and_failed_calls_retry_elsewhere() -> None:
    c = coordinator("least_loaded+fcfs", {"s": 1}, slow=True)
    c.on_query_arrival("q", deadline=None)
    a, _ = c.on_call_ready("q", stage="s", node_id="a", prompt_tokens=0)  # fast
    b, _ = c.on_call_ready("q", stage="s", node_id="b", prompt_tokens=0)  # slow
    w, _ = c.on_call_ready("q", stage="s", node_id="w", prompt_tokens=0)  # waits on fast
    assert (a.instance, b.instance, w.instance) == ("fast", "slow", "fast")
    moved = c.on_instance_down("fast")
    assert w.instance == "slow" and w.state == CallState.WAITING and moved == []
    retried = c.on_call_failed(a, "connection refused", retryable=True)
    assert a.instance == "slow" and "fast" in a.excluded and retried == []
    c.on_call_done(b, output_tokens=1)  # frees slow: a was ready before w (FCFS)
    assert a.state == CallState.RUNNING and w.state == CallState.WAITING
    c.on_instance_down("slow")  # outside the raises block: it must not raise itself
    with pytest.raises(QueryRejected, match="no model instance"):
        c.on_query_arrival("q3", deadline=None)


def test_a_call_fails_for_good_after_non_retryable_errors_or_too_many_attempts() -> None:
    # A non-retryable error may be the instance's fault: the call gets one untried
    # instance; failing there too, the call itself is bad.
    c = coordinator("least_loaded+fcfs", {"s": 1}, slow=True, max_attempts=5)
    c.on_query_arrival("q", deadline=None)
    a, [first] = c.on_call_ready("q", stage="s", node_id="a", prompt_tokens=0)
    [again] = c.on_call_failed(a, "prompt too long", retryable=False)
    assert isinstance(again, StartCall) and again.instance != first.instance
    [fail] = c.on_call_failed(a, "prompt too long", retryable=False)
    assert isinstance(fail, FailCall) and fail.reason == "prompt too long"
    assert a.attempts == 2 < c.max_attempts
    c = coordinator("least_loaded+fcfs", {"s": 1}, slow=True, max_attempts=2)
    c.on_query_arrival("q", deadline=None)
    b, _ = c.on_call_ready("q", stage="s", node_id="b", prompt_tokens=0)
    assert c.on_call_failed(b, "timeout", retryable=True)[0].call is b  # retried on slow
    decisions = c.on_call_failed(b, "timeout", retryable=True)
    assert isinstance(decisions[-1], FailCall) and b.state == CallState.FAILED


def test_the_time_model_learns_from_observed_timings() -> None:
    c = coordinator("least_loaded+fcfs", {"s": 10})
    c.on_query_arrival("q", deadline=None)
    model = c.time_models["fast"]
    for i in range(30):  # the instance is really 3x slower at decoding than modelled
        call, _ = c.on_call_ready("q", stage="s", node_id=f"n{i}", prompt_tokens=0)
        c.on_call_done(call, output_tokens=10, ttft_s=0.0, total_s=27.0)
    assert model.decode_ratio == pytest.approx(3.0, rel=0.05)


def test_late_reports_on_calls_of_a_cancelled_query_are_ignored() -> None:
    from agentflow.scheduler.lengths.learned import LearnedLengthModel

    c = coordinator("least_loaded+fcfs", {"s": 1}, slow=True)
    c.length_model = LearnedLengthModel()
    c.on_query_arrival("gone", deadline=None)
    c.on_query_arrival("other", deadline=None)
    call, _ = c.on_call_ready("gone", stage="s", node_id="a", prompt_tokens=0)
    waiting, _ = c.on_call_ready("other", stage="s", node_id="x", prompt_tokens=0)
    waiting2, _ = c.on_call_ready("other", stage="s", node_id="y", prompt_tokens=0)
    c.cancel_query("gone")
    observed = c.length_model.observed
    # the runtime's abort raced with completion: the call reports anyway
    assert c.on_call_progress(call, 5) == []
    assert c.on_call_done(call, output_tokens=80, total_s=9.0) == []
    assert c.on_call_failed(call, "late error") == []
    assert c.length_model.observed == observed  # nothing learned from a forgotten query
    assert call.state == CallState.CANCELLED
    assert {x.state for x in (waiting, waiting2)} == {CallState.RUNNING}


def test_observers_see_every_event_with_its_decisions_nested_in_order() -> None:
    class Log:
        def __init__(self):
            self.lines = []

        def event_started(self, event):
            self.lines.append(("start", event))

        def event_finished(self, event, decisions):
            self.lines.append(("end", event, [type(d).__name__ for d in decisions]))

    c = coordinator("least_loaded+fcfs", {"s": 1})
    log = Log()
    c.add_observer(log)
    c.on_query_arrival("q", deadline=None)
    c.on_call_ready("q", stage="s", node_id="a", prompt_tokens=0)
    c.cancel_query("q")
    assert log.lines == [
        ("start", "on_query_arrival"), ("end", "on_query_arrival", []),
        ("start", "on_call_ready"), ("end", "on_call_ready", ["StartCall"]),
        ("start", "cancel_query"), ("start", "on_query_done"), ("end", "on_query_done", []),
        ("end", "cancel_query", [])]
