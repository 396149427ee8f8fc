"""Load SQLite benchmark databases into PostgreSQL, one schema per database.

A benchmark (Spider, BIRD, the demo) becomes one PostgreSQL database in which each benchmark
database is a schema named after its id; agentflow opens it with that schema as its
``search_path``, so gold queries name tables exactly as on SQLite. Names are stored lower-case
(PostgreSQL folds unquoted names to lower case, and the gold queries do not quote theirs).
Column types come from the values actually stored, as for DuckDB (see ``to_duckdb``); keys are
added after the data, and only where the data satisfies them, so loading never fails on a
messy benchmark database — what was dropped is reported.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot

from agentflow.datasets.to_duckdb import duckdb_type, fk_problem, open_source, read_tables
from agentflow.datasets.to_duckdb import quote_name as _source_q  # SQLite-side names, as written

_PG_TYPES = {"BIGINT": "bigint", "DOUBLE": "double precision", "BLOB": "bytea",
             "VARCHAR": "text"}


@dataclass
class PgLoadReport:
    db_id: str
    schema: str
    tables: int = 0
    rows: int = 0
    notes: list[str] = field(default_factory=list)


def schema_name(db_id: str) -> str:
    """The PostgreSQL schema that holds benchmark database ``db_id``."""
    name = re.sub(r"[^a-z0-9_]", "_", db_id.lower())
    return name if re.match(r"^[a-z_]", name) else f"db_{name}"


def load_sqlite_into_postgres(src: Path, conn, db_id: str, *,
                              grant_to: str | None = None) -> PgLoadReport:
    """Copy SQLite file ``src`` into schema ``schema_name(db_id)`` over psycopg ``conn``
    (autocommit off; committed at the end, so a failed load leaves nothing half-made)."""
    schema = schema_name(db_id)
    report = PgLoadReport(db_id=db_id, schema=schema)
    source = open_source(src)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            cur.execute(f'CREATE SCHEMA "{schema}"')
            cur.execute(f'SET LOCAL search_path = "{schema}"')
            _copy(source, cur, schema, report)
            cur.execute('ANALYZE')  # planner statistics: sample values without scans
            if grant_to:
                cur.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{grant_to}"')
                cur.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{grant_to}"')
        conn.commit()
    except Exception:
        conn.rollback()
        raise
    finally:
        source.close()
    return report


def _q(name: str) -> str:
    return '"' + name.lower().replace('"', '""') + '"'


def _copy(source: sqlite3.Connection, cur, schema: str, report: PgLoadReport) -> None:
    tables, by_lower, valid_pk = read_tables(source)
    for table in tables:
        report.rows += _copy_table(source, cur, table, report)
        report.tables += 1
    for table in tables:
        if table.pk and valid_pk[table.name.lower()]:
            cur.execute(f"ALTER TABLE {_q(table.name)} ADD PRIMARY KEY "
                        f"({', '.join(_q(c) for c in table.pk)})")
        elif table.pk:
            report.notes.append(f"{table.name}: primary key ({', '.join(table.pk)}) dropped: "
                                "duplicate or NULL values")
    for table in tables:
        for cols, ref, ref_cols in table.fks:
            ref_table = by_lower.get(ref.lower())
            why = fk_problem(source, table, cols, ref_table, ref_cols, valid_pk,
                              self_references=True)  # keys are added after the data
            if why or ref_table is None:
                report.notes.append(f"dropped foreign key {table.name}({', '.join(cols)}) -> "
                                    f"{ref}: {why}")
                continue
            target_cols = [c for c in ref_cols if c] or ref_table.pk
            cur.execute("SAVEPOINT fk")
            try:
                cur.execute(f"ALTER TABLE {_q(table.name)} ADD FOREIGN KEY "
                            f"({', '.join(_q(c) for c in cols)}) REFERENCES "
                            f"{_q(ref_table.name)} ({', '.join(_q(c) for c in target_cols)})")
                cur.execute("RELEASE SAVEPOINT fk")
            except Exception as err:  # a key PostgreSQL refuses is reported, not fatal
                cur.execute("ROLLBACK TO SAVEPOINT fk")
                report.notes.append(f"dropped foreign key {table.name}({', '.join(cols)}) -> "
                                    f"{ref}: {str(err).splitlines()[0]}")
    for name, sql in source.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='view' ORDER BY name"):
        cur.execute("SAVEPOINT view")
        try:
            cur.execute(sqlglot.transpile(sql, read="sqlite", write="postgres")[0])
            cur.execute("RELEASE SAVEPOINT view")
        except Exception as err:  # a view that does not transpile is reported, not fatal
            cur.execute("ROLLBACK TO SAVEPOINT view")
            report.notes.append(f"view {name} skipped: {str(err).splitlines()[0]}")


def _copy_table(source: sqlite3.Connection, cur, table, report: PgLoadReport) -> int:
    types: dict[str, str] = {}
    seen: set[str] = set()
    for col, declared in table.columns:
        if col.lower() in seen:
            raise ValueError(f"{table.name}: columns differ only in case ({col}); PostgreSQL "
                             "folds them to one name")
        seen.add(col.lower())
        storage = {r[0] for r in source.execute(
            f"SELECT DISTINCT typeof({_source_q(col)}) FROM {_source_q(table.name)}")}
        types[col] = _PG_TYPES[duckdb_type(storage, declared)]
        if len(storage - {"null"}) > 1 and types[col] == "text":
            report.notes.append(f"{table.name}.{col} mixes {sorted(storage - {'null'})}; "
                                "stored as text")
    cur.execute(f"CREATE TABLE {_q(table.name)} ("
                + ", ".join(f"{_q(c)} {types[c]}" for c, _ in table.columns) + ")")
    col_list = ", ".join(_source_q(c) for c, _ in table.columns)
    converters = [_converter(types[c]) for c, _ in table.columns]
    rows = 0
    with cur.copy(f"COPY {_q(table.name)} FROM STDIN") as copy:
        for row in source.execute(f"SELECT {col_list} FROM {_source_q(table.name)}"):
            copy.write_row([conv(v) for conv, v in zip(converters, row)])
            rows += 1
    return rows


def _converter(pg_type: str):
    if pg_type == "text":
        def text(v):
            if v is None:
                return None
            if isinstance(v, bytes):
                v = v.decode("utf-8", errors="replace")
            return str(v).replace("\x00", "")  # PostgreSQL text cannot hold NUL
        return text
    if pg_type == "bytea":
        return lambda v: v if v is None or isinstance(v, bytes) else str(v).encode()
    return lambda v: v
