"""The executor on real SQLite files: results, caps, timeouts, and the engine-level read-only guard."""

from __future__ import annotations

import asyncio
import re
import shutil
import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolenv_sql import DATA_DIR
from toolenv_sql.errors import SQLError
from toolenv_sql.executor import execute, run_query, sqlite_uri
from toolenv_sql.paths import resolve_db_path

SINGER = DATA_DIR / "spider_dev_sample/database/concert_singer/concert_singer.sqlite"


@pytest.fixture
def numbers_db(tmp_path: Path) -> Path:
    path = tmp_path / "numbers.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE n (i INTEGER, sq INTEGER)")
        conn.execute("CREATE INDEX n_sq ON n (sq)")
        conn.executemany("INSERT INTO n VALUES (?, ?)", [(i, i * i) for i in range(1000)])
    conn.close()
    return path


def test_result_columns_rows_and_count(numbers_db: Path) -> None:
    res = run_query(numbers_db, "sqlite", "SELECT i, sq FROM n WHERE i < 3 ORDER BY i")
    assert res.columns == ["i", "sq"]
    assert res.rows == [(0, 0), (1, 1), (2, 4)]
    assert res.row_count == 3 and not res.truncated


def test_row_cap_keeps_first_rows_and_counts_all(numbers_db: Path) -> None:
    res = run_query(numbers_db, "sqlite", "SELECT i FROM n ORDER BY i", max_rows=5)
    assert res.rows == [(i,) for i in range(5)]
    assert res.row_count == 1000 and res.truncated


def test_count_all_false_stops_one_row_past_the_cap(numbers_db: Path) -> None:
    res = run_query(numbers_db, "sqlite", "SELECT i FROM n", max_rows=5, count_all=False)
    assert len(res.rows) == 5 and 5 < res.row_count < 1000


def test_count_limit_stops_counting_one_row_past_it(numbers_db: Path) -> None:
    res = run_query(numbers_db, "sqlite", "SELECT i FROM n ORDER BY i", max_rows=5, count_limit=100)
    assert (res.rows, res.row_count, res.exact_count, res.truncated) == ([(i,) for i in range(5)], 101, False, True)
    whole = run_query(numbers_db, "sqlite", "SELECT i FROM n", max_rows=5, count_limit=1000)
    assert (whole.row_count, whole.exact_count) == (1000, True)
    assert run_query(numbers_db, "sqlite", "SELECT i FROM n", max_rows=50, count_limit=3).row_count == 51
    with pytest.raises(ValueError, match="count_limit must be >= 0"):
        run_query(numbers_db, "sqlite", "SELECT i FROM n", count_limit=-1)


def test_runaway_recursive_cte_times_out_and_connection_still_works(numbers_db: Path) -> None:
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    with pytest.raises(SQLError, match=r"longer than 0.3 s"):
        run_query(numbers_db, "sqlite", runaway, timeout=0.3)
    assert run_query(numbers_db, "sqlite", "SELECT count(*) FROM n").rows == [(1000,)]


def test_endless_rows_time_out_while_fetching(numbers_db: Path) -> None:
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
    with pytest.raises(SQLError, match="stopped"):
        run_query(numbers_db, "sqlite", endless, timeout=0.3, max_rows=10)


def test_memory_bomb_values_are_refused(numbers_db: Path) -> None:
    # 3.11+: SQLite's value-size limit ("too big"); 3.10 has no setlimit, so the functions are refused.
    refused = "too big" if sys.version_info >= (3, 11) else "not authorized"
    for bomb in ("SELECT zeroblob(500000000)", "SELECT length(randomblob(500000000))"):
        with pytest.raises(SQLError, match=refused):
            run_query(numbers_db, "sqlite", bomb)


