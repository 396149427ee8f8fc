"""Shared fixtures: small real databases made on the spot, and the shared Spider copy."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest

SHARED_SPIDER = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "spider"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tiers that need a tool outside Python, marked by what the test uses rather than by
    hand: ``postgres`` (the session's ``pg_server``), ``browser`` (Debian's Chromium through
    ``tests.server.utils.chromium``). ``ray`` and ``slow`` are marked in the tests."""
    from tests.server.utils import chromium

    for item in items:
        if "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "chromium", None) is chromium:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(autouse=True, scope="session")
def _no_shared_server_state():
    """Servers the tests start keep their state in the process unless a test gives them a
    store of its own: the default file in the user's cache would be shared by every test's
    server (and a killed one's queries re-run by the next)."""
    import os

    old = os.environ.get("AGENTFLOW_STATE")
    os.environ["AGENTFLOW_STATE"] = "off"
    yield
    if old is None:
        os.environ.pop("AGENTFLOW_STATE", None)
    else:
        os.environ["AGENTFLOW_STATE"] = old


@pytest.fixture(autouse=True, scope="session")
def _private_teaching_store(tmp_path_factory):
    """Tests (and the CLIs they start) teach into their own store, never the user's."""
    import os

    path = tmp_path_factory.mktemp("teaching") / "teaching.sqlite"
    old = os.environ.get("AGENTFLOW_TEACHING")
    os.environ["AGENTFLOW_TEACHING"] = str(path)
    yield path
    if old is None:
        os.environ.pop("AGENTFLOW_TEACHING", None)
    else:
        os.environ["AGENTFLOW_TEACHING"] = old


@pytest.fixture(autouse=True, scope="session")
def _private_host_profiles(tmp_path_factory):
    """Tests simulate local instances with the stored profiles, never with a host profile
    the user's ``agentflow calibrate`` left in the cache (tests that store one set their
    own path)."""
    import os

    path = tmp_path_factory.mktemp("host-profiles") / "host-profiles.json"
    old = os.environ.get("AGENTFLOW_HOST_PROFILES")
    os.environ["AGENTFLOW_HOST_PROFILES"] = str(path)
    yield path
    if old is None:
        os.environ.pop("AGENTFLOW_HOST_PROFILES", None)
    else:
        os.environ["AGENTFLOW_HOST_PROFILES"] = old


