"""Charts of query results: a Vega-Lite spec chosen by the result's column types.

Why Vega-Lite: one declarative spec serves every client. The API returns it as JSON (any
Vega-Lite renderer can draw it), and the server renders it to SVG/PNG with ``vl-convert``
(no JavaScript build, nothing loaded from the internet), which is what the web page shows.
Specs are built with Altair rather than by hand.

The rule, in order: a time-like column (dates, or a column named year/month/day/date/time)
plus numeric columns is a line chart over time; a text column plus numeric columns is a bar
chart per category; anything else (a single number, only numbers, only text) gets no chart.

Identifiers are numbers but never measures: "name and floor area of each store" must not
draw ``store_id`` as a series. A column is an identifier when the schema says it is a key
(``keys``) or its name is ``id``/``*_id``/``*Id``. When the question asks for ids ("orders per
customer id") such a column may still be the category axis; otherwise it is left out.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

MAX_POINTS = 500
_TIME_NAME = re.compile(r"(^|_)(date|day|month|year|time|week|quarter|period)s?($|_)", re.I)
_ISO_DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?$")


@dataclass(frozen=True)
class ChartChoice:
    mark: str          # "bar" | "line"
    x: int             # column index of the category / time axis
    ys: tuple[int, ...]  # numeric column indexes
    x_type: str        # "nominal" | "temporal" | "ordinal"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_ID_NAME = re.compile(r"(^|[_\s.])(id|Id|ID)$|[a-z0-9](Id|ID)$")  # not "paid", "valid"
_ID_WORDS = frozenset({"id", "ids", "identifier", "identifiers"})


def is_identifier(name: str, keys: Any = ()) -> bool:
    """Whether a result column is an identifier (a key of the schema, or named like one)."""
    bare = str(name).rsplit(".", 1)[-1].strip('"`[]')
    return bare.lower() in {str(k).lower() for k in keys} or bool(_ID_NAME.search(bare))


def _asks_for_ids(question: str) -> bool:
    return bool(_ID_WORDS & set(re.findall(r"[a-z]+", question.lower())))


def choose(columns: list[str], rows: list[list[Any]], *, keys: Any = (),
           question: str = "") -> ChartChoice | None:
    """Which chart fits this result, if any (cheap: no Altair needed). ``keys``: the key
    column names of the queried tables; ``question``: what was asked (see the module doc)."""
    if len(rows) < 2 or len(rows) > MAX_POINTS or len(columns) < 2:  # one bar says nothing
        return None
    kinds = []
    for i, name in enumerate(columns):
        values = [r[i] for r in rows if i < len(r) and r[i] is not None]
        if not values:
            kinds.append("empty")
        elif is_identifier(name, keys):
            kinds.append("id")
        elif all(_is_number(v) for v in values):
            year_like = all(isinstance(v, int) and 1000 <= v <= 2999 for v in values)
            kinds.append("year" if year_like and _TIME_NAME.search(str(name)) else "number")
        elif all(isinstance(v, (dt.date, dt.datetime)) or
                 (isinstance(v, str) and _ISO_DATE.match(v)) for v in values):
            kinds.append("date")
        else:
            kinds.append("text")
    numbers = tuple(i for i, k in enumerate(kinds) if k == "number")
    for i, k in enumerate(kinds):
        if k in ("date", "year") and numbers:
            return ChartChoice("line", i, numbers, "temporal" if k == "date" else "ordinal")
    for i, k in enumerate(kinds):
        if k == "text" and numbers:
            return ChartChoice("bar", i, numbers, "nominal")
    if numbers and _asks_for_ids(question):  # "orders per customer id": ids as categories
        for i, k in enumerate(kinds):
            if k == "id":
                return ChartChoice("bar", i, numbers, "nominal")
    return None


def vega_lite(columns: list[str], rows: list[list[Any]], title: str | None = None, *,
              keys: Any = (), question: str = "") -> dict[str, Any] | None:
    """The Vega-Lite spec (a dict) of the chart for this result, or None."""
    choice = choose(columns, rows, keys=keys, question=question or title or "")
    if choice is None:
        return None
    import altair as alt

    # Field names are c0, c1, ...: column names such as "count(*)" or "a.b" mean something
    # else to Vega-Lite; axis titles carry the real names.
    x_key, x_title = f"c{choice.x}", str(columns[choice.x])
    x_code = {"temporal": "T", "ordinal": "O", "nominal": "N"}[choice.x_type]
    x = alt.X(f"{x_key}:{x_code}", title=x_title, sort=None if choice.mark == "line" else "-y")
    tooltip = [alt.Tooltip(f"{x_key}:{x_code}", title=x_title)]
    if len(choice.ys) == 1:
        y_key, y_title = f"c{choice.ys[0]}", str(columns[choice.ys[0]])
        values = [{x_key: _plain(r[choice.x]), y_key: _plain(r[choice.ys[0]])} for r in rows]
        encoding = dict(x=x, y=alt.Y(f"{y_key}:Q", title=y_title),
                        tooltip=[*tooltip, alt.Tooltip(f"{y_key}:Q", title=y_title)])
    else:  # several measures, in long form: one series (line) or bar per measure
        values = [{x_key: _plain(r[choice.x]), "measure": str(columns[i]),
                   "value": _plain(r[i])} for r in rows for i in choice.ys]
        encoding = dict(x=x, y=alt.Y("value:Q", title=None),
                        color=alt.Color("measure:N", title=None,
                                        legend=alt.Legend(orient="bottom")),
                        tooltip=[*tooltip, alt.Tooltip("measure:N"), alt.Tooltip("value:Q")])
        if choice.mark == "bar":
            encoding["xOffset"] = alt.XOffset("measure:N")
    chart = alt.Chart(alt.Data(values=values))
    mark = chart.mark_line(point=True) if choice.mark == "line" else chart.mark_bar()
    spec = mark.encode(**encoding).properties(width=360, height=220)
    if title:
        spec = spec.properties(title=title)
    return spec.to_dict()


def schema_keys(database: Any) -> frozenset[str]:
    """The primary- and foreign-key column names of a database's tables (lower case)."""
    out: set[str] = set()
    for table in database.schema().tables:
        out.update(c.name.lower() for c in table.columns if c.primary_key)
        for fk in table.foreign_keys:
            out.update(c.lower() for c in fk.columns)
    return frozenset(out)


def render(spec: dict[str, Any], fmt: str = "svg") -> bytes:
    """SVG or PNG of a Vega-Lite spec, drawn on the server by vl-convert."""
    import vl_convert

    if fmt == "svg":
        return vl_convert.vegalite_to_svg(spec).encode("utf-8")
    if fmt == "png":
        return vl_convert.vegalite_to_png(spec, scale=2)
    raise ValueError(f"unknown chart format {fmt!r} (svg, png or vega-lite)")


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return str(value)
