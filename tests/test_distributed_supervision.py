"""The router's side of self-supervising backends (no Ray needed): a backend that reports its
own death (``watch_health``) and says when it is healthy again (``until_healthy``) — the
protocol the Ray actor backend implements. The backend here is the scripted one (not a model)
with those two hooks driven by the test."""

from __future__ import annotations

import asyncio
import time

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig, InstanceConfig, SchedulerConfig
from agentflow.llm.scripted import ScriptedBackend

GOOD = "SELECT count(*) FROM stores"


def script(request):
    return {"extract_keywords": "stores"}.get(request.stage, GOOD)


class SelfSupervised(ScriptedBackend):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.listeners = []
        self.healthy = asyncio.Event()  # set by the test: "the restarted actor answered"
        self.probes = 0

    def watch_health(self, listener):
        self.listeners.append(listener)

    async def until_healthy(self):
        self.probes += 1
        await self.healthy.wait()


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_death_reported_between_calls_takes_the_instance_down_until_it_is_healthy():
    backends = {"ray-a": SelfSupervised(script, latency_s=0.01, name="ray-a"),
                "local": ScriptedBackend(script, latency_s=0.01, name="local")}
    config = AgentFlowConfig(fewshot=None, instances=[InstanceConfig(name=n) for n in backends],
                             scheduler=SchedulerConfig(policy="vllm", revive_after_s=None))
    with AgentFlow(config, backends=backends) as af:
        queue = af.router.coordinator.queues["ray-a"]
        assert len(backends["ray-a"].listeners) == 1  # the router subscribed at start
        af._loop.call_soon_threadsafe(backends["ray-a"].listeners[0], "actor died on node-7")
        _wait(lambda: not queue.up)
        assert af.router.down_reasons["ray-a"] == "actor died on node-7"
        answer = af.ask("How many stores are there?", db="bookshop")
        assert answer.status == "done"
        assert {c["instance"] for s in answer.stages for c in s["llm_calls"]} == {"local"}
        time.sleep(0.2)
        assert not queue.up and backends["ray-a"].probes == 1  # no timer revived it
        af._loop.call_soon_threadsafe(backends["ray-a"].healthy.set)
        _wait(lambda: queue.up)
        assert "ray-a" not in af.router.down_reasons
        answers = [af.ask(f"How many stores are there? {i}", db="bookshop") for i in range(3)]
        assert "ray-a" in {c["instance"] for a in answers for s in a.stages
                           for c in s["llm_calls"]}
