"""`execution_match` against what text-to-SQL RL users expect of it: Spider's and BIRD's execution
evaluation. Every check runs real queries on the shipped SQLite files (DuckDB where it is the point)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from _sql_ties import play as _play

from toolenv import Task
from toolenv_sql.envs import make_chinook_env
from toolenv_sql.reward import ExecutionMatch, rows_match

SINGERS = "spider_dev_sample/database/concert_singer/concert_singer.sqlite"
# A 9 MB text value (printf also builds it on Python 3.10, which refuses zeroblob).
BIG = "printf('%.*c', 9000000, 'x')"


def _task(gold: str, db_path: str = SINGERS, **context: Any) -> Task:
    return Task(id="t", question="q", context={"db_path": db_path, "gold_sql": gold, **context})


def test_extra_rows_past_the_kept_bytes_do_not_match() -> None:
    """The predicted rows were kept up to 16 MB: extra rows past that went unseen, so a result
    holding the gold rows and then more (here two 9 MB values) scored 1."""
    gold = _task("SELECT 'a', 'b'")
    assert _play(gold, "SELECT 'a', 'b'")[0] == 1.0
    assert _play(gold, f"SELECT 'a', 'b' UNION ALL SELECT {BIG}, {BIG}")[0] == 0.0


def test_a_gold_result_too_large_to_keep_is_reported_not_matched() -> None:
    """A gold result past the kept bytes is only a prefix: a prediction returning that prefix
    alone scored 1. It scores 0, and reward_info says why."""
    gold = _task(f"SELECT 'a', 'b' UNION ALL SELECT {BIG}, {BIG}")
    reward, info = _play(gold, "SELECT 'a', 'b'")
    assert reward == 0.0
    assert "too large" in info["execution_match"]["error"]


def test_a_gold_query_that_fails_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    """A task whose gold SQL fails (or whose database is missing) scored 0 for every answer
    with no trace: a training run on a broken task set learnt from zeros. reward_info and the
    log now say that the task, not the answer, is at fault."""
    with caplog.at_level(logging.WARNING, logger="toolenv_sql.reward"):
        reward, info = _play(_task("SELECT nope FROM singer"), "SELECT 1")
        assert reward == 0.0
        assert info["execution_match"]["error"].startswith("the gold query failed")
        assert "no such column: nope" in info["execution_match"]["error"]
        reward, info = _play(_task("SELECT 1", db_path="spider_dev_sample/database/nope.sqlite"), "SELECT 1")
        assert reward == 0.0 and "does not exist" in info["execution_match"]["error"]
    warned = [r.getMessage() for r in caplog.records if r.name == "toolenv_sql.reward"]
    assert any("gold query failed" in m for m in warned), warned


def test_why_an_answer_scored_zero_is_in_reward_info() -> None:
    """The model's own failure is recorded too (no warning: it is the policy's mistake)."""
    task = _task("SELECT count(*) FROM singer")
    reward, info = _play(task, "SELECT nope FROM singer")
    assert reward == 0.0 and "no such column: nope" in info["execution_match"]["error"]
    reward, info = _play(task, "DROP TABLE singer")
    assert reward == 0.0 and "read-only" in info["execution_match"]["error"]
    reward, info = _play(task, "SELECT count(*) FROM singer")
    assert reward == 1.0 and info["execution_match"]["error"] is None


def test_duckdb_decimals_match_the_same_number_as_a_double(tmp_path: Path) -> None:
    """DuckDB returns DECIMAL columns and literals as `decimal.Decimal`, which Python never
    finds equal to the nearest double: `sum(price)` against `sum(price::DOUBLE)` scored 0."""
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "shop.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE items AS SELECT * FROM (VALUES (0.1::DECIMAL(8, 2)), (0.2::DECIMAL(8, 2))) t(price)")
    conn.close()
    task = _task("SELECT sum(price) FROM items", db_path="shop.duckdb")
    assert _play(task, "SELECT sum(CAST(price AS DOUBLE)) FROM items", root=tmp_path)[0] == 1.0
    assert _play(task, "SELECT 0.3", root=tmp_path, require_table=False)[0] == 1.0  # the literal, as a number
    assert _play(task, "SELECT 0.31", root=tmp_path, require_table=False)[0] == 0.0


def test_the_prompt_names_the_dialect_the_answer_is_read_in() -> None:
    """With `dialect="mysql"` the answer is read as MySQL, but the prompt asked for "the
    database's dialect" (the question says SQLite): SQLite's `a || b` then ran as MySQL's
    `a OR b`, and a right answer written as told scored 0."""
    default = make_chinook_env(limit=1)
    assert "in the database's dialect" in (default.system_prompt or "")
    env = make_chinook_env(limit=1, dialect="mysql")
    obs, _ = env.reset(seed=0)
    assert "MySQL" in obs and "in the database's dialect" not in obs
    assert " inside <answer>...</answer>" in (env.system_prompt or "")  # the answer-tool rewrite still applies
    custom = make_chinook_env(limit=1, dialect="mysql", system_prompt="Write SQL.")
    assert custom.system_prompt == "Write SQL."


@pytest.mark.parametrize(
    "answer",
    [
        "```SELECT count(*) FROM singer```",
        "```SELECT\n  count(*)\nFROM singer\n```",
        "```WITH s AS (SELECT * FROM singer) SELECT count(*) FROM s```",
        "```sql SELECT count(*) FROM singer```",
        "```sqlite\nSELECT count(*) FROM singer;\n```",
        "```\nSELECT count(*) FROM singer\n```",
        "`SELECT count(*) FROM singer`",
    ],
)
def test_a_fenced_answer_keeps_its_first_keyword(answer: str) -> None:
    """A fence without a language tag lost the query's first word (`SELECT`, taken for the
    tag): a right answer in ```SELECT …``` scored 0. A whole answer in single backticks
    (never SQL: a quoted name alone) is unwrapped too."""
    assert _play(_task("SELECT count(*) FROM singer"), answer) == (
        1.0,
        {"execution_match": {"score": 1.0, "error": None}},
    )


def test_summation_order_does_not_decide_a_match_for_large_floats() -> None:
    """Floats were rounded to 6 decimals, which keeps every bit of a value past 1e9: the same
    sum taken in another row order (a join, a subquery) differs in its last bit and scored 0.
    They are compared to 12 significant digits as well."""
    world = "spider_dev_sample/database/world_1/world_1.sqlite"
    task = _task("SELECT sum(SurfaceArea * Population) FROM country", db_path=world)
    reordered = "SELECT sum(SurfaceArea * Population) FROM (SELECT * FROM country ORDER BY Population)"
    assert _play(task, reordered)[0] == 1.0
    assert _play(task, "SELECT sum(SurfaceArea * Population) FROM country WHERE Code <> 'CHN'")[0] == 0.0
    small = _task("SELECT avg(LifeExpectancy) FROM country WHERE Continent = 'Europe'", db_path=world)
    assert (
        _play(small, "SELECT sum(LifeExpectancy) / count(LifeExpectancy) FROM country WHERE Continent = 'Europe'")[0]
        == 1.0
    )
    assert _play(small, "SELECT round(avg(LifeExpectancy), 2) FROM country WHERE Continent = 'Europe'")[0] == 0.0


def test_nan_matches_nan(tmp_path: Path) -> None:
    """A DuckDB NaN never equalled another NaN object, so a right answer holding one scored 0."""
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "n.duckdb"
    duckdb.connect(str(path)).close()
    task = _task("SELECT 'nan'::DOUBLE UNION ALL SELECT 1.5::DOUBLE", db_path="n.duckdb")
    assert _play(task, "SELECT 1.5::DOUBLE UNION ALL SELECT 'nan'::DOUBLE", root=tmp_path)[0] == 1.0


def test_column_order_false_takes_the_columns_in_any_order_as_spider_does() -> None:
    """Spider's official evaluation (test-suite-sql-eval's `result_eq`) finds a match under any
    order of the columns; the default keeps them in order (as BIRD's set of rows does)."""
    task = _task("SELECT name, country, age FROM singer ORDER BY age DESC")
    permuted = "SELECT country, age, name FROM singer ORDER BY age DESC"
    assert _play(task, permuted)[0] == 0.0
    spider = ExecutionMatch(column_order=False)
    assert _play(task, permuted, reward=spider)[0] == 1.0
    assert _play(task, permuted, column_order=False)[0] == 1.0  # the env's override
    assert _play(task, "SELECT country, age, name FROM singer ORDER BY age", reward=spider)[0] == 0.0
    assert _play(task, "SELECT country, age, name, name FROM singer ORDER BY age DESC", reward=spider)[0] == 0.0
    # Each column holds the gold's values, but not in the gold's rows: no order of columns matches.
    pairs = _task("SELECT name, country FROM singer")
    mixed = (
        "SELECT b.country, a.name FROM (SELECT name, row_number() OVER (ORDER BY name) AS r FROM singer) AS a "
        "JOIN (SELECT country, row_number() OVER (ORDER BY country DESC) AS r FROM singer) AS b ON a.r = b.r"
    )
    assert _play(pairs, "SELECT country, name FROM singer", reward=spider)[0] == 1.0
    assert _play(pairs, mixed, reward=spider) == (0.0, {"execution_match": {"score": 0.0, "error": None}})


def test_rows_match_in_any_column_order() -> None:
    rows = [(1, "a", None), (2, "b", 2.5), (2, "b", 2.5)]
    swapped = [(c, b, a) for a, b, c in rows]
    assert not rows_match(swapped, rows, ordered=True)
    assert rows_match(swapped, rows, ordered=True, column_order=False)
    assert rows_match(swapped[::-1], rows, ordered=False, column_order=False)
    assert not rows_match(swapped[::-1], rows, ordered=True, column_order=False)
    assert not rows_match([(1, 1), (2, 2)], [(1, 2), (2, 1)], ordered=False, column_order=False)
    assert rows_match([], [], ordered=False, column_order=False)
    assert not rows_match([(1, 2)], [(1,)], ordered=False, column_order=False)
    # Every column holds the same ten values, so only the rows tell the orders apart: the
    # reversed columns match; rows that lost a value (its neighbour twice) do not.
    rotations = [tuple((r + c) % 10 for c in range(10)) for r in range(10)]
    assert rows_match([row[::-1] for row in rotations], rotations, ordered=False, column_order=False)
    shuffled = [(*row[:8], row[9], (row[8] + 1) % 10) for row in rotations]
    assert not rows_match(shuffled, rotations, ordered=False, column_order=False)


def test_duckdb_lists_structs_and_maps_are_compared_not_crashed_on(tmp_path: Path) -> None:
    """DuckDB returns LIST, STRUCT and MAP values as Python lists and dicts, which cannot be
    counted: comparing unordered results holding one raised TypeError out of the step."""
    duckdb = pytest.importorskip("duckdb")
    duckdb.connect(str(tmp_path / "n.duckdb")).close()
    gold = "SELECT [1, 2] AS l, {'a': 1.5} AS s, MAP {'k': [0.1]} AS m UNION ALL SELECT [3], {'a': 2.0}, MAP {}"
    task = _task(gold, db_path="n.duckdb")
    swapped = "SELECT [3] AS l, {'a': 2.0} AS s, MAP {} AS m UNION ALL SELECT [1, 2], {'a': 1.5}, MAP {'k': [0.1]}"
    assert _play(task, swapped, root=tmp_path)[0] == 1.0
    assert _play(task, swapped.replace("[1, 2]", "[2, 1]"), root=tmp_path)[0] == 0.0
