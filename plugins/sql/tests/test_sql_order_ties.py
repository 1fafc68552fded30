"""`execution_match` under ORDER BY with ties: SQL leaves the order of rows with equal keys (and
which of them a LIMIT keeps) to the engine's plan, so a right answer may return them otherwise.
Every check runs real queries on real SQLite (and DuckDB) files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from _sql_ties import SINGERS
from _sql_ties import rows as _rows
from _sql_ties import score as _score

from toolenv import Task
from toolenv_sql.envs import make_spider_env
from toolenv_sql.order import order_keys
from toolenv_sql.reward import rows_match

WORLD = "spider_dev_sample/database/world_1/world_1.sqlite"
TV = "spider_dev_sample/database/tvshow/tvshow.sqlite"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A SQLite file holding `SINGERS`, inserted in that order."""
    path = tmp_path / "s.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE singer (name TEXT, age INTEGER, country TEXT)")
        conn.executemany("INSERT INTO singer VALUES (?, ?, ?)", SINGERS)
    conn.close()
    return path


def _differs(path: Path, gold: str, answer: str) -> None:
    """The answer really returns other rows or another order than the gold query (or the test proves nothing)."""
    assert _rows(path, gold) != _rows(path, answer)


def test_tied_rows_in_another_order_score_1(db: Path) -> None:
    """`ORDER BY age` says nothing of Ann, Bob and Eve's order: an answer returning them
    otherwise (here forced by a tie-breaker) is right, and scored 0."""
    gold = "SELECT name, age FROM singer ORDER BY age"
    answer = "SELECT name, age FROM singer ORDER BY age, name DESC"
    _differs(db, gold, answer)
    assert _score(db, gold, answer) == 1.0
    assert _score(db, gold, gold) == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "SELECT name, age FROM singer ORDER BY age DESC",  # descending for ascending
        "SELECT name, age FROM singer ORDER BY name",  # the wrong key
        "SELECT name, age FROM singer ORDER BY country, age",  # ties broken first, then ordered
        "SELECT name, age FROM singer WHERE name <> 'Eve' ORDER BY age",  # a tied row missing
        "SELECT name, age FROM singer UNION ALL SELECT 'Eve', 30 ORDER BY age",  # a tied row twice
        "SELECT name, age FROM singer",  # the table's order: Cy is not first
    ],
)
def test_a_wrong_order_still_scores_0(db: Path, answer: str) -> None:
    gold = "SELECT name, age FROM singer ORDER BY age"
    _differs(db, gold, answer)
    assert _score(db, gold, answer) == 0.0


def test_any_of_the_rows_tied_at_the_limit_may_be_kept(db: Path) -> None:
    """The two youngest are Cy and one of Ann, Bob and Eve: which one the gold's LIMIT keeps
    is the engine's choice, so each is a right answer; a row past the tie is not."""
    gold = "SELECT name FROM singer ORDER BY age LIMIT 2"
    for answer in (
        "SELECT name FROM singer ORDER BY age, name DESC LIMIT 2",
        "SELECT name FROM singer ORDER BY age, country DESC, name LIMIT 2",
        "SELECT 'Cy' UNION ALL SELECT 'Eve'",
    ):
        assert _score(db, gold, answer) == 1.0, answer
    for answer in (
        "SELECT name FROM singer ORDER BY age DESC LIMIT 2",
        "SELECT 'Cy' UNION ALL SELECT 'Dan'",  # 40 is not tied with 30
        "SELECT 'Eve' UNION ALL SELECT 'Cy'",  # the order outside the tie is wrong
        "SELECT 'Cy' UNION ALL SELECT 'Eve' UNION ALL SELECT 'Bob'",  # more rows than the LIMIT
        "SELECT 'Cy'",
    ):
        _differs(db, gold, answer)
        assert _score(db, gold, answer) == 0.0, answer


