"""A throwaway PostgreSQL server in a temporary folder, for tests, benchmarks and demos.

It runs the distribution's own binaries (Debian's ``postgresql`` package: ``initdb``,
``pg_ctl``) on a free loopback port. PostgreSQL refuses to run as root, so when we are root
the data folder is handed to the unprivileged ``postgres`` user and the server runs as that
user. The superuser ``postgres`` is reached through the server's Unix socket in the temp
folder (trust, local only); TCP logins on 127.0.0.1 need a password (scram-sha-256), like a
real deployment.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow.children import popen_tied

# What one reader's query may use on the server: disk for spills, memory per sort/hash, and a
# backstop time limit for any statement (agentflow sets a tighter one per query).
READER_LIMITS = {"temp_file_limit": "256MB", "work_mem": "32MB", "statement_timeout": "120s"}


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed (or cannot run here)."""


def find_bindir() -> Path:
    """Where ``initdb``/``pg_ctl`` are: ``PG_BINDIR``, Debian's versioned folder, or PATH."""
    candidates = [os.environ.get("PG_BINDIR", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit()
                         else 0, reverse=True)
    which = shutil.which("pg_ctl")
    if which:
        candidates.append(str(Path(which).resolve().parent))
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) not found; install Debian's `postgresql` "
        "package (bash .ci/install-postgres) or set PG_BINDIR")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalPostgres:
    """``with LocalPostgres() as pg: pg.admin_url ...``; ``restart()`` for reconnect tests."""

    port: int = 0
    root: Path | None = None  # None: a temporary folder, removed by close()
    bindir: Path = field(default_factory=find_bindir)
    _run_as: str | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.port = self.port or _free_port()
        self._own_root = self.root is None
        self.home = Path(self.root or tempfile.mkdtemp(prefix="agentflow-pg-"))
        self.root = self.home
        self.data = self.home / "data"
        self.socket_dir = self.home / "sock"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as err:
                raise PostgresUnavailable("running as root and there is no `postgres` user "
                                          "to run the server as") from err
            self._run_as = "postgres"

    # ------------------------------------------------------------------ lifecycle
    def _cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        kwargs: dict[str, Any] = {"user": self._run_as} if self._run_as else {}
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120,
                              cwd=self.home, **kwargs)

    def init(self) -> LocalPostgres:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as:
            entry = pwd.getpwnam(self._run_as)
            for p in (self.home, self.socket_dir):
                os.chown(p, entry.pw_uid, entry.pw_gid)
        if not (self.data / "PG_VERSION").exists():
            self._cmd("initdb", "-D", str(self.data), "--username=postgres", "--auth-local=trust",
                      "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8",
                      "--no-sync")
        return self

    def start(self, timeout_s: float = 60.0) -> LocalPostgres:
        """Run ``postgres`` itself as this process's child, tied to it (``children``): it
        stops when this process dies, however it dies. (``pg_ctl start`` daemonises the
        server, so a test run killed midway left it running.)"""
        cmd = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
               "-c", "listen_addresses=127.0.0.1",
               "-c", f"unix_socket_directories={self.socket_dir}", "-c", "fsync=off",
               "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
               "-c", "max_connections=60", "-c", "shared_buffers=32MB", "-c", "autovacuum=off"]
        log = self.home / "server.log"
        kwargs: dict[str, Any] = {"user": self._run_as} if self._run_as else {}
        with open(log, "ab") as out:
            # SIGQUIT: PostgreSQL's immediate shutdown (the postmaster stops its backends)
            self._proc = popen_tied(cmd, death_signal=signal.SIGQUIT, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.home, **kwargs)
        deadline = time.monotonic() + timeout_s
        while not self._accepting():
            code = self._proc.poll()
            if code is not None or time.monotonic() > deadline:
                self._proc.kill()
                self._proc.wait()
                how = f"exited with status {code}" if code is not None else \
                    f"not accepting connections after {timeout_s:g} s"
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                raise PostgresUnavailable(f"postgres did not start ({how}):\n{tail}")
            time.sleep(0.1)
        return self

    def _accepting(self) -> bool:
        out = self._cmd("pg_isready", "-q", "-h", str(self.socket_dir), "-p", str(self.port),
                        check=False)
        return out.returncode == 0

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def stop(self, mode: str = "fast") -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal({"smart": signal.SIGTERM, "fast": signal.SIGINT,
                          "immediate": signal.SIGQUIT}[mode])
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, down_s: float = 0.0) -> None:
        """Stop (terminating sessions, as an operator's restart does), wait, start again."""
        self.stop("fast")
        time.sleep(down_s)
        self.start()

    def __enter__(self) -> LocalPostgres:
        return self.init().start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop("immediate")
        if self._own_root:
            shutil.rmtree(self.home, ignore_errors=True)

    # ------------------------------------------------------------------ access
    @property
    def admin_url(self) -> str:
        """Superuser over the Unix socket (trust): for setting up, never for agentflow."""
        return f"postgresql+psycopg://postgres@/postgres?host={self.socket_dir}&port={self.port}"

    def admin_connect(self, dbname: str = "postgres"):
        import psycopg

        return psycopg.connect(host=str(self.socket_dir), port=self.port, user="postgres",
                               dbname=dbname, autocommit=True)

    def url(self, user: str, dbname: str, password: str | None = None) -> str:
        cred = f"{user}:{password}" if password else user
        return f"postgresql://{cred}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> None:
        with self.admin_connect() as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  (name,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')

    def create_reader(self, role: str, password: str, dbname: str) -> None:
        """A login role that can read every table of ``dbname`` and write nothing: what
        agentflow should be given (see ``agentflow.sql.postgres.check_role``)."""
        with self.admin_connect() as conn:
            literal = "'" + password.replace("'", "''") + "'"
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(f'CREATE ROLE "{role}" LOGIN')
            conn.execute(f'ALTER ROLE "{role}" LOGIN PASSWORD {literal}')
            conn.execute(f'ALTER ROLE "{role}" SET default_transaction_read_only = on')
            # Limits the server enforces per query (issue 35 §2); temp_file_limit only a
            # superuser may set, so the reader cannot raise it. agentflow lowers
            # statement_timeout and work_mem per query (SET LOCAL) within these.
            for name, value in READER_LIMITS.items():
                conn.execute(f'ALTER ROLE "{role}" SET {name} = \'{value}\'')
            conn.execute('REVOKE CREATE ON SCHEMA public FROM PUBLIC')
        with self.admin_connect(dbname) as conn:
            conn.execute('REVOKE CREATE ON SCHEMA public FROM PUBLIC')
            conn.execute(f'REVOKE TEMPORARY ON DATABASE "{dbname}" FROM PUBLIC')
            grant_read(conn, role)


def grant_read(conn, role: str) -> None:
    """Give ``role`` USAGE and SELECT on every non-system schema of the connected database."""
    schemas = [r[0] for r in conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
        "AND nspname <> 'information_schema'")]
    for schema in schemas:
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
