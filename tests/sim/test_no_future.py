"""The simulator shows the scheduler only what serving would know.

Two runs of the same simulated cluster differ in one query only: the probe is the same up to
its first execution and then either answers or needs two revision rounds. Every scheduling
decision — each call's dispatch, backend priority and queue key, of every query — is logged
as the coordinator makes it; up to the moment that execution finishes, the two logs must be
the same, decision by decision. Two controls show the comparison can tell: the same pair
with the revision rounds built at arrival (what the simulator used to do), and with deadlines
scaled by each query's own idle latency, differ long before it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.scheduler import FailCall, StartCall
from agentflow.scheduler.ranking import key_at
from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import Workload, reference_latencies
from agentflow.sim.replay import GrowingDag
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import (
    HEXGEN_SHAPE_STAGES,
    PARALLEL_STEPS,
    TraceNode,
    TraceQuery,
    load_agentflow,
)
from agentflow.workflow import Expansion, ManualClock, Node, NodeKind, Query, WorkflowRun, chain
from agentflow.workflow.trace import trace_record

# Two engines of two slots each: calls wait in the coordinator's queues, where their keys
# order them, and dispatch has a choice to make.
CLUSTER = SimClusterConfig(name="tiny", instances=[
    SimInstanceConfig(gpu="H100", model="Llama-3.1-8B", max_num_seqs=2, count=2)])


def chess_like(qid: str, cand: int, *, rounds: int = 0, check: int = 10,
               grown: bool = True) -> TraceQuery:
    """keywords -> two candidates -> execute [-> revise -> execute]* -> select -> evaluate.
    The revision rounds are added at run time by the execution before them (``grown``)."""
    nodes = [TraceNode("kw", "extract_keywords", "llm", (), 600, 20),
             TraceNode("c0", "generate_candidate", "llm", ("kw",), 3000, cand),
             TraceNode("c1", "generate_candidate", "llm", ("kw",), 3000, cand // 2),
             TraceNode("exec.0", "execute", "tool", ("c0", "c1"), duration_s=0.05)]
    last = "exec.0"
    for r in range(1, rounds + 1):
        nodes += [TraceNode(f"rev.{r}", "revise", "llm", (last,), 6000, 400,
                            expanded=grown, expanded_by=last if grown else None),
                  TraceNode(f"exec.{r}", "execute", "tool", (f"rev.{r}",), duration_s=0.05,
                            expanded=grown, expanded_by=last if grown else None)]
        last = f"exec.{r}"
    nodes += [TraceNode("select", "select", "tool", (last,), duration_s=0.05),
              TraceNode("eval", "evaluate", "llm", ("select",), 900, check)]
    return TraceQuery(id=qid, question=f"question {qid}", nodes=nodes)


class DecisionLog:
    """Every coordinator event with the decisions it made and, after it, every waiting or
    running call's instance, backend priority and queue key at that instant."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.entries: list[tuple] = []
        sim.coordinator.add_observer(self)

    def event_started(self, event: str) -> None:
        pass

    def event_finished(self, event: str, decisions: list) -> None:
        now = self.sim.clock.now()
        made = []
        for d in decisions:
            if isinstance(d, StartCall):
                made.append(("start", d.call.query.id, d.call.node_id, d.instance, d.priority))
            elif isinstance(d, FailCall):
                made.append(("fail", d.call.query.id, d.call.node_id, d.reason))
        calls = []
        for name, queue in sorted(self.sim.coordinator.queues.items()):
            for c in sorted(queue.waiting, key=lambda c: c.seq):
                calls.append((name, c.query.id, c.node_id, key_at(c.rank_key, now)))
        self.entries.append((now, event, tuple(made), tuple(calls)))


def run_logged(policy: str, probe: TraceQuery, population: list[TraceQuery],
               deadline: str = "fixed") -> tuple[list[tuple], float]:
    """The decision log of one run, and when the probe's first execution finished."""
    background = [chess_like(f"b{i}", cand) for i, cand in enumerate((400, 80, 900, 250, 600))]
    queries = [background[0], background[1], probe, *background[2:]]
    idle = IdleLatency(CLUSTER)
    reference = reference_latencies(population, idle)
    wl = Workload(queries, [0.0, 0.2, 0.4, 0.5, 0.7, 0.9],
                  [idle.query_s(q) for q in queries], [reference[""] for _ in queries])
    stages: list = []
    sim = Simulation(CLUSTER, policy, on_stage=stages.append)
    log = DecisionLog(sim)
    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0, deadline), wl.idle_latency_s)
    assert all(r.status == "done" for r in result.records)
    exec_end = next(s.end for s in stages if s.query_id == f"2:{probe.id}"
                    and s.node_id == "exec.0")
    return log.entries, exec_end


