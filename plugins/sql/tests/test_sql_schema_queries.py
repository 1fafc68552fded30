"""SHOW / DESCRIBE / SQLite's schema PRAGMAs: still refused (only parsed read queries reach the engine), but the message
says how to read the schema on that engine, with a query that runs there.

Models trained on MySQL write `SHOW TABLES` and `DESCRIBE t`; "Only read queries are allowed
… The database is read-only" is wrong for them (they are reads) and tells the model nothing.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import toolenv  # noqa: F401  (registers the toolenv/ ids)
from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolResult
from toolenv_sql import SQLTool
from toolenv_sql.errors import SQLError
from toolenv_sql.guard import prepare

SINGER = "spider_dev_sample/database/concert_singer/concert_singer.sqlite"

SCHEMA_QUERIES = [
    ("mysql", "SHOW TABLES"),
    ("mysql", "SHOW FULL TABLES"),
    ("mysql", "SHOW COLUMNS FROM singer"),
    ("mysql", "SHOW CREATE TABLE singer"),
    ("mysql", "DESCRIBE singer"),
    ("mysql", "DESC singer;"),
    ("sqlite", "SHOW TABLES"),
    ("sqlite", "DESCRIBE singer"),
    ("postgres", "SHOW TABLES"),
    ("duckdb", "SHOW TABLES"),
    ("duckdb", "DESCRIBE singer"),
    ("sqlite", "PRAGMA table_info(singer)"),
    ("sqlite", "PRAGMA main.table_xinfo('singer')"),
    ("sqlite", "pragma table_list"),
    ("sqlite", "PRAGMA index_list(singer);"),
    ("sqlite", "PRAGMA foreign_key_list = singer_in_concert"),
]


def _hint(message: str) -> str:
    """The query the message suggests (after "run: ")."""
    assert "run: " in message, message
    return message.split("run: ", 1)[1]


async def call(tool: SQLTool, query: str, context: dict[str, object]) -> ToolResult:
    results, _ = await ToolCaller([tool]).invoke(
        [ToolCall(name="sql", arguments={"query": query}, id="c0")], ToolContext(Task(context=context))
    )
    return results[0]


@pytest.mark.parametrize(("dialect", "sql"), SCHEMA_QUERIES)
@pytest.mark.parametrize("engine", ["sqlite", "duckdb"])
def test_schema_statements_are_refused_with_what_to_run_instead(dialect: str, sql: str, engine: str) -> None:
    with pytest.raises(SQLError) as err:
        prepare(sql, dialect=dialect, engine=engine)
    message = str(err.value)
    assert "read-only" not in message and "Only read queries" not in message, message
    assert sql.split()[0].upper().rstrip(";") in message  # names what was refused
    assert "question" in message  # where the schema already is
    assert ("information_schema.columns" if engine == "duckdb" else "sqlite_master") in _hint(message)
    assert "\n" not in message


@pytest.mark.parametrize("dialect", [None, "mysql", "postgres"])
async def test_the_suggested_query_runs_on_sqlite(dialect: str | None) -> None:
    tool = SQLTool(dialect=dialect)
    refused = await call(tool, "SHOW TABLES", {"db_path": SINGER})
    assert refused.is_error
    listed = await call(tool, _hint(refused.text), {"db_path": SINGER})
    assert not listed.is_error, listed.text
    names = {row[0] for row in listed.metadata["rows"]}
    assert {"singer", "concert", "stadium", "singer_in_concert"} <= names
    assert any("CREATE TABLE" in str(cell) for row in listed.metadata["rows"] for cell in row)


@pytest.mark.parametrize("dialect", [None, "mysql", "postgres"])
async def test_the_suggested_query_runs_on_duckdb(tmp_path: Path, dialect: str | None) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install 'toolenv-sql[duckdb]')")
    conn = duckdb.connect(str(tmp_path / "shop.duckdb"))
    conn.execute("CREATE TABLE items (id INTEGER, name VARCHAR)")
    conn.close()
    tool = SQLTool(root=tmp_path, dialect=dialect)
    refused = await call(tool, "DESCRIBE items", {"db_path": "shop.duckdb"})
    assert refused.is_error
    listed = await call(tool, _hint(refused.text), {"db_path": "shop.duckdb"})
    assert not listed.is_error, listed.text
    assert [row[:3] for row in listed.metadata["rows"]] == [["items", "id", "INTEGER"], ["items", "name", "VARCHAR"]]


def test_a_mysql_model_in_spider_is_told_how_to_list_the_tables() -> None:
    env = gym.make("toolenv/Spider-v0", dialect="mysql", max_turns=5)
    env.reset(options={"task_id": "spider-dev-0000"})
    refused, *_ = env.step("<sql>SHOW TABLES</sql>")
    listed, *_ = env.step(f"<sql>{_hint(refused.removesuffix('</information>'))}</sql>")
    env.close()
    assert "sqlite_master" in refused and "read-only" not in refused
    assert "singer_in_concert" in listed and "CREATE TABLE" in listed


@pytest.mark.parametrize(
    ("dialect", "sql"), [("mysql", "EXPLAIN SELECT 1"), ("sqlite", "PRAGMA journal_mode = WAL"), ("mysql", "SET x = 1")]
)
def test_other_statements_keep_the_read_only_refusal(dialect: str, sql: str) -> None:
    with pytest.raises(SQLError, match="Only read queries are allowed"):
        prepare(sql, dialect=dialect, engine="sqlite")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT name FROM pragma_table_info('singer')",
        "SELECT count(*) FROM singer, PRAGMA_INDEX_LIST('singer') AS p",
        "SELECT * FROM pragma_table_list",
    ],
)
async def test_schema_pragma_functions_get_the_schema_query(sql: str) -> None:
    refused = await call(SQLTool(), sql, {"db_path": SINGER})
    assert refused.is_error and "is not supported here" in refused.text and "PRAGMA functions" not in refused.text
    listed = await call(SQLTool(), _hint(refused.text), {"db_path": SINGER})
    assert not listed.is_error and "singer" in {row[0] for row in listed.metadata["rows"]}


@pytest.mark.parametrize("sql", ["PRAGMA journal_mode = WAL", "PRAGMA writable_schema = 1", "PRAGMA user_version"])
def test_other_pragmas_are_still_refused_as_writes(sql: str) -> None:
    with pytest.raises(SQLError, match=r"Only read queries are allowed .*; this is PRAGMA\. The database is read-only"):
        prepare(sql, dialect=None, engine="sqlite")
