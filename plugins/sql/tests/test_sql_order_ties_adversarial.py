"""`execution_match`'s ORDER BY ties, attacked: each wrong answer here returns rows (or an order)
the gold query cannot return under any plan, so it must score 0; each right one must keep its 1.
A tie is only sound when the key read for it is the key the engine sorted by, so most attacks are
ORDER BY terms whose key was read from the wrong column. Every check runs real queries on real
SQLite (and DuckDB) files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from _sql_ties import SINGERS
from _sql_ties import rows as _rows
from _sql_ties import score as _score

from toolenv_sql.order import order_keys

# Ratios under a millionth, all distinct: "the smallest" has one right answer.
RATIOS = [("a", 3e-7), ("b", 1e-7), ("c", 2e-7), ("d", 0.5000001), ("e", 0.5000002)]


def _names(*names: str) -> str:
    """A query returning `names` in that order, one per row."""
    return " UNION ALL ".join(f"SELECT '{n}'" for n in names)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "s.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE singer (name TEXT, age INTEGER, country TEXT)")
        conn.executemany("INSERT INTO singer VALUES (?, ?, ?)", SINGERS)
        conn.execute("CREATE TABLE share (name TEXT, ratio REAL)")
        conn.executemany("INSERT INTO share VALUES (?, ?)", RATIOS)
        conn.execute("CREATE TABLE part (name TEXT, a REAL, b REAL)")
        conn.executemany("INSERT INTO part VALUES (?, ?, ?)", [("u", 0.1, 0.2), ("v", 0.3, 0.0), ("w", 1.0, 0.0)])
    conn.close()
    return path


@pytest.fixture
def duck(tmp_path: Path) -> Path:
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "s.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE singer (name VARCHAR, age INTEGER, country VARCHAR)")
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?)", SINGERS)
    conn.close()
    return path


def _wrong(path: Path, gold: str, answer: str) -> None:
    """`answer` returns the gold's rows in an order the gold cannot give under any plan (each
    case says why), and scores 0."""
    gold_rows, rows = _rows(path, gold), _rows(path, answer)
    assert sorted(rows) == sorted(gold_rows) and rows != gold_rows
    assert _score(path, gold, answer) == 0.0


# Ann, Cy, Bob, Dan, Eve, Fay: sorted by name but for Cy ("B" sorts before "Bob").
CY_BEFORE_BOB = "SELECT name FROM singer ORDER BY CASE name WHEN 'Cy' THEN 'B' ELSE name END"
# A position or an alias in parentheses, or under COLLATE, is still that output column to both
# engines (their parsers drop the parentheses); sqlglot sees another expression, and the key
# was read by selecting it: a constant (every row tied) or the table's column the alias hides.
PARENTHESES = [
    (  # position 2 (the age), read as the constant 2
        "SELECT name, age FROM singer ORDER BY (2)",
        "SELECT name, age FROM singer ORDER BY name",
    ),
    (  # position 1 (the name, all distinct), read as the constant 1
        "SELECT name FROM singer ORDER BY 1 COLLATE NOCASE",
        "SELECT name FROM singer ORDER BY name DESC",
    ),
    (  # the alias (the name), read as the table's country: Bob and Cy (US) seemed tied
        "SELECT name AS country FROM singer ORDER BY (country)",
        CY_BEFORE_BOB,
    ),
    (
        "SELECT name AS country FROM singer ORDER BY country COLLATE NOCASE",
        CY_BEFORE_BOB,
    ),
]


@pytest.mark.parametrize(("gold", "wrong"), PARENTHESES)
def test_a_position_or_alias_in_parentheses_or_collated_is_its_column(db: Path, gold: str, wrong: str) -> None:
    _wrong(db, gold, wrong)


@pytest.mark.parametrize(("gold", "wrong"), PARENTHESES)
def test_duckdb_a_position_or_alias_in_parentheses_or_collated_is_its_column(duck: Path, gold: str, wrong: str) -> None:
    _wrong(duck, gold, wrong)


def test_a_parenthesized_position_keeps_its_ties(db: Path) -> None:
    """The fix reads the key from the column, so the real ties (ages) may still move."""
    gold = "SELECT name, age FROM singer ORDER BY (2) LIMIT 2"
    assert _score(db, gold, "SELECT name, age FROM singer ORDER BY age, name DESC LIMIT 2") == 1.0
    assert _score(db, gold, "SELECT 'Cy', 20 UNION ALL SELECT 'Dan', 40") == 0.0


# `*` stands for several output columns, so the select list's index of an alias or expression
# after it is not its output column's: the key was read from a column of the star (the age).
STARS = [
    "SELECT *, name AS n FROM singer ORDER BY n",
    "SELECT *, upper(name) FROM singer ORDER BY upper(name)",
    "SELECT singer.*, name AS n FROM singer ORDER BY n",
]


@pytest.mark.parametrize("gold", STARS)
def test_a_key_column_after_a_star_is_found_where_it_is(db: Path, gold: str) -> None:
    """Sorted by name, Ann comes before Bob; their ages (30, 30) seemed tied."""
    extra = gold.split(", ", 1)[1].split(" FROM", 1)[0]
    _wrong(db, gold, f"SELECT *, {extra} FROM singer ORDER BY name = 'Bob' DESC, name")


@pytest.mark.parametrize("gold", STARS)
def test_duckdb_a_key_column_after_a_star_is_found_where_it_is(duck: Path, gold: str) -> None:
    extra = gold.split(", ", 1)[1].split(" FROM", 1)[0]
    _wrong(duck, gold, f"SELECT *, {extra} FROM singer ORDER BY name = 'Bob' DESC, name")


def test_a_star_keeps_its_ties(db: Path, duck: Path) -> None:
    gold = "SELECT *, age * 2 FROM singer ORDER BY age * 2 LIMIT 2"
    for path in (db, duck):
        assert _score(path, gold, "SELECT *, age * 2 FROM singer ORDER BY age, name DESC LIMIT 2") == 1.0
        assert _score(path, gold, "SELECT *, age * 2 FROM singer ORDER BY age DESC LIMIT 2") == 0.0
    gold = "SELECT *, age AS years FROM singer ORDER BY years LIMIT 2"  # DuckDB reads the alias first
    assert _score(duck, gold, "SELECT *, age FROM singer ORDER BY age, name DESC LIMIT 2") == 1.0


def test_duckdb_an_alias_given_twice_is_the_last(duck: Path) -> None:
    """DuckDB sorts `ORDER BY k` by the last column named k (SQLite by the first): the key was
    read from the first, the age, and Ann and Bob (30, 30) seemed tied."""
    gold = "SELECT age AS k, name AS k FROM singer ORDER BY k"
    _wrong(duck, gold, "SELECT age, name FROM singer ORDER BY name = 'Bob' DESC, name")


def test_sqlite_an_alias_given_twice_is_the_first(db: Path) -> None:
    gold = "SELECT age AS k, name AS k FROM singer ORDER BY k LIMIT 2"
    assert _score(db, gold, "SELECT age, name FROM singer ORDER BY age, name DESC LIMIT 2") == 1.0
    assert _score(db, gold, "SELECT 30, 'Ann' UNION ALL SELECT 30, 'Bob'") == 0.0


@pytest.mark.parametrize(
    ("gold", "wrong"),
    [
        ("SELECT name FROM share ORDER BY ratio LIMIT 1", "SELECT 'c'"),  # 2e-7 is not the smallest
        ("SELECT name FROM share ORDER BY ratio", "SELECT name FROM share ORDER BY name"),
        ("SELECT name FROM share WHERE ratio > 0.1 ORDER BY ratio DESC", _names("d", "e")),
        ("SELECT name FROM share ORDER BY ratio * 1.0 DESC LIMIT 1", "SELECT 'd'"),
    ],
)
def test_keys_a_millionth_apart_are_not_tied(db: Path, gold: str, wrong: str) -> None:
    """Keys were rounded as values are (to 6 decimals): every ratio under 5e-7 was the key 0.0,
    so any row was "tied" for the smallest, and 0.5000001 with 0.5000002."""
    assert _rows(db, gold) != _rows(db, wrong)
    assert _score(db, gold, wrong) == 0.0


def test_keys_apart_by_summation_order_alone_are_still_tied(db: Path) -> None:
    """0.1 + 0.2 and 0.3 + 0.0 are one value to a question; an equivalent query may sort them
    either way, so both orders score 1 (not only the gold's)."""
    gold = "SELECT name FROM part ORDER BY a + b"
    assert _rows(db, gold) == [("v",), ("u",), ("w",)]
    assert _score(db, gold, _names("u", "v", "w")) == 1.0
    assert _score(db, gold, _names("w", "u", "v")) == 0.0


@pytest.mark.parametrize(
    ("rows", "gold", "wrong"),
    [
        (  # SQLite reads CAST(… AS DATE) as a number: 1, 5, 12 (the month); sqlglot renders
            # DATE(day), NULL for each of these dates, and every row was tied
            [("x", "05/12/1990"), ("y", "01/02/2000"), ("z", "12/30/1985")],
            "SELECT name FROM event ORDER BY CAST(day AS DATE)",
            "SELECT name FROM event ORDER BY name DESC",
        ),
        (  # CAST(… AS NUMERIC) keeps these integers apart; sqlglot renders CAST(… AS REAL): one float
            [("x", "9007199254740993"), ("y", "9007199254740992")],
            "SELECT name FROM event ORDER BY CAST(day AS NUMERIC) LIMIT 1",
            "SELECT 'x'",
        ),
        (  # CAST(… AS BOOLEAN) is NUMERIC in SQLite (1.5, 1.2); rendered CAST(… AS INTEGER): 1, 1
            [("x", "1.5"), ("y", "1.2")],
            "SELECT name FROM event ORDER BY CAST(day AS BOOLEAN) LIMIT 1",
            "SELECT 'x'",
        ),
    ],
)
def test_a_key_sqlglot_cannot_render_as_written_is_not_read(
    tmp_path: Path, rows: list[tuple[str, str]], gold: str, wrong: str
) -> None:
    """The key is read by a query sqlglot renders: where that rendering means something else
    (a coarser key), rows the engine sorted apart were tied."""
    path = tmp_path / "e.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE event (name TEXT, day TEXT)")
        conn.executemany("INSERT INTO event VALUES (?, ?)", rows)
    conn.close()
    assert _rows(path, gold) != _rows(path, wrong)
    assert _score(path, gold, wrong) == 0.0
    assert _score(path, gold, gold) == 1.0


