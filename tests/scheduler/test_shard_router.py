"""Sharded coordinators in serving, in one process (``scheduler: {shards: K}``): real
queries through the demo database and scripted backends (no model; the scheduler and the
pipelines are real), and the DAG mirror a remote shard schedules from."""

from __future__ import annotations

import networkx as nx
import pytest

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.scheduler.coordinator import Coordinator
from agentflow.scheduler.run_mirror import RunMirror, dag_snapshot, query_from, query_snapshot
from agentflow.scheduler.shard_router import ShardedRouter
from agentflow.scheduler.shards import instance_kind, split_instances
from agentflow.server.testing import scripted_instance
from agentflow.workflow import ManualClock, Node, NodeKind, Query, WorkflowRun


def _config(**scheduler) -> AgentFlowConfig:
    instances = [scripted_instance(f"a100-{i}", gpu="A100-80G", latency_s=0.02)
                 for i in range(2)] + \
        [scripted_instance(f"l40s-{i}", gpu="L40S", latency_s=0.02) for i in range(2)]
    return AgentFlowConfig.model_validate({"fewshot": None, "instances": instances,
                                           "scheduler": scheduler})


def test_two_shards_answer_every_query_each_on_its_own_instances() -> None:
    config = _config(shards=2, policy="flowsage")
    with AgentFlow(config) as af:
        router = af.router
        assert isinstance(router, ShardedRouter) and len(router.shards) == 2
        owned = [set(s.router.coordinator.queues) for s in router.shards]  # type: ignore[attr-defined]
        # stratified: each shard has an A100 and an L40S
        assert all({n.split("-")[0] for n in names} == {"a100", "l40s"} for names in owned)
        handles = [af.submit(f"How many stores are there? {i}", db="bookshop")
                   for i in range(8)]
        answers = [h.result(timeout=120) for h in handles]
        assert [a.status for a in answers] == ["done"] * 8
        used = [{c["instance"] for s in a.stages for c in s["llm_calls"]} for a in answers]
        assert all(any(u <= names for names in owned) for u in used)  # one shard per query
        assert all(r > 0 for r in router.router.routed)
        assert not router.route  # every query left its shard
        assert all(not s.router.coordinator.queries for s in router.shards)  # type: ignore[attr-defined]


def test_too_many_shards_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="5 shards need at least 5 instances"):
        AgentFlow(_config(shards=5))
    with pytest.raises(ValueError):
        _config(shards=0)


def test_the_mirror_gives_the_coordinator_the_critical_paths_of_the_run() -> None:
    """A shard in another process schedules from a ``RunMirror`` of the DAG: the remaining
    critical path it computes is the one the real run gives, at arrival and after stages
    started and finished (times sent as seconds ago, into a clock 1000 s ahead)."""

    async def noop(ctx):
        return None

    def build() -> tuple[WorkflowRun, Query]:
        g = nx.DiGraph()
        nodes = [Node("kw", "extract_keywords", NodeKind.LLM, noop, hints={"max_tokens": 30}),
                 Node("c0", "generate_candidate", NodeKind.LLM, noop),
                 Node("c1", "generate_candidate", NodeKind.LLM, noop),
                 Node("x", "execute", NodeKind.TOOL, noop, expected_s=0.5),
                 Node("ev", "evaluate", NodeKind.LLM, noop)]
        for n in nodes:
            g.add_node(n.id, node=n)
        g.add_edges_from([("kw", "c0"), ("kw", "c1"), ("c0", "x"), ("c1", "x"), ("x", "ev")])
        q = Query("how many?", "db", arrival=10.0, slo_s=60.0, id="q1")
        return WorkflowRun(q, g), q

    from agentflow.scheduler.cluster import InstanceSpec

    specs = [InstanceSpec("a", "A100-80G", "Llama-3.1-8B", max_inflight=4)]
    here, there = ManualClock(12.0), ManualClock(1012.0)
    local = Coordinator(specs, clock=here, policy="flowsage")
    remote = Coordinator(specs, clock=there, policy="flowsage")
    run, query = build()
    mirror = RunMirror(query_from(query_snapshot(query, 12.0), 1012.0))
    assert mirror.query.arrival == pytest.approx(1010.0) and mirror.query.deadline == \
        pytest.approx(1070.0)
    mirror.update(dag_snapshot(run, 12.0), 1012.0)
    qa = local.on_query_arrival("q1", arrival=10.0, deadline=70.0, key_text="how many?",
                                run=run)
    qb = remote.on_query_arrival("q1", arrival=1010.0, deadline=1070.0,
                                 key_text="how many?", run=mirror)
    assert remote.remaining_s(qb, 1012.0) == pytest.approx(local.remaining_s(qa, 12.0))
    run.mark_started("kw", 12.0)
    run.mark_done("kw", 13.0)
    run.mark_started("c0", 13.0)
    run.mark_started("c1", 13.5)
    here.advance_to(14.0)
    there.advance_to(1014.0)
    version = mirror.version
    mirror.update(dag_snapshot(run, 14.0), 1014.0)
    assert mirror.version > version and mirror.started_at("c1") == pytest.approx(1013.5)
    assert mirror.state("kw") == run.DONE and mirror.state("c0") == run.RUNNING
    ca, _ = local.on_call_ready("q1", stage="generate_candidate", node_id="c0",
                                prompt_tokens=3000)
    cb, _ = remote.on_call_ready("q1", stage="generate_candidate", node_id="c0",
                                 prompt_tokens=3000)
    assert remote.remaining_s(qb, 1014.0) == pytest.approx(local.remaining_s(qa, 14.0))
    assert remote.downstream_s(cb, 1014.0) == pytest.approx(local.downstream_s(ca, 14.0))
    mirror.update(dag_snapshot(run, 14.0), 1014.0)
    assert mirror.version == version + 1  # nothing changed: no new version


def test_split_of_configured_instances_keeps_the_kinds_apart() -> None:
    config = _config()
    parts = split_instances(config.instances, 2, kind=instance_kind)
    assert [[i.name for i in p] for p in parts] == [["a100-0", "l40s-0"], ["a100-1", "l40s-1"]]