def test_rows_kept_stay_within_a_byte_budget(numbers_db: Path) -> None:
    """Many large values (each under the value cap) do not pile up in the kept rows: they stop at a budget."""
    from toolenv_sql import executor

    wide = "SELECT printf('%.*c', 1000000, 'y') AS a, printf('%.*c', 1000000, 'x') AS b FROM n WHERE i < 40"
    res = run_query(numbers_db, "sqlite", wide, max_rows=50)
    kept = sum(len(v) for row in res.rows for v in row)
    assert res.row_count == 40 and res.truncated
    assert 0 < kept <= executor._MAX_KEPT_BYTES
    small = run_query(numbers_db, "sqlite", "SELECT i, printf('%.*c', 1000, 'x') FROM n", max_rows=50)
    assert len(small.rows) == 50 and small.row_count == 1000  # ordinary results are unaffected


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Connection.setlimit came in Python 3.11")
def test_one_wide_row_of_big_values_is_refused(numbers_db: Path) -> None:
    """Repeating one 9 MB value in many columns would take 9 MB a column: the value cap shrinks with the width."""
    from toolenv_sql import executor

    wide = "WITH t(b) AS (SELECT zeroblob(9000000)) SELECT " + ", ".join(["b"] * 40) + " FROM t"
    with pytest.raises(SQLError, match=r"too big.*select fewer or shorter values"):
        run_query(numbers_db, "sqlite", wide)
    narrow = "WITH t(b) AS (SELECT zeroblob(9000000)) SELECT b, length(b) FROM t"
    assert run_query(numbers_db, "sqlite", narrow).rows[0][1] == 9_000_000  # the value cap itself is unchanged
    per_column = executor._MAX_ROW_BYTES // 40
    fits = f"WITH t(b) AS (SELECT zeroblob({per_column})) SELECT " + ", ".join(["b"] * 40) + " FROM t"
    assert run_query(numbers_db, "sqlite", fits + ";").row_count == 1  # a trailing `;` is fine too


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Connection.setlimit came in Python 3.11")
@pytest.mark.parametrize("tail", [";", "; -- done", " /* why */ ;", ";\n-- a note\n"])
def test_a_query_that_ends_in_a_comment_keeps_its_full_value_cap(numbers_db: Path, tail: str) -> None:
    """The width probe wraps the query in parentheses; a trailing `;` or comment must not make
    it fail, or the query would get the smallest cap and its long values would come back NULL."""
    row = run_query(numbers_db, "sqlite", "SELECT printf('%.*c', 100000, 'x') AS s, '--' AS d" + tail).rows[0]
    assert len(row[0]) == 100_000 and row[1] == "--"


def test_unencodable_sql_is_an_sql_error(numbers_db: Path) -> None:
    # A lone surrogate cannot be sent to SQLite: 3.10 raises sqlite3.Warning, 3.11+ UnicodeEncodeError.
    with pytest.raises(SQLError, match="SQLite"):
        run_query(numbers_db, "sqlite", "SELECT coun\ud800t(*) FROM n")


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO n VALUES (1, 1)",
        "UPDATE n SET sq = 0",
        "DELETE FROM n",
        "DROP TABLE n",
        "CREATE TABLE m (a)",
        "CREATE TEMP TABLE m AS SELECT 1",
        "ALTER TABLE n ADD COLUMN z",
        "ATTACH DATABASE 'other.db' AS other",
        "DETACH DATABASE main",
        "PRAGMA user_version = 7",
        "PRAGMA journal_mode = WAL",
        "PRAGMA writable_schema = ON",
        "VACUUM",
        "VACUUM INTO 'copy.db'",
        "REINDEX",
        "ANALYZE",
        "BEGIN IMMEDIATE",
        "SAVEPOINT s",
        "SELECT load_extension('evil')",
    ],
)
@pytest.mark.parametrize("immutable", [True, False])
def test_engine_layer_refuses_writes_without_the_sql_gate(
    numbers_db: Path, sql: str, immutable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run_query skips the sqlglot gate: this checks the authorizer and the read-only open alone.
    monkeypatch.chdir(numbers_db.parent)
    before = numbers_db.read_bytes()
    files = sorted(p.name for p in numbers_db.parent.iterdir())
    with pytest.raises(SQLError, match="SQLite error"):
        run_query(numbers_db, "sqlite", sql, immutable=immutable)
    assert numbers_db.read_bytes() == before
    assert sorted(p.name for p in numbers_db.parent.iterdir()) == files


def test_uri_is_read_only_and_percent_encoded(tmp_path: Path) -> None:
    odd = tmp_path / "a?mode=rwc#x.sqlite"
    sqlite3.connect(odd).close()
    uri = sqlite_uri(odd)
    assert uri.endswith("?mode=ro&immutable=1") and "%3F" in uri and "%23" in uri
    assert run_query(odd, "sqlite", "SELECT 1").rows == [(1,)]


def test_paths_are_confined_to_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(SINGER, root / "db.sqlite")
    (tmp_path / "secret.sqlite").write_bytes(b"")
    assert resolve_db_path("db.sqlite", root) == (root / "db.sqlite").resolve()
    for bad in ["../secret.sqlite", str(tmp_path / "secret.sqlite"), "/etc/passwd"]:
        with pytest.raises(SQLError, match="outside the allowed database root"):
            resolve_db_path(bad, root)
    (root / "link.sqlite").symlink_to(tmp_path / "secret.sqlite")
    with pytest.raises(SQLError, match="outside"):
        resolve_db_path("link.sqlite", root)
    with pytest.raises(SQLError, match="does not exist"):
        resolve_db_path("missing.sqlite", root)


async def test_connections_are_per_thread_and_queries_run_concurrently(numbers_db: Path) -> None:
    results = await asyncio.gather(
        *(execute(numbers_db, "sqlite", f"SELECT sq FROM n WHERE i = {i}") for i in range(40))
    )
    assert [r.rows for r in results] == [[(i * i,)] for i in range(40)]
    # the same query from a foreign thread gets its own connection and works
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(run_query(numbers_db, "sqlite", "SELECT max(i) FROM n").rows))
    thread.start()
    thread.join()
    assert out == [[(999,)]]