def test_rows_tied_across_an_offset_may_be_kept_too(db: Path) -> None:
    """`LIMIT 2 OFFSET 3` starts inside the tie at 30 and ends inside the tie at 40: rows on
    both sides are the engine's choice."""
    gold = "SELECT name FROM singer ORDER BY age LIMIT 2 OFFSET 3"
    assert _score(db, gold, "SELECT 'Ann' UNION ALL SELECT 'Fay'") == 1.0
    assert _score(db, gold, "SELECT 'Eve' UNION ALL SELECT 'Dan'") == 1.0
    assert _score(db, gold, "SELECT 'Cy' UNION ALL SELECT 'Dan'") == 0.0  # Cy comes before the offset
    assert _score(db, gold, "SELECT 'Dan' UNION ALL SELECT 'Eve'") == 0.0
    # Both rows from the tie at 30 would leave out the tie at 40 that must follow.
    assert _score(db, gold, "SELECT 'Ann' UNION ALL SELECT 'Bob'") == 0.0


def test_a_limit_inside_one_tie_takes_any_of_its_rows(db: Path) -> None:
    gold = "SELECT name, country FROM singer WHERE age = 30 ORDER BY age LIMIT 2"
    assert _score(db, gold, "SELECT name, country FROM singer WHERE age = 30 ORDER BY name DESC LIMIT 2") == 1.0
    assert _score(db, gold, "SELECT 'Eve', 'UK' UNION ALL SELECT 'Eve', 'UK'") == 0.0  # one Eve only


@pytest.mark.parametrize(
    ("gold", "right", "wrong"),
    [
        (  # an output alias
            "SELECT name, age AS years FROM singer ORDER BY years",
            "SELECT name, age FROM singer ORDER BY age, name DESC",
            "SELECT name, age FROM singer ORDER BY age DESC",
        ),
        (  # a position
            "SELECT name, age FROM singer ORDER BY 2 LIMIT 3",
            "SELECT name, age FROM singer ORDER BY age, name DESC LIMIT 3",
            "SELECT name, age FROM singer ORDER BY name LIMIT 3",
        ),
        (  # an expression over a column not selected
            "SELECT name FROM singer ORDER BY age * 2 - 1",
            "SELECT name FROM singer ORDER BY age, country, name DESC",
            "SELECT name FROM singer ORDER BY country, age",
        ),
        (  # an aggregate, as Spider's "which has the most" questions
            "SELECT country, age FROM singer GROUP BY country, age ORDER BY count(*) LIMIT 1",
            "SELECT country, age FROM singer GROUP BY country, age ORDER BY count(*), country DESC, age DESC LIMIT 1",
            "SELECT country, age FROM singer GROUP BY country, age ORDER BY count(*) DESC LIMIT 1",
        ),
        (  # two keys, tied on both
            "SELECT name FROM singer ORDER BY country, age LIMIT 4",
            "SELECT name FROM singer ORDER BY country, age, name DESC LIMIT 4",
            "SELECT name FROM singer ORDER BY age, country LIMIT 4",
        ),
        (  # a compound query ordered by its output column's name
            "SELECT name, age FROM singer WHERE age < 35 UNION SELECT name, age FROM singer WHERE age > 35 "
            "ORDER BY age",
            "SELECT name, age FROM singer ORDER BY age, name DESC",
            "SELECT name, age FROM singer ORDER BY age DESC",
        ),
    ],
)
def test_keys_are_read_through_aliases_positions_and_expressions(db: Path, gold: str, right: str, wrong: str) -> None:
    _differs(db, gold, right)
    _differs(db, gold, wrong)
    assert _score(db, gold, right) == 1.0
    assert _score(db, gold, wrong) == 0.0


def test_where_keys_cannot_be_read_the_order_is_compared_as_before(db: Path) -> None:
    """Under DISTINCT a key column not selected would change the rows, so the key is not read
    and the gold's order counts as a whole (strict, never lenient by mistake)."""
    assert order_keys("SELECT DISTINCT name FROM singer ORDER BY age", "sqlite") is None
    gold = "SELECT DISTINCT name FROM singer ORDER BY age"
    assert _score(db, gold, gold) == 1.0
    assert _score(db, gold, "SELECT name FROM singer ORDER BY age DESC") == 0.0


def test_column_order_false_keeps_the_ties(db: Path) -> None:
    gold = "SELECT name, age FROM singer ORDER BY age LIMIT 2"
    answer = "SELECT age, name FROM singer ORDER BY age, name DESC LIMIT 2"
    assert _score(db, gold, answer, column_order=False) == 1.0
    assert _score(db, gold, answer) == 0.0
    assert _score(db, gold, "SELECT age, name FROM singer ORDER BY age DESC LIMIT 2", column_order=False) == 0.0


