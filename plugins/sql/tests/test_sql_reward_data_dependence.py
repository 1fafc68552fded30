"""`execution_match` scores 0 an answer whose rows do not come from the data: naming a table
(`SELECT 6 FROM singer LIMIT 1`) is not enough. By default an answer whose every output column is
a constant is refused; with `test_suite=True` the answer and the gold query also run on a copy of
the database with rows removed (Spider's test-suite idea) and must match there too, which also
refuses a paste that reads a column only to cancel it. Real Spider tasks and the shipped SQLite
files."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _sql_ties import play as _play

from toolenv import Task
from toolenv_sql.datasets import chinook_tasks, spider_tasks
from toolenv_sql.dependence import constant_output, perturbed_copy
from toolenv_sql.envs import make_spider_env
from toolenv_sql.executor import execute
from toolenv_sql.paths import DATA_DIR, resolve_database

SINGERS = "spider_dev_sample/database/concert_singer/concert_singer.sqlite"
FLIGHTS = "spider_dev_sample/database/flight_2/flight_2.sqlite"
NOT_FROM_DATA = "the answer's rows do not come from the data"


def _task(gold: str) -> Task:
    return Task(id="t", question="q", context={"db_path": SINGERS, "gold_sql": gold})


def _spider(index: int) -> Task:
    return spider_tasks()[index]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tables(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows (by rowid) of the SQLite file at `path`, read directly."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        names = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        found = {n: conn.execute(f'SELECT * FROM "{n}" ORDER BY rowid').fetchall() for n in names}
    conn.close()
    return found


def _dangling(path: Path) -> set[tuple[Any, ...]]:
    """The rows of the SQLite file at `path` whose foreign key names no row (SQLite's own check)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        found = {tuple(row) for row in conn.execute("PRAGMA foreign_key_check")}
    conn.close()
    return found


TEST_SUITE = {"execution_match": {"test_suite": True}}

# The reviewer's repro (real Spider-v0 tasks 0 and 4): each returns the gold rows, each names a
# table, and every column each returns is a constant.
CONSTANT = [
    (0, "SELECT 6 FROM singer LIMIT 1"),
    (0, "SELECT 6 WHERE EXISTS (SELECT 1 FROM singer)"),
    (4, "SELECT 34.5, 25, 43 FROM singer LIMIT 1"),
    (4, "SELECT 34.5, 25, 43 FROM stadium WHERE 0 = 1 UNION ALL SELECT 34.5, 25, 43"),
    # The constants reached through a CTE, a derived table, VALUES or a scalar subquery.
    (0, "WITH s AS (SELECT 6 AS n FROM singer) SELECT n FROM s LIMIT 1"),
    (0, "SELECT x.n FROM (SELECT 6 AS n) AS x JOIN singer LIMIT 1"),
    (0, "SELECT v.column1 FROM (VALUES (6)) AS v, singer LIMIT 1"),
    (0, "SELECT (SELECT 6 FROM stadium LIMIT 1) FROM singer LIMIT 1"),
    (0, "SELECT max(6) FROM singer"),
]
# Pastes that read a column, only to cancel it or next to pasted ones: only the copy refuses them.
READ_FOR_SHOW = [
    (0, "SELECT 6 + 0 * count(*) FROM singer"),
    (4, "SELECT avg(age), 25, 43 FROM singer WHERE country = 'France'"),
]
FROM_DATA = [
    (0, "SELECT count(*) FROM singer"),
    (0, "SELECT count(singer_id) FROM singer"),
    (0, "SELECT (SELECT count(*) FROM singer)"),
    (4, "SELECT avg(age), min(age), max(age) FROM singer WHERE country = 'France'"),
    (4, "SELECT sum(age) * 1.0 / count(*), min(age), max(age) FROM singer WHERE country LIKE 'France'"),
]


def _refused(task: Task, answer: str, reason: str, **overrides: Any) -> None:
    """`answer` scores 0 for `reason`, and 1 with the checks off (it does return the gold rows)."""
    reward, info = _play(task, answer, **overrides)
    assert reward == 0.0
    assert info["execution_match"]["error"].startswith(NOT_FROM_DATA), info
    assert reason in info["execution_match"]["error"], info
    assert _play(task, answer, require_table=False)[0] == 1.0


@pytest.mark.parametrize(("index", "answer"), CONSTANT)
def test_constant_columns_next_to_a_table_score_zero(index: int, answer: str) -> None:
    _refused(_spider(index), answer, "every column it returns is a constant")
    _refused(_spider(index), answer, "every column it returns is a constant", reward=TEST_SUITE)


@pytest.mark.parametrize(("index", "answer"), READ_FOR_SHOW)
def test_pastes_that_read_a_column_score_zero_with_the_test_suite(index: int, answer: str) -> None:
    assert not constant_output(answer, "sqlite")  # a column is read: the syntactic check lets it by
    assert _play(_spider(index), answer)[0] == 1.0  # and by default it is scored by its rows
    _refused(_spider(index), answer, "a copy with some rows removed", reward=TEST_SUITE)


@pytest.mark.parametrize("test_suite", [False, True])
@pytest.mark.parametrize(("index", "answer"), FROM_DATA)
def test_answers_that_query_the_data_still_score_one(index: int, answer: str, test_suite: bool) -> None:
    reward, info = _play(_spider(index), answer, reward={"execution_match": {"test_suite": test_suite}})
    assert (reward, info["execution_match"]["error"]) == (1.0, None)


def test_a_join_along_a_foreign_key_still_matches_on_the_copy() -> None:
    """No row a foreign key refers to is removed, so a join the gold query does not make (each
    `singer_in_concert` row names a singer) keeps every row there too."""
    task = _task("SELECT count(*) FROM singer_in_concert")
    answer = "SELECT count(*) FROM singer_in_concert AS c JOIN singer AS s ON c.singer_id = s.singer_id"
    reward, info = _play(task, answer, reward=TEST_SUITE)
    assert (reward, info["execution_match"]["error"]) == (1.0, None)


def test_a_coincidental_match_scores_zero_with_the_test_suite() -> None:
    """Another question's query that happens to return the gold rows (flights from Aberdeen for
    flights to Aberdeen) matches on the database, not on the copy."""
    gold = (
        "SELECT count(*) FROM flights AS f JOIN airports AS a ON f.DestAirport = a.AirportCode "
        "WHERE a.City = 'Aberdeen'"
    )
    answer = gold.replace("DestAirport", "SourceAirport")
    task = Task(id="t", question="q", context={"db_path": FLIGHTS, "gold_sql": gold})
    assert _play(task, answer)[0] == 1.0  # the same count, by coincidence
    reward, info = _play(task, answer, reward=TEST_SUITE)
    assert reward == 0.0 and "a copy with some rows removed" in info["execution_match"]["error"]


def test_a_constant_gold_query_allows_a_constant_answer() -> None:
    gold = "SELECT 'a' FROM singer LIMIT 1"
    assert _play(_task(gold), gold)[0] == 1.0
    assert _play(_task(gold), gold, reward=TEST_SUITE)[0] == 1.0


def test_the_perturbed_copy_leaves_the_original_untouched_and_is_deterministic(tmp_path: Path) -> None:
    source = tmp_path / "singers.sqlite"
    source.write_bytes((DATA_DIR / SINGERS).read_bytes())
    source.chmod(0o444)  # read-only: the copy is built without writing to it
    digest, mtime = _digest(source), source.stat().st_mtime_ns
    first = asyncio.run(perturbed_copy(source, seed=0))
    assert asyncio.run(perturbed_copy(source, seed=0)) == first  # built once, then cached
    assert (_digest(source), source.stat().st_mtime_ns) == (digest, mtime)
    original, copy = _tables(source), _tables(first)
    assert original.keys() == copy.keys()
    for name, rows in original.items():
        # Rows are removed, never added nor changed; each table keeps at least one.
        assert set(copy[name]) <= set(rows) and (not rows or copy[name]), name
    assert sum(map(len, copy.values())) < sum(map(len, original.values()))
    assert len(copy["singer"]) < len(original["singer"])
    # No row a foreign key refers to goes: every reference that holds in the original holds in the copy.
    assert _dangling(first) <= _dangling(source)
    other = asyncio.run(perturbed_copy(source, seed=1))
    assert other != first and _tables(other) != copy  # another seed removes other rows
    # The same seed removes the same rows in a fresh process's copy (no state but the seed).
    rebuilt = tmp_path / "again.sqlite"
    rebuilt.write_bytes(source.read_bytes())
    assert _tables(asyncio.run(perturbed_copy(rebuilt, seed=0))) == copy


@pytest.mark.parametrize("tasks", [spider_tasks, chinook_tasks], ids=["spider", "chinook"])
def test_every_bundled_gold_query_scores_one_and_many_are_checked(tasks: Any) -> None:
    """Each gold query matches itself with every check on (no gold query has constant columns,
    and each matches itself on the copy); the copy changes many gold results, so the test-suite
    check bites on those tasks (Spider: 486 of 697; Chinook: 30 of 84, as most of its parent
    rows are referred to, and stay)."""
    all_tasks = list(tasks())
    env = make_spider_env(tasks=all_tasks, reward={"execution_match": {"test_suite": True}})
    refused, changed = [], 0
    for task in all_tasks:
        gold = task.context["gold_sql"].strip().rstrip(";")
        env.reset(options={"task": task})
        _, reward, _, _, info = env.step(f"<answer>{gold}</answer>")
        if reward != 1.0:
            refused.append((task.id, info["reward_info"]["execution_match"]["error"]))
        path, engine = resolve_database(task.context, DATA_DIR)
        copy = asyncio.run(perturbed_copy(path))
        before = asyncio.run(execute(path, engine, gold, timeout=60.0)).rows
        after = asyncio.run(execute(copy, engine, gold, timeout=60.0)).rows
        changed += sorted(map(repr, before)) != sorted(map(repr, after))
    env.close()
    assert refused == []
    assert changed > len(all_tasks) / 3


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 6",
        "SELECT 6 FROM singer LIMIT 1",
        "SELECT upper('a') || 'b', CAST(6 AS REAL), -1, NULL FROM singer",
        "SELECT 34.5 FROM stadium WHERE 0 = 1 UNION ALL SELECT 34.5",
        "SELECT 6 INTERSECT SELECT count(*) FROM singer",  # its rows are the constant side's
        "SELECT 6 EXCEPT SELECT count(*) FROM singer",
        "VALUES (1, 2), (3, 4)",
        "WITH s(n) AS (SELECT 6 FROM singer) SELECT s.n FROM s JOIN singer",
        "SELECT * FROM (SELECT 6, 7) JOIN (SELECT 8)",
        "SELECT count(*) FROM (SELECT 6)",  # an aggregate over constants
        "SELECT max(6), min(6), avg(6) FROM singer",  # the constant, however many rows
        "SELECT 1 FROM singer AS s WHERE (SELECT s.name) IS NOT NULL",
    ],
)
def test_constant_output_finds_constant_columns(sql: str) -> None:
    assert constant_output(sql, "sqlite")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT name FROM singer",
        "SELECT * FROM singer",
        "SELECT * FROM (SELECT 6) JOIN singer",
        "SELECT count(*) FROM singer",
        "SELECT count(*) FROM (SELECT 6 FROM singer)",  # constant columns, but as many rows as singers
        "SELECT sum(1), total(1) FROM singer",
        "SELECT row_number() OVER () FROM singer",
        "SELECT EXISTS (SELECT 1 FROM singer)",
        "SELECT (SELECT s.name) FROM singer AS s",
        "SELECT name FROM singer UNION SELECT 'x'",  # one branch reads the data
        "SELECT count(*) FROM singer EXCEPT SELECT 6",
        "SELECT s.n FROM (SELECT name AS n FROM singer) AS s",
        # A CTE spelt as the table it reads, and a recursive CTE whose rows the data decides.
        "WITH singer AS (SELECT * FROM singer) SELECT count(*) FROM singer",
        "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < (SELECT count(*) FROM singer)) "
        "SELECT max(n) FROM c",
        "not SQL at all",
    ],
)
def test_constant_output_counts_anything_else_as_data(sql: str) -> None:
    assert not constant_output(sql, "sqlite")


