import pytest

from agentflow.sql import RejectedStatementError, SqlSyntaxError, check_query


@pytest.mark.parametrize("sql", [
    "SELECT 1",
    "select name from singer where age > 30 order by name limit 3",
    "WITH t AS (SELECT 1 AS x) SELECT x FROM t",
    "SELECT 1 UNION SELECT 2",
    "SELECT a FROM t INTERSECT SELECT a FROM u",
    "SELECT a FROM t EXCEPT SELECT a FROM u",
    "(SELECT 1)",
    "SELECT 1;",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) SELECT * FROM c",
])
@pytest.mark.parametrize("dialect", ["sqlite", "duckdb"])
def test_read_only_queries_are_allowed(sql: str, dialect: str) -> None:
    check_query(sql, dialect)


@pytest.mark.parametrize("sql, reason", [
    ("DROP TABLE singer", "DROP"),
    ("DELETE FROM singer", "DELETE"),
    ("UPDATE singer SET age = 1", "UPDATE"),
    ("INSERT INTO singer VALUES (1)", "INSERT"),
    ("CREATE TABLE x (a INT)", "CREATE"),
    ("ALTER TABLE singer ADD COLUMN x INT", "ALTER"),
    ("ATTACH DATABASE 'other.db' AS other", "ATTACH"),
    ("PRAGMA writable_schema = 1", "PRAGMA"),
    ("VACUUM", "VACUUM"),
    ("SELECT 1; SELECT 2", "exactly one statement"),
    ("SELECT 1; DROP TABLE singer", "exactly one statement"),
    ("SELECT * INTO copy FROM singer", "INTO"),
    ("SELECT * FROM read_csv('/etc/passwd')", "read"),
    ("SELECT load_extension('evil.so')", "load_extension"),
    ("SELECT readfile('/etc/passwd')", "readfile"),
    ("COPY singer TO 'out.csv'", "COPY"),
    ("", "empty"),
    ("   ", "empty"),
])
def test_everything_else_is_rejected_with_a_reason(sql: str, reason: str) -> None:
    with pytest.raises(RejectedStatementError) as info:
        check_query(sql, "sqlite" if "read_csv" not in sql else "duckdb")
    assert reason.lower() in str(info.value).lower()
    assert info.value.kind == "rejected"


def test_syntax_errors_carry_a_position() -> None:
    with pytest.raises(SqlSyntaxError) as info:
        check_query("SELECT name FROM singer WHERE", "sqlite")
    assert info.value.line == 1
    assert info.value.column is not None and info.value.column > 20
    assert "line 1" in str(info.value)
