"""agentflow bench real_vs_sim without real engines: the workload both sides replay (scaling,
caps, DAG order, instance assignment) and the simulated replay of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.bench.fidelity.real_vs_sim import (
    build_workload,
    replay_sim,
    scaled,
    sim_engines,
)
from agentflow.config import InstanceConfig
from agentflow.sim.host_calibration import engine_limits
from agentflow.sim.workload import TraceNode, TraceQuery

ROOT = Path(__file__).resolve().parents[2]

CLUSTER = ROOT / "examples" / "cluster-llama-server-2cpu.yaml"


def query(qid: str) -> TraceQuery:
    """a -> (b, c in parallel) -> tool -> d."""
    return TraceQuery(qid, [
        TraceNode("a", "extract_keywords", "llm", (), 300, 20),
        TraceNode("b", "generate_candidate", "llm", ("a",), 1200, 60),
        TraceNode("c", "generate_candidate", "llm", ("a",), 800, 40),
        TraceNode("t", "execute", "tool", ("b", "c"), duration_s=0.5),
        TraceNode("d", "revise", "llm", ("t",), 600, 7)])


def test_scaling_and_caps():
    assert scaled(1200, 0.1, None) == 120
    assert scaled(3, 0.1, None) == 1  # never below one token
    assert scaled(1200, 1.0, 500) == 500


def test_workload_keeps_the_dag_and_assigns_instances():
    w = build_workload([query("x"), query("y"), query("z")], ["i0", "i1"], rate=1.0, seed=3,
                       scale=0.5, max_prompt=500, max_output=None, assign="query")
    assert w.arrivals == sorted(w.arrivals) and len(w.calls) == 3
    first = {c.id.split("/")[1]: c for c in w.calls[0]}
    assert set(first) == {"a", "b", "c", "d"}  # the tool step is not replayed
    assert first["d"].parents == ("q0/b", "q0/c")  # ... but its order is kept
    assert (first["b"].prompt_tokens, first["b"].output_tokens) == (500, 30)
    assert [c.instance for c in w.calls[1]] == ["i1"] * 4  # by query
    by_call = build_workload([query("x")], ["i0", "i1"], rate=1.0, seed=3, scale=1.0,
                             max_prompt=None, max_output=None, assign="call")
    assert [c.instance for c in by_call.calls[0]] == ["i0", "i1", "i0", "i1"]


def test_engine_limits_come_from_the_llama_server_backend():
    cfg = InstanceConfig(name="c", gpu="Xeon-core", model="gemma-3-270m",
                         backend={"type": "llama_server", "parallel": 3, "batch": 1024})
    limited = engine_limits(cfg)
    assert (limited.max_num_seqs, limited.max_num_batched_tokens) == (3, 1024)
    engines = sim_engines(str(CLUSTER))
    assert set(engines) == {"cpu-0", "cpu-1"}
    assert all(e.max_num_seqs == 4 for e in engines.values())


def test_simulated_replay_runs_every_call_after_its_parents():
    engines = sim_engines(str(CLUSTER))
    w = build_workload([query("x"), query("y")], list(engines), rate=0.5, seed=1, scale=0.2,
                       max_prompt=None, max_output=None, assign="query")
    out = replay_sim(w, engines)
    for qi, calls in enumerate(w.calls):
        for c in calls:
            assert out.finish[c.id] > out.submit[c.id] >= w.arrivals[qi]
            for p in c.parents:
                assert out.submit[c.id] == pytest.approx(max(out.finish[q] for q in c.parents))
                assert out.finish[p] <= out.submit[c.id]
        assert out.query_latency(w, qi) > 0
    # b and c (parallel candidates of one query, on one instance) batch together: they
    # overlap, and b takes longer than it does alone
    b, c = "q0/b", "q0/c"
    assert out.submit[b] == out.submit[c] and out.finish[c] > out.submit[b]
    alone_q = TraceQuery("solo", [TraceNode("b", "generate_candidate", "llm", (), 1200, 60)])
    alone_w = build_workload([alone_q], ["cpu-0"], rate=0.5, seed=1, scale=0.2,
                             max_prompt=None, max_output=None, assign="query")
    alone = replay_sim(alone_w, sim_engines(str(CLUSTER)))
    assert out.call_latency(b) > alone.call_latency("q0/b") * 1.05


def test_batched_rows_identify_the_per_sequence_decode_compute():
    """Rows timed by a known profile: fitted on single requests plus batched decode, the
    fit recovers the decode-compute efficiency that single requests alone cannot pin."""
    from dataclasses import replace

    from agentflow import hardware
    from agentflow.sim.host_calibration import fit_profile, sim_batch

    limits = engine_limits(InstanceConfig(name="c", gpu="Xeon-core", model="gemma-3-270m",
                                          backend={"type": "llama_server", "parallel": 4}))
    model = hardware.model("gemma-3-270m")
    truth = replace(hardware.gpu("Xeon-core"), decode_compute_efficiency=0.05,
                    compute_efficiency=0.3)
    rows = []
    for p in (32, 512):
        for o in (1, 24):
            ttft, total = sim_batch(truth, model, limits, 1, p, o)
            rows.append((p, o, ttft, total))
    batched = [(b, p, 32, sim_batch(truth, model, limits, b, p, 32)[1])
               for b in (2, 4) for p in (32, 512)]
    start = replace(truth, decode_compute_efficiency=0.2, compute_efficiency=0.2)
    fitted = fit_profile(rows, start, model, limits, batched)
    assert fitted.decode_compute_efficiency == pytest.approx(0.05, rel=0.1)
    assert fitted.compute_efficiency == pytest.approx(0.3, rel=0.1)


def test_busy_time_is_the_union_of_the_calls_in_flight():
    from agentflow.bench.fidelity.real_vs_sim import busy_seconds

    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == pytest.approx(4.0)


def test_calibration_rows_scaled_to_a_dedicated_core_by_their_share():
    from agentflow.sim.host_calibration import dedicated

    single = [(32, 24, 0.5, 2.0, 0.5), (256, 1, 1.0, 1.0)]  # the second saved without share
    assert dedicated(single, slice(2, 4), True) == [(32, 24, 0.25, 1.0), (256, 1, 1.0, 1.0)]
    assert dedicated(single, slice(2, 4), False) == [(32, 24, 0.5, 2.0), (256, 1, 1.0, 1.0)]
    assert dedicated([(4, 32, 64, 10.0, 0.4)], slice(3, 4), True) == [(4, 32, 64, 4.0)]


def test_policy_comparison_runs_both_sides_on_the_same_scaled_workload():
    """agentflow bench real_policies: the trace both sides replay is scaled once (calls'
    tokens, tool durations), and the simulated cluster has llama-server's slot limits."""
    from agentflow.bench.fidelity.real_policies import scaled_trace, sim_cluster

    (q,) = scaled_trace([query("q")], 0.1, None, 5)
    by = {n.id: n for n in q.nodes}
    assert (by["b"].prompt_tokens, by["b"].output_tokens) == (120, 5)  # 6 capped at 5
    assert by["t"].duration_s == pytest.approx(0.05)
    assert [n.parents for n in q.nodes] == [n.parents for n in query("q").nodes]
    cluster = sim_cluster(str(CLUSTER))
    assert {i.max_num_seqs for i in cluster.instances} == {4}


