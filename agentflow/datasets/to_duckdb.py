"""Copy a SQLite database into a DuckDB file, so a benchmark runs on both engines.

SQLite columns are dynamically typed: a column declared ``INT`` may hold text. DuckDB is strict,
so each column's DuckDB type is chosen from the storage classes its values *actually* have
(``typeof``), not from the declaration; the declaration is used only for empty columns. Keys are
kept where the data satisfies them (DuckDB enforces them), and dropped with a note otherwise,
so conversion never fails on a messy benchmark database.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import networkx as nx
import sqlglot

_INSERT_BATCH = 500


@dataclass
class TableReport:
    name: str
    rows: int
    column_types: dict[str, str]
    notes: list[str] = field(default_factory=list)


@dataclass
class ConversionReport:
    src: Path
    dst: Path
    tables: list[TableReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)


def convert_sqlite_to_duckdb(src: Path, dst: Path, *, overwrite: bool = True) -> ConversionReport:
    """Copy every table (and view, where it transpiles) of ``src`` into a new DuckDB file."""
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"SQLite database not found: {src}")
    if dst.exists() and not overwrite:
        raise FileExistsError(f"{dst} exists; pass overwrite=True to replace it")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    report = ConversionReport(src=src, dst=dst)
    source = open_source(src)
    try:
        target = duckdb.connect(str(tmp))
        try:
            _copy(source, target, report)
        finally:
            target.close()
        os.replace(tmp, dst)
    finally:
        source.close()
        tmp.unlink(missing_ok=True)
    return report


@dataclass
class SourceTable:
    name: str
    columns: list[tuple[str, str]]  # (name, declared type)
    pk: list[str]
    fks: list[tuple[list[str], str, list[str]]]  # (columns, referenced table, referenced columns)


def _copy(source: sqlite3.Connection, target: duckdb.DuckDBPyConnection,
          report: ConversionReport) -> None:
    tables, by_lower, valid_pk = read_tables(source)
    graph = nx.DiGraph()
    graph.add_nodes_from(by_lower)
    kept_fks: dict[str, list[tuple[list[str], str, list[str]]]] = {k: [] for k in by_lower}
    for table in tables:
        for cols, ref, ref_cols in table.fks:
            why = fk_problem(source, table, cols, by_lower.get(ref.lower()), ref_cols, valid_pk)
            if why:
                report.notes.append(f"dropped foreign key {table.name}({', '.join(cols)}) -> "
                                    f"{ref}({', '.join(ref_cols)}): {why}")
                continue
            kept_fks[table.name.lower()].append((cols, by_lower[ref.lower()].name, ref_cols))
            if ref.lower() != table.name.lower():
                graph.add_edge(ref.lower(), table.name.lower())
    # DuckDB checks keys on insert, so referenced tables go first; cycles lose their keys.
    while not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        ref, child = cycle[0]
        graph.remove_edge(ref, child)
        kept_fks[child] = [fk for fk in kept_fks[child] if fk[1].lower() != ref]
        report.notes.append(f"dropped foreign keys {child} -> {ref}: they form a cycle")
    for lower in nx.lexicographical_topological_sort(graph):
        table = by_lower[lower]
        report.tables.append(_copy_table(source, target, table, valid_pk[lower],
                                         kept_fks[lower]))
        if table.pk and not valid_pk[lower]:
            report.tables[-1].notes.append(
                f"primary key ({', '.join(table.pk)}) dropped: duplicate or NULL values")
    for name, sql in source.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='view' ORDER BY name"):
        try:
            target.execute(sqlglot.transpile(sql, read="sqlite", write="duckdb")[0])
        except Exception as err:  # a view that does not transpile is reported, not fatal
            report.notes.append(f"view {name} skipped: {str(err).splitlines()[0]}")


def open_source(src: Path) -> sqlite3.Connection:
    """``src`` opened read-only; text is decoded leniently (benchmark files hold invalid
    UTF-8)."""
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    source.text_factory = lambda b: b.decode("utf-8", errors="replace")
    return source


def read_tables(source: sqlite3.Connection
                 ) -> tuple[list[SourceTable], dict[str, SourceTable], dict[str, bool]]:
    """Every table of ``source`` (by name), the same by lower-case name, and whether each
    one's primary key holds on the data (no NULL, no duplicate)."""
    tables = [_read_table(source, name) for (name,) in source.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY name")]
    valid_pk = {t.name.lower(): bool(t.pk) and _key_is_valid(source, t.name, t.pk)
                for t in tables}
    return tables, {t.name.lower(): t for t in tables}, valid_pk


def _read_table(source: sqlite3.Connection, name: str) -> SourceTable:
    info = source.execute(f"PRAGMA table_info({quote_name(name)})").fetchall()
    columns = [(row[1], row[2] or "") for row in info]
    pk = [row[1] for row in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    fks: dict[int, tuple[list[str], str, list[str]]] = {}
    for row in source.execute(f"PRAGMA foreign_key_list({quote_name(name)})").fetchall():
        fk_id, _seq, ref, col, ref_col = row[0], row[1], row[2], row[3], row[4]
        cols, _, ref_cols = fks.setdefault(fk_id, ([], ref, []))
        cols.append(col)
        ref_cols.append(ref_col)
    return SourceTable(name=name, columns=columns, pk=pk, fks=list(fks.values()))


def _key_is_valid(source: sqlite3.Connection, table: str, cols: list[str]) -> bool:
    col_list = ", ".join(quote_name(c) for c in cols)
    not_null = " OR ".join(f"{quote_name(c)} IS NULL" for c in cols)
    nulls = source.execute(
        f"SELECT count(*) FROM {quote_name(table)} WHERE {not_null}").fetchone()[0]
    dups = source.execute(f"SELECT count(*) FROM (SELECT {col_list} FROM {quote_name(table)} "
                          f"GROUP BY {col_list} HAVING count(*) > 1)").fetchone()[0]
    return nulls == 0 and dups == 0


def fk_problem(source: sqlite3.Connection, table: SourceTable, cols: list[str],
               ref: SourceTable | None, ref_cols: list[str], valid_pk: dict[str, bool], *,
               self_references: bool = False) -> str | None:
    """Why the foreign key cannot be kept, or None. ``self_references``: the target adds
    keys after the data, so a table may reference itself (DuckDB checks keys on insert,
    so there it may not)."""
    if ref is None:
        return "referenced table does not exist"
    ref_cols = [c if c is not None else "" for c in ref_cols]
    if not all(ref_cols):  # "REFERENCES t" without columns means t's primary key
        ref_cols[:] = ref.pk
    if ([c.lower() for c in ref_cols] != [c.lower() for c in ref.pk]
            or not valid_pk[ref.name.lower()]):
        return "referenced columns are not the referenced table's valid primary key"
    if ref is table and not self_references:
        return "self-references are not kept"
    names = {c.lower() for c, _ in table.columns}
    if not all(c.lower() in names for c in cols):
        return "column does not exist"
    join = " AND ".join(f"c.{quote_name(a)} = p.{quote_name(b)}" for a, b in zip(cols, ref_cols))
    present = " AND ".join(f"c.{quote_name(a)} IS NOT NULL" for a in cols)
    orphans = source.execute(
        f"SELECT count(*) FROM {quote_name(table.name)} c WHERE {present} AND NOT EXISTS "
        f"(SELECT 1 FROM {quote_name(ref.name)} p WHERE {join})").fetchone()[0]
    if orphans:
        return f"{orphans} rows reference missing keys"
    return None


def duckdb_type(storage: set[str], declared: str) -> str:
    """DuckDB type for a column whose values have the SQLite storage classes ``storage``."""
    storage = storage - {"null"}
    if not storage:
        return _affinity_type(declared)
    if storage == {"integer"}:
        return "BIGINT"
    if storage <= {"integer", "real"}:
        return "DOUBLE"
    if storage == {"blob"}:
        return "BLOB"
    return "VARCHAR"


def _affinity_type(declared: str) -> str:
    """SQLite's type-affinity rules (section 3.1 of its datatype documentation)."""
    d = declared.upper()
    if "INT" in d:
        return "BIGINT"
    if any(k in d for k in ("CHAR", "CLOB", "TEXT")):
        return "VARCHAR"
    if "BLOB" in d or not d:
        return "VARCHAR"
    if any(k in d for k in ("REAL", "FLOA", "DOUB")):
        return "DOUBLE"
    return "DOUBLE"


def _copy_table(source: sqlite3.Connection, target: duckdb.DuckDBPyConnection, table: SourceTable,
                keep_pk: bool, fks: list[tuple[list[str], str, list[str]]]) -> TableReport:
    types: dict[str, str] = {}
    notes: list[str] = []
    for col, declared in table.columns:
        storage = {r[0] for r in source.execute(
            f"SELECT DISTINCT typeof({quote_name(col)}) FROM {quote_name(table.name)}")}
        types[col] = duckdb_type(storage, declared)
        if len(storage - {"null"}) > 1 and types[col] == "VARCHAR":
            notes.append(f"column {col} mixes {sorted(storage - {'null'})}; stored as VARCHAR")
    parts = [f"{quote_name(c)} {types[c]}" for c, _ in table.columns]
    if keep_pk:
        parts.append(f"PRIMARY KEY ({', '.join(quote_name(c) for c in table.pk)})")
    for cols, ref, ref_cols in fks:
        parts.append(f"FOREIGN KEY ({', '.join(quote_name(c) for c in cols)}) "
                     f"REFERENCES {quote_name(ref)} "
                     f"({', '.join(quote_name(c) for c in ref_cols)})")
    target.execute(f"CREATE TABLE {quote_name(table.name)} ({', '.join(parts)})")
    col_list = ", ".join(quote_name(c) for c, _ in table.columns)
    cursor = source.execute(f"SELECT {col_list} FROM {quote_name(table.name)}")
    width = len(table.columns)
    converters = [_converter(types[c]) for c, _ in table.columns]
    rows = 0
    while batch := cursor.fetchmany(_INSERT_BATCH):
        values = ", ".join(["(" + ", ".join(["?"] * width) + ")"] * len(batch))
        params = [conv(v) for row in batch for conv, v in zip(converters, row)]
        target.execute(f"INSERT INTO {quote_name(table.name)} VALUES {values}", params)
        rows += len(batch)
    return TableReport(name=table.name, rows=rows, column_types=types, notes=notes)


def _converter(duck_type: str):
    if duck_type == "VARCHAR":
        return lambda v: v if v is None or isinstance(v, str) else (
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v))
    return lambda v: v


def quote_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
