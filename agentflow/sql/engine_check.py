"""The engine's own reading of the text it is about to run, checked against the guard's verdict.

The guard (``guard``) decides on sqlglot's parse of a query, but the engine runs its own parser.
Wherever the two read a text differently the guard is walked around: sqlglot's DuckDB tokenizer
has no backtick identifiers, so `` `--` `` started a "comment" for the guard while DuckDB read a
name and ran what followed (``version()``, an unbounded ``repeat``). Two things close that:

* the text that runs is regenerated from the guard's own tree (``regenerate``), so what was a
  comment for the guard is gone, and the size bounds of ``bounds`` apply to what really runs;
* before it runs, the engine's parser reads that text and every function and table it names
  must be one the guard approved: DuckDB through ``json_serialize_sql`` (its parser, as JSON),
  PostgreSQL through ``pglast`` (libpg_query: PostgreSQL's parser), SQLite through the
  authorizer callback, which the engine calls for every function and table it resolves while
  preparing the statement. Anything the check does not recognise is refused: a parser
  difference fails closed, with a message naming what the engine saw.

Catalog and path tables (``pragma_database_list``, ``duckdb_databases()``, ``pg_roles``...) tell
a tenant the server's file paths and other tenants' role names; they are refused unless the
caller allows the catalog (an admin, or agentflow's own introspection).
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ErrorLevel, ParseError, TokenError

from agentflow.sql.allowlist import ALLOWED
from agentflow.sql.errors import RejectedStatementError

# A function whose name is all symbols is an operator (``+``, ``||``, ``~~`` for LIKE, ``->>``).
_OPERATOR = re.compile(r"^[^\w]+$")

# Statement and FROM-item kinds of DuckDB's parse tree a query may contain; any other (a SHOW,
# a DESCRIBE, a PIVOT over an unknown source, something new) is refused.
_DUCKDB_NODES = {"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"}
_DUCKDB_FROM = {"BASE_TABLE", "JOIN", "SUBQUERY", "TABLE_FUNCTION", "EMPTY", "EXPRESSION_LIST"}

# SQLite's own schema table: its rows are the schema the tenant is shown anyway, and loading a
# table-valued function (json_each) reads it.
_SQLITE_SCHEMA = {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"}


def regenerate(tree: exp.Expr, dialect: str, *, quiet: bool = False) -> str:
    """The text that runs: the guard's tree written out again, without comments."""
    if quiet:
        return tree.sql(dialect=dialect, comments=False, unsupported_level=ErrorLevel.IGNORE)
    return tree.sql(dialect=dialect, comments=False)


def catalog_problem(dialect: str, schema: str, name: str) -> str | None:
    """Why a table (or table function) is catalog data a tenant may not read, or None."""
    schema, name = schema.lower(), name.lower()
    if dialect == "sqlite":
        catalog = name.startswith("pragma_")
    elif dialect == "duckdb":
        catalog = (name.startswith(("duckdb_", "pragma_", "pg_", "sqlite_"))
                   or schema in {"information_schema", "pg_catalog"}
                   or name in {"information_schema", "pg_catalog"})
    elif dialect == "postgres":
        catalog = name.startswith("pg_") or schema in {"information_schema", "pg_catalog"}
    else:
        catalog = False
    if not catalog:
        return None
    return (f"table {name!r} is part of the engine's catalog (server paths, settings, other "
            "users); a query may only read the database's own tables")


# Functions that report the server itself (version, settings, who is connected): catalog too,
# for admins only. Everything else stays on the allow-list's terms.
_CATALOG_FUNCTIONS = frozenset("""
    version current_setting current_database current_schema current_schemas sqlite_version
    current_user session_user user current_role current_catalog
""".split())


def is_catalog_function(dialect: str, name: str) -> bool:
    """Whether ``name`` is a catalog function: let through where the catalog is allowed."""
    low = name.lower()
    return low in _CATALOG_FUNCTIONS or catalog_problem(dialect, "", low) is not None


def approved_tables(tree: exp.Expr) -> set[tuple[str, str, str]]:
    """(catalog, schema, name) of every table, CTE reference and table function in the tree,
    lower-cased: the only relations the engine may resolve."""
    out: set[tuple[str, str, str]] = set()
    for table in tree.find_all(exp.Table):
        if isinstance(table.this, exp.Func):
            from agentflow.sql.allowlist import normalised_name

            name = normalised_name(table.this)
        else:
            name = table.name
        out.add((table.catalog.lower(), table.db.lower(), name.lower()))
    return out