def test_attribution_splits_each_call_and_names_the_phase_that_is_off():
    from agentflow.bench.fidelity.attribution import (
        Split,
        breakdown,
        in_flight_at_submit,
        real_split,
        sim_split,
    )

    # llama-server's own timings: 2 s of prompt, 3 s of decode in a 6 s call -> 1 s queued
    assert real_split(6.0, 2.5, {"prompt_ms": 2000, "predicted_ms": 3000}) == \
        Split(1.0, 2.0, 3.0)
    # without them the first token splits the call (no queue can be told apart)
    assert real_split(6.0, 2.5, None) == Split(0.0, 2.5, 3.5)
    assert sim_split(0.5, 2.0, 5.0) == Split(0.5, 2.0, 3.0)
    # a alone; b and c overlap on i0 (c submitted while b runs); d alone on i1
    submit = {"a": 0.0, "b": 10.0, "c": 11.0, "d": 10.5}
    finish = {"a": 5.0, "b": 20.0, "c": 18.0, "d": 12.0}
    conc = in_flight_at_submit(submit, finish, {"a": "i0", "b": "i0", "c": "i0", "d": "i1"})
    assert conc == {"a": 1, "b": 1, "c": 2, "d": 1}
    real = {"a": Split(0, 2, 3), "b": Split(0, 4, 6), "c": Split(3, 2, 2), "d": Split(0, 1, 1)}
    sim = {"a": Split(0, 2, 3), "b": Split(0, 4, 6), "c": Split(0, 2, 2), "d": Split(0, 1, 1)}
    table = breakdown(real, sim, conc)
    assert table["1"]["calls"] == 3 and table["1"]["median_call_error"] == 0.0
    # all of the error is c's queue, which only the overlapping bin has
    assert table["2"]["queue"] == {"real_s": 3.0, "sim_s": 0.0, "abs_err_s": 3.0,
                                   "error_share": 1.0}
    assert table["all"]["queue"]["error_share"] == 1.0
    assert table["all"]["decode"]["error_share"] == 0.0


