"""One instance description for serving and simulation: the same cluster file gives the
same scheduler, and that scheduler makes the same decisions whichever runtime built it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig, InstanceConfig
from agentflow.llm.scripted import ScriptedBackend
from agentflow.scheduler import StartCall
from agentflow.scheduler.setup import instance_spec
from agentflow.sim.cluster import SimClusterConfig, load_cluster
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import build_workload
from agentflow.sim.workload import TraceNode, TraceQuery

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cluster-4gpu.yaml"


def serving(path: Path) -> AgentFlow:
    """The AgentFlow `agentflow serve --config path` builds, with scripted backends in place
    of the vLLM servers (the one thing this machine cannot run)."""
    config = AgentFlowConfig.load(path).model_copy(update={"fewshot": None})
    backends = {i.name: ScriptedBackend(lambda r: "SELECT 1", name=i.name)
                for i in config.instances}
    return AgentFlow(config, backends=backends)


def trace(n: int) -> list[TraceQuery]:
    out = []
    for i in range(n):
        cand = 150 + 97 * (i % 5)
        out.append(TraceQuery(id=f"t{i}", question=f"how many rows in table {i}?", nodes=[
            TraceNode("kw", "extract_keywords", "llm", (), 700 + 10 * i, 25, max_tokens=40),
            *[TraceNode(f"c{j}", "generate_candidate", "llm", ("kw",), 9000 + 300 * j,
                        cand + 40 * j, max_tokens=800) for j in range(3)],
            TraceNode("exec", "execute", "tool", ("c0", "c1", "c2"), duration_s=0.4),
            TraceNode("rev", "revise", "llm", ("exec",), 6000, 80, max_tokens=160),
            TraceNode("eval", "evaluate", "llm", ("rev",), 960, 3, max_tokens=3)]))
    return out


def test_the_example_cluster_file_is_one_description_for_both() -> None:
    sim_cluster = load_cluster(str(EXAMPLE))  # the README's own file, as it is
    with serving(EXAMPLE) as af:
        served = {n: q.spec for n, q in af.router.coordinator.queues.items()}
    simulated = {n: q.spec for n, q in Simulation(sim_cluster, "flowsage")
                 .coordinator.queues.items()}
    assert served == simulated
    assert list(served) == ["a100-0", "a100-1", "a6000-0", "l40s-0"]
    a6000 = served["a6000-0"]  # TP=4 and AWQ reach the scheduler, with the prefill bound
    assert (a6000.tensor_parallel, a6000.weight_bits, a6000.max_inflight,
            a6000.max_pending_prefill) == (4, 4, 16, 2)
    assert a6000.kv_token_budget == Simulation(sim_cluster, "vllm").instances[
        "a6000-0"].kv_blocks_total * 16


@pytest.mark.parametrize("backlog", [False, True], ids=["count-limits", "backlog"])
@pytest.mark.parametrize("policy", ["flowsage", "sagesched", "hexgen-flow"])
def test_serving_and_simulation_coordinators_make_the_same_decisions(policy: str,
                                                                     backlog: bool) -> None:
    """Drive the simulator once with its own coordinator and once with the coordinator
    serving builds from the same file (same clock): every decision, in order, is equal —
    admission by backlog included (this workload overloads the cluster, so it refuses)."""
    cluster = load_cluster(str(EXAMPLE))
    wl = build_workload(trace(8), cluster, n=40, rate=0.4, seed=3)
    limits = AgentFlowConfig.load(EXAMPLE).scheduler
    limits.admit_by_backlog = backlog

    def run(swap: bool) -> tuple[list, list]:
        sim = Simulation(cluster, policy, max_waiting_calls=limits.max_waiting_calls,
                         max_active_queries=limits.max_active_queries,
                         admit_by_backlog=limits.admit_by_backlog,
                         max_backlog_s=limits.max_backlog_s)
        if swap:
            af = serving(EXAMPLE)
            af.config.scheduler.policy = policy
            af.config.scheduler.admit_by_backlog = backlog
            coordinator = af._create_router().coordinator
            af.close()
            coordinator.clock = sim.clock  # serving's wall clock, replaced by virtual time
            sim.coordinator = coordinator
        log: list = []
        apply = sim._apply

        def logged(decisions):
            log.extend((sim.clock.now(), type(d).__name__, d.call.payload, d.instance,
                        d.priority) if isinstance(d, StartCall)
                       else (sim.clock.now(), type(d).__name__, d.call.payload, d.reason)
                       for d in decisions)
            apply(decisions)

        sim._apply = logged
        result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
        return log, [(r.status, r.finish) for r in result.records]

    sim_log, sim_records = run(swap=False)
    serve_log, serve_records = run(swap=True)
    rejected = sum(status == "rejected" for status, _ in sim_records)
    if backlog:
        assert 0 < rejected < 40 and len(sim_log) > 100
    else:
        assert rejected == 0 and len(sim_log) > 200  # 40 queries x 6 calls, plus retries
    assert len({entry[3] for entry in sim_log}) == 4  # every instance was used
    assert serve_log == sim_log
    assert serve_records == sim_records


def test_instances_expand_and_name_alike_everywhere() -> None:
    cfg = AgentFlowConfig(instances=[
        InstanceConfig(gpu="H100", model="Llama-3.1-8B", count=2),
        InstanceConfig(name="big", gpu="H200", model="Llama-3.1-70B", count=2),
        InstanceConfig(name="solo", gpu="L40S", model="Llama-3.1-8B")])
    names = [i.name for i in cfg.instances]
    assert names == ["h100-0", "h100-1", "big-0", "big-1", "solo"]
    sim = SimClusterConfig(instances=[
        InstanceConfig(gpu="H100", model="Llama-3.1-8B", count=2),
        InstanceConfig(name="big", gpu="H200", model="Llama-3.1-70B", count=2),
        InstanceConfig(name="solo", gpu="L40S", model="Llama-3.1-8B")])
    assert [n for n, _ in sim.expanded()] == names
    # defaults: a GPU instance admits up to its batch limit, a CPU instance one call
    assert instance_spec(cfg.instances[0]).max_inflight == 64
    cpu = instance_spec(InstanceConfig(name="cpu"))
    assert (cpu.max_inflight, cpu.kv_token_budget) == (1, None)
    explicit = InstanceConfig(name="x", gpu="H100", model="Llama-3.1-8B", kv_token_budget=1234)
    assert instance_spec(explicit).kv_token_budget == 1234


def test_bad_cluster_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="unknown GPU"):
        InstanceConfig(name="x", gpu="B300")
    with pytest.raises(ValidationError, match="unique"):
        AgentFlowConfig(instances=[InstanceConfig(name="a"), InstanceConfig(name="a")])
    f = tmp_path / "c.yaml"
    f.write_text("instances:\n  - {name: cpu, backend: {type: local}}\n")
    with pytest.raises(ValidationError, match="needs its gpu and model"):
        load_cluster(str(f))
    f.write_text("pipelin: chess\ninstances:\n  - {gpu: H100, model: Llama-3.1-8B}\n")
    with pytest.raises(ValidationError, match="pipelin"):  # a typo is not silently ignored
        load_cluster(str(f))
    f.write_text("instances:\n  - {gpu: H100, model: Llama-3.1-8B, tensor_paralel: 2}\n")
    with pytest.raises(ValidationError, match="tensor_paralel"):
        load_cluster(str(f))


def test_a_cpu_model_is_a_label_and_an_impossible_gpu_instance_says_what_to_set() -> None:
    assert InstanceConfig(name="cpu", model="my-finetune").model == "my-finetune"
    with pytest.raises(ValidationError, match="unknown model"):
        InstanceConfig(name="g", gpu="H100", model="my-finetune")
    with pytest.raises(ValueError, match="set its tensor_parallel or weight_bits"):
        instance_spec(InstanceConfig(name="x", gpu="L40S", model="Llama-3.1-70B"))
    given = InstanceConfig(name="x", gpu="L40S", model="Llama-3.1-70B", kv_token_budget=9000)
    assert instance_spec(given).kv_token_budget == 9000
