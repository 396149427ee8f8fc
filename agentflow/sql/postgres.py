"""PostgreSQL: read-only pooled connections, a role check, and catalog introspection.

Read-only is enforced three times over: every session starts with
``default_transaction_read_only=on`` (so each query runs in a read-only transaction, which
PostgreSQL itself enforces for DML, DDL, ``nextval``, ``COPY ... TO PROGRAM``, ``NOTIFY``...),
the guard's allow-list rejects what a read-only transaction still permits (``set_config``,
advisory locks, ``dblink``, ``pg_read_file``, ``lo_import`` — a superuser's large-object write
is not stopped by read-only mode —, ``pg_terminate_backend``, ``FOR UPDATE``), and
``check_role`` tells whether the login role could write at all — the role is the one layer an
operator controls, so agentflow recommends a role without write grants and can insist on it.

Credentials never appear in a URL that is logged or shown: a password may come from an
environment variable named in the config, from a ``.pgpass``-style file (libpq's own
``passfile``), or from libpq's ``PGPASSWORD``/``PGPASSFILE``; the password is scrubbed from
every error message the database produces.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from agentflow.sql.schema import Column, ForeignKey, Schema, SchemaSource, Table

log = logging.getLogger(__name__)

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


class ReadOnlyRoleError(PermissionError):
    """The login role can write and the configuration requires a read-only one."""


@dataclass(frozen=True)
class RoleCheck:
    """What the login role could do if the read-only transaction were not there."""

    role: str
    superuser: bool
    writable_tables: int  # tables it may INSERT/UPDATE/DELETE/TRUNCATE
    creatable_schemas: list[str]  # schemas it may CREATE objects in
    read_only_default: bool  # default_transaction_read_only is on for its sessions

    @property
    def read_only(self) -> bool:
        return not self.superuser and not self.writable_tables and not self.creatable_schemas

    def problems(self) -> list[str]:
        out = []
        if self.superuser:
            out.append("is a superuser")
        if self.writable_tables:
            out.append(f"may write {self.writable_tables} tables")
        if self.creatable_schemas:
            out.append(f"may create objects in {', '.join(self.creatable_schemas)}")
        return out


@dataclass(frozen=True)
class PostgresEngine:
    """A pooled, read-only PostgreSQL engine and what a ``Database`` over it keeps: the
    passwords to scrub from its messages and its schema search path."""

    engine: Engine
    secrets: tuple[str, ...]
    search_path: tuple[str, ...]


def postgres_engine(url: URL, *,
                    search_path: list[str] | tuple[str, ...] | str | None = None,
                    pool_size: int = 4, max_overflow: int = 4, pool_timeout_s: float = 30.0,
                    connect_timeout_s: int = 10, password_env: str | None = None,
                    passfile: str | None = None) -> PostgresEngine:
    """A pooled, read-only PostgreSQL engine (psycopg 3 driver); ``Database.open`` wraps it.

    ``pool_pre_ping`` tests a pooled connection before each use, so after a server restart
    the first query gets a fresh connection instead of a dead one."""
    if isinstance(search_path, str):
        search_path = [p.strip() for p in search_path.split(",") if p.strip()]
    search_path = tuple(search_path or ())
    for name in search_path:
        if not _SCHEMA_NAME.match(name):
            raise ValueError(f"invalid schema name in search_path: {name!r}")
    secrets = []
    connect_args: dict[str, Any] = {"connect_timeout": connect_timeout_s,
                                    "application_name": "agentflow"}
    if password_env:
        password = os.environ.get(password_env)
        if password is None:
            raise ValueError(f"environment variable {password_env} (the database password) "
                             "is not set")
        connect_args["password"] = password
        secrets.append(password)
    if passfile:
        connect_args["passfile"] = os.path.expanduser(passfile)
    if url.password:
        secrets.append(str(url.password))
    options = "-c default_transaction_read_only=on"
    if search_path:
        options += " -c search_path=" + ",".join(search_path)
    connect_args["options"] = options
    engine = sa.create_engine(url.set(drivername="postgresql+psycopg"), pool_size=pool_size,
                              max_overflow=max_overflow, pool_timeout=pool_timeout_s,
                              pool_pre_ping=True, hide_parameters=True,
                              connect_args=connect_args)
    sa.event.listen(engine, "begin", _set_role_on_begin)
    return PostgresEngine(engine=engine, secrets=tuple(secrets), search_path=search_path)


def require_read_only_role(db: SchemaSource) -> None:
    """Refuse (``ReadOnlyRoleError``) a login role that could write."""
    check = check_role(db)
    if not check.read_only:
        raise ReadOnlyRoleError(
            f"database {db.id!r}: role {check.role!r} {'; '.join(check.problems())}; "
            "give agentflow a role with only SELECT grants (docs/serving.md, PostgreSQL "
            "databases)")


# --------------------------------------------------------------------------- tenant roles
# Why SET LOCAL ROLE per transaction rather than a pool per role: one pool serves every
# tenant, and ``SET LOCAL`` ends with the transaction, which ``Database.execute`` always rolls
# back — a pooled connection cannot carry one tenant's role into another's query, even when
# a statement fails half-way. The login role must be a member of each tenant role (``GRANT
# tenant_a TO reader``); a role that does not exist or is not granted fails the query (never
# falls back to the login role).
ROLE_OPTION = "agentflow_role"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def role_of(db: SchemaSource) -> str | None:
    """The tenant role ``db``'s statements run as (None: the login role)."""
    return db.engine.get_execution_options().get(ROLE_OPTION)