def test_the_simulated_replay_records_each_calls_phases():
    engines = sim_engines(str(CLUSTER))
    w = build_workload([query("x")], list(engines), rate=1.0, seed=0, scale=1.0,
                       max_prompt=None, max_output=None, assign="query")
    out = replay_sim(w, engines)
    for c in w.calls[0]:
        split = out.split[c.id]
        assert split.prefill > 0 and split.total == pytest.approx(out.call_latency(c.id))
        assert (split.decode > 0) == (c.output_tokens > 1)


def test_llama_server_breaks_prompts_where_it_checkpoints_a_sliding_window_model():
    from agentflow import hardware
    from agentflow.llm.llamacpp_server import prompt_breaks

    gemma = hardware.model("gemma-3-270m")
    server = {"type": "llama_server"}
    assert prompt_breaks(server, gemma) == (516, 4)  # 4 + n_ubatch, then 4
    assert prompt_breaks({**server, "batch": 256, "ubatch": 512}, gemma) == (256, 4)
    assert prompt_breaks({**server, "extra_args": ["--swa-full"]}, gemma) == ()
    assert prompt_breaks({**server, "extra_args": ["--ctx-checkpoints", "0"]}, gemma) == ()
    assert prompt_breaks(server, hardware.model("Llama-3.1-8B")) == ()  # no window


def test_a_prompt_shares_its_last_chunks_with_a_newcomers_prompt():
    """llama-server's case, measured: an 804-token prompt runs as 288 + 512 + 4 tokens, and
    a 1191-token prompt arriving during the first chunk rides in the next two steps, so the
    first prompt's first token waits for the newcomer's chunk (8.8 s real; one whole chunk
    would give 3.3 s)."""
    def first_tokens(breaks: bool) -> tuple[dict[str, float], int]:
        engine = sim_engines(str(CLUSTER))["cpu-0"]
        if not breaks:
            engine.prompt_breaks = ()
        engine.add("a", 804, 44, 0, 0.0)
        engine.add("b", 1191, 66, 0, 0.5)
        firsts = {}
        while (t := engine.next_event_time()) is not None:
            for ev in engine.step_until(t):
                if ev.kind == "first_token":
                    firsts[ev.seq_id] = ev.time
        return firsts, engine.plans

    assert sim_engines(str(CLUSTER))["cpu-0"].prompt_breaks == (516, 4)
    split, split_plans = first_tokens(True)
    whole, whole_plans = first_tokens(False)
    assert split["a"] > 1.5 * whole["a"]  # a's last chunks carry b's prompt
    assert split["b"] == pytest.approx(whole["b"], rel=0.1)  # the work is the same
    assert split_plans > whole_plans


def test_calls_ready_together_reach_the_engine_one_after_another():
    """Four evaluations ready at once: the first sent runs its first chunk alone and the
    other three wait for that step, then share the next one, as measured on llama-server
    (0.45 s queued behind the first); sent at the same instant they would share one step."""
    fan = TraceQuery("f", [TraceNode("a", "extract_keywords", "llm", (), 30, 1)] + [
        TraceNode(f"e{i}", "evaluate", "llm", ("a",), 96, 2) for i in range(4)])

    def queued(gap: float) -> list[float]:
        engines = sim_engines(str(CLUSTER))
        w = build_workload([fan], list(engines), rate=1.0, seed=0, scale=1.0,
                           max_prompt=None, max_output=None, assign="query")
        out = replay_sim(w, engines, send_gap_s=gap)
        return [out.split[f"q0/e{i}"].queue for i in range(4)]

    assert max(queued(0.0)) < 1e-3
    first, *rest = queued(0.002)
    assert first < 0.01 and min(rest) > 0.3  # a step of 92 prompt tokens ahead of them


