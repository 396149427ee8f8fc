"""``agentflow serve`` (and ``python serve.py``): agentflow as an HTTP service.

With no options it serves the embedded default (the local CPU model) and the demo database
(``bookshop``) on http://127.0.0.1:8000 — the web page is at ``/``, the API docs at
``/docs``. ``--config`` points it at a real cluster; ``--data`` adds Spider/BIRD databases.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys

from agentflow.cli import apply_database_options, missing_extra

log = logging.getLogger("agentflow.server")

DESCRIPTION = ("With no options it serves the embedded default (the local CPU model) and the "
               "demo database (bookshop) on http://127.0.0.1:8000: the web page is at /, the "
               "API docs at /docs. --config points it at a real cluster; --data adds "
               "Spider/BIRD databases.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--config", default=None,
                   help="YAML/JSON config: instances (vLLM / OpenAI-compatible / local), "
                        "pipeline, scheduler, and an optional 'server:' section (api_keys, "
                        "drain_s, ...)")
    p.add_argument("--data", action="append", default=[],
                   help="a Spider/BIRD folder whose databases to serve (repeatable)")
    p.add_argument("--engine", choices=["sqlite", "duckdb"], default=None,
                   help="open databases with SQLite (default) or their DuckDB copies")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run every instance as a Ray actor placed by its GPU type, on the "
                        "cluster at ADDRESS (auto, HOST:6379, ray://HOST:10001, or 'local'); "
                        "the same as 'placement: ray' in the config (needs agentflow[ray])")
    p.add_argument("--state", default=None, metavar="URL",
                   help="where queries, conversations and tenant usage live: a SQLite file "
                        "(default <cache>/server-state.sqlite), postgresql://... for replicas "
                        "on many hosts, or 'off' (this process only); also server.state or "
                        "AGENTFLOW_STATE")
    p.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="run N server processes on the port (SO_REUSEPORT), sharing the "
                        "state store: any replica answers for any query, limits hold across "
                        "them, a replica that dies has its queries moved to another; with "
                        "--ray, N Ray Serve replicas on that cluster (needs "
                        "agentflow[serve])")
    p.add_argument("--serve-config", default=None, metavar="FILE",
                   help="write a Ray Serve config for this command line to FILE ('-': "
                        "stdout) and exit: --replicas N Serve replicas built by "
                        "agentflow.server.ray_serve:app_builder, the config inline; for "
                        "'serve deploy FILE' or a KubeRay RayService's serveConfigV2 (needs "
                        "--state or server.state: postgresql://... across pods)")
    p.add_argument("--replica-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--scheduler-socket", default=None, help=argparse.SUPPRESS)
    p.add_argument("--scheduler-per-replica", action="store_true",
                   help="with --replicas N on one host: each replica runs its own "
                        "coordinator over its own connections to the instances (N queues, "
                        "N times each instance's max_inflight) instead of all submitting "
                        "to one scheduler process")
    p.add_argument("--drain", type=float, default=None, metavar="SECONDS",
                   help="on shutdown, let queries in flight finish for this long before "
                        "cancelling them (default 10)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level (default info)")
    p.add_argument("--no-access-log", action="store_true",
                   help="do not log requests (the web page's polling is never logged)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="show llama.cpp's own log lines (hidden by default)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve agentflow over HTTP (API, metrics, web page)",
                       description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=cmd_serve)


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be served, checked before the model loads (None when free)."""
    import socket

    if not 0 < port < 65536:
        return f"--port must be between 1 and 65535, got {port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        return f"cannot listen on {host!r}: {err.strerror}"
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return (f"port {port} on {host} is already in use (another server?); pick "
                        f"another with --port")
            return f"cannot listen on {host}:{port}: {err.strerror}"
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from agentflow.server import create_app, load_serve_config, run
        from agentflow.server.logs import configure
    except ImportError as err:
        return missing_extra("the server", "server", err)
    from agentflow.catalog import DatabaseCatalog
    from agentflow.llm.llama_logging import quiet_llama

    configure(args.log_level)
    quiet_llama(not args.verbose)
    config, settings = load_serve_config(args.config)
    apply_database_options(config, args)
    on_serve = bool(args.ray) and args.replicas > 1  # a Ray Serve deployment
    if args.ray and not on_serve:
        from agentflow.distributed.placement import RayPlacement

        base = config.placement or RayPlacement()
        config.placement = base.model_copy(update={"address": args.ray})
    if config.placement is not None or on_serve:
        from agentflow.distributed import require_ray

        try:
            require_ray()
        except ImportError as err:
            print(f"agentflow: error: {err}", file=sys.stderr)
            return 2
        if on_serve:
            try:
                import ray.serve  # noqa: F401
            except ImportError as err:
                return missing_extra("--replicas N with --ray (Ray Serve)", "serve", err)
    if args.drain is not None:
        settings.drain_s = args.drain
    if args.serve_config:
        return _write_serve_config(args, config, settings)
    from agentflow.server.settings import resolve_state

    settings.state = resolve_state(args.state, settings.state, args.port)
    replica = args.replica_index is not None  # one of --replicas N, started by the supervisor
    if args.replicas < 1:
        print(f"agentflow: error: --replicas must be at least 1, got {args.replicas}",
              file=sys.stderr)
        return 2
    if args.replicas > 1 and settings.state is None:
        print("agentflow: error: --replicas needs a state store the replicas share "
              "(--state FILE or postgresql://...), not --state off", file=sys.stderr)
        return 2
    # Everything that can fail without the model fails first, in a second.
    problem = None if replica else port_problem(args.host, args.port)
    if problem:
        print(f"agentflow: error: {problem}", file=sys.stderr)
        return 2
    DatabaseCatalog.from_config(config).close()  # bad --data folders
    if on_serve:
        from agentflow.server.ray_serve import serve_on_ray

        return serve_on_ray(args.ray, config, settings, args.replicas, host=args.host,
                            port=args.port, log_level=args.log_level)
    if args.replicas > 1:
        from agentflow.server.supervisor import Supervisor, replica_command

        assert settings.state is not None
        log.info("starting %d replicas on %s:%d, state in %s", args.replicas, args.host,
                 args.port, redacted(settings.state))
        if args.scheduler_per_replica:
            return Supervisor(replica_command(args, settings.state), args.replicas).run()
        if config.placement is not None:
            print("agentflow: error: --replicas N shares one scheduler process, which reaches "
                  "the instances through their backends; 'placement: ray' is not supported "
                  "with it (drop placement, or --scheduler-per-replica)", file=sys.stderr)
            return 2
        return _with_shared_scheduler(args, config, settings.state)
    if args.scheduler_socket:  # a replica: its calls go to the supervisor's scheduler
        config.scheduler = config.scheduler.model_copy(update={
            "shard_hosts": "socket", "shard_socket": args.scheduler_socket})
    log.info("starting %d instance(s) (%s); pipeline %s", len(config.instances),
             ", ".join(i.label for i in config.instances), config.pipeline)
    app = create_app(config, settings)
    service = app.state.service
    if settings.keys():
        log.info("API keys required (%d configured)", len(settings.keys()))
    if service.replica is not None:
        log.info("state in %s (replica %s)", redacted(settings.state), service.replica.id)
    ids = service.af.catalog.ids
    log.info("serving %s", databases_line(ids))
    log.info("web page http://%s:%d/ · API docs http://%s:%d/docs", args.host, args.port,
             args.host, args.port)
    sockets = None
    if replica:
        from agentflow.server.supervisor import reuse_port_socket

        sockets = [reuse_port_socket(args.host, args.port)]
    try:
        run(app, args.host, args.port, log_level=args.log_level,
            access_log=not args.no_access_log, sockets=sockets)
    finally:
        service.close()  # if uvicorn never started (port taken), still release the engine
    return 0


