"""`execution_match` scores 0 an answer that reads no table of the database when the gold query
does: literals pasted from a tool result (`VALUES ('Joe Sharp', 'Netherlands', 52), ...`), a
constant count (`SELECT 6`) or an empty query for an empty gold result matched the gold rows
without querying the data, and an RL policy learns to answer so. Real queries on the shipped
SQLite files (and a DuckDB file)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _sql_ties import play as _play

from toolenv import Task
from toolenv_sql.datasets import chinook_tasks, spider_tasks
from toolenv_sql.envs import make_spider_env
from toolenv_sql.paths import DATA_DIR, resolve_database
from toolenv_sql.reads import database_tables, tables_read
from toolenv_sql.reward import ExecutionMatch
from toolenv_sql.tool import SQLTool

SINGERS = "spider_dev_sample/database/concert_singer/concert_singer.sqlite"
NO_TABLE = "the answer reads no table of the database"


def _task(gold: str, db_path: str = SINGERS) -> Task:
    return Task(id="t", question="q", context={"db_path": db_path, "gold_sql": gold})


def _rows(sql: str) -> list[tuple[Any, ...]]:
    """`sql`'s rows on the singers' database, read with plain sqlite3."""
    with sqlite3.connect(DATA_DIR / SINGERS) as conn:
        return conn.execute(sql).fetchall()


def _literal(value: Any) -> str:
    return str(value) if isinstance(value, int) else "'" + str(value).replace("'", "''") + "'"


def _refused(task: Task, answer: str) -> None:
    """`answer` scores 0 for reading no table, and 1 with the check off (so it does match the gold rows)."""
    reward, info = _play(task, answer)
    assert reward == 0.0
    assert info["execution_match"]["error"].startswith(NO_TABLE), info
    assert _play(task, answer, require_table=False)[0] == 1.0


def test_rows_pasted_as_literals_score_zero() -> None:
    """The repro's hack: run the gold-like query in the tool, answer with its rows as VALUES."""
    gold = "SELECT name, country, age FROM singer ORDER BY age DESC"
    rows = _rows(gold)
    assert len(rows) > 1
    values = ", ".join("(" + ", ".join(_literal(v) for v in row) + ")" for row in rows)
    _refused(_task(gold), f"VALUES {values}")
    _refused(_task(gold), " UNION ALL ".join("SELECT " + ", ".join(_literal(v) for v in row) for row in rows))


def test_a_constant_count_scores_zero() -> None:
    """A count the tool showed, answered as a constant."""
    gold = "SELECT count(*) FROM singer"
    (count,) = _rows(gold)[0]
    _refused(_task(gold), f"SELECT {count}")
    # A CTE is not a table, even spelt as one (in any case): the query still reads no data.
    _refused(_task(gold), f"WITH singer AS (SELECT {count}) SELECT * FROM singer")
    _refused(_task(gold), f"WITH SINGER AS (SELECT {count}) SELECT * FROM singer")
    # The schema's own table is not a table of the database (nor a table function: see DuckDB's below).
    _refused(_task(gold), f"SELECT {count} FROM sqlite_master LIMIT 1")
    # Naming a table is not reading its data: constant columns beside it are still pasted rows.
    reward, info = _play(_task(gold), f"SELECT {count} WHERE EXISTS (SELECT 1 FROM singer)")
    assert reward == 0.0 and "do not come from the data" in info["execution_match"]["error"]


def test_an_empty_query_for_an_empty_gold_scores_zero() -> None:
    gold = "SELECT name FROM singer WHERE age > 1000"
    assert _rows(gold) == []
    _refused(_task(gold), "SELECT 1 WHERE 1 = 0")
    assert _play(_task(gold), "SELECT name FROM singer WHERE 1 = 0")[0] == 1.0  # reads the table


