"""Width and precision caps for every formatting function, checked before a query runs.

A format string is a size argument in disguise: ``printf('%0999999999d', 1)`` and
``format('{:>999999999}', 1)`` build a 1 GB value (DuckDB: 38 s and 2 GB, outside its memory
limit), and SQLite's ``printf('%.*c', 1000000000, 'x')`` spins 15 s in one VM step that no
interrupt reaches. No engine limit sees these in time, so the guard reads the format itself:
every width, precision or position written in a conversion must be at most
``MAX_FORMAT_WIDTH``, a ``*`` (width taken from an argument) needs that argument to be a
literal within the cap, and the format string must be a literal — a format computed at run
time could say anything. The rule is per *style*, not per function, so it holds for every
function of that style: C ``printf`` style (SQLite ``printf``/``format``, DuckDB ``printf``,
PostgreSQL ``format``) and Python/fmt style (DuckDB ``format``).
"""

from __future__ import annotations

import re

from sqlglot import exp

# Widest field a formatting function may pad to: far above any report column or zero-padded
# id, far below a value that takes noticeable time or memory to build.
MAX_FORMAT_WIDTH = 1000

# One C-style conversion: %[pos$][flags][width|*[pos$]][.precision|.*[pos$]][length]type.
_C_SPEC = re.compile(r"%(?P<spec>[^a-zA-Z%]*)(?P<type>[a-zA-Z%]|$)")
_NUMBER = re.compile(r"\d+")

# Which style each dialect's formatting functions use (normalised names).
_STYLES: dict[str, dict[str, str]] = {
    "sqlite": {"printf": "c", "format": "c"},
    "duckdb": {"printf": "c", "format": "fmt"},
    "postgres": {"format": "c"},
}
_ANY_STYLE = {"printf": "c", "format": "c"}


def format_problem(name: str, node: exp.Func, dialect: str | None) -> str | None:
    """Why the call ``name(...)`` may not run, or None when its format is within the caps."""
    style = _STYLES.get(dialect or "", _ANY_STYLE).get(name)
    if style is None:
        return None
    if isinstance(node, exp.Anonymous):
        args = list(node.expressions)
    else:  # exp.Format: the format string is ``this``, the values ``expressions``
        args = [node.this, *node.expressions]
    if not args:
        return None
    fmt = args[0]
    if not (isinstance(fmt, exp.Literal) and fmt.is_string):
        return (f"{name}() needs its format as a string literal (a format computed at run time "
                "can ask for any width)")
    text = fmt.this
    return (_c_problem(name, text, args[1:]) if style == "c"
            else _fmt_problem(name, text))


def _too_wide(name: str, spec: str) -> str | None:
    for number in _NUMBER.findall(spec):
        if int(number) > MAX_FORMAT_WIDTH:
            return (f"{name}() format '%{spec}' asks for a width or precision of {int(number):,}; "
                    f"at most {MAX_FORMAT_WIDTH:,} are allowed")
    return None


def _c_problem(name: str, text: str, values: list[exp.Expression]) -> str | None:
    used = 0  # arguments consumed so far, for ``*``
    for match in _C_SPEC.finditer(text):
        spec, kind = match.group("spec"), match.group("type")
        if kind == "%" and not spec:
            continue
        problem = _too_wide(name, spec)
        if problem:
            return problem
        for star in re.finditer(r"\*(\d+\$)?", spec):
            if star.group(1):
                return (f"{name}() format '%{spec}' takes a width from a numbered argument; "
                        "write the width in the format")
            width = values[used] if used < len(values) else None
            used += 1
            if not _small_literal(width):
                return (f"{name}() format '%{spec}' takes its width or precision from an "
                        f"argument that is not a literal of at most {MAX_FORMAT_WIDTH:,}")
        used += 1
    return None


def _fmt_problem(name: str, text: str) -> str | None:
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "{}" and text.startswith(ch * 2, i):
            i += 2
            continue
        if ch != "{":
            i += 1
            continue
        end = text.find("}", i)
        if end < 0:
            return None  # the engine reports the malformed format itself
        field = text[i + 1:end]
        if "{" in field:
            return (f"{name}() format takes a width from an argument ('{{' inside a "
                    "replacement field); write the width in the format")
        for number in _NUMBER.findall(field):
            if int(number) > MAX_FORMAT_WIDTH:
                return (f"{name}() format '{{{field}}}' asks for a width, precision or position "
                        f"of {int(number):,}; at most {MAX_FORMAT_WIDTH:,} are allowed")
        i = end + 1
    return None


def _small_literal(node: exp.Expression | None) -> bool:
    if isinstance(node, exp.Neg):
        node = node.this
    if not (isinstance(node, exp.Literal) and not node.is_string):
        return False
    try:
        return abs(int(float(node.this))) <= MAX_FORMAT_WIDTH
    except ValueError:
        return False
