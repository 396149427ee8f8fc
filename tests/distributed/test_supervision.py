"""The router's side of a backend that watches its own process (no Ray needed): a death it
reports between calls (``watch_health``) takes the instance out at once, and the instance is
back only once the router's probe call is answered — the protocol the Ray actor backend
uses. The backend is the scripted one (not a model), with the death and the restart driven
by the test."""

from __future__ import annotations

import time

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig, InstanceConfig, SchedulerConfig
from agentflow.llm.base import BackendError
from agentflow.llm.scripted import ScriptedBackend

GOOD = "SELECT count(*) FROM stores"


def script(request):
    return {"extract_keywords": "stores"}.get(request.stage, GOOD)


class Watched(ScriptedBackend):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.listeners = []
        self.alive = True  # False: "restarting", every call (probes too) fails
        self.refused_probes = 0

    def watch_health(self, listener):
        self.listeners.append(listener)

    async def generate(self, request, on_progress=None):
        if not self.alive:
            self.refused_probes += request.stage == "probe"
            raise BackendError(f"{self.name}: actor unavailable", retryable=True)
        return await super().generate(request, on_progress)


def _wait(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_death_reported_between_calls_takes_the_instance_out_until_a_probe_answers():
    backends = {"ray-a": Watched(script, latency_s=0.01, name="ray-a"),
                "local": ScriptedBackend(script, latency_s=0.01, name="local")}
    config = AgentFlowConfig(
        fewshot=None, instances=[InstanceConfig(name=n) for n in backends],
        scheduler=SchedulerConfig(policy="vllm", revive_after_s=0.5,
                                  health={"probe_after_s": 0.1}))
    with AgentFlow(config, backends=backends) as af:
        queue = af.router.coordinator.queues["ray-a"]
        assert len(backends["ray-a"].listeners) == 1  # the router subscribed at start
        backends["ray-a"].alive = False
        af._loop.call_soon_threadsafe(backends["ray-a"].listeners[0], "actor died on node-7")
        _wait(lambda: not queue.up)
        assert "actor died on node-7" in af.router.down_reasons["ray-a"]
        answer = af.ask("How many stores are there?", db="bookshop")
        assert answer.status == "done"
        assert {c["instance"] for s in answer.stages for c in s["llm_calls"]} == {"local"}
        _wait(lambda: backends["ray-a"].refused_probes >= 1)  # a probe went out, failed ...
        assert not queue.up  # ... and the instance stays out
        backends["ray-a"].alive = True  # "Ray restarted the actor"
        _wait(lambda: queue.up)
        assert "ray-a" not in af.router.down_reasons
        answers = [af.ask(f"How many stores are there? {i}", db="bookshop") for i in range(3)]
        assert "ray-a" in {c["instance"] for a in answers for s in a.stages
                           for c in s["llm_calls"]}
