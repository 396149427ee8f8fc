"""Schema introspection and the compact schema text that goes into prompts.

Introspection reads each engine's own catalog (SQLite pragmas, DuckDB's ``duckdb_*()``
functions) rather than SQLAlchemy's generic inspector: both are exact about keys, and
duckdb-engine's inspector goes through a PostgreSQL catalog emulation that is incomplete.
Other engines use SQLAlchemy's inspector; PostgreSQL's catalog is read by
``postgres.introspect_postgres``, which builds this module's types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine


class SchemaSource(Protocol):
    """An open database as introspection reads it (``sql.database.Database`` is one). A
    protocol, so that this module and ``sql.postgres`` stand below the database whose
    ``schema()`` calls them instead of importing it back."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def engine(self) -> Engine: ...

    def schema(self) -> Schema: ...

    def try_execute(self, sql: str, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    primary_key: bool = False
    nullable: bool = True
    comment: str = ""  # COMMENT ON COLUMN (PostgreSQL): documentation users write
    values: tuple[str, ...] = ()  # the labels of an enum type, in order


@dataclass(frozen=True)
class ForeignKey:
    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    foreign_keys: tuple[ForeignKey, ...] = ()
    comment: str = ""  # COMMENT ON TABLE/VIEW
    kind: str = "table"  # or "view"
    # Where the engine has schemas: ``name`` is ``schema.table`` outside the default schema.
    schema: str | None = None
    bare_name: str = ""
    row_estimate: int = -1  # the planner's estimate (PostgreSQL reltuples); -1 unknown

    @property
    def quoted(self) -> str:
        """The name as a query must write it (schema-qualified and quoted when needed)."""
        if self.schema is not None and self.bare_name and self.name != self.bare_name:
            return f"{quote_ident(self.schema)}.{quote_ident(self.bare_name)}"
        return quote_ident(self.name)

    def column(self, name: str) -> Column | None:
        lower = name.lower()
        return next((c for c in self.columns if c.name.lower() == lower), None)


@dataclass(frozen=True)
class Schema:
    tables: tuple[Table, ...] = field(default_factory=tuple)

    def table(self, name: str) -> Table | None:
        lower = name.lower()
        return next((t for t in self.tables if t.name.lower() == lower), None)

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]


def introspect(db: SchemaSource) -> Schema:
    """The schema of a SQLite, DuckDB or other SQLAlchemy database (PostgreSQL:
    ``postgres.introspect_postgres``)."""
    with db.engine.connect() as conn:
        if db.kind == "sqlite":
            return _introspect_sqlite(conn)
        if db.kind == "duckdb":
            return _introspect_duckdb(conn)
    return _introspect_generic(db.engine)


