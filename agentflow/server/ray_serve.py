"""``agentflow serve --ray ADDRESS --replicas N``: the server as a Ray Serve deployment.

Why Ray Serve: one host's ``--replicas N`` (SO_REUSEPORT) stops at that host's cores; on a
Ray cluster, Serve places N replicas across the nodes, routes HTTP to them through its
proxy, restarts one that dies or fails its health check, and scales with one number.
Each replica is the same FastAPI app ``agentflow serve`` runs (``create_app``), built in
the replica's process from the config and settings; what the replicas must agree on lives
in the state store (queries, events, answers, conversations, limits, taught pairs), which
for replicas on several hosts is PostgreSQL (``--state postgresql://...``). Any replica
then answers for any query, and a replica that dies has its queries moved to another
(``agentflow.server.replica``).

The scheduler: with ``scheduler: {shard_hosts: ray}`` in the config every replica submits
its calls to the same coordinator shard actors, found by the fleet's name
(``scheduler.shard_shared``, set here; ``agentflow.distributed.shard_actor``); otherwise each
replica runs its own coordinator over its own connections to the instances. ``placement:
ray`` (instances as Ray actors) is refused here, as every replica would start its own copy
of every instance.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

log = logging.getLogger("agentflow.server")

APP_NAME = "agentflow"


class AgentFlowReplica:
    """One Serve replica: the agentflow app built from plain config data (what Ray ships
    to the replica's process)."""

    def __init__(self, config: dict[str, Any], settings: dict[str, Any]):
        from agentflow.config import AgentFlowConfig
        from agentflow.server import create_app
        from agentflow.server.logs import configure
        from agentflow.server.settings import ServerSettings

        configure(settings.pop("_log_level", "info"))
        self._app = create_app(AgentFlowConfig.model_validate(config),
                              ServerSettings.model_validate(settings))
        self.service = self._app.state.service

    def __serve_build_asgi_app__(self) -> Any:
        return self._app

    def check_health(self) -> None:
        """Serve's per-replica probe (every ``health_check_period_s``): a replica whose
        engine loop stopped is restarted (the same test as ``/livez``)."""
        if not self.service.alive():
            raise RuntimeError("the engine loop has stopped")

    def replica_id(self) -> str:
        replica = self.service.replica
        return replica.id if replica is not None else ""


def build(config: dict[str, Any], settings: dict[str, Any], replicas: int, *,
          num_cpus: float = 1.0, health_period_s: float = 10.0) -> Any:
    """The Serve application: ``replicas`` copies of ``AgentFlowReplica``."""
    from ray import serve

    ingress = serve.ingress()(AgentFlowReplica)
    deployment = serve.deployment(
        ingress, name="agentflow", num_replicas=replicas,
        ray_actor_options={"num_cpus": num_cpus},
        health_check_period_s=health_period_s, max_ongoing_requests=1000,
        graceful_shutdown_timeout_s=max(5.0, float(settings.get("drain_s", 10)) + 5))
    return deployment.bind(config, settings)  # type: ignore[attr-defined]


def deploy(address: str, config: dict[str, Any], settings: dict[str, Any], replicas: int,
           *, host: str, port: int, num_cpus: float = 1.0,
           runtime_env: dict[str, Any] | None = None) -> None:
    """Connect to the cluster at ``address`` ('local' starts one here) and run the app on
    Serve's proxy at ``host:port``; returns once every replica is up."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"namespace": "agentflow", "runtime_env": runtime_env,
                                  "log_to_driver": False}
        if address == "local":
            ray.init(**kwargs)
        else:
            ray.init(address=address, **kwargs)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build(config, settings, replicas, num_cpus=num_cpus), name=APP_NAME,
              route_prefix="/", blocking=False)


def undeploy() -> None:
    """Delete the app (each replica drains: its lifespan closes the service) and stop
    Serve."""
    import ray
    from ray import serve

    from agentflow.distributed.shard_actor import kill_shared_shards

    try:
        serve.delete(APP_NAME)
    finally:
        serve.shutdown()
        kill_shared_shards(ray)  # detached: a replica killed outright never let go of them


def serve_on_ray(address: str, config: Any, settings: Any, replicas: int, *, host: str,
                 port: int, log_level: str = "info") -> int:
    """``agentflow serve --ray ADDRESS --replicas N``: deploy, then wait for SIGINT or
    SIGTERM and take the deployment down."""
    import os

    if config.placement is not None:
        print("agentflow: error: --replicas N on Ray runs its own engine in each replica; "
              "'placement: ray' would start a copy of every instance per replica (one "
              "shared fleet behind Serve replicas is not built): drop placement from the "
              "config", file=sys.stderr, flush=True)
        return 2
    if not settings.state:
        print("agentflow: error: Serve replicas must share a state store: --state FILE on "
              "one host, postgresql://... on many", file=sys.stderr, flush=True)
        return 2
    if config.scheduler.shard_hosts == "ray":  # every replica on the same shard actors
        config.scheduler = config.scheduler.model_copy(update={"shard_shared": True})
    data = settings.model_dump(mode="json")
    data["_log_level"] = log_level
    env = {"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}} \
        if os.environ.get("PYTHONPATH") else None
    deploy(address, config.model_dump(mode="json", exclude_unset=True), data, replicas,
           host=host, port=port, runtime_env=env)
    log.info("agentflow on Ray Serve: %d replicas at http://%s:%d/ (cluster %s)",
             replicas, host, port, address)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("taking the Serve deployment down (replicas drain)")
    undeploy()
    return 0
