"""The ``agentflow`` command line."""

import sys
from typing import Any

from rich.console import Console


def table_console(width: int = 160) -> Console:
    """Stdout console for wide tables: a terminal keeps its own width; files and pipes get
    ``width`` columns instead of rich's 80, so tables are not folded into unreadable cells."""
    console = Console()
    return console if console.is_terminal else Console(width=width)


def apply_database_options(config: Any, args: Any) -> None:
    """``--data`` folders add to the config's; ``--engine`` overrides its engine."""
    config.data = [*config.data, *args.data]
    if args.engine:
        config.engine = args.engine


def missing_extra(what: str, extra: str, err: ImportError) -> int:
    """Say which extra to install for a command whose imports failed; the exit status."""
    print(f"agentflow: error: {what} needs the '{extra}' extra ({err.name} is missing): "
          f"pip install 'agentflow[{extra}]'", file=sys.stderr)
    return 2