def before(log: list[tuple], t: float) -> list[tuple]:
    return [e for e in log if e[0] < t]


@pytest.mark.parametrize("policy", ["flowsage", "llf", "hexgen-flow"])
def test_queries_equal_up_to_a_stage_get_equal_decisions_before_it(policy: str) -> None:
    answers = chess_like("p", 500, check=5)
    revises = chess_like("p", 500, rounds=2, check=40)
    population = [answers, revises]  # the same pipeline reference in both runs
    log_a, end_a = run_logged(policy, answers, population)
    log_b, end_b = run_logged(policy, revises, population)
    assert end_a == end_b
    head_a, head_b = before(log_a, end_a), before(log_b, end_b)
    assert len(head_a) > 20 and any(e[2] for e in head_a)  # real decisions were made
    for i, (a, b) in enumerate(zip(head_a, head_b)):
        assert a == b, f"decision {i} at t={a[0]:.3f} differs before the probe's execution"
    assert len(head_a) == len(head_b)
    assert log_a != log_b  # after it, the runs do differ

    # Controls: the comparison does see a difference the scheduler could act on.
    leaked = chess_like("p", 500, rounds=2, check=40, grown=False)  # the whole DAG at arrival
    log_c, end_c = run_logged(policy, leaked, population)
    cut = min(end_a, end_c)
    assert before(log_c, cut) != before(log_a, cut)
    log_d, end_d = run_logged(policy, answers, population, deadline="idle-scaled")
    log_e, end_e = run_logged(policy, revises, population, deadline="idle-scaled")
    cut = min(end_d, end_e)
    assert before(log_d, cut) != before(log_e, cut)


def test_the_graph_grows_as_serving_grew_it(tmp_path: Path) -> None:
    """A real run's expansions are recorded; the replay shows each one when its stage ends."""
    def tool(node_id: str, stage: str) -> Node:
        async def run(ctx):  # pragma: no cover - driven by hand below
            return None
        return Node(node_id, stage, NodeKind.TOOL, run)

    run = WorkflowRun(Query("q", "db", arrival=0.0, id="q1"),
                      chain(tool("gen", "gen"), tool("exec.0", "execute"),
                            tool("select", "select")))
    for t, node in enumerate(["gen", "exec.0", "rev.1", "exec.1", "select"]):
        run.mark_started(node, float(t))
        grow = None
        if node == "exec.0":
            grow = Expansion([tool("rev.1", "revise"), tool("exec.1", "execute")],
                             [("exec.0", "rev.1"), ("rev.1", "exec.1"), ("exec.1", "select")])
        run.mark_done(node, t + 0.5, expansion=grow)
    by = {r.node_id: r.expanded_by for r in run.query.timeline}
    assert by == {"gen": None, "exec.0": None, "select": None, "rev.1": "exec.0",
                  "exec.1": "exec.0"}
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(trace_record(run.query, pipeline={"name": "t"}, sql=None)) + "\n")
    (trace,) = load_agentflow(path)
    assert {n.id: (n.expanded, n.expanded_by) for n in trace.nodes}["exec.1"] == \
        (True, "exec.0")

    dag = GrowingDag(trace, lambda n: Node(n.id, n.stage, NodeKind.TOOL, run=None))
    graph = dag.initial_graph()
    assert set(graph.nodes) == {"gen", "exec.0", "select"}
    assert set(graph.edges) == {("gen", "exec.0"), ("exec.0", "select")}
    assert dag.expansion_after("gen") is None
    grown = dag.expansion_after("exec.0")
    assert [n.id for n in grown.nodes] == ["rev.1", "exec.1"]  # together, as serving added
    assert set(grown.edges) == {("exec.0", "rev.1"), ("rev.1", "exec.1"), ("exec.1", "select")}
    assert not dag.hidden

    # A trace from before ``expanded_by`` was recorded: nothing is shown before it is ready.
    old = json.loads(path.read_text())
    for n in old["nodes"]:
        del n["expanded_by"]
    path.write_text(json.dumps(old) + "\n")
    (trace,) = load_agentflow(path)
    dag = GrowingDag(trace, lambda n: Node(n.id, n.stage, NodeKind.TOOL, run=None))
    assert set(dag.initial_graph().nodes) == {"gen"}


