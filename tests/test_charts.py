"""Which chart a result gets, by its column types (Vega-Lite specs built with Altair)."""

from __future__ import annotations

import datetime as dt

import pytest

from agentflow.charts import choose, vega_lite

altair = pytest.importorskip("altair")


def test_text_and_number_is_a_bar_chart_sorted_by_value() -> None:
    spec = vega_lite(["city", "stores"], [["Lisbon", 2], ["Porto", 1]])
    assert spec["mark"]["type"] == "bar"
    assert spec["encoding"]["x"]["type"] == "nominal" and spec["encoding"]["x"]["sort"] == "-y"
    assert spec["encoding"]["y"]["title"] == "stores"


def test_dates_or_a_year_column_make_a_line_over_time() -> None:
    by_month = [["2023-01", 10], ["2023-02", 12], ["2023-03", 9]]
    assert choose(["month", "orders"], by_month).mark == "line"
    assert vega_lite(["month", "orders"], by_month)["encoding"]["x"]["type"] == "temporal"
    by_year = [[2021, 3.5], [2022, 4.0]]
    assert choose(["published_year", "avg_price"], by_year).x_type == "ordinal"
    dates = [[dt.date(2024, 1, 1), 1], [dt.date(2024, 1, 2), 2]]
    assert choose(["day", "n"], dates).mark == "line"
    # a number column that is not named like time is a measure, not an axis
    assert choose(["store_id", "n"], [[2021, 1], [2022, 2]]) is None


def test_several_measures_become_one_series_each() -> None:
    spec = vega_lite(["genre", "books", "avg pages"], [["Poetry", 3, 120.5], ["Crime", 5, 300]])
    assert spec["encoding"]["color"]["field"] == "measure"
    values = spec["data"]["values"]
    assert {v["measure"] for v in values} == {"books", "avg pages"} and len(values) == 4


@pytest.mark.parametrize("columns, rows", [
    (["count(*)"], [[12]]),                       # a single number
    (["city", "stores"], [["Lisbon", 2]]),        # one bar says nothing
    (["name", "city"], [["a", "b"], ["c", "d"]]),  # no measure
    (["a", "b"], []),                              # no rows
])
def test_no_chart_when_none_fits(columns, rows) -> None:
    assert choose(columns, rows) is None and vega_lite(columns, rows) is None


def test_odd_column_names_are_safe_field_names() -> None:
    spec = vega_lite(["t.name", "count(*)"], [["x", 1], ["y", 2]])
    assert spec["encoding"]["x"]["field"] == "c0" and spec["encoding"]["x"]["title"] == "t.name"


def test_id_columns_are_never_measures() -> None:
    # the case: "name and floor area of each store" drew store_id as a series
    rows = [[1, "Chiado Books", 180], [2, "Porto Livros", 240], [3, "Kreuzberg Books", 150]]
    choice = choose(["store_id", "name", "floor_area_m2"], rows,
                    question="What are the name and floor area of each store?")
    assert choice is not None and choice.x == 1 and choice.ys == (2,)
    spec = vega_lite(["store_id", "name", "floor_area_m2"], rows)
    assert "color" not in spec["encoding"] and spec["encoding"]["y"]["title"] == "floor_area_m2"
    for name in ("id", "Stadium_ID", "customerId", "t1.order_id"):
        assert choose([name, "total"], [[1, 5.0], [2, 7.5]]) is None, name
    # names that only end in "id" are measures as usual
    assert choose(["city", "paid"], [["Lisbon", 5.0], ["Porto", 7.5]]).ys == (1,)


def test_schema_keys_count_as_ids_and_the_question_can_make_ids_the_axis() -> None:
    rows = [["a", 1, 10], ["b", 2, 20]]
    assert choose(["name", "code", "n"], rows).ys == (1, 2)
    assert choose(["name", "code", "n"], rows, keys={"Code"}).ys == (2,)
    per_customer = [[7, 3], [9, 5], [12, 1]]
    assert choose(["customer_id", "orders"], per_customer,
                  question="How many orders did each customer place?") is None
    choice = choose(["customer_id", "orders"], per_customer,
                    question="How many orders per customer id?")
    assert choice.mark == "bar" and choice.x == 0 and choice.ys == (1,)


def test_schema_keys_of_the_demo_database() -> None:
    from agentflow.catalog import DatabaseCatalog
    from agentflow.charts import schema_keys

    catalog = DatabaseCatalog()
    try:
        keys = schema_keys(catalog.open("bookshop"))
    finally:
        catalog.close()
    assert {"store_id", "order_id", "manager_id", "customer_id"} <= keys
    assert "floor_area_m2" not in keys
