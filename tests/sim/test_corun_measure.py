"""The co-run measurement of ``agentflow calibrate``: the speed probe on each instance alone
and beside its busy neighbours (``host_calibration.measure_corun``), the factor it stores
(``corun_factor``) and how the host profile carries it to the simulator."""

from __future__ import annotations

import asyncio

import pytest

from agentflow import hardware
from agentflow.config import InstanceConfig
from agentflow.sim import host_calibration as calib
from agentflow.sim import host_profiles as hp
from agentflow.sim.engine import engine_for


class Busy:
    """Fake backends: each request takes a little while; who has one in flight is kept."""

    def __init__(self, names):
        self.in_flight = {n: 0 for n in names}
        self.requests = {n: 0 for n in names}

    def backend(self, name):
        busy = self

        class B:
            async def generate(self, request, on_progress=None):
                busy.in_flight[name] += 1
                busy.requests[name] += 1
                try:
                    await asyncio.sleep(0.01)
                finally:
                    busy.in_flight[name] -= 1

        return B()


def test_each_instance_is_probed_alone_and_beside_its_busy_neighbours(monkeypatch):
    names = ["cpu-0", "cpu-1", "cpu-2"]
    busy = Busy(names)
    backends = {n: busy.backend(n) for n in names}
    owner = {id(b): n for n, b in backends.items()}
    seen: list[tuple[str, list[int]]] = []

    async def fake_probe(backend, make_prompt):
        # "CPU seconds": 1.0 alone, 1.25 with any neighbour busy through the whole probe
        name = owner[id(backend)]
        others = []
        for _ in range(5):
            others.append(sum(v for n, v in busy.in_flight.items() if n != name))
            await backend.generate(None)
        seen.append((name, others))
        return 1.25 if min(others) > 0 else 1.0 if max(others) == 0 else 9.9

    monkeypatch.setattr(calib, "speed_probe", fake_probe)
    pairs = asyncio.run(calib.measure_corun(backends, lambda n: "x" * n, names, rounds=3))
    assert pairs == {n: [(1.0, 1.25)] * 3 for n in names}
    assert calib.corun_factor([p for v in pairs.values() for p in v]) == pytest.approx(0.8)
    assert all(v == 0 for v in busy.in_flight.values())  # no load left running
    # the rounds alternate which probe comes first
    assert [max(o) > 0 for n, o in seen if n == "cpu-0"] == [False, True, True, False,
                                                              False, True]
    # one instance: no neighbours, nothing measured
    assert asyncio.run(calib.measure_corun({"cpu-0": backends["cpu-0"]}, str, ["cpu-0"],
                                           2)) == {"cpu-0": []}


def test_the_factor_is_the_median_ratio_and_one_when_nothing_was_measured():
    assert calib.corun_factor([]) == 1.0
    assert calib.corun_factor([(4.0, 5.0), (5.0, 4.0), (4.4, 4.0)]) == pytest.approx(1.1)
    with pytest.raises(ValueError):
        calib.corun_factor([(0.0, 4.0)])


def test_the_host_profile_stores_the_factor_and_the_simulator_takes_it(host_store):
    host = hp.HostIdentity("AMD EPYC")
    host_store(host)
    e = hp.HostProfile(base="Xeon-core", model="gemma-3-270m", host=host,
                       constants={"compute_efficiency": 0.3}, alone_factor=1.12,
                       corun_pairs=((4.48, 4.0), (4.4, 4.0)))
    hp.save(e)
    (back,) = hp.load()
    assert back.alone_factor == 1.12 and back.corun_pairs == e.corun_pairs
    local = InstanceConfig(name="cpu-0", gpu="Xeon-core", model="gemma-3-270m",
                           backend={"type": "llama_server", "parallel": 4})
    assert engine_for("cpu-0", local).gpu.cpu_alone_factor == 1.12
    # an entry saved before the factor existed loads with none (1.0), and the stored
    # profiles have none
    old = {k: v for k, v in e.to_json().items() if k not in ("alone_factor", "corun_pairs")}
    assert hp.HostProfile.from_json(old).profile().cpu_alone_factor == 1.0
    assert hardware.gpu("Xeon-core").cpu_alone_factor == 1.0