def test_a_duckdb_answer_of_constant_columns_scores_zero(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    conn = duckdb.connect(str(tmp_path / "shop.duckdb"))
    conn.execute("CREATE TABLE items AS SELECT * FROM range(3) t(price)")
    conn.close()
    task = Task(id="t", question="q", context={"db_path": "shop.duckdb", "gold_sql": "SELECT count(*) FROM items"})
    reward, info = _play(task, "SELECT 3 FROM items LIMIT 1", root=tmp_path)
    assert reward == 0.0 and info["execution_match"]["error"].startswith(NOT_FROM_DATA)
    assert _play(task, "SELECT 3 FROM items LIMIT 1", root=tmp_path, require_table=False)[0] == 1.0
    # DuckDB files are not copied: with test_suite the syntactic check still holds, and a query scores 1.
    assert _play(task, "SELECT count(price) FROM items", root=tmp_path, reward=TEST_SUITE)[0] == 1.0


def test_spider_env_forwards_test_suite_to_its_reward() -> None:
    """`gym.make("toolenv/Spider-v0", test_suite=True)` scores with the test-suite check, as
    `require_table` and `column_order` reach the env's reward."""
    import gymnasium as gym

    on = gym.make("toolenv/Spider-v0", test_suite=True, limit=1)
    off = gym.make("toolenv/Spider-v0", limit=1)
    try:
        assert on.unwrapped.reward_fn.parts["execution_match"][0].test_suite is True  # type: ignore[attr-defined]
        assert off.unwrapped.reward_fn.parts["execution_match"][0].test_suite is False  # type: ignore[attr-defined]
    finally:
        on.close()
        off.close()