def test_resim_checks_the_current_simulator_against_a_saved_real_side(tmp_path, capsys):
    """--resim reads an earlier run's --json and compares without real engines: a saved
    "real" side that is the simulator's own replay gives zero error; one twice as slow
    gives 50% per call."""
    import json

    from agentflow.bench.fidelity import real_vs_sim

    trace = ROOT.parent / "shared" / "traces" / "hexgen-flow" / "trace1.json"
    if not trace.is_file():
        pytest.skip("the shared HexGen-Flow trace is not here")
    from agentflow.sim.workload import load_trace

    args = {"trace": str(trace), "rate": 0.5, "quick": False, "queries": 2, "skip": 0,
            "scale": 0.02, "max_prompt": None, "max_output": None, "assign": "query",
            "seed": 0}
    engines = sim_engines(str(CLUSTER))
    w = build_workload(load_trace(str(trace))[:2], list(engines), rate=0.5, seed=0,
                       scale=0.02, max_prompt=None, max_output=None, assign="query")
    sim = replay_sim(w, engines)
    ids = [c.id for cs in w.calls for c in cs]
    for factor, expected in ((1.0, "0.0000"), (2.0, "0.5000")):
        saved = tmp_path / f"run{factor}.json"
        saved.write_text(json.dumps({"args": args, "call_real_s": [
            factor * sim.call_latency(i) for i in ids], "query_real_s": [
            factor * sim.query_latency(w, q) for q in range(len(w.calls))],
            "engine_real_cpu_s": {n: factor * v for n, v in sim.engine_s.items()}}))
        real_vs_sim.main(["--cluster", str(CLUSTER), "--resim", str(saved)])
        last = capsys.readouterr().out.strip().splitlines()
        work = f"{1 / factor:.3f}"
        busy = [n for n, v in sim.engine_s.items() if v > 0]
        assert last[-3] == (f"engine work sim/real per instance: "
                            f"{', '.join([work] * len(busy))} ({', '.join(busy)}; priced "
                            "at the profile's constants, no probe before the replay)")
        assert last[-2] == f"median |sim-real|/real per call: {expected}"
        assert last[-1] == f"P95 error per query: {expected}"


def test_a_lone_calls_engine_work_is_its_latency_and_a_batch_shares_its_steps():
    """The simulated side of the engine-work figure: seconds in iterations. One call alone
    keeps its engine busy for its whole latency; two at once share steps, so the engine is
    busy for less than the sum of their latencies."""
    lone = [TraceQuery("q0", [TraceNode("a", "generate", "llm", (), 400, 30)])]
    engines = sim_engines(str(CLUSTER))
    w = build_workload(lone, ["cpu-0"], rate=1.0, seed=0, scale=1.0, max_prompt=None,
                       max_output=None, assign="query")
    sim = replay_sim(w, engines)
    (cid,) = [c.id for cs in w.calls for c in cs]
    assert sim.engine_s["cpu-0"] == pytest.approx(sim.call_latency(cid), rel=1e-3)
    assert sim.engine_s["cpu-1"] == 0.0
    pair = [TraceQuery("q0", [TraceNode("a", "generate", "llm", (), 400, 30),
                              TraceNode("b", "generate", "llm", (), 400, 30)])]
    w = build_workload(pair, ["cpu-0"], rate=1.0, seed=0, scale=1.0, max_prompt=None,
                       max_output=None, assign="query")
    sim = replay_sim(w, sim_engines(str(CLUSTER)))
    total = sum(sim.call_latency(c.id) for cs in w.calls for c in cs)
    longest = max(sim.call_latency(c.id) for cs in w.calls for c in cs)
    # (a call's latency also holds the per-request front-end cost, outside the iterations)
    assert longest * (1 - 1e-3) <= sim.engine_s["cpu-0"] < 0.8 * total


def test_the_probe_prices_a_single_request_as_the_replay_would():
    from agentflow.bench.fidelity.probe import PROBE_SHAPES, simulated_alone

    alone = TraceQuery("p", [TraceNode("a", "revise", "llm", (), *PROBE_SHAPES[1])])
    engines = sim_engines(str(CLUSTER))
    w = build_workload([alone], list(engines), rate=1.0, seed=0, scale=1.0, max_prompt=None,
                       max_output=None, assign="query")
    replayed = replay_sim(w, engines).call_latency("q0/a")
    assert simulated_alone(sim_engines(str(CLUSTER))["cpu-0"], *PROBE_SHAPES[1]) == \
        pytest.approx(replayed)
    assert simulated_alone(sim_engines(str(CLUSTER))["cpu-0"], *PROBE_SHAPES[0]) < replayed


