"""Issue 20 §4: a CSV export never hands a spreadsheet a formula (OWASP's CSV-injection rule),
checked on the function and on the real ``rows.csv`` route over loopback."""

from __future__ import annotations

import csv
import io

import pytest

from agentflow.server.results import safe_cell, to_csv

LEADING = ["=", "+", "-", "@", "\t", "\r"]


@pytest.mark.parametrize("lead", LEADING)
def test_each_formula_start_is_quoted_and_keeps_every_character(lead: str) -> None:
    value = f"{lead}HYPERLINK(\"http://evil.example\",\"click\")"
    text = to_csv([f"{lead}col"], [[value]])
    header, row = list(csv.reader(io.StringIO(text)))
    assert header == [f"'{lead}col"]
    assert row == ["'" + value]


def test_the_classic_payloads_are_neutralised() -> None:
    rows = [["=cmd|' /C calc'!A0"], ["@SUM(1+1)*cmd|' /C calc'!A0"], ["+1+cmd|' /C calc'!A0"],
            ["-2+3+cmd|' /C calc'!A0"], ["=1+2"]]
    parsed = list(csv.reader(io.StringIO(to_csv(["x"], rows))))[1:]
    assert all(cell.startswith("'") for (cell,) in parsed)
    assert [cell[1:] for (cell,) in parsed] == [r[0] for r in rows]


@pytest.mark.parametrize("value, expected", [
    (-3, "-3"), (-3.5, "-3.5"), (+7, "7"), (0, "0"),
    ("-3", "-3"), ("-3.50", "-3.50"), ("+12", "+12"), ("-1e5", "-1e5"), ("-.5", "-.5"),
    ("-3 ", "'-3 "), ("-3-3", "'-3-3"), ("-", "'-"), ("+", "'+"),
    (None, ""), (True, "True"), ("plain", "plain"), ("a=b", "a=b"), (" =1", " =1"),
])
def test_numbers_stay_numbers_and_only_formula_starts_change(value, expected) -> None:
    (row,) = list(csv.reader(io.StringIO(to_csv(["v"], [[value]]))))[1:]
    assert row == [expected]


def test_safe_cell_keeps_numeric_types() -> None:
    assert safe_cell(-3) == -3 and isinstance(safe_cell(-3), int)
    assert safe_cell(-2.5) == -2.5
    assert safe_cell("=1") == "'=1"


def test_rows_csv_route_neutralises_database_values() -> None:
    """A database value starting with each character reaches rows.csv quoted."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from agentflow.api import AgentFlow
    from agentflow.config import AgentFlowConfig
    from agentflow.llm.scripted import ScriptedBackend
    from agentflow.server.testing import LiveServer

    cells = ["=HYPERLINK(\"http://evil.example\")", "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]
    # tab and carriage return built by the database (char(9), char(13)): the SQL text the
    # model returns has its whitespace tidied on the way
    literals = [f"'{c}'" for c in cells[:4]] + ["char(9) || 'x'", "char(13) || 'x'"]
    select = ", ".join(f"{lit} AS c{i}" for i, lit in enumerate(literals))
    sql = f"SELECT {select}, -3 AS n FROM stores LIMIT 1"
    af = AgentFlow(AgentFlowConfig(fewshot=None, pipeline="single"),
                   backends={"b": ScriptedBackend(lambda request: sql)})
    try:
        with LiveServer({}, agentflow=af) as live:
            r = httpx.post(f"{live.url}/v1/queries",
                           json={"question": "Show the values", "db": "bookshop"}, timeout=30)
            assert r.status_code == 200, r.text
            view = r.json()
            assert view["status"] == "done", view
            body = httpx.get(live.url + view["links"]["csv"], timeout=30).text
    finally:
        af.close()
    header, row = list(csv.reader(io.StringIO(body)))
    assert header == [f"c{i}" for i in range(len(cells))] + ["n"]
    assert row == ["'" + c for c in cells] + ["-3"]