def _write_serve_config(args: argparse.Namespace, config, settings) -> int:
    """``--serve-config FILE``: the Serve config of ``--replicas N`` replicas; nothing runs
    (the state store must be named: a default file in this machine's cache would be no
    store the pods share)."""
    import yaml

    from agentflow.server.ray_serve import serve_config
    from agentflow.server.settings import resolve_state

    settings.state = resolve_state(args.state, settings.state, default_file=False)
    host = args.host if args.host != "127.0.0.1" else "0.0.0.0"  # the pods' proxies
    try:
        data = serve_config(config, settings, args.replicas, host=host, port=args.port,
                            log_level=args.log_level)
    except ValueError as err:
        print(f"agentflow: error: {err}", file=sys.stderr)
        return 2
    text = yaml.safe_dump(data, sort_keys=False)
    if args.serve_config == "-":
        sys.stdout.write(text)
    else:
        from pathlib import Path

        Path(args.serve_config).write_text(text)
        log.info("wrote a Serve config for %d replicas to %s", args.replicas,
                 args.serve_config)
    return 0


def _with_shared_scheduler(args: argparse.Namespace, config, state: str) -> int:
    """Run the replicas and one scheduler process they all submit to, its socket and config
    in a private directory removed afterwards."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from agentflow.server.supervisor import Supervisor, replica_command

    folder = Path(tempfile.mkdtemp(prefix="agentflow-scheduler-"))  # mode 0700
    try:
        (folder / "config.json").write_text(json.dumps(config.model_dump(mode="json")))
        sock = str(folder / "scheduler.sock")
        scheduler = [sys.executable, "-m", "agentflow.distributed.shard_socket", "--config",
                     str(folder / "config.json"), "--socket", sock,
                     "--log-level", args.log_level]
        return Supervisor(replica_command(args, state), args.replicas, scheduler=scheduler,
                          scheduler_socket=sock).run()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def redacted(url: str | None) -> str:
    """A store URL for the log, without its password."""
    import re

    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url or "")


def databases_line(ids: list[str], shown: int = 8) -> str:
    """The databases for one log line: the demo first, at most ``shown`` names (a Spider
    folder adds 135, which no one reads on one line)."""
    ordered = sorted(ids, key=lambda i: (i != "bookshop", i))
    names = ", ".join(ordered[:shown])
    more = (f" and {len(ids) - shown} more (GET /v1/databases lists them)"
            if len(ids) > shown else "")
    return f"{len(ids)} database{'' if len(ids) == 1 else 's'}: {names}{more}"


def main(argv: list[str] | None = None) -> int:
    """``python serve.py [options]``: the same as ``agentflow serve``."""
    parser = argparse.ArgumentParser(prog="serve.py", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_serve(args)
    except (FileNotFoundError, LookupError, ValueError) as err:
        message = err.args[0] if isinstance(err, LookupError) and err.args else err
        print(f"agentflow: error: {message}", file=sys.stderr)
        return 2
