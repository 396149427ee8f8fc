"""``agentflow bench NAME [ARGS]``: run one of the benchmarks of ``agentflow.bench``."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from agentflow.bench.registry import listing

    p = sub.add_parser(
        "bench", help="run a benchmark (agentflow bench --help lists them)",
        description="Run one benchmark: every benchmark takes --help, and --quick for a short "
                    "run; each ends with a line of its figures. Benchmarks print ratios "
                    "measured side by side, not timed assertions.",
        epilog=listing(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", metavar="NAME", help="the benchmark (listed below)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the benchmark's own arguments (agentflow bench NAME --help)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from agentflow.bench.registry import run

    try:
        return run(args.name, args.args)
    except ImportError as err:
        # a benchmark's optional dependency: name the extra that brings it
        extra = _EXTRA_OF.get((err.name or "").split(".")[0], "bench")
        print(f"agentflow: error: benchmark {args.name!r} needs {err.name}, which is not "
              f"installed: pip install 'agentflow[{extra}]'", file=sys.stderr)
        return 2


# The modules the benchmarks import beyond the core, and the extra of pyproject.toml that
# declares each.
_EXTRA_OF = {"scipy": "bench", "httpx": "bench", "fastapi": "server", "uvicorn": "server",
             "prometheus_client": "server", "llama_cpp": "local", "ray": "ray",
             "psycopg": "postgres", "mcp": "mcp"}
