"""The scheduler in real serving: AgentFlow over two scripted instances (not models)."""

from __future__ import annotations

import asyncio

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig, InstanceConfig, SchedulerConfig
from agentflow.llm.scripted import ScriptedBackend

GOOD = "SELECT count(*) FROM stores"


def script(request):
    return {"extract_keywords": "stores", "generate_candidate": GOOD}.get(request.stage, GOOD)


def make(backends: dict, **sched) -> AgentFlow:
    config = AgentFlowConfig(
        fewshot=None,
        instances=[InstanceConfig(name=n, max_inflight=1) for n in backends],
        scheduler=SchedulerConfig(**sched))
    return AgentFlow(config, backends=backends)


def test_calls_are_spread_over_instances_and_the_timeline_says_where_and_how_long() -> None:
    backends = {n: ScriptedBackend(script, latency_s=0.05, name=n) for n in ("gpu-a", "gpu-b")}
    with make(backends, policy="flowsage") as af:
        answer = af.ask("How many stores are there?", db="bookshop", slo=30)
    assert answer.status == "done" and answer.rows == [[12]]
    calls = [c for s in answer.stages for c in s["llm_calls"]]
    assert {c["instance"] for c in calls} == {"gpu-a", "gpu-b"}
    assert all(c["queue_s"] >= 0 and c["run_s"] >= 0.04 for c in calls)
    # three candidates on two single-slot instances: one of them had to queue
    cands = [c for s in answer.stages if s["stage"] == "generate_candidate"
             for c in s["llm_calls"]]
    assert max(c["queue_s"] for c in cands) >= 0.04


def test_a_failing_instance_is_taken_down_and_its_calls_rerun_elsewhere() -> None:
    backends = {"broken": ScriptedBackend(script, fail_after=0, name="broken"),
                "healthy": ScriptedBackend(script, latency_s=0.01, name="healthy")}
    with make(backends, policy="vllm", revive_after_s=None) as af:
        answer = af.ask("How many stores are there?", db="bookshop")
        assert answer.status == "done", answer.error
        assert {c["instance"] for s in answer.stages for c in s["llm_calls"]} == {"healthy"}
        assert "broken" in af.router.down_reasons
        assert not af.router.coordinator.queues["broken"].up


def test_when_every_instance_fails_the_query_fails_with_the_reason() -> None:
    backends = {"a": ScriptedBackend(script, fail_after=0, name="a")}
    with make(backends, revive_after_s=None) as af:
        answer = af.ask("How many stores are there?", db="bookshop")
    assert answer.status == "failed"
    assert "no instance can run the call" in answer.error or "LLM backend error" in answer.error


def test_overload_rejects_with_a_reason_instead_of_queueing_forever() -> None:
    backends = {"a": ScriptedBackend(script, latency_s=0.3, name="a")}
    with make(backends, max_active_queries=1) as af:
        async def both():
            return await asyncio.gather(
                af.ask_async("How many stores are there?", db="bookshop", pipeline="single"),
                af.ask_async("How many stores are there?", db="bookshop", pipeline="single"))
        first, second = asyncio.run(both())
    statuses = sorted([first.status, second.status])
    assert statuses == ["done", "rejected"]
    rejected = first if first.status == "rejected" else second
    assert "overloaded" in rejected.error and rejected.details["retry_after_s"] >= 1


def test_each_calls_max_tokens_reaches_the_predictor_and_the_trace() -> None:
    from agentflow.scheduler.lengths.learned import LearnedLengthModel

    class Recording(LearnedLengthModel):
        def __init__(self):
            super().__init__()
            self.caps: dict[str, set] = {}

        def predict(self, stage, key_text, input_tokens=None, *, max_tokens=None):
            self.caps.setdefault(stage, set()).add(max_tokens)
            return super().predict(stage, key_text, input_tokens, max_tokens=max_tokens)

    backends = {n: ScriptedBackend(script, latency_s=0.01, name=n) for n in ("gpu-a", "gpu-b")}
    with make(backends, policy="flowsage") as af:
        af.router.coordinator.length_model = length_model = Recording()
        answer = af.ask("How many stores are there?", db="bookshop", slo=30)
    assert answer.status == "done"
    assert length_model.caps["extract_keywords"] == {40}
    assert length_model.caps["generate_candidate"] == {160}
    calls = {s["stage"]: c for s in answer.stages for c in s["llm_calls"]}
    assert calls["generate_candidate"]["max_tokens"] == 160


def test_prompts_are_counted_by_each_instances_own_tokenizer() -> None:
    class CoarseTokenizer(ScriptedBackend):
        """A scripted instance whose model's tokenizer makes twice as many tokens."""

        counted = 0

        def count_tokens(self, text: str) -> int:
            CoarseTokenizer.counted += 1
            return 2 * super().count_tokens(text)

        @property
        def tokenizer_key(self) -> tuple:
            return ("coarse",)

    backends = {"small-0": ScriptedBackend(script, latency_s=0.01, name="small-0"),
                "big-0": CoarseTokenizer(script, latency_s=0.01, name="big-0"),
                "big-1": CoarseTokenizer(script, latency_s=0.01, name="big-1")}
    with make(backends, policy="flowsage") as af:
        counts = af.router._count_tokens("SELECT name FROM singer WHERE age > 30 " * 20)
        assert counts["big-0"] == counts["big-1"] == 2 * counts["small-0"]
        assert CoarseTokenizer.counted == 1  # once per distinct tokenizer
        answer = af.ask("How many stores are there?", db="bookshop", slo=30)
    assert answer.status == "done"


def test_run_time_and_kv_use_are_priced_with_the_instances_prompt_length() -> None:
    from agentflow.scheduler import Coordinator, InstanceSpec
    from agentflow.workflow import ManualClock

    c = Coordinator([InstanceSpec("a", gpu="H100", model="Llama-3.1-8B", max_inflight=4),
                     InstanceSpec("b", gpu="H100", model="Llama-3.1-8B", max_inflight=4)],
                    clock=ManualClock(0.0), policy="least_loaded+fcfs")
    c.on_query_arrival("q", deadline=None)
    call, _ = c.on_call_ready("q", stage="s", node_id="n", prompt_tokens=1000,
                              prompt_tokens_by_instance={"a": 1000, "b": 3000})
    assert c.expected_s(call, "b") > c.expected_s(call, "a")
    assert c.queues[call.instance].kv_tokens_in_use == c._kv_tokens(call)
    assert c._kv_tokens(call) - call.tokens_on(call.instance) == int(call.output.quantile(0.9))
