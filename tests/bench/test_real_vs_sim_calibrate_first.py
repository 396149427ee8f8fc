"""real_vs_sim's --calibrate-first (precalibrate.py), its chain attribution (chain.py) and
the real side's send order, without real engines: the simulator stands in for a machine of
known speed, so what the fit must find is known."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from agentflow import hardware
from agentflow.bench.fidelity import real_vs_sim
from agentflow.bench.fidelity.attribution import Split
from agentflow.bench.fidelity.chain import (
    chain_split,
    critical_chain,
    order_disagreements,
    start_times,
)
from agentflow.bench.fidelity.precalibrate import describe, fit_speed, workload_shapes
from agentflow.bench.fidelity.real_vs_sim import (
    _Sender,
    build_workload,
    replay_sim,
    sim_engines,
)
from agentflow.sim.cluster import load_cluster
from agentflow.sim.engine import engine_for
from agentflow.sim.host_calibration import engine_limits, sim_single
from agentflow.sim.workload import TraceNode, TraceQuery, load_trace

ROOT = Path(__file__).resolve().parents[2]

CLUSTER = str(ROOT / "examples" / "cluster-llama-server-2cpu.yaml")
TRACE = ROOT.parent / "shared" / "traces" / "hexgen-flow" / "trace1.json"
SHAPES = [(65, 2), (600, 8), (800, 50), (1200, 80)]


def slower(base: hardware.GPUProfile) -> hardware.GPUProfile:
    """A machine 20% slower in compute, 10% in memory, 20 ms per request."""
    return replace(base, peak_tflops=base.peak_tflops * 0.8,
                   mem_bw_gbs=base.mem_bw_gbs * 0.9, request_overhead_s=0.02)


def first_instance():
    name, cfg = load_cluster(CLUSTER).expanded()[0]
    limits = engine_limits(cfg)
    return name, limits, engine_for(name, limits).model, hardware.gpu(cfg.gpu)


def lone_rows(g: hardware.GPUProfile, limits, model) -> list[tuple]:
    rows = []
    for p, o in SHAPES * 2:
        ttft, total = sim_single(g, model, limits, p, o)
        rows.append((p, o, ttft, total))
    return rows


def test_the_shapes_stand_for_the_calls_that_carry_the_time():
    """90 one-token calls and 10 long ones of ten times the weight each: by count the
    quarters would be all short calls; by time half the shapes are the long ones."""
    shapes = [(30, 1)] * 90 + [(1200, 80)] * 10
    weights = [0.2] * 90 + [2.0] * 10
    got = workload_shapes(shapes, weights)
    assert got == [(30, 1), (1200, 80)]
    assert workload_shapes(shapes, [1.0] * 100) == [(30, 1)]  # by count: no long shape
    with pytest.raises(ValueError, match="one weight per call"):
        workload_shapes(shapes, [1.0])


def test_the_fit_finds_the_speed_of_a_machine_it_was_not_told():
    name, limits, model, base = first_instance()
    truth = slower(base)

    def simulate(g, p, o):
        return sim_single(g, model, limits, p, o)

    fitted, before, after = fit_speed(lone_rows(truth, limits, model), base, simulate)
    assert fitted.peak_tflops / base.peak_tflops == pytest.approx(0.8, rel=0.02)
    assert fitted.mem_bw_gbs / base.mem_bw_gbs == pytest.approx(0.9, rel=0.02)
    assert fitted.request_overhead_s == pytest.approx(0.02, rel=0.05)
    assert before > 0.05 and after < 0.005
    # the efficiencies, the batching physics, are the stored profile's
    assert fitted.compute_efficiency == base.compute_efficiency
    assert "compute x0.8" in describe(base, fitted)
    with pytest.raises(ValueError, match="no calibration rows"):
        fit_speed([], base, simulate)


def test_resim_prints_the_stored_profile_and_the_calibrated_figures(tmp_path, capsys):
    """A saved "real" side that is the simulator on a slower machine, with lone rows taken on
    that machine: on the stored profile the replay is off; calibrated first, it is not."""
    if not TRACE.is_file():
        pytest.skip("the shared HexGen-Flow trace is not here")
    args = {"trace": str(TRACE), "rate": 0.2, "quick": False, "queries": 3, "skip": 0,
            "scale": 0.05, "max_prompt": None, "max_output": None, "assign": "query",
            "seed": 0}
    cluster = dict(load_cluster(CLUSTER).expanded())
    truth = {n: slower(hardware.gpu(cfg.gpu)) for n, cfg in cluster.items()}
    w = build_workload(load_trace(str(TRACE))[:3], list(cluster), rate=0.2, seed=0,
                       scale=0.05, max_prompt=None, max_output=None, assign="query")
    real = replay_sim(w, sim_engines(CLUSTER, truth))
    ids = [c.id for cs in w.calls for c in cs]
    rows = {}
    for n, cfg in cluster.items():
        limits = engine_limits(cfg)
        rows[n] = {"rows": lone_rows(truth[n], limits, engine_for(n, limits).model)}
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({
        "args": args, "call_real_s": [real.call_latency(i) for i in ids],
        "query_real_s": [real.query_latency(w, q) for q in range(len(w.calls))],
        "call_submit_s": [real.submit[i] for i in ids],
        "call_finish_s": [real.finish[i] for i in ids],
        "calls": [{"id": i, "in_flight": 1, "real": asdict(real.split[i])} for i in ids],
        "calibrate_first": {"instances": rows}}))
    real_vs_sim.main(["--cluster", CLUSTER, "--resim", str(saved)])
    out = capsys.readouterr().out.strip().splitlines()
    stored = next(line for line in out if line.startswith("stored profile:"))
    assert float(stored.split("P95 per query ")[1]) > 0.1
    assert float(out[-2].rsplit(" ", 1)[1]) < 0.005
    assert float(out[-1].rsplit(" ", 1)[1]) < 0.005


def test_a_querys_latency_is_its_critical_chain_phase_by_phase():
    """a -> (b, c) -> d: the chain runs through the parent that finished last, and its
    calls' queue + prefill + decode add up to the query's latency exactly."""
    q = TraceQuery("q", [TraceNode("a", "extract_keywords", "llm", (), 300, 20),
                         TraceNode("b", "generate_candidate", "llm", ("a",), 1200, 60),
                         TraceNode("c", "generate_candidate", "llm", ("a",), 300, 4),
                         TraceNode("d", "revise", "llm", ("b", "c"), 600, 7)])
    engines = sim_engines(CLUSTER)
    w = build_workload([q, q], list(engines), rate=0.5, seed=0, scale=1.0, max_prompt=None,
                       max_output=None, assign="query")
    sim = replay_sim(w, engines)
    parents = {c.id: c.parents for cs in w.calls for c in cs}
    for qi, calls in enumerate(w.calls):
        chain = critical_chain([c.id for c in calls], parents, sim.finish)
        assert chain == [f"q{qi}/a", f"q{qi}/b", f"q{qi}/d"]
        assert chain_split(chain, sim.split).total == pytest.approx(sim.query_latency(w, qi),
                                                                    abs=1e-9)


def test_order_disagreements_count_only_choices_the_server_made():
    inst = {x: "i" for x in "abcd"}
    real_submit = {"a": 0.0, "b": 0.0, "c": 5.0, "d": 5.0}
    real_start = {"a": 0.01, "b": 2.0, "c": 5.0, "d": 5.01}  # c, d: not told apart
    sim_submit = dict(real_submit)
    sim_start = {"a": 1.0, "b": 0.0, "c": 5.0, "d": 6.0}
    assert order_disagreements(inst, real_submit, real_start, sim_submit, sim_start) == \
        {"i": (1, 1)}
    sim_submit["b"] = -1.0  # b reached the simulator first: not a choice of its engine
    assert order_disagreements(inst, real_submit, real_start, sim_submit, sim_start) == \
        {"i": (0, 0)}
    assert start_times({"a": 1.0}, {"a": Split(0.5, 1.0, 1.0)}) == {"a": 1.5}


def test_the_real_side_sends_calls_ready_together_in_trace_order():
    """Registered in any order in one loop turn, they are let through lowest position
    first, one per turn of the sender."""
    sent: list[int] = []

    async def run() -> None:
        sender = _Sender(0.001)

        async def call(pos: int) -> None:
            await sender.turn(pos)
            sent.append(pos)

        await asyncio.gather(*(call(p) for p in (3, 1, 2, 0)))
        await call(7)  # alone later: goes at once
        await asyncio.gather(*(call(p) for p in (9, 8)))

    asyncio.run(run())
    assert sent == [0, 1, 2, 3, 7, 8, 9]
