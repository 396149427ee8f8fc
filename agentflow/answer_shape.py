"""Answers whose *shape* already says they do not answer the question.

A tiny model's favourite way out is ``SELECT * FROM <table>``: it always runs, it is never
empty, and three candidates that all write it agree perfectly. None of that is evidence: the
question asked for a name, a count or a date, and a whole table answers nothing. So a
``SELECT *`` answer to a question that asks for something specific is *degenerate*: the
pipelines ask again (another temperature, a grammar without ``*``), the selector does not count
it as a vote, and the confidence score treats it as implausible.

A question that does ask for everything ("Show all information about ...", "list all the
details of ...") may be answered with ``*``; the patterns are in ``_ASKS_FOR_EVERYTHING``.
"""

from __future__ import annotations

import re
from typing import Any

_ASKS_FOR_EVERYTHING = re.compile(
    r"\b(all|every|full|complete|whole)\s+(the\s+)?(information|info|details?|data|columns?|"
    r"attributes?|fields?|records?|rows?)\b|\beverything\b|\ball\s+about\b|"
    r"\b(information|details?|data|records?)\s+(of|for|on|about)\s+(all|every|each)\b",
    re.I)


def asks_for_everything(question: str) -> bool:
    """Whether the question asks for whole rows (so ``SELECT *`` may be right)."""
    return bool(_ASKS_FOR_EVERYTHING.search(question))


def star_projection(sql: str, dialect: str = "sqlite") -> bool:
    """Whether the outermost SELECT (or any SELECT of a UNION) returns ``*`` or ``t.*``:
    ``COUNT(*)`` is not a star projection."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except Exception:  # sqlglot raises several error types; fall back to the text
        return bool(re.match(r"\s*SELECT\s+(DISTINCT\s+)?(\w+\.)?\*", sql, re.I))
    if tree is None:
        return False
    for select in _outer_selects(tree):
        for projection in select.expressions:
            if isinstance(projection, exp.Star) or (
                    isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)):
                return True
    return False


def _outer_selects(node: Any) -> list[Any]:
    """The SELECTs whose columns are the result: the statement, or each operand of a
    UNION/INTERSECT/EXCEPT (not subqueries)."""
    from sqlglot import exp

    if isinstance(node, exp.Select):
        return [node]
    if isinstance(node, exp.SetOperation):
        return _outer_selects(node.left) + _outer_selects(node.right)
    if isinstance(node, exp.Subquery):
        return _outer_selects(node.this)
    return []


def degenerate(question: str, sql: str | None, dialect: str = "sqlite") -> str | None:
    """Why ``sql`` cannot be a considered answer to ``question``, or None."""
    if not sql or asks_for_everything(question) or not star_projection(sql, dialect):
        return None
    return "SELECT * returns whole rows, but the question asks for something specific"


__all__ = ["asks_for_everything", "degenerate", "star_projection"]
