"""Entry point of the ``agentflow`` console script: one subcommand group per capability."""

from __future__ import annotations

import argparse
import sys

from agentflow import __version__
from agentflow.cli import ask as ask_cli
from agentflow.cli import bench as bench_cli
from agentflow.cli import calibrate as calibrate_cli
from agentflow.cli import datasets as datasets_cli
from agentflow.cli import evaluate as evaluate_cli
from agentflow.cli import mcp as mcp_cli
from agentflow.cli import serve as serve_cli
from agentflow.cli import simulate as simulate_cli
from agentflow.cli import teach as teach_cli
from agentflow.errors import AgentflowError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentflow",
        description="Serve agentic Text-to-SQL pipelines on heterogeneous GPU clusters.")
    parser.add_argument("--version", action="version", version=f"agentflow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    ask_cli.register(sub)
    bench_cli.register(sub)
    calibrate_cli.register(sub)
    datasets_cli.register(sub)
    evaluate_cli.register(sub)
    mcp_cli.register(sub)
    serve_cli.register(sub)
    simulate_cli.register(sub)
    teach_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (FileNotFoundError, LookupError, ValueError, AgentflowError) as err:
        # Errors a user can fix (bad path, unknown database, bad option): one clear line.
        message = err.args[0] if isinstance(err, LookupError) and err.args else err
        print(f"agentflow: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