# ------------------------------------------------------------------------------------- DuckDB
_local = threading.local()


def _duckdb_parse(text: str) -> dict[str, Any]:
    import duckdb

    con = getattr(_local, "duckdb", None)
    if con is None:
        # An in-memory database with nothing in it: the parser needs no data.
        con = _local.duckdb = duckdb.connect(config={"enable_external_access": False})
    row = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [text]).fetchone()
    return json.loads(row[0]) if row else {"error": True}


@dataclass(frozen=True)
class EngineView:
    """What an engine's parser names in one statement."""

    functions: frozenset[tuple[str, str]]  # (schema, name)
    tables: frozenset[tuple[str, str, str]]  # (catalog, schema, name)
    problems: tuple[str, ...] = ()  # nodes the check does not know: fail closed


def _dicts(node: Any) -> Iterator[dict[str, Any]]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def duckdb_view(text: str) -> EngineView:
    tree = _duckdb_parse(text)
    if tree.get("error") or len(tree.get("statements", [])) != 1:
        return EngineView(frozenset(), frozenset(),
                          (f"DuckDB's parser reads the text differently from the guard "
                           f"({tree.get('error_message') or 'not exactly one query'})",))
    functions: set[tuple[str, str]] = set()
    tables: set[tuple[str, str, str]] = set()
    problems: list[str] = []
    for node in _dicts(tree["statements"][0]):
        if "function_name" in node:
            functions.add(((node.get("catalog") or "") + ("." if node.get("catalog") else "")
                           + (node.get("schema") or ""), str(node["function_name"])))
        kind = node.get("type")
        if kind == "BASE_TABLE":
            tables.add((node.get("catalog_name") or "", node.get("schema_name") or "",
                        str(node.get("table_name"))))
        if "from_table" in node:
            source = node["from_table"]
            if isinstance(source, dict) and source.get("type") not in _DUCKDB_FROM:
                problems.append(f"DuckDB reads a {source.get('type')} source")
        if "left" in node and "right" in node and kind == "JOIN":
            for side in (node["left"], node["right"]):
                if isinstance(side, dict) and side.get("type") not in _DUCKDB_FROM:
                    problems.append(f"DuckDB reads a {side.get('type')} source")
        if "node" in node and isinstance(node["node"], dict):
            inner = node["node"].get("type")
            if inner is not None and inner not in _DUCKDB_NODES:
                problems.append(f"DuckDB reads a {inner} statement")
    return EngineView(frozenset(functions), frozenset(tables), tuple(problems))


# --------------------------------------------------------------------------------- PostgreSQL
def postgres_view(text: str) -> EngineView:
    try:
        from pglast.parser import ParseError as PgParseError
        from pglast.parser import parse_sql_json
    except ImportError as err:  # the postgres extra brings it; without it, nothing runs
        raise RejectedStatementError(
            "PostgreSQL queries are checked with PostgreSQL's own parser (pglast), which is "
            "not installed: pip install 'agentflow[postgres]'", sql=text) from err
    try:
        tree = json.loads(parse_sql_json(text))
    except PgParseError as err:
        return EngineView(frozenset(), frozenset(),
                          (f"PostgreSQL's parser reads the text differently from the guard "
                           f"({err})",))
    statements = tree.get("stmts", [])
    if len(statements) != 1 or "SelectStmt" not in statements[0].get("stmt", {}):
        return EngineView(frozenset(), frozenset(),
                          ("PostgreSQL's parser does not read exactly one query",))
    functions: set[tuple[str, str]] = set()
    tables: set[tuple[str, str, str]] = set()
    for node in _dicts(statements[0]):
        if "FuncCall" in node:
            names = [n.get("String", {}).get("sval", "") for n in node["FuncCall"]["funcname"]]
            functions.add((".".join(names[:-1]), names[-1]))
        if "RangeVar" in node:
            rv = node["RangeVar"]
            tables.add((rv.get("catalogname", ""), rv.get("schemaname", ""),
                        rv.get("relname", "")))
        if "SQLValueFunction" in node:
            op = str(node["SQLValueFunction"].get("op", ""))
            if any(word in op for word in ("USER", "ROLE", "CATALOG", "SCHEMA")):
                functions.add(("", op.removeprefix("SVFOP_").lower()))
        if "TypeCast" in node:
            names = [n.get("String", {}).get("sval", "")
                     for n in node["TypeCast"].get("typeName", {}).get("names", [])]
            if names and names[-1].lower().startswith("reg"):
                # 'name'::regrole / ::regclass look names up in the catalog
                functions.add(("", f"::{names[-1].lower()}"))
    return EngineView(frozenset(functions), frozenset(tables))


