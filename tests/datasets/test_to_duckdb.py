import sqlite3
from pathlib import Path

import duckdb

from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb


def test_tables_rows_types_and_keys_are_copied(library_db: Path, tmp_path: Path) -> None:
    report = convert_sqlite_to_duckdb(library_db, tmp_path / "lib.duckdb")
    assert {t.name: t.rows for t in report.tables} == {"author": 3, "book": 4, "loan": 4}
    book = next(t for t in report.tables if t.name == "book")
    assert book.column_types == {"book_id": "BIGINT", "title": "VARCHAR", "author_id": "BIGINT",
                                 "year": "BIGINT", "price": "DOUBLE"}
    con = duckdb.connect(str(tmp_path / "lib.duckdb"), read_only=True)
    fks = con.execute("SELECT table_name, referenced_table FROM duckdb_constraints() "
                      "WHERE constraint_type = 'FOREIGN KEY' ORDER BY 1").fetchall()
    assert fks == [("book", "author"), ("loan", "book")]
    assert con.execute("SELECT count(*) FROM author WHERE country IS NULL").fetchone() == (1,)
    con.close()


def test_messy_sqlite_columns_and_broken_keys_are_survived(tmp_path: Path) -> None:
    """Benchmark databases hold text in INT columns and keys their data violate."""
    src = tmp_path / "messy.sqlite"
    con = sqlite3.connect(src)
    con.executescript("""
        CREATE TABLE team (id INT PRIMARY KEY, name TEXT);
        CREATE TABLE player (pid INT PRIMARY KEY, team_id INT REFERENCES team(id),
                             height INT, born DATE);
        INSERT INTO team VALUES (1, 'A'), (NULL, 'SQLite lets an INT PRIMARY KEY be NULL');
        INSERT INTO player VALUES (1, 1, 180, '1990-01-01'), (2, 9, 'tall', NULL),
                                  (3, 1, 175.5, '1991-02-03');
    """)
    con.commit()
    con.close()
    report = convert_sqlite_to_duckdb(src, tmp_path / "messy.duckdb")
    player = next(t for t in report.tables if t.name == "player")
    assert player.column_types["height"] == "VARCHAR"
    assert any("mixes" in n for n in player.notes)
    assert player.column_types["born"] == "VARCHAR"
    team = next(t for t in report.tables if t.name == "team")
    assert any("primary key" in n for n in team.notes)
    assert any("dropped foreign key" in n for n in report.notes)
    con = duckdb.connect(str(tmp_path / "messy.duckdb"), read_only=True)
    assert con.execute("SELECT height FROM player ORDER BY pid").fetchall() == [
        ("180",), ("tall",), ("175.5",)]
    con.close()
