"""A speed reference per instance, from every calibration try's probes, and the headline's
pricing at it and at the speed probe just before a replay (#40: stop 49's idle replays ran
the same work ~16% slower than the calm phase the calibration's stable try caught, and one
pinned core's probe ran ~7% slower than the other's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow import hardware
from agentflow.bench.fidelity import probe
from agentflow.cli.main import main
from agentflow.config import InstanceConfig
from agentflow.sim import host_calibration as calib
from agentflow.sim import host_profiles as hp
from agentflow.sim.engine import engine_for

HOST = hp.HostIdentity("AMD EPYC")
ROOT = Path(__file__).resolve().parents[2]
CLUSTER = str(ROOT / "examples" / "cluster-llama-server-2cpu.yaml")


def local(name: str) -> InstanceConfig:
    return InstanceConfig(name=name, gpu="Xeon-core", model="gemma-3-270m",
                          backend={"type": "llama_server", "parallel": 4})


@pytest.fixture
def store(host_store):
    return host_store(HOST)


def fitted(**extra) -> hp.HostProfile:
    return hp.HostProfile(base="Xeon-core", model="gemma-3-270m", host=HOST,
                          constants={"compute_efficiency": 0.3}, speed_probe_cpu_s=3.0,
                          speed_probe_shapes=calib.SPEED_PROBE, **extra)


def test_each_instance_is_priced_at_its_own_typical_probe_over_the_fits(store):
    """cpu-0's probes have median 3.3, cpu-1's 3.6; the rows were fitted while it cost 3.0:
    the engines run 1.1x and 1.2x the constants' times; the named profile, and an entry
    stored before the probes were kept, price every instance at the constants."""
    hp.save(fitted(instance_probes={"cpu-0": (3.0, 3.3, 3.9), "cpu-1": (3.6, 3.5, 4.0)}))
    (back,) = hp.load()
    assert back.instance_probes == {"cpu-0": (3.0, 3.3, 3.9), "cpu-1": (3.6, 3.5, 4.0)}
    assert back.instance_reference("cpu-0", calib.SPEED_PROBE) == pytest.approx(3.3)
    assert back.instance_reference("cpu-9", calib.SPEED_PROBE) == 3.0  # not timed: the fit's
    assert back.instance_reference("cpu-0", ((512, 1),)) is None  # another probe
    assert back.instance_speeds() == pytest.approx({"cpu-0": 1.1, "cpu-1": 1.2})
    e0, e1 = engine_for("cpu-0", local("cpu-0")), engine_for("cpu-1", local("cpu-1"))
    assert (e0.slowdown, e1.slowdown) == pytest.approx((1.1, 1.2))
    assert e0.gpu.compute_efficiency == 0.3
    assert engine_for("cpu-0", local("cpu-0"), hardware.gpu("Xeon-core")).slowdown == 1.0
    assert engine_for("cpu-2", local("cpu-2")).slowdown == 1.0  # no probes of its own
    old = {k: v for k, v in back.to_json().items() if k != "instance_probes"}
    hp.save(hp.HostProfile.from_json(old))
    assert hp.load()[0].profile().cpu_instance_speed == ()
    assert engine_for("cpu-1", local("cpu-1")).slowdown == 1.0
    # the replay's reference per instance is the speed its engine is priced at
    hp.save(back)
    refs = probe.speed_references(CLUSTER)
    assert refs == pytest.approx({"cpu-0": 3.3, "cpu-1": 3.6})


def test_the_headline_prices_half_the_probe_before_and_half_the_typical_speed():
    refs = {"a": 3.0, "b": 3.0, "c": 3.0}
    got = probe.predicted_factors({"a": 3.6, "b": 2.4}, refs)
    assert got == pytest.approx({"a": 1.1, "b": 0.9})  # c: no probe before, not repriced
    assert probe.predicted_factors({"a": 3.6}, refs, weight=1.0) == pytest.approx({"a": 1.2})
    assert probe.predicted_factors({"a": 3.6}, refs, weight=0.0) == pytest.approx({"a": 1.0})
    with pytest.raises(ValueError):
        probe.predicted_factors({"a": 3.6}, refs, weight=1.5)
    assert "x1.100, x0.900" in probe.pricing_note(got, True)
    assert probe.pricing_note({}, True) == ("priced at each instance's typical calibration "
                                            "speed, no probe before the replay")
    assert "the profile's constants, no probe" in probe.pricing_note({}, False)


def test_calibrate_tries_again_while_the_probe_moves_and_keeps_every_trys_probes(
        store, tmp_path, monkeypatch, capsys):
    """Try 1's probe moves 20% (a WARNING), try 2's 3%: two tries, the fit of try 2's rows
    and its probe mean as the fit's speed, and each instance's reference the median of all
    its busy probes of both tries (rows before/after and beside busy neighbours; not the
    alone ones); the co-run factor over both tries' pairs."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text("""name: two
instances:
  - {name: cpu-0, gpu: Xeon-core, model: gemma-3-270m, backend: {type: llama_server}}
  - {name: cpu-1, gpu: Xeon-core, model: gemma-3-270m, backend: {type: llama_server}}