def _apply_role(raw: Any, role: str | None) -> None:
    if role:
        cur = raw.cursor()
        try:
            cur.execute(f"SET LOCAL ROLE {quote_ident(role)}")
        finally:
            cur.close()


def _set_role_on_begin(conn: Any) -> None:
    """SQLAlchemy ``begin`` event: every transaction of a role view starts as its role."""
    _apply_role(conn.connection.dbapi_connection, conn.get_execution_options().get(ROLE_OPTION))


def check_role(db: SchemaSource) -> RoleCheck:
    """Ask the server what the login role may do (read-only catalog queries)."""
    with db.engine.connect() as conn:
        role, superuser, ro = conn.exec_driver_sql(
            "SELECT current_user, rolsuper, current_setting('default_transaction_read_only') "
            "FROM pg_roles WHERE rolname = current_user").one()
        writable = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', "
            "'information_schema') AND left(n.nspname, 3) <> 'pg_' AND "
            "has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')").scalar()
        creatable = [r[0] for r in conn.exec_driver_sql(
            "SELECT nspname FROM pg_namespace WHERE left(nspname, 3) <> 'pg_' AND nspname <> "
            "'information_schema' AND has_schema_privilege(oid, 'CREATE') ORDER BY 1")]
        conn.rollback()
    return RoleCheck(role=role, superuser=bool(superuser), writable_tables=int(writable or 0),
                     creatable_schemas=creatable, read_only_default=ro == "on")


def _one(cur: Any) -> tuple:
    """The row of a query that always returns exactly one (an aggregate, a setting)."""
    row = cur.fetchone()
    if row is None:
        raise RuntimeError("a single-row catalog query returned no row")
    return tuple(row)


# --------------------------------------------------------------------------- introspection
_TABLES_SQL = """
SELECT c.oid, n.nspname, c.relname, c.relkind, obj_description(c.oid, 'pg_class'),
       c.reltuples::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND n.nspname = ANY(%(schemas)s)
  AND NOT c.relispartition AND has_table_privilege(c.oid, 'SELECT')
ORDER BY array_position(%(schemas)s, n.nspname::text), c.relname
"""

_COLUMNS_SQL = """
SELECT a.attrelid, a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
       col_description(a.attrelid, a.attnum), t.typtype,
       CASE WHEN t.typtype = 'e' THEN
         (SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder) FROM pg_enum e
          WHERE e.enumtypid = t.oid) END
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = ANY(%(oids)s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""

_KEYS_SQL = """
SELECT con.conrelid, con.contype, con.confrelid,
       (SELECT array_agg(a.attname::text ORDER BY k.i) FROM unnest(con.conkey) WITH ORDINALITY
          k(n, i) JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n),
       (SELECT array_agg(a.attname::text ORDER BY k.i) FROM unnest(con.confkey) WITH ORDINALITY
          k(n, i) JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n)
FROM pg_constraint con
WHERE con.contype IN ('p', 'f') AND con.conrelid = ANY(%(oids)s)
"""


def introspect_postgres(db: SchemaSource) -> Schema:
    """Tables, views and their columns from ``pg_catalog``, in ``search_path`` order.

    Tables in the first schema of the search path keep bare names; others are named
    ``schema.table`` (what a query must write to reach them). Comments (``COMMENT ON``) and
    enum labels come along: they are the documentation users write."""
    with db.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        if raw is None:
            raise RuntimeError("the pooled PostgreSQL connection is already closed")
        _apply_role(raw, role_of(db))  # what the tenant's role may see, not the login's
        cur = raw.cursor()
        cur.execute("SELECT current_schemas(false)")
        schemas = list(_one(cur)[0] or [])
        if not schemas:
            cur.execute("SELECT array_agg(nspname::text) FROM pg_namespace WHERE nspname NOT "
                        "LIKE 'pg\\_%' AND nspname <> 'information_schema'")
            schemas = list(_one(cur)[0] or [])
        cur.execute(_TABLES_SQL, {"schemas": schemas})
        rels = cur.fetchall()
        oids = [r[0] for r in rels]
        cur.execute(_COLUMNS_SQL, {"oids": oids})
        columns: dict[int, list[tuple]] = {}
        for row in cur.fetchall():
            columns.setdefault(row[0], []).append(row[1:])
        cur.execute(_KEYS_SQL, {"oids": oids})
        keys = cur.fetchall()
        cur.close()
        conn.rollback()
    default = schemas[0] if schemas else "public"
    names = {oid: (rel if nsp == default else f"{nsp}.{rel}") for oid, nsp, rel, *_ in rels}
    pks: dict[int, set[str]] = {}
    fks: dict[int, list] = {}
    for relid, contype, ref_oid, cols, ref_cols in keys:
        if contype == "p":
            pks.setdefault(relid, set()).update(cols or [])
        elif ref_oid in names:
            fks.setdefault(relid, []).append(
                ForeignKey(tuple(cols or ()), names[ref_oid], tuple(ref_cols or ())))
    tables = []
    for oid, nsp, rel, relkind, comment, reltuples in rels:
        cols = tuple(
            Column(name=name, type=dtype, primary_key=name in pks.get(oid, ()),
                   nullable=bool(nullable), comment=ccomment or "",
                   values=tuple(labels or ()))
            for name, dtype, nullable, ccomment, _typtype, labels in columns.get(oid, []))
        tables.append(Table(name=names[oid], columns=cols,
                            foreign_keys=tuple(fks.get(oid, ())), comment=comment or "",
                            kind="view" if relkind in ("v", "m") else "table",
                            schema=nsp, bare_name=rel, row_estimate=int(reltuples)))
    return Schema(tables=tuple(tables))
