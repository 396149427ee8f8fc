"""Which benchmarks exist, and how ``agentflow bench NAME`` runs one.

A benchmark is a module of a group package (``agentflow/bench/<group>/``) with a top-level
``main(argv)``; the other modules of a group are its helpers. Discovery reads the sources
(``ast``) instead of importing them, so ``agentflow bench --help`` lists every benchmark in
milliseconds even where a benchmark's optional dependencies (httpx, ray, scipy) are missing.

``--quick`` is one flag for every benchmark: a module that defines ``QUICK_ARGS`` gets those
arguments in its place (the user's own arguments come after them, so they win); a module that
parses ``--quick`` itself receives it unchanged.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# In the order ``agentflow bench --help`` lists them.
GROUPS: dict[str, str] = {
    "scheduler": "scheduling policies in the simulator",
    "fidelity": "the simulator against real engines and measured profiles",
    "serving": "a real server on loopback; the local backend",
    "security": "SQL that tries to exhaust time or memory",
    "answers": "execution accuracy, confidence, teaching",
}
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    name: str
    group: str
    summary: str  # its docstring's first line

    @property
    def module(self) -> str:
        return f"agentflow.bench.{self.group}.{self.name}"


class UnknownBenchmark(LookupError):
    """``agentflow bench NAME`` with a NAME no group has."""


@cache
def benchmarks() -> dict[str, Benchmark]:
    """Every benchmark by name, group by group in ``GROUPS`` order, then by name."""
    found: dict[str, Benchmark] = {}
    for group in GROUPS:
        for path in sorted((PACKAGE_DIR / group).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            if path.stem.startswith("_") or not _has_main(tree):
                continue
            doc = ast.get_docstring(tree) or ""
            if path.stem in found:
                raise RuntimeError(f"two benchmarks named {path.stem!r}: "
                                   f"{found[path.stem].group} and {group}")
            found[path.stem] = Benchmark(path.stem, group, _summary(doc))
    return found


def _has_main(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main"
               for node in tree.body)


def _summary(doc: str) -> str:
    """The docstring's first sentence (a question keeps its answer: the next sentence)."""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split()).rstrip(":")
    sentences = re.split(r"(?<=[.?])\s+", paragraph)
    keep = sentences[:2] if sentences[0].endswith("?") else sentences[:1]
    return " ".join(keep)


def find(name: str) -> Benchmark:
    """The benchmark ``name`` (``-`` and ``_`` alike), or UnknownBenchmark naming the close ones."""
    key = name.replace("-", "_")
    found = benchmarks()
    if key in found:
        return found[key]
    import difflib

    close = difflib.get_close_matches(key, list(found), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UnknownBenchmark(f"no benchmark named {name!r}{hint} (agentflow bench --help "
                           "lists them)")


def quick_args(bench: Benchmark) -> tuple[str, ...] | None:
    """What ``--quick`` stands for, or None where the benchmark parses ``--quick`` itself."""
    module = importlib.import_module(bench.module)
    quick = getattr(module, "QUICK_ARGS", None)
    return None if quick is None else tuple(quick)


def expand_quick(bench: Benchmark, argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--quick`` replaced by the benchmark's ``QUICK_ARGS`` (put first, so
    arguments the user gives too win: argparse keeps the last value)."""
    if "--quick" not in argv:
        return list(argv)
    quick = quick_args(bench)
    if quick is None:
        return list(argv)
    return [*quick, *(a for a in argv if a != "--quick")]


def run(name: str, argv: Sequence[str]) -> int:
    """Run benchmark ``name`` with ``argv``; its exit status (``main``'s int, else 0)."""
    bench = find(name)
    module = importlib.import_module(bench.module)
    args = expand_quick(bench, argv)
    wants_help = any(a in ("-h", "--help") for a in args)
    if wants_help and getattr(module, "QUICK_ARGS", None) is not None:
        quick = " ".join(module.QUICK_ARGS) or "(the full run is already short)"
        print(f"--quick (for every benchmark): a short run, the same as: {quick}\n")
    program, sys.argv[0] = sys.argv[0], f"agentflow bench {bench.name}"  # argparse's prog
    try:
        result = module.main(args)
        if inspect.isawaitable(result):  # an async main
            import asyncio

            result = asyncio.run(result)
    finally:
        sys.argv[0] = program
    return int(result or 0)


def listing(width: int = 100) -> str:
    """``agentflow bench --help``'s list: group by group, each benchmark's name and summary."""
    lines = []
    indent = 2 + max(len(n) for n in benchmarks()) + 2
    for group, what in GROUPS.items():
        lines.append(f"{group}: {what}")
        for bench in benchmarks().values():
            if bench.group == group:
                lines.extend(textwrap.wrap(
                    bench.summary.replace("``", ""), width, break_on_hyphens=False,
                    initial_indent=f"  {bench.name:<{indent - 4}}  ",
                    subsequent_indent=" " * indent))
        lines.append("")
    return "\n".join(lines).rstrip()