def test_duckdb_ties(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "s.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE singer (name VARCHAR, age INTEGER, country VARCHAR)")
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?)", SINGERS)
    conn.close()
    gold = "SELECT name, age FROM singer ORDER BY age LIMIT 3"
    assert _score(path, gold, "SELECT name, age FROM singer ORDER BY age, name DESC LIMIT 3") == 1.0
    assert _score(path, gold, "SELECT name, age FROM singer ORDER BY age, name LIMIT 3") == 1.0
    assert _score(path, gold, "SELECT name, age FROM singer ORDER BY age DESC LIMIT 3") == 0.0
    assert _score(path, gold, "SELECT name, age FROM singer ORDER BY name LIMIT 3") == 0.0
    gold = "SELECT name FROM singer ORDER BY age * 2, country LIMIT 3"
    assert _score(path, gold, "SELECT name FROM singer ORDER BY age, country, name DESC LIMIT 3") == 1.0
    assert _score(path, gold, "SELECT name FROM singer ORDER BY age, country DESC LIMIT 3") == 0.0


@pytest.mark.parametrize(
    ("db_path", "gold", "right", "wrong"),
    [
        (  # spider-dev-0804: five countries have population 0
            WORLD,
            "SELECT Name FROM country ORDER BY Population ASC LIMIT 3",
            "SELECT Name FROM country ORDER BY Population ASC, Name LIMIT 3",
            "SELECT Name FROM country ORDER BY SurfaceArea ASC LIMIT 3",
        ),
        (  # spider-dev-0740: five countries have 12 languages
            WORLD,
            "SELECT T1.Name FROM country AS T1 JOIN countrylanguage AS T2 ON T1.Code = T2.CountryCode "
            "GROUP BY T1.Name ORDER BY COUNT(*) DESC LIMIT 1",
            "SELECT Name FROM country WHERE Code IN (SELECT CountryCode FROM countrylanguage "
            "GROUP BY CountryCode ORDER BY count(*) DESC, CountryCode LIMIT 1)",
            "SELECT Name FROM country WHERE Code = 'TZA'",  # 11 languages
        ),
        (  # spider-dev-0613: ratings tie
            TV,
            "SELECT Episode FROM TV_series ORDER BY rating",
            "SELECT Episode FROM TV_series ORDER BY rating, Episode",
            "SELECT Episode FROM TV_series ORDER BY rating DESC",
        ),
    ],
)
def test_spider_questions_with_ties(db_path: str, gold: str, right: str, wrong: str) -> None:
    from toolenv_sql.paths import DATA_DIR

    path = DATA_DIR / db_path
    _differs(path, gold, right)
    _differs(path, gold, wrong)
    task = Task(id="t", question="q", context={"db_path": db_path, "gold_sql": gold})
    for answer, expected in ((right, 1.0), (wrong, 0.0), (gold, 1.0)):
        env = make_spider_env(tasks=[task])
        env.reset(options={"task": task})
        assert env.step(f"<answer>{answer}</answer>")[1] == expected, answer
        env.close()


def test_rows_match_without_keys_is_unchanged_and_with_keys_lets_ties_move() -> None:
    gold = [("a", 1), ("b", 1), ("c", 2)]
    swapped = [("b", 1), ("a", 1), ("c", 2)]
    assert not rows_match(swapped, gold, ordered=True)
    assert rows_match(swapped, gold, ordered=True, keys=[1, 1, 2])
    assert not rows_match(swapped, gold, ordered=True, keys=[1, 2, 3])
    assert not rows_match([("c", 2), ("a", 1), ("b", 1)], gold, ordered=True, keys=[1, 1, 2])
    assert rows_match([("a", 1), ("d", 2)], [("a", 1), ("c", 2)], ordered=True, keys=[1, 2], after=[("d", 2)])
    assert rows_match([("d", 0), ("c", 2)], [("a", 0), ("c", 2)], ordered=True, keys=[0, 2], before=[("d", 0)])
    assert not rows_match([("d", 2), ("c", 2)], [("a", 1), ("c", 2)], ordered=True, keys=[1, 2], after=[("d", 2)])
    assert rows_match([(1, "b"), (1, "a"), (2, "c")], gold, ordered=True, column_order=False, keys=[1, 1, 2])
    assert rows_match(swapped[::-1], gold, ordered=False, keys=[1, 1, 2])  # unordered: keys play no part
