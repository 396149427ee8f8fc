"""The ``agentflow`` command line."""

from rich.console import Console


def table_console(width: int = 160) -> Console:
    """Stdout console for wide tables: a terminal keeps its own width; files and pipes get
    ``width`` columns instead of rich's 80, so tables are not folded into unreadable cells."""
    console = Console()
    return console if console.is_terminal else Console(width=width)