def make_library_sqlite(path: Path) -> Path:
    """A tiny library database: 3 tables with keys, a NULL, a date column."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.executescript("""
        PRAGMA foreign_keys = ON;
        CREATE TABLE author (author_id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT);
        CREATE TABLE book (book_id INTEGER PRIMARY KEY, title TEXT NOT NULL,
                           author_id INTEGER REFERENCES author(author_id), year INTEGER,
                           price REAL);
        CREATE TABLE loan (loan_id INTEGER PRIMARY KEY, book_id INTEGER NOT NULL,
                           loaned_on TEXT, returned_on TEXT,
                           FOREIGN KEY (book_id) REFERENCES book(book_id));
        INSERT INTO author VALUES (1, 'Ursula K. Le Guin', 'USA'), (2, 'Italo Calvino', 'Italy'),
                                  (3, 'Clarice Lispector', NULL);
        INSERT INTO book VALUES (1, 'The Dispossessed', 1, 1974, 9.5),
                                (2, 'Invisible Cities', 2, 1972, 12.0),
                                (3, 'The Hour of the Star', 3, 1977, 8.25),
                                (4, 'A Wizard of Earthsea', 1, 1968, 7.0);
        INSERT INTO loan VALUES (1, 1, '2024-01-03', '2024-01-20'), (2, 2, '2024-02-11', NULL),
                                (3, 1, '2024-03-05', '2024-03-09'), (4, 4, '2024-03-07', NULL);
    """)
    con.commit()
    con.close()
    return path


LIBRARY_QUESTIONS = [
    ("How many books are there?", "SELECT count(*) FROM book", "", "simple"),
    ("Which books did Italo Calvino write?",
     "SELECT T1.title FROM book AS T1 JOIN author AS T2 ON T1.author_id = T2.author_id "
     "WHERE T2.name = 'Italo Calvino'", "Italo Calvino refers to author.name", "simple"),
    ("List the titles of books on loan that were not returned, newest loan first.",
     "SELECT b.title FROM loan l JOIN book b ON b.book_id = l.book_id "
     "WHERE l.returned_on IS NULL ORDER BY l.loaned_on DESC",
     "not returned means returned_on IS NULL", "moderate"),
    ("What is the average price of books per author country?",
     "SELECT a.country, avg(b.price) FROM book b JOIN author a ON a.author_id = b.author_id "
     "GROUP BY a.country", "", "challenging"),
]


def make_bird_layout(root: Path) -> Path:
    """A BIRD-layout folder (dev.json, dev_tables.json, dev_databases/, descriptions)."""
    db_dir = root / "dev_databases" / "library"
    make_library_sqlite(db_dir / "library.sqlite")
    desc = db_dir / "database_description"
    desc.mkdir(parents=True)
    fields = ["original_column_name", "column_name", "column_description", "data_format",
              "value_description"]
    rows = {
        "author": [["author_id", "author id", "unique id of the author", "integer", ""],
                   ["country", "", "country of birth", "text", "NULL if unknown"]],
        "book": [["price", "price", "list price in euros", "real", "café prices excluded"]],
    }
    for table, table_rows in rows.items():
        # BIRD ships descriptions in mixed encodings: one UTF-8 with BOM, one cp1252.
        encoding = "utf-8-sig" if table == "author" else "cp1252"
        with (desc / f"{table}.csv").open("w", newline="", encoding=encoding) as fh:
            writer = csv.writer(fh)
            writer.writerow(fields)
            writer.writerows(table_rows)
    questions = [{"question_id": i, "db_id": "library", "question": q, "evidence": ev,
                  "SQL": sql, "difficulty": diff}
                 for i, (q, sql, ev, diff) in enumerate(LIBRARY_QUESTIONS)]
    (root / "dev.json").write_text(json.dumps(questions, indent=1))
    (root / "dev_tables.json").write_text(json.dumps([{"db_id": "library"}]))
    return root


def make_spider_layout(root: Path) -> Path:
    """A Spider-layout folder with the same library database."""
    make_library_sqlite(root / "database" / "library" / "library.sqlite")
    (root / "tables.json").write_text(json.dumps([{"db_id": "library"}]))
    (root / "dev.json").write_text(json.dumps(
        [{"db_id": "library", "question": q, "query": sql} for q, sql, _, _ in LIBRARY_QUESTIONS]))
    return root


@pytest.fixture
def library_db(tmp_path: Path) -> Path:
    return make_library_sqlite(tmp_path / "library.sqlite")


@pytest.fixture
def bird_dir(tmp_path: Path) -> Path:
    return make_bird_layout(tmp_path / "bird")


@pytest.fixture
def spider_dir(tmp_path: Path) -> Path:
    return make_spider_layout(tmp_path / "spider")


@pytest.fixture
def shared_spider() -> Path:
    if not (SHARED_SPIDER / "dev.json").is_file():
        pytest.skip(f"shared Spider dataset not found at {SHARED_SPIDER}")
    return SHARED_SPIDER


def in_ci() -> bool:
    """Whether this run is CI's (``CI=true``, as GitHub Actions and ``.ci/run``'s callers set)."""
    import os

    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server (Debian's binaries) for the whole test session, on a free
    loopback port in a temp folder. Skipped, with the reason, where the binaries (or
    psycopg) are absent. Where they are installed but the server does not start, CI
    (``CI=true``) fails every PostgreSQL test with the reason: a skip there once hid that
    postgres crashed at start in every full run (55 tests skipped, the run green). Outside
    CI it skips, saying why."""
    from agentflow.sql.pg_local import LocalPostgres, PostgresUnavailable, find_bindir

    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg (3) is not installed: pip install 'psycopg[binary]'")
    try:
        find_bindir()
    except PostgresUnavailable as err:
        pytest.skip(f"PostgreSQL server not available: {err}")
    # Twice: one failed start (a busy machine, a port taken between the pick and the bind)
    # would otherwise fail or skip every PostgreSQL test of the session.
    for attempt in (1, 2):
        try:
            server = LocalPostgres().init().start()
            break
        except PostgresUnavailable as err:
            if attempt == 2:
                if in_ci():
                    pytest.fail(f"PostgreSQL is installed but the test server did not start "
                                f"(twice); CI=true fails rather than skip: {err}",
                                pytrace=False)
                pytest.skip(f"PostgreSQL server not available: {err}")
    yield server
    server.close()
