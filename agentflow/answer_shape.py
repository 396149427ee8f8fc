"""Answers whose *shape* already says they do not answer the question.

A tiny model's favourite way out is ``SELECT * FROM <table>``: it always runs, it is never
empty, and three candidates that all write it agree perfectly. None of that is evidence: the
question asked for a name, a count or a date, and a whole table answers nothing. So a
``SELECT *`` answer to a question that asks for something specific is *degenerate*: the
pipelines ask again (another temperature, a grammar without ``*``), the selector does not count
it as a vote, and the confidence score treats it as implausible.

A question that does ask for everything ("Show all information about ...", "list all the
details of ...") may be answered with ``*``; the patterns are in ``_ASKS_FOR_EVERYTHING``.

The pipelines ask about the same candidate several times per query (whether to retry it, its
cluster's votes, the confidence assessment: ~10 calls for a CHESS query), and each call used
to parse the SQL again: a fifth of a replica's engine-loop CPU on scripted backends
(``agentflow bench replicas_load --profile``). The verdict depends on the text and dialect
alone, so it is kept (``_VERDICTS``, bounded); and the SQL guard, which has just parsed the
same text to run it, hands its verdict on (``record_tree``), so a candidate that ran is not
parsed here at all.
"""

from __future__ import annotations

import re
from typing import Any

from agentflow.text_memo import TextMemo

# (sql, dialect) -> star_projection's verdict. Texts longer than _KEEP_CHARS are not kept (so
# the memo holds at most ~20 MB of text); the guard records from database threads, the loop reads.
_KEEP_CHARS = 10_000
_VERDICTS: TextMemo[tuple[str, str | None], bool] = TextMemo(
    keep=2048, keep_chars=_KEEP_CHARS, text_of=lambda key: key[0])

_ASKS_FOR_EVERYTHING = re.compile(
    r"\b(all|every|full|complete|whole)\s+(the\s+)?(information|info|details?|data|columns?|"
    r"attributes?|fields?|records?|rows?)\b|\beverything\b|\ball\s+about\b|"
    r"\b(information|details?|data|records?)\s+(of|for|on|about)\s+(all|every|each)\b",
    re.I)


def asks_for_everything(question: str) -> bool:
    """Whether the question asks for whole rows (so ``SELECT *`` may be right)."""
    return bool(_ASKS_FOR_EVERYTHING.search(question))


def star_projection(sql: str, dialect: str | None = "sqlite") -> bool:
    """Whether the outermost SELECT (or any SELECT of a UNION) returns ``*`` or ``t.*``:
    ``COUNT(*)`` is not a star projection."""
    key = (sql, dialect)
    kept = _VERDICTS.get(key)
    if kept is not None:
        return kept
    verdict = _parse_and_judge(sql, dialect)
    _VERDICTS.put(key, verdict)
    return verdict


def record_tree(sql: str, dialect: str | None, statements: list[Any]) -> None:
    """The SQL guard's parse of ``sql`` (every statement its parser returned, before any is
    dropped or the tree is changed): keep the verdict it gives, so that ``star_projection``
    need not parse the text again. Only a parse that is exactly what ``sqlglot.parse_one``
    would return (one statement) is used: ``SELECT * FROM t; -- note`` parses to a
    ``Block`` there, which is not a star projection, and the verdict must not depend on
    who parsed first."""
    key = (sql, dialect)
    if len(statements) == 1 and statements[0] is not None and _VERDICTS.keeps(key):
        _VERDICTS.put(key, _judge(statements[0]))


def known(sql: str, dialect: str | None) -> bool | None:
    """The verdict kept for ``sql``, or None (never judged, or forgotten since)."""
    return _VERDICTS.peek((sql, dialect))


def remember(sql: str, dialect: str | None, verdict: bool) -> None:
    """Keep a verdict given earlier (a statement the database remembers having checked
    hands its verdict on again, which this memo may have dropped meanwhile)."""
    _VERDICTS.put((sql, dialect), verdict)


def _parse_and_judge(sql: str, dialect: str | None) -> bool:
    import sqlglot

    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except Exception:  # sqlglot raises several error types; fall back to the text
        return bool(re.match(r"\s*SELECT\s+(DISTINCT\s+)?(\w+\.)?\*", sql, re.I))
    if tree is None:
        return False
    return _judge(tree)


def _judge(tree: Any) -> bool:
    from sqlglot import exp

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


__all__ = ["asks_for_everything", "degenerate", "known", "record_tree", "remember",
           "star_projection"]