def _introspect_sqlite(conn: sa.Connection) -> Schema:
    names = [r[0] for r in conn.exec_driver_sql(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY rowid")]
    tables = []
    for name in names:
        info = conn.exec_driver_sql(f"SELECT * FROM pragma_table_info({_lit(name)})").fetchall()
        columns = tuple(Column(name=r[1], type=(r[2] or "").upper(), primary_key=bool(r[5]),
                               nullable=not r[3] and not r[5]) for r in info)
        groups: dict[int, tuple[list[str], str, list[str]]] = {}
        for r in conn.exec_driver_sql(f"SELECT * FROM pragma_foreign_key_list({_lit(name)})"):
            cols, _, refs = groups.setdefault(r[0], ([], r[2], []))
            cols.append(r[3])
            refs.append(r[4] or "")
        fks = tuple(ForeignKey(tuple(c), ref, tuple(rc)) for c, ref, rc in groups.values())
        tables.append(Table(name=name, columns=columns, foreign_keys=fks))
    return Schema(tables=tuple(tables))


def _introspect_duckdb(conn: sa.Connection) -> Schema:
    cols: dict[str, list[tuple[str, str, bool]]] = {}
    for table, column, dtype, nullable in conn.exec_driver_sql(
            "SELECT table_name, column_name, data_type, is_nullable FROM duckdb_columns() "
            "WHERE NOT internal AND schema_name = current_schema() "
            "ORDER BY table_oid, column_index"):
        cols.setdefault(table, []).append((column, dtype, bool(nullable)))
    pks: dict[str, set[str]] = {}
    fks: dict[str, list[ForeignKey]] = {}
    for table, ctype, columns, ref_table, ref_columns in conn.exec_driver_sql(
            "SELECT table_name, constraint_type, constraint_column_names, "
            "referenced_table, referenced_column_names FROM duckdb_constraints() "
            "WHERE schema_name = current_schema()"):
        if ctype == "PRIMARY KEY":
            pks.setdefault(table, set()).update(columns)
        elif ctype == "FOREIGN KEY":
            fks.setdefault(table, []).append(
                ForeignKey(tuple(columns), ref_table, tuple(ref_columns or ())))
    tables = tuple(
        Table(name=t,
              columns=tuple(Column(c, d, primary_key=c in pks.get(t, ()), nullable=n)
                            for c, d, n in columns),
              foreign_keys=tuple(fks.get(t, ())))
        for t, columns in cols.items())
    return Schema(tables=tables)


def _introspect_generic(engine: sa.Engine) -> Schema:
    inspector = sa.inspect(engine)
    tables = []
    for name in inspector.get_table_names():
        pk = set(inspector.get_pk_constraint(name).get("constrained_columns") or ())
        columns = tuple(Column(c["name"], str(c["type"]), c["name"] in pk,
                               bool(c.get("nullable", True)))
                        for c in inspector.get_columns(name))
        fks = tuple(ForeignKey(tuple(f["constrained_columns"]), f["referred_table"],
                               tuple(f["referred_columns"]))
                    for f in inspector.get_foreign_keys(name))
        tables.append(Table(name, columns, fks))
    return Schema(tables=tuple(tables))


# Above this many rows (planner estimate) sample values come from a TABLESAMPLE, not a scan.
BIG_TABLE_ROWS = 100_000
_SAMPLE_ROWS = 10_000


def sampled_source(db: SchemaSource, table: Table, rows: int = _SAMPLE_ROWS) -> str:
    """What to put after FROM to read ``table`` without a full scan when it is big: on
    PostgreSQL a ``TABLESAMPLE SYSTEM`` of about ``rows`` rows above ``BIG_TABLE_ROWS``
    (planner estimate); the table itself otherwise."""
    if getattr(db, "kind", None) == "postgresql" and table.kind == "table" \
            and table.row_estimate > BIG_TABLE_ROWS:
        pct = max(0.01, min(100.0, 100.0 * rows / table.row_estimate))
        return f"{table.quoted} TABLESAMPLE SYSTEM ({pct:.4f})"
    return table.quoted


def sample_values(db: SchemaSource, table: str | Table, column: str | Column, k: int = 3,
                  max_len: int = 40) -> list[Any]:
    """Up to ``k`` distinct non-NULL values of a column (the most frequent first), for prompts.

    On PostgreSQL no full scan: the planner's most-common values when analysed, else the
    values of a bounded sample (TABLESAMPLE on big tables, the first rows otherwise)."""
    return trim_samples(raw_sample_values(db, table, column, k), max_len)


def raw_sample_values(db: SchemaSource, table: str | Table, column: str | Column,
                      k: int = 3) -> list[Any]:
    """``sample_values`` before the prompt's trimming: what the database returned (the first
    ``j`` of ``k`` values are the ``j`` most frequent, so a cache of ``k`` serves any ``j``)."""
    if isinstance(table, str):
        table = db.schema().table(table) or Table(name=table, columns=())
    col_name = column if isinstance(column, str) else column.name
    q = quote_ident
    values = None
    if db.kind == "postgresql":
        col = table.column(col_name) or Column(col_name, "")
        values = _planner_values(db, table, col, k)
        if values is None:
            source = sampled_source(db, table)
            sql = (f"SELECT v FROM (SELECT {q(col_name)} AS v FROM {source} WHERE "
                   f"{q(col_name)} IS NOT NULL LIMIT {_SAMPLE_ROWS}) s GROUP BY v "
                   f"ORDER BY count(*) DESC, v LIMIT {int(k)}")
    else:
        sql = (f"SELECT {q(col_name)} FROM {table.quoted} WHERE {q(col_name)} IS NOT NULL "
               f"GROUP BY {q(col_name)} ORDER BY count(*) DESC, {q(col_name)} LIMIT {int(k)}")
    if values is None:
        result = db.try_execute(sql, timeout_s=5.0, max_rows=k)
        if not hasattr(result, "rows"):
            return []
        values = [r[0] for r in result.rows]
    return list(values)


def trim_samples(values: Sequence[Any], max_len: int = 40) -> list[Any]:
    """Sample values as a prompt shows them: long text cut to ``max_len``, binary dropped."""
    out = []
    for value in values:
        if isinstance(value, str) and len(value) > max_len:
            value = value[: max_len - 1] + "…"
        elif isinstance(value, (bytes, bytearray, memoryview)):
            continue
        out.append(value)
    return out


def _planner_values(db: SchemaSource, table: Table, column: Column, k: int
                    ) -> list[Any] | None:
    """PostgreSQL: the most common values from the planner's statistics (``pg_stats``: no
    scan at all), or ``None`` when the column has none (not analysed yet, or a view)."""
    if table.schema is None:
        return None
    result = db.try_execute(
        "SELECT most_common_vals::text::text[] FROM pg_stats WHERE schemaname = "
        f"{_lit(table.schema)} AND tablename = {_lit(table.bare_name)} AND attname = "
        f"{_lit(column.name)}", timeout_s=5.0, max_rows=1, allow_catalog=True)
    rows = getattr(result, "rows", None)
    if not rows or rows[0][0] is None:
        return None
    return [v for v in rows[0][0] if v is not None][:k]


# (table, column, k, max_len) -> the column's sample values; ``Database`` passes its cache
SampleValues = Callable[[Table, Column, int, int], list[Any]]


def schema_prompt(db: SchemaSource, *, tables: Mapping[str, Sequence[str] | None] | None = None,
                  samples: int = 3, max_value_len: int = 40,
                  values_of: SampleValues | None = None) -> str:
    """Render the schema as CREATE TABLE statements with example values in comments.

    ``tables`` restricts the text to some tables (and, per table, some columns; ``None`` = all
    columns) — what schema selection in a pipeline produces. Keys stay visible so a model can
    join: primary-key columns are always kept and foreign keys are listed when both ends remain.
    ``values_of`` supplies the sample values (default: one query per column, now).
    """
    if values_of is None:
        def values_of(table: Table, col: Column, k: int, max_len: int) -> list[Any]:
            return sample_values(db, table, col, k, max_len)
    schema = db.schema()
    chosen = _select(schema, tables)
    lines: list[str] = []
    kept_tables = {t.name.lower() for t, _ in chosen}
    for table, columns in chosen:
        body = []
        for col in columns:
            text = f"  {quote_ident(col.name)} {col.type or 'TEXT'}"
            if col.primary_key:
                text += " PRIMARY KEY" if sum(c.primary_key for c in table.columns) == 1 else ""
            values = values_of(table, col, samples, max_value_len) \
                if samples and not col.values else []
            notes = []
            if col.comment:
                notes.append(_one_line(col.comment))
            if col.values:
                notes.append("one of " + _format_values(col.values))
            elif values:
                notes.append("e.g. " + _format_values(values))
            body.append((text, "; ".join(notes)))
        pk = [c.name for c in table.columns if c.primary_key]
        extra = []
        if len(pk) > 1:
            extra.append(f"  PRIMARY KEY ({', '.join(quote_ident(c) for c in pk)})")
        for fk in table.foreign_keys:
            if fk.ref_table.lower() in kept_tables:
                extra.append(
                    f"  FOREIGN KEY ({', '.join(quote_ident(c) for c in fk.columns)}) "
                    f"REFERENCES {_quote_table_name(fk.ref_table)}"
                    f"({', '.join(quote_ident(c) for c in fk.ref_columns if c)})")
        entries = [text for text, _ in body] + extra
        rendered = []
        for i, entry in enumerate(entries):
            comma = "," if i < len(entries) - 1 else ""
            comment = body[i][1] if i < len(body) else ""
            rendered.append(f"{entry}{comma}{'  -- ' + comment if comment else ''}")
        if table.comment:
            lines.append(f"-- {_one_line(table.comment)}")
        keyword = "VIEW" if table.kind == "view" else "TABLE"
        lines.append(f"CREATE {keyword} {table.quoted} (\n" + "\n".join(rendered) + "\n);")
    return "\n".join(lines)


def _select(schema: Schema, tables: Mapping[str, Sequence[str] | None] | None
            ) -> list[tuple[Table, list[Column]]]:
    if tables is None:
        return [(t, list(t.columns)) for t in schema.tables]
    wanted = {name.lower(): cols for name, cols in tables.items()}
    out = []
    for table in schema.tables:
        if table.name.lower() not in wanted:
            continue
        cols = wanted[table.name.lower()]
        if cols is None:
            out.append((table, list(table.columns)))
            continue
        keep = {c.lower() for c in cols}
        keep |= {c.name.lower() for c in table.columns if c.primary_key}
        keep |= {c.lower() for fk in table.foreign_keys for c in fk.columns}
        out.append((table, [c for c in table.columns if c.name.lower() in keep]))
    return out


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _quote_table_name(name: str) -> str:
    """A table name as ``Table.name`` holds it (``schema.table`` outside the default)."""
    if "." in name:
        schema, _, bare = name.partition(".")
        return f"{quote_ident(schema)}.{quote_ident(bare)}"
    return quote_ident(name)


def _format_values(values: Sequence[Any]) -> str:
    return ", ".join(repr(v) if isinstance(v, str) else str(v) for v in values)


def quote_ident(name: str) -> str:
    """Quote only when needed, so prompts stay readable for small models."""
    if name.isidentifier() and name.isascii():
        return name
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