@pytest.mark.parametrize(
    "gold",
    ["SELECT country, name FROM singer ORDER BY #2", "SELECT country, name FROM singer ORDER BY #2 || ''"],
)
def test_duckdb_a_positional_column_is_the_output_column(duck: Path, gold: str) -> None:
    """DuckDB's `ORDER BY #2` is the 2nd output column (the name); selected, `#2` is the 2nd
    column of the table (the age), so Ann and Bob (30, 30) seemed tied."""
    _wrong(duck, gold, "SELECT country, name FROM singer ORDER BY name = 'Bob' DESC, name")


def test_duckdb_a_positional_column_keeps_its_ties(duck: Path) -> None:
    gold = "SELECT name, age FROM singer ORDER BY #2 LIMIT 2"
    assert _score(duck, gold, "SELECT name, age FROM singer ORDER BY age, name DESC LIMIT 2") == 1.0
    assert _score(duck, gold, "SELECT name, age FROM singer ORDER BY age DESC LIMIT 2") == 0.0


def test_the_key_query_keeps_a_limit_so_it_sorts_no_more_than_it_reads(db: Path) -> None:
    """Without any LIMIT the key query sorted the whole result where the gold keeps its top rows
    (3-5x slower on a 3M-row SQLite table, a full sort in memory for DuckDB); only `past` rows
    past the gold's OFFSET + LIMIT are read, so it keeps a LIMIT of that many."""
    keys = order_keys("SELECT name FROM singer ORDER BY age LIMIT 2 OFFSET 1", "sqlite", past=1)
    assert keys is not None and (keys.offset, keys.limit) == (1, 2)
    assert _rows(db, keys.sql) == _rows(db, "SELECT name, age FROM singer ORDER BY age LIMIT 4")
    unlimited = order_keys("SELECT name FROM singer ORDER BY age OFFSET 2", "duckdb", past=1)
    assert unlimited is not None and len(_rows(db, unlimited.sql)) == len(SINGERS)