def test_engine_errors_are_sql_errors(numbers_db: Path) -> None:
    with pytest.raises(SQLError, match="no such column: nope"):
        run_query(numbers_db, "sqlite", "SELECT nope FROM n")


async def test_query_past_the_inline_budget_finishes_on_the_pool(numbers_db: Path) -> None:
    slowish = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) SELECT count(*) FROM c"
    res = await execute(numbers_db, "sqlite", slowish, timeout=10.0, inline_budget=0.0005)
    assert res.rows == [(300000,)]
    with pytest.raises(SQLError, match="stopped"):
        await execute(numbers_db, "sqlite", slowish, timeout=0.0005, inline_budget=0.001)


def test_a_forked_child_gets_its_own_pool_and_connections(numbers_db: Path) -> None:
    import multiprocessing

    run_query(numbers_db, "sqlite", "SELECT 1")  # the parent holds a connection and (below) a pool
    asyncio.run(execute(numbers_db, "sqlite", "SELECT 1", inline_budget=0))
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        rows = pool.apply(_child_query, (str(numbers_db),))
    assert rows == [[(499500,)], [(999,)]]


def _child_query(path: str) -> list[list[tuple[int, ...]]]:
    inline = run_query(Path(path), "sqlite", "SELECT sum(i) FROM n").rows
    pooled = asyncio.run(execute(Path(path), "sqlite", "SELECT max(i) FROM n", inline_budget=0)).rows
    return [inline, pooled]


