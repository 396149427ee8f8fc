"""`agentflow datasets to-postgres` and `datasets check --engine postgres` on a real server."""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentflow.accuracy import MatchRule
from agentflow.cli.main import main
from agentflow.datasets import load_dataset
from agentflow.datasets.check import check_dataset

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def bench(pg_server):
    """An empty database `loadtest` and the read-only role `loader_reader`."""
    pg_server.create_database("loadtest")
    pg_server.create_reader("loader_reader", "lr-pass", "loadtest")
    return pg_server


def admin_url(pg) -> str:
    return f"postgresql://postgres@/loadtest?host={pg.socket_dir}&port={pg.port}"


def run_sqlite_script(path: Path, script: str) -> Path:
    con = sqlite3.connect(path)
    con.executescript(script)
    con.commit()
    con.close()
    return path


@contextmanager
def loaded_into_bench(bench, src: Path, schema: str):
    """Load ``src`` as the superuser, autocommit off as `datasets to-postgres` connects (the
    load is one transaction); yields the report and the connection, to look at the result."""
    import psycopg

    from agentflow.datasets.to_postgres import load_sqlite_into_postgres

    with psycopg.connect(host=str(bench.socket_dir), port=bench.port, user="postgres",
                         dbname="loadtest") as conn:
        yield load_sqlite_into_postgres(src, conn, schema), conn


def test_spider_folder_loads_and_every_gold_query_passes(bench, spider_dir: Path,
                                                         tmp_path: Path, capsys) -> None:
    # A messy column (text in an INT column) and a key the data breaks, as benchmarks have.
    run_sqlite_script(spider_dir / "database" / "library" / "library.sqlite",
                      "CREATE TABLE shelf (shelf_id INTEGER PRIMARY KEY, code INT, "
                      "book_id INTEGER REFERENCES book(book_id));"
                      "INSERT INTO shelf VALUES (1, 'A1', 1), (2, 7, 99);"
                      "CREATE VIEW recent AS SELECT title FROM book WHERE year > 1970;")
    assert main(["datasets", "to-postgres", str(spider_dir), "--url", admin_url(bench),
                 "--grant", "loader_reader"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "loaded 1 databases" in out and "shelf.code mixes" in out
    assert "dropped foreign key shelf(book_id) -> book: 1 rows reference missing keys" in out

    url = bench.url("loader_reader", "loadtest", "lr-pass")
    dataset = load_dataset(spider_dir)
    with dataset.open("library", engine="postgres", pg_url=url) as db:
        schema = db.schema()
        assert {"author", "book", "loan", "shelf", "recent"} <= set(schema.table_names)
        assert schema.table("book").foreign_keys[0].ref_table == "author"
        assert schema.table("shelf").column("code").type == "text"
        assert schema.table("recent").kind == "view"
        # SQLite's case-insensitive (even quoted) names reach the lower-case PostgreSQL ones.
        assert db.execute('SELECT count(*) FROM "Book" WHERE "Year" > 1970',
                          dialect="sqlite").rows == [(3,)]
    jsonl = tmp_path / "check.jsonl"
    assert main(["datasets", "check", str(spider_dir), "--engine", "postgres",
                 "--pg-url", url, "--jsonl", str(jsonl)]) == 0
    assert "4 passed, 0 failed" in capsys.readouterr().out
    assert len(jsonl.read_text().splitlines()) == 4


def test_loading_again_replaces_the_schema(bench, spider_dir: Path) -> None:
    for _ in range(2):
        assert main(["datasets", "to-postgres", str(spider_dir), "--url", admin_url(bench)]) == 0
    with bench.admin_connect("loadtest") as conn:
        assert conn.execute("SELECT count(*) FROM library.book").fetchone() == (4,)


def test_to_postgres_without_a_url_is_a_clear_error(spider_dir: Path, monkeypatch,
                                                    capsys) -> None:
    monkeypatch.delenv("AGENTFLOW_PG_URL", raising=False)
    assert main(["datasets", "to-postgres", str(spider_dir)]) == 2
    assert "--url" in capsys.readouterr().out


def test_spider_dev_gold_self_check_on_postgres(bench, shared_spider) -> None:
    """Every gold query of Spider dev on PostgreSQL: each failure is a named dialect
    difference of the gold query, none unexplained, no crash."""
    assert main(["datasets", "to-postgres", str(shared_spider), "--url",
                 admin_url(bench), "--grant", "loader_reader"]) == 0
    report = check_dataset(load_dataset(shared_spider), engine="postgres",
                           rule=MatchRule.SPIDER, pg_url=bench.url("loader_reader",
                                                                   "loadtest", "lr-pass"))
    differences = report.differences()
    print(f"\nSpider dev on PostgreSQL: {report.passed} passed, {report.failed} failed; "
          f"{json.dumps(dict(differences))}")
    assert report.passed + report.failed == len(load_dataset(shared_spider))
    assert "unexplained" not in differences
    assert report.passed / len(report.records) > 0.9


def test_self_references_are_kept_when_the_data_holds_them(bench, tmp_path: Path) -> None:
    """PostgreSQL gets keys after the data, so a table may reference itself; a
    self-reference the data breaks is dropped with the same checks as any other key."""
    src = run_sqlite_script(
        tmp_path / "staff.sqlite",
        "CREATE TABLE staff (id INTEGER PRIMARY KEY, boss INTEGER REFERENCES staff(id));"
        "INSERT INTO staff VALUES (1, NULL), (2, 1), (3, 2);"
        "CREATE TABLE team (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES team(id));"
        "INSERT INTO team VALUES (1, NULL), (2, 9);")
    with loaded_into_bench(bench, src, "staff") as (report, conn):
        keys = conn.execute(
            "SELECT conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' AND "
            "connamespace = 'staff'::regnamespace ORDER BY 1").fetchall()
    assert keys == [("staff.staff",)]
    assert report.notes == ["dropped foreign key team(parent) -> team: 1 rows reference "
                            "missing keys"]


def test_names_with_double_quotes_load(bench, tmp_path: Path) -> None:
    """SQLite allows a double quote inside a quoted name; reading the source must escape
    it as the PostgreSQL side does, not fail the whole load."""
    src = run_sqlite_script(
        tmp_path / "quoted.sqlite",
        'CREATE TABLE "say ""hi""" (id INTEGER PRIMARY KEY, "a ""b""" TEXT);'
        'INSERT INTO "say ""hi""" VALUES (1, \'x\'), (2, \'y\');')
    with loaded_into_bench(bench, src, "quoted") as (report, conn):
        rows = conn.execute('SELECT "a ""b""" FROM quoted."say ""hi""" ORDER BY id').fetchall()
    assert report.rows == 2 and rows == [("x",), ("y",)]