@pytest.mark.parametrize(
    "gold",
    [
        "SELECT name AS n FROM singer ORDER BY \"n\" || ''",
        'SELECT name AS n FROM singer ORDER BY lower("n")',
        "SELECT name AS n FROM singer ORDER BY n || ''",
    ],
)
def test_an_alias_inside_an_order_by_expression_is_not_read_as_text(db: Path, gold: str) -> None:
    """SQLite reads an output alias inside an ORDER BY expression (the name here), but not in
    the select list, where a double-quoted name no column has is the string 'n': every key was
    that one string, every row tied."""
    _wrong(db, gold, "SELECT name FROM singer ORDER BY name DESC")


def test_sqlite_a_name_a_star_gives_is_read_before_a_later_alias(db: Path) -> None:
    """SQLite sorts `SELECT *, age AS name … ORDER BY name` by the star's name column (the first
    output column so named), DuckDB by the alias: the key was the alias (the age) in both."""
    gold = "SELECT *, age AS name FROM singer ORDER BY name"
    _wrong(db, gold, "SELECT *, age AS name FROM singer ORDER BY singer.name = 'Bob' DESC, singer.name")
    gold = 'SELECT *, age AS "n" FROM singer ORDER BY "n"'  # the alias (no column is n): never the text 'n'
    _wrong(db, gold, "SELECT *, age AS n FROM singer ORDER BY name")


def test_duckdb_a_later_alias_is_read_before_a_name_a_star_gives(duck: Path) -> None:
    gold = "SELECT *, age AS name FROM singer ORDER BY name LIMIT 2"
    assert _rows(duck, gold)[0][0] == "Cy"
    assert _score(duck, gold, "SELECT *, age AS name FROM singer ORDER BY age, singer.name DESC LIMIT 2") == 1.0
    assert _score(duck, gold, "SELECT *, age AS name FROM singer ORDER BY singer.name LIMIT 2") == 0.0


def test_duckdb_decimal_keys_a_millionth_apart_are_not_tied(duck: Path) -> None:
    """DuckDB's decimals were rounded as values to 6 decimals too: 1e-7 and 2e-7 were one key."""
    import duckdb

    conn = duckdb.connect(str(duck))
    conn.execute("CREATE TABLE share (name VARCHAR, ratio DECIMAL(18, 9))")
    conn.executemany("INSERT INTO share VALUES (?, ?)", [("a", "0.0000003"), ("b", "0.0000001"), ("c", "0.0000002")])
    conn.close()
    gold = "SELECT name FROM share ORDER BY ratio LIMIT 1"
    assert _score(duck, gold, "SELECT 'c'") == 0.0
    assert _score(duck, gold, "SELECT 'b'") == 1.0
