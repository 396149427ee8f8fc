"""The co-run factor: a host's local engines priced at ``cpu_alone_factor`` while no other
local engine is busy, at the profile's constants while one is (``agentflow.sim.host_corun``,
applied by ``real_vs_sim``'s simulated replay)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agentflow import hardware
from agentflow.bench.fidelity.real_vs_sim import build_workload, replay_sim, sim_engines
from agentflow.sim.host_corun import CoRun, alone_factor
from agentflow.sim.workload import TraceNode, TraceQuery

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = str(ROOT / "examples" / "cluster-llama-server-2cpu.yaml")


def engines(factor: float) -> dict:
    g = replace(hardware.gpu("Xeon-core"), cpu_alone_factor=factor)
    return sim_engines(CLUSTER, {"cpu-0": g, "cpu-1": g})


def one_call_each(starts: list[float], prompt: int = 400, output: int = 30):
    """Query i (one call) arrives at ``starts[i]`` on instance i % 2."""
    queries = [TraceQuery(f"q{i}", [TraceNode("a", "generate", "llm", (), prompt, output)])
               for i in range(len(starts))]
    w = build_workload(queries, ["cpu-0", "cpu-1"], rate=1.0, seed=0, scale=1.0,
                       max_prompt=None, max_output=None, assign="query")
    w.arrivals = list(starts)
    return w


def test_a_call_with_its_neighbour_idle_is_priced_at_the_alone_factor():
    w = one_call_each([0.0])
    plain = replay_sim(w, engines(1.0))
    alone = replay_sim(w, engines(1.25))
    assert alone.engine_s["cpu-0"] == pytest.approx(1.25 * plain.engine_s["cpu-0"], rel=1e-9)
    assert alone.alone_busy_s["cpu-0"] == pytest.approx(alone.engine_s["cpu-0"], rel=1e-9)
    assert alone.alone_factor == {"cpu-0": 1.25, "cpu-1": 1.25}
    # without the host coupling the factor is never applied
    off = replay_sim(w, engines(1.25), corun=False)
    assert off.engine_s == plain.engine_s and off.alone_busy_s == {}


def test_calls_beside_a_busy_neighbour_are_priced_at_the_profiles_constants():
    """Two equal calls, one per core, the second 1 ms later: only what ran before it
    arrived (the first iteration in flight on cpu-0) is priced alone."""
    w = one_call_each([0.0, 0.001])
    plain = replay_sim(w, engines(1.0))
    corun = replay_sim(w, engines(1.25))
    assert corun.engine_s["cpu-1"] == pytest.approx(plain.engine_s["cpu-1"], rel=1e-9)
    assert plain.engine_s["cpu-0"] < corun.engine_s["cpu-0"] < 1.25 * plain.engine_s["cpu-0"]
    # ... and apart, each alone the whole time
    apart = one_call_each([0.0, 100.0])
    plain = replay_sim(apart, engines(1.0))
    corun = replay_sim(apart, engines(1.25))
    for n in ("cpu-0", "cpu-1"):
        assert corun.engine_s[n] == pytest.approx(1.25 * plain.engine_s[n], rel=1e-9)


def test_a_neighbour_that_goes_idle_mid_call_leaves_the_rest_priced_alone():
    """cpu-0 has a long call, cpu-1 a shorter one beside its start: cpu-0's iterations
    after cpu-1 went idle are priced alone, so its busy seconds grow by the factor on that
    part only, which is what ``alone_busy_s`` reports (to within the iteration in flight at
    the switch, which keeps its price: one decode step here)."""
    queries = [TraceQuery("q0", [TraceNode("a", "generate", "llm", (), 100, 400)]),
               TraceQuery("q1", [TraceNode("a", "generate", "llm", (), 50, 60)])]
    w = build_workload(queries, ["cpu-0", "cpu-1"], rate=1.0, seed=0, scale=1.0,
                       max_prompt=None, max_output=None, assign="query")
    w.arrivals = [0.0, 0.0]
    plain = replay_sim(w, engines(1.0))
    corun = replay_sim(w, engines(1.5))
    part = corun.alone_busy_s["cpu-0"]
    assert 0 < part < corun.engine_s["cpu-0"]
    # the part priced alone took 1.5x; the rest what it takes beside a busy neighbour
    assert corun.engine_s["cpu-0"] - part + part / 1.5 == pytest.approx(
        plain.engine_s["cpu-0"], rel=2e-3)
    assert corun.engine_s["cpu-1"] == pytest.approx(plain.engine_s["cpu-1"], rel=1e-9)


def test_a_factor_of_one_replays_exactly_as_without_the_coupling():
    w = build_workload([TraceQuery(f"q{i}", [
        TraceNode("a", "x", "llm", (), 300 + 50 * i, 20),
        TraceNode("b", "y", "llm", ("a",), 200, 10 + i)]) for i in range(6)],
        ["cpu-0", "cpu-1"], rate=0.5, seed=3, scale=1.0, max_prompt=None,
        max_output=None, assign="query")
    a = replay_sim(w, engines(1.0))
    b = replay_sim(w, engines(1.0), corun=False)
    assert a.finish == b.finish and a.engine_s == b.engine_s


def test_the_factor_sits_on_top_of_an_engines_own_slowdown_and_the_background():
    w = one_call_each([0.0])
    slowed = engines(1.2)
    for e in slowed.values():
        e.slowdown = 2.0
    base = engines(1.0)
    for e in base.values():
        e.slowdown = 2.0
    assert replay_sim(w, slowed).engine_s["cpu-0"] == pytest.approx(
        1.2 * replay_sim(w, base).engine_s["cpu-0"], rel=1e-9)
    half = replay_sim(w, engines(1.2), background=0.5).engine_s["cpu-0"]
    assert half == pytest.approx(1.1 * replay_sim(w, engines(1.0)).engine_s["cpu-0"], rel=1e-9)
    assert replay_sim(w, engines(1.2), background=1.0).engine_s == \
        replay_sim(w, engines(1.0)).engine_s
    with pytest.raises(ValueError):
        alone_factor(engines(1.2)["cpu-0"], background=1.5)


def test_one_engine_alone_on_its_host_is_never_repriced():
    e = engines(1.3)["cpu-0"]
    host = CoRun({"cpu-0": e})
    host.update(0.0)
    assert not host.active and e.slowdown == 1.0


def test_the_background_is_the_other_processes_share_of_the_machine():
    from agentflow.bench.fidelity.environment import background_share

    assert background_share({"others_cpu_s": 30.0, "wall_s": 100.0, "cpus": 2.0}) == 0.15
    assert background_share({"others_cpu_s": 500.0, "wall_s": 100.0, "cpus": 2.0}) == 1.0
    assert background_share({}) == 0.0


def test_resim_prices_the_saved_run_with_the_hosts_factor_and_shows_it_off(
        tmp_path, host_store, capsys):
    """A host profile with a factor: ``--resim`` simulates with it, the saved run's other
    processes as background; a "real" side that is that very replay gives engine work 1,
    and the line with the factor off gives less (the lone stretches priced beside)."""
    import json

    from agentflow.bench.fidelity import real_vs_sim
    from agentflow.sim import host_profiles as hp

    trace = ROOT.parent / "shared" / "traces" / "hexgen-flow" / "trace1.json"
    if not trace.is_file():
        pytest.skip("the shared HexGen-Flow trace is not here")
    from agentflow.sim.workload import load_trace

    host = hp.HostIdentity("AMD EPYC")
    host_store(host)
    hp.save(hp.HostProfile(base="Xeon-core", model="gemma-3-270m", host=host,
                           constants={}, alone_factor=1.2))
    environment = {"others_cpu_s": 20.0, "wall_s": 100.0, "cpus": 2.0}  # background 0.1
    args = {"trace": str(trace), "rate": 0.05, "quick": False, "queries": 3, "skip": 0,
            "scale": 0.02, "max_prompt": None, "max_output": None, "assign": "query",
            "seed": 0}
    w = build_workload(load_trace(str(trace))[:3], ["cpu-0", "cpu-1"], rate=0.05, seed=0,
                       scale=0.02, max_prompt=None, max_output=None, assign="query")
    assert replay_sim(w, sim_engines(CLUSTER), background=0.1).alone_factor == \
        pytest.approx({"cpu-0": 1.18, "cpu-1": 1.18})  # 1 + 0.2 x 0.9
    # the headline is priced before the replay: the background measured during it does not
    # price it, so a "real" side that is the replay priced at the factor in full gives 1
    sim = replay_sim(w, sim_engines(CLUSTER))
    ids = [c.id for cs in w.calls for c in cs]
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({
        "args": args, "environment": environment,
        "call_real_s": [sim.call_latency(i) for i in ids],
        "query_real_s": [sim.query_latency(w, q) for q in range(len(w.calls))],
        "engine_real_cpu_s": sim.engine_s}))
    real_vs_sim.main(["--cluster", CLUSTER, "--resim", str(saved)])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-3] == ("engine work sim/real per instance: 1.000, 1.000 (cpu-0, cpu-1; "
                       "priced at the profile's constants, no probe before the replay)")
    assert any(line.startswith("co-run pricing") and "10.0% of the machine" in line
               for line in out)

    def values(line: str) -> list[float]:
        return [float(v) for v in line.split("): ")[-1].split(" (")[0].split(", ")]

    (off,) = [line for line in out if "co-run off" in line]
    assert all(0.8 < v < 1.0 for v in values(off.replace("co-run off:", "co-run off):")))
    # beside it, the factor on the 90% the other processes left (not predictive): between
    (bg,) = [line for line in out if "not predictive" in line]
    assert all(0.95 < v < 1.0 for v in values(bg))
