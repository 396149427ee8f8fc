"""Turning model output into one SQL statement, and results into comparable keys."""

from __future__ import annotations

import re
from typing import Any

_FENCE = re.compile(r"```(?:sql|sqlite)?\s*(.*?)(?:```|$)", re.S | re.I)
_START = re.compile(r"\b(SELECT|WITH)\b", re.I)


def extract_sql(text: str) -> str:
    """The first SQL statement in ``text``: code fences removed, cut at ``;`` or a blank line,
    trailing ``--`` comments dropped. Returns "" when there is no SELECT/WITH at all."""
    fenced = _FENCE.search(text)
    if fenced and _START.search(fenced.group(1)):
        text = fenced.group(1)
    match = _START.search(text)
    if not match:
        return ""
    body = text[match.start():]
    body = re.split(r";|\n\s*\n", body, maxsplit=1)[0]
    lines = []
    for line in body.splitlines():
        stripped = line.strip()
        if stripped.startswith("--") or stripped.startswith("#"):
            break
        lines.append(line.split(" --")[0].rstrip())
    return " ".join(" ".join(lines).split())


def result_key(rows: list[tuple], order_matters: bool = False) -> tuple:
    """A hashable key equal for results that hold the same rows (as multisets unless order
    matters): how candidates are clustered by what they return."""
    normalised = [tuple(_norm(v) for v in row) for row in rows]
    if not order_matters:
        normalised = sorted(normalised, key=repr)
    return tuple(normalised)


def _norm(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    return value


def preview(rows: list[tuple], columns: list[str], limit: int = 5) -> str:
    """A few rows as compact text for prompts (execution feedback, unit-test judging)."""
    head = " | ".join(columns)
    body = [" | ".join(_cell(v) for v in row) for row in rows[:limit]]
    more = [f"... ({len(rows)} rows)"] if len(rows) > limit else []
    return "\n".join([head, *body, *more])


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    return text if len(text) <= 40 else text[:39] + "…"
