import asyncio
import time

import networkx as nx
import pytest

from agentflow.workflow import (
    Expansion,
    GraphError,
    ManualClock,
    MonotonicClock,
    Node,
    NodeKind,
    Query,
    QueryStatus,
    WorkflowRun,
    chain,
    execute,
)


class NoLLM:
    """A router for graphs without LLM stages: any call is a test failure."""

    def __init__(self, clock):
        self.clock = clock

    async def submit(self, call, on_progress=None):
        raise AssertionError("this graph makes no LLM calls")


def tool(node_id: str, fn=None, expected_s: float = 1.0, stage: str | None = None) -> Node:
    async def run(ctx):
        return await fn(ctx) if fn else node_id
    return Node(id=node_id, stage=stage or node_id, kind=NodeKind.TOOL, run=run,
                expected_s=expected_s)


def graph_of(nodes, edges) -> nx.DiGraph:
    g = nx.DiGraph()
    for n in nodes:
        g.add_node(n.id, node=n)
    g.add_edges_from(edges)
    return g


def run_sync(run: WorkflowRun, state=None):
    return asyncio.run(execute(run, NoLLM(MonotonicClock()), env=None, state=state))


def test_independent_stages_run_concurrently() -> None:
    started: list[str] = []
    all_started = asyncio.Event()

    async def slow(ctx):
        started.append(ctx.node.id)
        if len(started) == 4:
            all_started.set()
        # run one after another, the first would wait here for the other three in vain
        await asyncio.wait_for(all_started.wait(), 30)
        return ctx.node.id

    fan = [tool(f"cand.{i}", slow) for i in range(4)]

    async def select(ctx):
        return sorted(ctx.parent_outputs.values())

    nodes = [tool("start"), *fan, tool("select", select)]
    edges = [("start", n.id) for n in fan] + [(n.id, "select") for n in fan]
    run = WorkflowRun(Query("q", "db", arrival=time.monotonic()), graph_of(nodes, edges))
    run_sync(run)
    assert run.query.status == QueryStatus.DONE, run.query.error
    assert run.outputs["select"] == ["cand.0", "cand.1", "cand.2", "cand.3"]
    record = run.query.stage("select")
    assert record.parents == ["cand.0", "cand.1", "cand.2", "cand.3"] and record.status == "ok"


def test_bounded_revision_loop_expands_the_graph_at_run_time() -> None:
    """exec fails until the third attempt; each failure inserts revise+exec before select."""
    attempts: list[str] = []
    max_rounds = 5

    def exec_node(node_id: str, round_: int) -> Node:
        async def run(ctx):
            attempts.append(node_id)
            if round_ < 2 and round_ < max_rounds:
                rev, nxt = f"revise.{round_ + 1}", f"exec.{round_ + 1}"
                ctx.expand([tool(rev, stage="revise"), exec_node(nxt, round_ + 1)],
                           [(node_id, rev), (rev, nxt), (nxt, "select")])
                return "error"
            return "ok"
        return Node(id=node_id, stage="execute", kind=NodeKind.TOOL, run=run)

    async def select(ctx):
        return {k: v for k, v in ctx.parent_outputs.items()}

    run = WorkflowRun(Query("q", "db", arrival=0.0),
                      chain(tool("gen"), exec_node("exec.0", 0), tool("select", select)))
    run_sync(run)
    assert attempts == ["exec.0", "exec.1", "exec.2"]
    assert set(run.graph.predecessors("select")) == {"exec.0", "exec.1", "exec.2"}
    assert run.outputs["select"]["exec.2"] == "ok"
    assert [r.node_id for r in run.query.timeline][-4:] == ["revise.1", "exec.1", "revise.2",
                                                           "exec.2"]
    assert run.query.stage("select").parents == ["exec.0", "exec.1", "exec.2"]


def test_a_failing_stage_fails_the_query_and_cancels_its_siblings() -> None:
    cancelled = []

    async def boom(ctx):
        await asyncio.sleep(0.05)
        raise RuntimeError("disk on fire")

    async def long(ctx):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(ctx.node.id)
            raise

    nodes = [tool("start"), tool("bad", boom), tool("slow", long), tool("end")]
    run = WorkflowRun(Query("q", "db", arrival=0.0), graph_of(
        nodes, [("start", "bad"), ("start", "slow"), ("bad", "end"), ("slow", "end")]))
    run_sync(run)  # returns only once "slow"'s 30 s sleep is cancelled (observed below)
    assert run.query.status == QueryStatus.FAILED
    assert run.query.error == "stage bad failed: RuntimeError: disk on fire"
    assert cancelled == ["slow"]
    assert run.query.stage("end").status == "cancelled"
    assert run.query.stage("bad").error == "RuntimeError: disk on fire"


def test_invalid_expansion_fails_the_query_with_the_reason() -> None:
    async def rewire(ctx):
        ctx.expand([tool("late")], [("late", "b")])  # b already ran
        return None

    nodes = [tool("a"), tool("b"), tool("c", rewire)]
    run = WorkflowRun(Query("q", "db", arrival=0.0), chain(*nodes))
    run_sync(run)
    assert run.query.status == QueryStatus.FAILED
    assert "already started" in run.query.error


def test_cycles_and_malformed_graphs_are_rejected() -> None:
    a, b = tool("a"), tool("b")
    with pytest.raises(GraphError, match="cycle"):
        WorkflowRun(Query("q", "db", arrival=0.0), graph_of([a, b], [("a", "b"), ("b", "a")]))
    g = nx.DiGraph()
    g.add_node("x")
    with pytest.raises(GraphError, match="must carry"):
        WorkflowRun(Query("q", "db", arrival=0.0), g)


def test_cancelling_the_query_cancels_running_stages() -> None:
    async def long(ctx):
        await asyncio.sleep(30)

    run = WorkflowRun(Query("q", "db", arrival=0.0), chain(tool("s", long), tool("t")))

    async def main():
        task = asyncio.ensure_future(execute(run, NoLLM(MonotonicClock()), env=None))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert run.query.status == QueryStatus.CANCELLED
    assert [r.status for r in run.query.timeline] == ["cancelled", "cancelled"]


def test_state_machine_times_come_from_the_caller() -> None:
    clock = ManualClock(100.0)
    run = WorkflowRun(Query("q", "db", arrival=100.0, slo_s=10), chain(tool("a"), tool("b")))
    assert run.query.deadline == 110.0
    run.mark_started("a", clock.now())
    clock.advance(2.5)
    run.mark_done("a", clock.now(), output=1, expansion=Expansion())
    timeline = run.query.timeline_dicts()
    assert timeline[0]["start"] == 0.0 and timeline[0]["end"] == 2.5
    with pytest.raises(GraphError, match="expected running"):
        run.mark_done("b", clock.now())