def test_hexgen_runtime_stages_appear_when_their_parents_finish() -> None:
    """A HexGen-Flow chain: revise rounds and evaluate calls are not in the graph at
    arrival, yet the stage after them already waits for them (ordering kept)."""
    steps = [("Information Retriever", 400, 10), ("generate_candidate_llama-agent", 9000, 300),
             ("generate_candidate_llama-agent", 9000, 200), ("revise", 6000, 80),
             ("revise", 6000, 80), ("unit_tester", 300, 5), ("evaluate", 960, 22),
             ("evaluate", 960, 22), ("unit_tester", 300, 5)]
    nodes: list[TraceNode] = []
    prev: tuple[str, ...] = ()
    group: list[str] = []
    for i, (stage, p, o) in enumerate(steps):
        if group and not (stage in PARALLEL_STEPS and nodes[-1].stage == stage):
            prev, group = tuple(group), []
        nodes.append(TraceNode(f"{i}:{stage}", stage, "llm", prev, p, o,
                               expanded=stage not in HEXGEN_SHAPE_STAGES))
        group.append(nodes[-1].id)
    dag = GrowingDag(TraceQuery("h", nodes), lambda n: Node(n.id, n.stage, NodeKind.LLM, None))
    run = WorkflowRun(Query("h", "", arrival=0.0), dag.initial_graph())
    assert sorted(run.graph.nodes) == ["0:Information Retriever",
                                       "1:generate_candidate_llama-agent",
                                       "2:generate_candidate_llama-agent", "5:unit_tester",
                                       "8:unit_tester"]
    clock = ManualClock(0.0)
    order = []
    while not run.finished:
        (node, *_) = run.ready()
        order.append(node.id)
        run.mark_started(node.id, clock.now())
        run.mark_done(node.id, clock.now(), expansion=dag.expansion_after(node.id))
    assert order == [n.id for n in nodes]  # the recorded order, one stage at a time
    assert not dag.hidden and len(run.graph) == len(nodes)


def test_fixed_slo_is_the_default_and_idle_scaled_an_option(tmp_path: Path) -> None:
    from agentflow.cli.main import main
    from agentflow.sim.experiment import build_workload

    trace = [chess_like("short", 60), chess_like("long", 900, rounds=3)]
    mixed = [*trace, replace_meta(chess_like("other", 300), kind="single")]
    idle = IdleLatency(CLUSTER)
    wl = build_workload(mixed, CLUSTER, n=6, rate=1.0, seed=0, idle=idle)
    by_kind: dict[str, list[float]] = {}
    for q in mixed:
        by_kind.setdefault(q.meta.get("kind", ""), []).append(idle.query_s(q))
    fixed = wl.deadlines(2.0)
    assert fixed == wl.deadlines(2.0, "fixed")
    for q, d in zip(wl.queries, fixed):
        ref = by_kind[q.meta.get("kind", "")]
        assert d == pytest.approx(2.0 * sum(ref) / len(ref))  # the pipeline's, not its own
    # a short and a long query of one pipeline: one deadline, though their sizes differ
    assert idle.query_s(trace[1]) > 1.5 * idle.query_s(trace[0])
    assert len({d for q, d in zip(wl.queries, fixed) if not q.meta}) == 1
    assert wl.deadlines(3.0, "idle-scaled") == [3.0 * t for t in wl.idle_latency_s]
    with pytest.raises(ValueError, match="unknown deadline"):
        wl.deadlines(2.0, "per-query")

    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"Text2SQLRequest": [
        {"step": "Information Retriever", "input_length": 650, "output_length": 20},
        {"step": "generate_candidate_llama-agent", "input_length": 9000, "output_length": 300},
        {"step": "revise", "input_length": 6000, "output_length": 80 * k},
        {"step": "unit_tester", "input_length": 300, "output_length": 5}]} for k in (1, 4)]))
    got = {}
    for deadline in ("fixed", "idle-scaled"):
        out = tmp_path / f"{deadline}.json"
        assert main(["simulate", "--trace", str(path), "--cluster", "h100-8b-4", "--policy",
                     "llf", "--rate", "2", "--queries", "8", "--deadline", deadline,
                     "--json", str(out)]) == 0
        got[deadline] = json.loads(out.read_text())
    assert got["fixed"]["config"]["deadline"] == "fixed"
    assert got["idle-scaled"]["config"]["deadline"] == "idle-scaled"
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", str(path), "--deadline", "per-query"])


def replace_meta(q: TraceQuery, **meta) -> TraceQuery:
    return TraceQuery(id=q.id, nodes=q.nodes, question=q.question, meta={**q.meta, **meta})