""")
    tries = iter([
        {"cpu-0": calib.Measured([(32, 1, 0.1, 0.1)], [], [], [3.0, 3.6], [(2.0, 3.4)]),
         "cpu-1": calib.Measured([(32, 1, 0.1, 0.1)], [], [], [3.2, 3.3], [(2.0, 4.0)])},
        {"cpu-0": calib.Measured([(32, 1, 0.2, 0.2)], [], [], [3.0, 3.05], [(3.3, 3.0)]),
         "cpu-1": calib.Measured([(32, 1, 0.2, 0.2)], [], [], [3.02, 3.09], [(3.3, 3.0)])},
    ])
    calls = []
    fitted_rows = []

    def fake_measure(args, names):
        calls.append(list(names))
        return next(tries)

    def fake_fit(base, model, limits, rows, batched, joined, **kw):
        fitted_rows.append(rows)
        return calib.CalibrationFit(base, 0.01, 0.02, rows, batched, joined)

    monkeypatch.setattr(calib, "measure_together", fake_measure)
    monkeypatch.setattr(calib, "fit_rows", fake_fit)
    out_json = tmp_path / "cal.json"
    assert main(["calibrate", "--cluster", str(cluster), "--tries", "3", "--json",
                 str(out_json)]) == 0
    out = capsys.readouterr().out
    assert len(calls) == 2 and "try 1: WARNING: the speed probe moved 20%" in out
    assert fitted_rows == [[(32, 1, 0.2, 0.2)] * 2]  # the last try's rows only
    (e,) = hp.load()
    assert e.speed_probe_cpu_s == pytest.approx((3.0 + 3.05 + 3.02 + 3.09) / 4)
    assert e.instance_probes == {"cpu-0": (3.0, 3.6, 3.4, 3.0, 3.05, 3.0),
                                 "cpu-1": (3.2, 3.3, 4.0, 3.02, 3.09, 3.0)}
    assert e.instance_reference("cpu-0", calib.SPEED_PROBE) == pytest.approx(3.025)
    assert e.instance_reference("cpu-1", calib.SPEED_PROBE) == pytest.approx(3.145)
    assert e.alone_factor == pytest.approx(calib.corun_factor(
        [(2.0, 3.4), (3.3, 3.0), (2.0, 4.0), (3.3, 3.0)]))
    assert "speed reference per instance" in out and "cpu-1 3.145 CPU-s" in out
    saved = json.loads(out_json.read_text())["Xeon-core / gemma-3-270m"]
    assert [t["moved"] for t in saved["tries"]] == [True, False]
    # --refit of the saved rows keeps the per-instance probes
    hp.save(fitted())
    assert main(["calibrate", "--cluster", str(cluster), "--refit", str(out_json)]) == 0
    assert hp.load()[0].instance_probes == e.instance_probes
    # one try (the default) stops after it, however much the probe moved
    tries = iter([{"cpu-0": calib.Measured([], [], [], [3.0, 3.6]),
                   "cpu-1": calib.Measured([], [], [], [3.0, 3.6])}])
    calls.clear()
    assert main(["calibrate", "--cluster", str(cluster)]) == 0
    assert len(calls) == 1


def test_the_replays_headline_is_priced_at_the_probe_before_it_and_says_so(
        store, tmp_path, capsys):
    """``--resim`` of a saved run whose probe before the replay cost 1.2x each instance's
    typical: the headline prices half of it (x1.1) and names the pricing; a "real" side
    that is the replay so priced gives engine work 1; without the probe, 1/1.1."""
    from agentflow.bench.fidelity import real_vs_sim
    from agentflow.bench.fidelity.real_vs_sim import (
        build_workload,
        priced_engines,
        replay_sim,
        sim_engines,
    )
    from agentflow.sim.workload import load_trace

    trace = ROOT.parent / "shared" / "traces" / "hexgen-flow" / "trace1.json"
    if not trace.is_file():
        pytest.skip("the shared HexGen-Flow trace is not here")
    hp.save(fitted(instance_probes={"cpu-0": (3.3,), "cpu-1": (3.6,)}))
    args = {"trace": str(trace), "rate": 0.05, "quick": False, "queries": 3, "skip": 0,
            "scale": 0.02, "max_prompt": None, "max_output": None, "assign": "query",
            "seed": 0}
    w = build_workload(load_trace(str(trace))[:3], ["cpu-0", "cpu-1"], rate=0.05, seed=0,
                       scale=0.02, max_prompt=None, max_output=None, assign="query")
    assert [e.slowdown for e in sim_engines(CLUSTER).values()] == pytest.approx([1.1, 1.2])
    real = replay_sim(w, priced_engines(CLUSTER, {"cpu-0": 1.1, "cpu-1": 1.1}))
    ids = [c.id for cs in w.calls for c in cs]
    saved = {"args": args, "call_real_s": [real.call_latency(i) for i in ids],
             "query_real_s": [real.query_latency(w, q) for q in range(len(w.calls))],
             "engine_real_cpu_s": real.engine_s,
             "speed_probe": {"before": {"cpu-0": 3.96, "cpu-1": 4.32},
                             "after": {"cpu-0": 3.3, "cpu-1": 3.6}}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(saved))
    real_vs_sim.main(["--cluster", CLUSTER, "--resim", str(path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-3] == ("engine work sim/real per instance: 1.000, 1.000 (cpu-0, cpu-1; priced "
                       "at the mean of each instance's typical calibration speed and the speed "
                       "probe just before the replay: x1.100, x1.100 the former)")
    assert out[-2] == "median |sim-real|/real per call: 0.0000"
    # the load-matched figure (probes around the replay, x1.1) is over the typical pricing
    (matched,) = [line for line in out if "load-matched" in line]
    assert "x1.100, x1.100" in matched
    del saved["speed_probe"]
    path.write_text(json.dumps(saved))
    real_vs_sim.main(["--cluster", CLUSTER, "--resim", str(path)])
    last = capsys.readouterr().out.strip().splitlines()[-3]
    assert last.endswith("(cpu-0, cpu-1; priced at each instance's typical calibration "
                         "speed, no probe before the replay)")
    work = [float(v) for v in last.split(": ")[1].split(" (")[0].split(", ")]
    assert work == pytest.approx([1 / 1.1, 1 / 1.1], rel=0.03)