@pytest.mark.parametrize(
    "answer",
    [
        "SELECT count(*) FROM singer",
        "SELECT count(*) FROM SINGER",
        'SELECT count(*) FROM "Singer"',
        "SELECT count(*) FROM main.singer",
        "SELECT (SELECT count(*) FROM singer)",
        "WITH s AS (SELECT * FROM singer) SELECT count(*) FROM s",
        "WITH RECURSIVE c(n) AS (SELECT count(*) FROM singer UNION ALL SELECT n FROM c WHERE 0) SELECT n FROM c",
    ],
)
def test_an_answer_reading_a_table_anywhere_is_scored(answer: str) -> None:
    """In any case, qualified, in a subquery or a CTE: the rows decide, as before."""
    assert _rows("SELECT count(*) FROM singer") == [(6,)]  # the constant answer above is right
    reward, info = _play(_task("SELECT count(*) FROM singer"), answer)
    assert (reward, info["execution_match"]["error"]) == (1.0, None)


def test_a_gold_query_that_reads_no_table_asks_for_none() -> None:
    assert _play(_task("SELECT 'a', 2"), "SELECT 'a', 2")[0] == 1.0


def test_the_opt_out_reaches_the_reward_from_env_args_and_specs() -> None:
    """`require_table=False` as an env arg (and so from a verl row's env_kwargs), for the default
    reward and for a named `execution_match` in a spec, or set in the spec itself."""
    task, answer = _task("SELECT count(*) FROM singer"), "SELECT 6"
    assert _play(task, answer, reward="execution_match")[0] == 0.0
    assert _play(task, answer, reward="execution_match", require_table=False)[0] == 1.0
    assert _play(task, answer, reward={"execution_match": {"weight": 1.0, "require_table": False}})[0] == 1.0
    assert _play(task, answer, reward=[ExecutionMatch(require_table=False)])[0] == 1.0
    assert _play(task, answer, reward=[{"name": "execution_match", "require_table": True}], require_table=False)[0] == 0


def test_a_duckdb_answer_reading_no_table_scores_zero(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    conn = duckdb.connect(str(tmp_path / "shop.duckdb"))
    conn.execute("CREATE TABLE Items AS SELECT * FROM range(3) t(price)")
    conn.close()
    task = _task("SELECT count(*) FROM items", db_path="shop.duckdb")
    reward, info = _play(task, "SELECT 3", root=tmp_path)
    assert reward == 0.0 and info["execution_match"]["error"].startswith(NO_TABLE)
    assert _play(task, "SELECT 3", root=tmp_path, require_table=False)[0] == 1.0
    reward, info = _play(task, "SELECT count(*) FROM range(3)", root=tmp_path)
    assert reward == 0.0 and info["execution_match"]["error"].startswith(NO_TABLE)
    assert _play(task, "SELECT count(*) FROM ITEMS", root=tmp_path)[0] == 1.0


def test_the_tool_still_runs_queries_that_read_no_table() -> None:
    """Only the answer is held to it: exploring with `SELECT 1` in the tool is fine."""
    task = _task("SELECT count(*) FROM singer")
    env = make_spider_env(tasks=[task], tools=[SQLTool()])
    env.reset(options={"task": task})
    observation, *_ = env.step("<sql>SELECT 6</sql>")
    assert "6" in observation and "error" not in observation.lower()
    env.close()


@pytest.mark.parametrize("tasks", [spider_tasks, chinook_tasks], ids=["spider", "chinook"])
def test_every_bundled_gold_query_still_scores_one_against_itself(tasks: Any) -> None:
    """No gold query is refused by the check (and every one reads a table, so each is checked)."""
    all_tasks = list(tasks())
    env = make_spider_env(tasks=all_tasks)
    refused = []
    for task in all_tasks:
        gold = task.context["gold_sql"]
        path, engine = resolve_database(task.context, DATA_DIR)
        read = tables_read(gold, engine)
        assert read is not None and not read.isdisjoint(asyncio.run(database_tables(path, engine, timeout=60.0))), gold
        env.reset(options={"task": task})
        _, reward, _, _, info = env.step(f"<answer>{gold}</answer>")
        if reward != 1.0:
            refused.append((task.id, info["reward_info"]["execution_match"]["error"]))
    env.close()
    assert refused == []
