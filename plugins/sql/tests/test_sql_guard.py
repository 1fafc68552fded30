"""The sqlglot gate: only single read queries pass; other dialects are transpiled."""

from __future__ import annotations

import sqlite3

import pytest

from toolenv_sql.errors import SQLError
from toolenv_sql.guard import is_ordered, prepare


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "select name from singer;",
        "WITH a AS (SELECT 1 AS x) SELECT x FROM a",
        "SELECT 1 UNION SELECT 2",
        "SELECT 1 INTERSECT SELECT 1",
        "SELECT 1 EXCEPT SELECT 2",
        "VALUES (1, 'a'), (2, 'b')",
        "SELECT `Name` FROM `Album`",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) SELECT x FROM c",
    ],
)
def test_read_queries_pass_unchanged(sql: str) -> None:
    assert prepare(sql, dialect=None, engine="sqlite") == sql.strip().rstrip(";").strip()


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("INSERT INTO singer VALUES (1)", "INSERT"),
        ("UPDATE singer SET name = 'x'", "UPDATE"),
        ("DELETE FROM singer", "DELETE"),
        ("DROP TABLE singer", "DROP"),
        ("CREATE TABLE t (a INT)", "CREATE"),
        ("ALTER TABLE singer ADD COLUMN z INT", "ALTER"),
        ("ATTACH DATABASE '/tmp/x.db' AS x", "ATTACH"),
        ("DETACH DATABASE x", "DETACH"),
        ("PRAGMA journal_mode = WAL", "PRAGMA"),
        ("VACUUM INTO '/tmp/copy.db'", "VACUUM"),
        ("WITH a AS (DELETE FROM t RETURNING *) SELECT * FROM a", "DELETE"),
        ("SELECT * INTO copy FROM singer", "INTO"),
        ("BEGIN", "BEGIN"),
    ],
)
def test_writes_and_ddl_are_rejected_by_kind(sql: str, needle: str) -> None:
    with pytest.raises(SQLError, match="Only read queries are allowed") as err:
        prepare(sql, dialect=None, engine="sqlite")
    assert needle in str(err.value)


def test_several_statements_are_rejected() -> None:
    with pytest.raises(SQLError, match="found 2"):
        prepare("SELECT 1; DROP TABLE singer", dialect=None, engine="sqlite")


@pytest.mark.parametrize("sql", ["", "   ", ";", "-- just a comment"])
def test_empty_query(sql: str) -> None:
    with pytest.raises(SQLError, match="empty"):
        prepare(sql, dialect=None, engine="sqlite")


def test_syntax_error_names_the_dialect() -> None:
    with pytest.raises(SQLError, match=r"syntax error \(sqlite\)"):
        prepare("SELECT 'unterminated", dialect=None, engine="sqlite")


def test_extension_loading_function_is_rejected() -> None:
    with pytest.raises(SQLError, match=r"load_extension\(\) is not allowed"):
        prepare("SELECT load_extension('/tmp/evil.so')", dialect=None, engine="sqlite")


def test_mysql_is_transpiled_to_sqlite_and_runs() -> None:
    sql = prepare("SELECT CONCAT(`a`, 'x') AS s FROM (SELECT 'q' AS a) t LIMIT 1", dialect="mysql", engine="sqlite")
    assert "`" not in sql
    assert sqlite3.connect(":memory:").execute(sql).fetchall() == [("qx",)]


def test_postgres_is_transpiled_to_sqlite_and_runs() -> None:
    sql = prepare(
        "SELECT a::int AS n FROM (SELECT '7' AS a) t WHERE 'Ab' ILIKE 'ab'", dialect="postgres", engine="sqlite"
    )
    assert sqlite3.connect(":memory:").execute(sql).fetchall() == [(7,)]


def test_writes_are_rejected_in_other_dialects_too() -> None:
    with pytest.raises(SQLError, match="INSERT"):
        prepare("INSERT INTO t VALUES (1)", dialect="postgres", engine="sqlite")


