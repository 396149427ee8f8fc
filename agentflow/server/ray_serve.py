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

On Kubernetes, a KubeRay ``RayService`` runs a Serve config (``spec.serveConfigV2``) whose
application is named by an import path: ``app_builder`` here is that path (a Serve
*application builder*: Serve calls it with the application's ``args``), and ``agentflow serve
--serve-config FILE`` writes the config for the command line it is given (``serve_config``):
the agentflow config inline, the state store, the replica count.
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


def replica_inputs(config: Any, settings: Any, log_level: str = "info"
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config and settings every Serve replica is built from, as plain data; raises
    ValueError for a deployment Serve replicas cannot make (``placement: ray``, no shared
    state store). ``scheduler: {shard_hosts: ray}`` becomes shared shard actors."""
    if config.placement is not None:
        raise ValueError("--replicas N on Ray runs its own engine in each replica; "
                         "'placement: ray' would start a copy of every instance per replica "
                         "(one shared fleet behind Serve replicas is not built): drop "
                         "placement from the config")
    if not settings.state:
        raise ValueError("Serve replicas must share a state store: --state FILE on one host, "
                         "postgresql://... on many")
    if config.scheduler.shard_hosts == "ray":  # every replica on the same shard actors
        config = config.model_copy(update={"scheduler": config.scheduler.model_copy(
            update={"shard_shared": True})})
    data = settings.model_dump(mode="json")
    data["_log_level"] = log_level
    return config.model_dump(mode="json", exclude_unset=True), data


def app_builder(args: dict[str, Any]) -> Any:
    """A Serve application builder (``import_path: agentflow.server.ray_serve:app_builder``
    in a Serve config or a RayService's ``serveConfigV2``). ``args``:

    * ``config``: the serve config (what ``agentflow serve --config`` reads: agentflow's
      config with a ``server:`` section) inline as a mapping, or the path of that file
      inside the image;
    * ``state``: the state store (``postgresql://...`` across pods), else ``server.state``;
    * ``replicas`` (default 1), ``num_cpus`` per replica (1), ``log_level`` ("info").

    Checked as ``agentflow serve --ray --replicas N`` checks its command line."""
    config, settings, replicas, num_cpus = builder_inputs(args)
    return build(config, settings, replicas, num_cpus=num_cpus)


def builder_inputs(args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], int, float]:
    """What ``app_builder`` builds the replicas from: (config, settings, replicas, num_cpus),
    as ``replica_inputs`` gives them to ``agentflow serve --ray``; no Ray needed."""
    from agentflow.config import AgentFlowConfig
    from agentflow.server.settings import ServerSettings, load_serve_config

    given = args.get("config")
    if isinstance(given, str):
        config, settings = load_serve_config(given)
    else:
        data = dict(given or {})
        settings = ServerSettings.model_validate(data.pop("server", None) or {})
        config = AgentFlowConfig.model_validate(data)
    if args.get("state"):
        settings.state = str(args["state"])
    replicas = int(args.get("replicas", 1))
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    config_data, settings_data = replica_inputs(config, settings,
                                                str(args.get("log_level", "info")))
    return config_data, settings_data, replicas, float(args.get("num_cpus", 1.0))


def serve_config(config: Any, settings: Any, replicas: int, *, host: str = "0.0.0.0",
                 port: int = 8000, log_level: str = "info", num_cpus: float = 1.0,
                 pythonpath: str | None = None) -> dict[str, Any]:
    """A Serve config (``serve deploy FILE``, or a RayService's ``serveConfigV2``) that
    runs ``replicas`` agentflow replicas through ``app_builder``: the agentflow config
    inline (nothing to mount), checked here as the builder will check it."""
    replica_inputs(config, settings, log_level)  # fails here, not in the cluster
    server = settings.model_dump(mode="json", exclude_unset=True)
    server["state"] = settings.state
    inline = {**config.model_dump(mode="json", exclude_unset=True), "server": server}
    app: dict[str, Any] = {
        "name": APP_NAME, "route_prefix": "/",
        "import_path": "agentflow.server.ray_serve:app_builder",
        "args": {"config": inline, "replicas": replicas, "num_cpus": num_cpus,
                 "log_level": log_level}}
    if pythonpath:
        app["runtime_env"] = {"env_vars": {"PYTHONPATH": pythonpath}}
    return {"proxy_location": "EveryNode", "http_options": {"host": host, "port": port},
            "applications": [app]}


def serve_on_ray(address: str, config: Any, settings: Any, replicas: int, *, host: str,
                 port: int, log_level: str = "info") -> int:
    """``agentflow serve --ray ADDRESS --replicas N``: deploy, then wait for SIGINT or
    SIGTERM and take the deployment down."""
    import os

    try:
        config_data, data = replica_inputs(config, settings, log_level)
    except ValueError as err:
        print(f"agentflow: error: {err}", file=sys.stderr, flush=True)
        return 2
    env = {"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}} \
        if os.environ.get("PYTHONPATH") else None
    deploy(address, config_data, data, replicas, host=host, port=port, runtime_env=env)
    log.info("agentflow on Ray Serve: %d replicas at http://%s:%d/ (cluster %s)",
             replicas, host, port, address)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("taking the Serve deployment down (replicas drain)")
    undeploy()
    return 0
