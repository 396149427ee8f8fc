"""Coordinator shards as Ray actors on a real local Ray (``scheduler: {shards: 2,
shard_hosts: ray}``): real queries through the demo database, the instances' backends
scripted (no model; built inside each shard's actor from the config), one shard's actor
killed mid-run with ``ray.kill``: it is restarted, the calls it held run again there, and
every query is answered."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'agentflow[ray]')")

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.distributed.shard_actor import RayShard  # noqa: E402
from agentflow.scheduler.shard_router import ShardedRouter  # noqa: E402
from agentflow.server.testing import scripted_instance  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _config() -> AgentFlowConfig:
    slow = {"latency_s": 0.1, "per_token_s": 0.01}  # calls last ~0.2 s: a kill lands mid-call
    instances = [scripted_instance(f"a100-{i}", gpu="A100-80G", **slow) for i in range(2)] + \
        [scripted_instance(f"l40s-{i}", gpu="L40S", **slow) for i in range(2)]
    return AgentFlowConfig.model_validate({
        "fewshot": None, "instances": instances,
        "scheduler": {"shards": 2, "shard_hosts": "ray", "shard_route": "hash"}})


def test_a_killed_shard_actor_is_restarted_and_every_query_is_answered(local_ray) -> None:
    with AgentFlow(_config()) as af:
        router = af.router
        assert isinstance(router, ShardedRouter)
        shards = router.shards
        assert all(isinstance(s, RayShard) for s in shards)
        victim = shards[0]
        assert isinstance(victim, RayShard)
        handles = [af.submit(f"How many stores are there? {i}", db="bookshop")
                   for i in range(10)]
        deadline = time.monotonic() + 60
        while not any(q == 0 for q in router.route.values()):  # shard 0 has a query
            assert time.monotonic() < deadline, "no query reached shard 0"
            time.sleep(0.01)
        time.sleep(0.3)  # its calls are in flight on the actor
        killed_on = {q for q, i in router.route.items() if i == 0}
        victim.kill()
        answers = [h.result(timeout=180) for h in handles]
        assert [a.status for a in answers] == ["done"] * 10, [a.error for a in answers]
        assert victim.restarts == 1 and victim.rerun_calls >= 1
        assert killed_on  # queries of the killed shard were in flight, and are answered
        # the restarted shard serves new queries
        more = [af.submit(f"How many stores are there? again {i}", db="bookshop")
                for i in range(4)]
        assert [h.result(timeout=120).status for h in more] == ["done"] * 4
        assert router.router.routed[0] >= 1 and router.router.routed[1] >= 1


def test_front_ends_of_one_fleet_share_its_named_shard_actors(local_ray) -> None:
    """What two Ray Serve replicas do (``shard_shared``): each front end finds the fleet's
    shard actors by name instead of starting its own, so both front ends' calls land in
    the same coordinators (one queue per shard); the last one to leave stops them."""
    from agentflow.distributed.shard_actor import SHARD_PREFIX
    from tests.utils import wait_until

    data = _config().model_dump(mode="json")
    data["scheduler"]["shard_shared"] = True
    config = AgentFlowConfig.model_validate(data)
    with AgentFlow(config) as a, AgentFlow(config) as b:
        assert a.backends == {} and b.backends == {}  # the instances live in the actors
        for i in range(2):
            sa, sb = a.router.shards[i], b.router.shards[i]
            assert isinstance(sa, RayShard) and isinstance(sb, RayShard)
            assert sa.name == sb.name and sa.front != sb.front
        handles = [af.submit(f"How many stores are there? {i}", db="bookshop")
                   for i in range(4) for af in (a, b)]
        answers = [h.result(timeout=180) for h in handles]
        assert [x.status for x in answers] == ["done"] * 8, [x.error for x in answers]
        calls = {"a": 0, "b": 0}  # each front end's calls, over both shards
        for i in range(2):
            one = ray.get(a.router.shards[i].actor.stats.remote())
            other = ray.get(b.router.shards[i].actor.stats.remote())
            assert one["incarnation"] == other["incarnation"]  # the same actor
            fa, fb = a.router.shards[i].front, b.router.shards[i].front
            assert set(one["fronts"]) == {fa, fb}
            calls["a"] += one["fronts"][fa]
            calls["b"] += one["fronts"][fb]
        assert calls["a"] > 0 and calls["b"] > 0, calls

    def shared_left() -> list[str]:
        return [e["name"] for e in ray.util.list_named_actors(all_namespaces=True)
                if e["name"].startswith(SHARD_PREFIX)]
    wait_until(lambda: not shared_left(), timeout_s=60, what="the shard actors stopped")