def test_is_ordered_looks_at_the_outermost_level_only() -> None:
    assert is_ordered("SELECT a FROM t ORDER BY a", "sqlite")
    assert is_ordered("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", "sqlite")
    assert not is_ordered("SELECT a FROM (SELECT a FROM t ORDER BY a)", "sqlite")
    assert not is_ordered("SELECT a FROM t", "sqlite")


def test_rejected_commands_do_not_echo_into_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"), pytest.raises(SQLError, match="EXPLAIN"):
        prepare("EXPLAIN SELECT 1", dialect=None, engine="sqlite")
    assert not [r for r in caplog.records if r.name == "sqlglot"]


def test_checks_are_cached_but_rejections_still_raise() -> None:
    assert prepare("SELECT 42", dialect=None, engine="sqlite") == prepare("SELECT 42", dialect=None, engine="sqlite")
    for _ in range(2):
        with pytest.raises(SQLError):
            prepare("DELETE FROM t", dialect=None, engine="sqlite")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1; -- a note",
        "SELECT 1; /* a note */",
        "SELECT 1;\n-- one\n-- two\n",
        "SELECT 1; ; -- note",
        "SELECT 1 -- no semicolon",
        "/* lead */ SELECT 1; -- and trail",
    ],
)
def test_a_comment_after_the_last_semicolon_is_not_a_statement(sql: str) -> None:
    prepared = prepare(sql, dialect=None, engine="sqlite")
    assert prepared.endswith("SELECT 1")  # the trailing comment and semicolons are gone
    assert sqlite3.connect(":memory:").execute(prepared).fetchall() == [(1,)]
    transpiled = prepare(sql, dialect="mysql", engine="sqlite")
    assert sqlite3.connect(":memory:").execute(transpiled).fetchall() == [(1,)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1; /* note */ DROP TABLE singer",
        "SELECT 1; -- note\nDELETE FROM singer",
        "SELECT 1; SELECT 2 -- note",
        "SELECT 1; -- note\nSELECT 2; -- note",
    ],
)
def test_stacked_statements_around_comments_are_still_rejected(sql: str) -> None:
    with pytest.raises(SQLError, match="found 2"):
        prepare(sql, dialect=None, engine="sqlite")


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT Name FROM singer WHERE Age >", "incomplete expression near '>' (line 1, column 35)"),
        ("SELECT Name FROM singer\nWHERE Name = 'Joe' AND", "incomplete expression near 'AND' (line 2, column 20)"),
        ("SELECT * FROM singer JOIN", "expected table name after 'JOIN', but the query ends there (line 1, column 22)"),
        ("SELECT 'abc", "unterminated string literal (no closing ') starting at line 1, column 8: 'abc"),
        ('SELECT "Name FROM singer', 'unterminated quoted name (no closing ") starting at line 1, column 8'),
        ("SELECT count(Name FROM singer", "expected ')' near 'FROM' (line 1, column 19)"),
        ("SELECT Name Age Song FROM singer", "unexpected 'Song' (line 1, column 17)"),
    ],
)
def test_syntax_errors_name_the_problem_in_plain_words(sql: str, message: str) -> None:
    with pytest.raises(SQLError) as err:
        prepare(sql, dialect=None, engine="sqlite")
    text = str(err.value)
    assert text.startswith("SQL syntax error (sqlite): ") and message in text, text
    for internal in ("<class", "<Token", "TokenType", "sqlglot", "Required keyword", "Error tokenizing"):
        assert internal not in text


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT (SELECT count(*) FROM pragma_compile_options()) AS n",
        "SELECT count(*) FROM singer, PRAGMA_FUNCTION_LIST() AS p",
        # Without parentheses SQLite still calls the function; it used to pass the guard and get
        # the authorizer's bare "not authorized".
        "SELECT * FROM pragma_database_list",
        "SELECT name FROM main.PRAGMA_collation_list AS c",
    ],
)
def test_pragma_table_functions_are_refused_as_pragma(sql: str) -> None:
    with pytest.raises(SQLError, match=r"PRAGMA functions are not allowed: pragma_\w+\(\)"):
        prepare(sql, dialect=None, engine="sqlite")