def test_batch_rows_with_a_lone_time_fit_the_ratio_so_the_machine_factor_cancels():
    """Rows timed by a known profile on a machine running 1.3x slow: a batched row's error
    against its own time is 30%, against its same-minute lone time it is none."""
    from agentflow import hardware
    from agentflow.sim.host_calibration import batch_residuals, batched_rows, sim_batch

    limits = engine_limits(InstanceConfig(name="c", gpu="Xeon-core", model="gemma-3-270m",
                                          backend={"type": "llama_server", "parallel": 4}))
    model, truth = hardware.model("gemma-3-270m"), hardware.gpu("Xeon-core")
    slow = 1.3
    saved = [(b, p, 32, slow * sim_batch(truth, model, limits, b, p, 32)[1], 1.0,
              slow * sim_batch(truth, model, limits, 1, p, 32)[1], 1.0)
             for b in (2, 4) for p in (32, 512)]
    with_lone = batched_rows(saved, by_share=False)
    assert all(len(r) == 5 for r in with_lone)
    assert batch_residuals(truth, model, limits, with_lone) == pytest.approx([0.0] * 4,
                                                                            abs=1e-9)
    without = [r[:4] for r in with_lone]
    assert batch_residuals(truth, model, limits, without) == pytest.approx(
        [1 / slow - 1] * 4, rel=1e-9)
    # shares scale each time by its own row's share; rows saved before had no lone time
    assert batched_rows([(2, 32, 8, 2.0, 0.5, 1.0, 0.8)], by_share=True) == \
        [(2, 32, 8, 1.0, 0.8)]
    assert batched_rows([(2, 32, 8, 2.0, 0.5)], by_share=True) == [(2, 32, 8, 1.0)]


def test_lone_calls_are_those_no_call_on_their_instance_overlapped():
    from agentflow.bench.fidelity.normalise import instance_slowdowns, lone_calls

    submit = {"a": 0.0, "b": 1.0, "c": 5.0, "d": 0.5, "e": 9.0}
    finish = {"a": 2.0, "b": 3.0, "c": 6.0, "d": 8.0, "e": 9.5}
    inst = {"a": "i0", "b": "i0", "c": "i0", "d": "i1", "e": "i1"}
    assert lone_calls(submit, finish, inst) == {"c", "d", "e"}  # d overlaps only i0's calls
    # a ratio of sums: the long call sets i1's factor, not the two short ones
    factors = {"i0": [("c", 1.2, 1.0)], "i1": [("d", 0.1, 0.2), ("e", 0.1, 0.2),
                                               ("x", 13.0, 10.0)]}
    assert instance_slowdowns(factors, ["i0", "i1", "i2"]) == pytest.approx(
        {"i0": 1.2, "i1": 13.2 / 10.4, "i2": (1.2 + 13.2 / 10.4) / 2})
    assert instance_slowdowns({}, ["i0"]) is None


def test_the_lone_call_factor_reads_the_machine_speed_from_the_replays_lone_calls():
    """A replay whose real side is the simulator slowed 1.25x: the lone calls give 1.25,
    and the normalised errors vanish while the raw ones are 20%."""
    from agentflow.bench.fidelity.real_vs_sim import Outcome, error_figures, lone_normalised

    w = build_workload([query("x"), query("y")], ["cpu-0", "cpu-1"], rate=0.01, seed=1,
                       scale=0.2, max_prompt=None, max_output=None, assign="query")
    slowed = sim_engines(str(CLUSTER))
    for e in slowed.values():
        e.slowdown = 1.25
    sim_real = replay_sim(w, slowed)
    real = Outcome(submit=sim_real.submit, finish=sim_real.finish,
                   prompt_tokens={c.id: c.prompt_tokens for cs in w.calls for c in cs})
    raw = error_figures(w, real, replay_sim(w, sim_engines(str(CLUSTER))))
    assert raw["median_call_error"] == pytest.approx(0.2, abs=0.01)
    got = lone_normalised(w, real, str(CLUSTER))
    assert got is not None and got["lone_calls"] >= 2
    assert got["slowdown"] == pytest.approx({"cpu-0": 1.25, "cpu-1": 1.25}, rel=1e-3)
    assert got["median_call_error"] == pytest.approx(0.0, abs=1e-3)
    assert got["p95_query_error"] == pytest.approx(0.0, abs=1e-3)


def test_a_joined_decode_waits_for_the_newcomers_prompt_batches():
    """The joined-decode calibration row in the simulator: A's decode slows by about B's
    prompt time (its tokens ride in B's prompt batches), B by little (one decode row)."""
    from agentflow import hardware
    from agentflow.sim.host_calibration import CAL_JOIN_OUTPUT, sim_joined, sim_single

    limits = engine_limits(InstanceConfig(name="c", gpu="Xeon-core", model="gemma-3-270m",
                                          backend={"type": "llama_server", "parallel": 4}))
    model, g = hardware.model("gemma-3-270m"), hardware.gpu("Xeon-core")
    a_alone = sim_single(g, model, limits, 32, CAL_JOIN_OUTPUT)[1]
    b_alone = sim_single(g, model, limits, 1024, 4)[1]
    a, b = sim_joined(g, model, limits, 1024)
    assert a > a_alone + 0.8 * b_alone
    assert b_alone < b < 1.2 * b_alone
