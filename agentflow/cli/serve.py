"""``agentflow serve`` (and ``python serve.py``): agentflow as an HTTP service.

With no options it serves the embedded default (the local CPU model) and the demo database
(``bookshop``) on http://127.0.0.1:8000 — the web page is at ``/``, the API docs at
``/docs``. ``--config`` points it at a real cluster; ``--data`` adds Spider/BIRD databases.
"""

from __future__ import annotations

import argparse
import logging
import sys


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
    p.add_argument("--engine", choices=["sqlite", "duckdb"], default=None)
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run every instance as a Ray actor placed by its GPU type, on the "
                        "cluster at ADDRESS (auto, HOST:6379, ray://HOST:10001, or 'local'); "
                        "the same as 'placement: ray' in the config (needs agentflow[ray])")
    p.add_argument("--drain", type=float, default=None, metavar="SECONDS",
                   help="on shutdown, let queries in flight finish for this long before "
                        "cancelling them (default 10)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--no-access-log", action="store_true", help="do not log every request")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve agentflow over HTTP (API, metrics, web page)",
                       description=__doc__.split("\n\n")[1])
    add_arguments(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from agentflow.server import create_app, load_serve_config, run
    except ImportError as err:
        print(f"agentflow: error: the server needs the 'server' extra ({err.name} is "
              f"missing): pip install 'agentflow[server]'", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, settings = load_serve_config(args.config)
    config.data = [*config.data, *args.data]
    if args.engine:
        config.engine = args.engine
    if args.ray:
        from agentflow.distributed.placement import RayPlacement

        base = config.placement or RayPlacement()
        config.placement = base.model_copy(update={"address": args.ray})
    if config.placement is not None:
        from agentflow.distributed import require_ray

        try:
            require_ray()
        except ImportError as err:
            print(f"agentflow: error: {err}", file=sys.stderr)
            return 2
    if args.drain is not None:
        settings.drain_s = args.drain
    print(f"agentflow: starting {len(config.instances)} instance(s) "
          f"({', '.join(i.name for i in config.instances)}); pipeline {config.pipeline}",
          file=sys.stderr)
    app = create_app(config, settings)
    service = app.state.service
    if settings.keys():
        print(f"agentflow: API keys required ({len(settings.keys())} configured)",
              file=sys.stderr)
    print(f"agentflow: serving {', '.join(service.af.catalog.ids[:5])}"
          f"{' ...' if len(service.af.catalog.ids) > 5 else ''} on "
          f"http://{args.host}:{args.port}/ (API docs at /docs)", file=sys.stderr)
    try:
        run(app, args.host, args.port, log_level=args.log_level,
            access_log=not args.no_access_log)
    finally:
        service.close()  # if uvicorn never started (port taken), still release the engine
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python serve.py [options]``: the same as ``agentflow serve``."""
    parser = argparse.ArgumentParser(prog="serve.py", description=__doc__.split("\n\n")[1])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_serve(args)
    except (FileNotFoundError, LookupError, ValueError) as err:
        message = err.args[0] if isinstance(err, LookupError) and err.args else err
        print(f"agentflow: error: {message}", file=sys.stderr)
        return 2