@pytest.fixture
def write_locked(numbers_db: Path) -> Iterator[sqlite3.Connection]:
    """A writer holding an exclusive lock on `numbers_db` (one uncommitted row added), as an
    `immutable=False` database that is being updated may have; `rollback()` releases it."""
    writer = sqlite3.connect(numbers_db, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("INSERT INTO n VALUES (-1, 1)")
    yield writer
    writer.close()


async def test_a_locked_database_does_not_block_the_event_loop(
    numbers_db: Path, write_locked: sqlite3.Connection
) -> None:
    """SQLite's own busy wait (5 s by default) ran on the event loop, twice (the width probe,
    then the query), whatever `inline_budget` and the query's timeout: every env of the process
    froze for 10 s, and the query failed past its timeout. Now the wait for the lock is the
    query's, on the pool: the writer's rollback, run by the loop just after the call, lets it run."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(execute(numbers_db, "sqlite", "SELECT count(*) FROM n", timeout=4, immutable=False))
    loop.call_soon(write_locked.rollback)
    res = await task
    assert res.rows == [(1000,)]


def test_a_lock_held_past_the_timeout_is_a_timeout_and_leaves_no_trace(
    numbers_db: Path, write_locked: sqlite3.Connection
) -> None:
    """The width probe failed on the lock and its fallback (the smallest value cap) was kept for
    the query text: once the lock was gone, a 100 kB value was refused as too big."""
    sql = "SELECT printf('%.*c', 100000, 'x') AS s FROM n LIMIT 1"
    with pytest.raises(SQLError, match=r"longer than 0.2 s"):
        run_query(numbers_db, "sqlite", sql, timeout=0.2, immutable=False)
    write_locked.rollback()
    (row,) = run_query(numbers_db, "sqlite", sql, timeout=30, immutable=False).rows
    assert len(row[0]) == 100_000


async def test_a_relative_path_is_taken_from_the_working_directory(
    numbers_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Path.as_uri()` refused a relative path: a ValueError escaped where an SQLError or a result is promised."""
    monkeypatch.chdir(numbers_db.parent)
    relative = Path(numbers_db.name)
    assert run_query(relative, "sqlite", "SELECT count(*) FROM n").rows == [(1000,)]
    assert (await execute(relative, "sqlite", "SELECT max(i) FROM n", inline_budget=0)).rows == [(999,)]
    assert sqlite_uri(relative) == sqlite_uri(numbers_db)
    with pytest.raises(SQLError, match="unable to open"):
        run_query(Path("missing.sqlite"), "sqlite", "SELECT 1")


# A text of 60,000 different characters, as `y`.
_DISTINCT = (
    "WITH RECURSIVE c(i) AS (SELECT 65536 UNION ALL SELECT i + 1 FROM c WHERE i < 125535),"
    " s(y) AS (SELECT group_concat(char(i), '') FROM c)"
)


# One call of these runs as a single SQLite VM step, which neither the progress handler nor
# interrupt() can stop: past a few hundred kB of arguments it ran far past the timeout (inline,
# on the event loop). Here about 6 s each before; at the 10 MB value cap, hours.
@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        (f"{_DISTINCT} SELECT length(trim(y || y, y)) FROM s", "trim()"),
        (f"{_DISTINCT} SELECT length(rtrim(y || y, y)) FROM s", "rtrim()"),
        (
            "SELECT instr(CAST(printf('%.*c', 1200000, 'a') AS BLOB),"
            " CAST(printf('%.*c', 600000, 'a') || 'b' AS BLOB))",
            "instr()",
        ),
        pytest.param(
            "SELECT printf('%.*c', 1000000, 'a') LIKE '%' || printf('%.*c', 2000, 'a') || 'b'",
            "LIKE or GLOB pattern",
            marks=pytest.mark.skipif(
                sys.version_info < (3, 11), reason="the LIKE pattern cap needs Connection.setlimit (Python 3.11+)"
            ),
        ),
    ],
)
def test_one_long_function_call_is_refused_not_run_past_the_timeout(numbers_db: Path, sql: str, needle: str) -> None:
    with pytest.raises(SQLError, match=re.escape(needle)):
        run_query(numbers_db, "sqlite", sql, timeout=1.0)
    assert run_query(numbers_db, "sqlite", "SELECT trim('  a  '), instr('abc', 'c')").rows == [("a", 3)]


def test_bounded_functions_answer_as_sqlite_s_own(numbers_db: Path) -> None:
    """`instr`, `replace` and two-argument `trim`/`ltrim`/`rtrim` are the executor's own (to
    bound their work); on every kind of value they answer exactly as SQLite's built-ins."""
    values = ["NULL", "''", "'abcabc'", "'bc'", "'ä€𝄞ä'", "'ä'", "x'616263'", "x'62'", "x''", "12", "2", "1.5", "-0.0"]
    calls = [f"{f}({a}, {b})" for f in ("instr", "trim", "ltrim", "rtrim") for a in values for b in values]
    calls += [f"replace({a}, {b}, {c})" for a in values for b in values for c in ("NULL", "'Z'", "x'5a'", "7", "''")]
    sql = "SELECT " + ", ".join(f"quote({c})" for c in calls)
    plain = sqlite3.connect(":memory:")
    try:
        expected = plain.execute(sql).fetchone()
    finally:
        plain.close()
    assert run_query(numbers_db, "sqlite", sql).rows == [expected]
    sql = "SELECT trim(printf('%.*c', 60000, 'a'), printf('%.*c', 60000, 'b') || 'a')"  # few different characters
    assert run_query(numbers_db, "sqlite", sql).rows == [("",)]
    sql = "SELECT quote(replace(printf('%.*c', 2000000, 'a'), 'a', 'bcdefghijk'))"
    with pytest.raises(SQLError, match="too big"):
        run_query(numbers_db, "sqlite", sql)