# --------------------------------------------------------------------- names the engine may see
_EXTRA_SAMPLES = ("[1, 2]", "{'a': 1}", "EXTRACT(year FROM DATE '2020-01-01')", "CURRENT_DATE",
                  "CURRENT_TIMESTAMP", "CURRENT_TIME", "LOCALTIME", "LOCALTIMESTAMP",
                  "CAST('1' AS INT)", "TRY_CAST('1' AS INT)", "CASE WHEN 1 THEN 2 END",
                  "'{\"a\":1}' -> '$.a'", "'{\"a\":1}' ->> '$.a'", "COUNT(*)")


@cache
def engine_names(dialect: str) -> frozenset[str]:
    """Function names (lower-case) the engine may resolve in a query the guard approved: the
    allow-list, plus how sqlglot writes each allowed function out again in ``dialect``
    (``count(*)`` is DuckDB's ``count_star``), as the engine's own parser reads it. Derived
    once per process (well under a second), so the allow-list stays the one list of names;
    only names sqlglot types (and so may respell) are written out again."""
    allowed = ALLOWED.get(dialect, frozenset())
    names = set(allowed)
    if dialect == "duckdb":
        names.add("error")  # only ``bounds`` writes it (a tenant's error() is refused)
    parser = Dialect.get_or_raise(dialect).parser_class
    typed = [n for n in sorted(allowed) if n.upper() in parser.FUNCTIONS
             or n.upper() in parser.FUNCTION_PARSERS or n.upper() in parser.NO_PAREN_FUNCTIONS]
    exprs: list[str] = []
    for text in [f"{n}({args})" for n in typed for args in ("1", "1, 2", "1, 2, 3", "")] + \
            list(_EXTRA_SAMPLES):
        try:
            regen = regenerate(sqlglot.parse_one(f"SELECT {text}", read=dialect), dialect,
                               quiet=True)
        except (ParseError, TokenError, ValueError, TypeError, KeyError):
            continue
        exprs.append(regen.removeprefix("SELECT "))
    if dialect == "duckdb":
        names |= _duckdb_functions(exprs)
    elif dialect == "sqlite":
        for e in exprs:
            names |= _sqlite_functions("SELECT " + e)
    elif dialect == "postgres":
        for e in exprs:
            try:
                names |= {n.lower() for _, n in postgres_view("SELECT " + e).functions}
            except RejectedStatementError:
                break  # no pglast: postgres_view refuses every query anyway
    return frozenset(names)


def _duckdb_functions(exprs: list[str]) -> set[str]:
    """Function names DuckDB's parser reads in ``SELECT e1, e2, ...``; halves the list
    where one sample does not parse (a few of sqlglot's samples are not valid DuckDB)."""
    if not exprs:
        return set()
    view = duckdb_view("SELECT " + ", ".join(exprs))
    if not view.problems:
        return {n.lower() for _, n in view.functions}
    if len(exprs) == 1:
        return set()
    half = len(exprs) // 2
    return _duckdb_functions(exprs[:half]) | _duckdb_functions(exprs[half:])


def _sqlite_functions(text: str) -> set[str]:
    seen: set[str] = set()

    def record(action: int, a1: Any, a2: Any, db: Any, source: Any) -> int:
        if action == sqlite3.SQLITE_FUNCTION and a2:
            seen.add(str(a2).lower())
        return sqlite3.SQLITE_OK

    con = sqlite3.connect(":memory:")
    con.set_authorizer(record)
    try:
        con.execute(text)
    except sqlite3.Error:
        pass
    finally:
        con.close()
    return seen


# ------------------------------------------------------------------------------------ verdicts
def check_view(view: EngineView, *, dialect: str, tables: set[tuple[str, str, str]],
               allow_catalog: bool, sql: str) -> None:
    """Raise RejectedStatementError unless every function and table in ``view`` (the engine's
    reading) is one the guard approved."""
    if view.problems:
        raise RejectedStatementError(f"refused: {view.problems[0]}; the statement did not run",
                                     sql=sql)
    allowed = engine_names(dialect)
    for schema, name in sorted(view.functions):
        low = name.lower()
        if _OPERATOR.match(low) or (low in allowed and schema.lower() in _system(dialect)):
            continue
        if allow_catalog and is_catalog_function(dialect, low):
            continue
        shown = f"{schema}.{name}" if schema else name
        raise RejectedStatementError(
            f"refused: the engine's parser reads a call of {shown}(), which the guard did not "
            "approve; the statement did not run", sql=sql)
    known = {t[2] for t in tables}
    for catalog, schema, name in sorted(view.tables):
        key = (catalog.lower(), schema.lower(), name.lower())
        if not allow_catalog:
            problem = catalog_problem(dialect, schema, name)
            if problem:
                raise RejectedStatementError(problem, sql=sql)
        if key not in tables and not (not catalog and not schema and key[2] in known):
            shown = ".".join(p for p in (catalog, schema, name) if p)
            raise RejectedStatementError(
                f"refused: the engine's parser reads table {shown!r}, which the guard did not "
                "approve; the statement did not run", sql=sql)


def _system(dialect: str) -> set[str]:
    return {"", "main", "system", "pg_catalog", "system.main", "system.pg_catalog"} \
        if dialect == "duckdb" else {"", "pg_catalog"}


def verify(text: str, *, dialect: str, tables: set[tuple[str, str, str]],
           allow_catalog: bool = False) -> None:
    """Read ``text`` with the engine's own parser (DuckDB, PostgreSQL) and refuse it unless it
    names only what the guard approved. SQLite is checked while it prepares the statement
    (``SqliteAuthorizer``)."""
    if dialect == "duckdb":
        check_view(duckdb_view(text), dialect=dialect, tables=tables,
                   allow_catalog=allow_catalog, sql=text)
    elif dialect == "postgres":
        check_view(postgres_view(text), dialect=dialect, tables=tables,
                   allow_catalog=allow_catalog, sql=text)


class SqliteAuthorizer:
    """``sqlite3.Connection.set_authorizer`` callback for one statement: SQLite calls it for
    every table column it reads and every function it resolves while preparing; anything the
    guard did not approve is denied (the prepare fails) and ``refused`` says what it was."""

    def __init__(self, tables: set[tuple[str, str, str]], *, allow_catalog: bool = False):
        self.tables = {t[2] for t in tables}
        self.allow_catalog = allow_catalog
        self.functions = engine_names("sqlite")
        self.refused: str | None = None

    def _deny(self, why: str) -> int:
        self.refused = self.refused or why
        return sqlite3.SQLITE_DENY

    def __call__(self, action: int, a1: str | None, a2: str | None, db: str | None,
                 source: str | None) -> int:
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            name = (a2 or "").lower()
            if name in self.functions or (self.allow_catalog and
                                          is_catalog_function("sqlite", name)):
                return sqlite3.SQLITE_OK
            return self._deny(f"the engine resolves function {name}(), which the guard did "
                              "not approve")
        if action == sqlite3.SQLITE_READ:
            table = (a1 or "").lower()
            if db not in (None, "main", "temp"):
                return self._deny(f"the engine reads {db}.{table}, another database")
            if table in _SQLITE_SCHEMA:
                return sqlite3.SQLITE_OK
            if not self.allow_catalog and catalog_problem("sqlite", "", table):
                return self._deny(catalog_problem("sqlite", "", table) or "")
            if table in self.tables or (source is not None and source.lower() in self.tables):
                return sqlite3.SQLITE_OK  # a table the guard saw, or one read by its view
            return self._deny(f"the engine reads table {table!r}, which the guard did not "
                              "approve")
        if action == sqlite3.SQLITE_PRAGMA and self.allow_catalog:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_UPDATE and (a1 or "").lower() in _SQLITE_SCHEMA:
            # SQLite registers a table-valued function (json_each) in its schema table on
            # first use; the connection is read-only, so nothing can really be written.
            return sqlite3.SQLITE_OK
        return self._deny(f"the engine was asked for action {action} ({a1}, {a2})")

    def error(self, sql: str) -> RejectedStatementError | None:
        if self.refused is None:
            return None
        return RejectedStatementError(f"refused: {self.refused}; the statement did not run",
                                      sql=sql)
