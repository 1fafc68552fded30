"""`SQLTool` through the real caller: tables, caps, bad input and hostile SQL as error observations."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolResult
from toolenv_sql import DATA_DIR, SQLTool

SPIDER_DB = DATA_DIR / "spider_dev_sample/database"
SINGER = "spider_dev_sample/database/concert_singer/concert_singer.sqlite"

#: Rows without end: SQLite and DuckDB 2 stream them, so the tool shows the first and stops
#: counting past `max_count`. DuckDB 1.x (what Python 3.10 gets) materialises a recursive CTE
#: first and runs into the tool's memory limit instead.
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
HOSTILE = [
    "INSERT INTO singer (Singer_ID, Name) VALUES (99, 'x')",
    "UPDATE singer SET Name = 'x'",
    "DELETE FROM singer",
    "REPLACE INTO singer (Singer_ID) VALUES (1)",
    "DROP TABLE singer",
    "CREATE TABLE evil (a)",
    "CREATE TEMP TABLE evil AS SELECT 1",
    "ALTER TABLE singer RENAME TO s2",
    "ATTACH DATABASE 'evil.db' AS evil",
    "DETACH DATABASE main",
    "PRAGMA journal_mode = WAL",
    "PRAGMA user_version = 3",
    "PRAGMA writable_schema = 1",
    "VACUUM",
    "VACUUM INTO 'copy.db'",
    "SELECT load_extension('/tmp/evil.so')",
    "SELECT 1; DROP TABLE singer",
    "SELECT * FROM singer; DELETE FROM singer",
    "WITH x AS (SELECT 1) INSERT INTO singer (Singer_ID) SELECT * FROM x",
    "BEGIN EXCLUSIVE",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


async def call(tool: SQLTool, arguments: dict[str, object], context: dict[str, object]) -> ToolResult:
    caller = ToolCaller([tool])
    results, _ = await caller.invoke(
        [ToolCall(name="sql", arguments=arguments, id="c0")], ToolContext(Task(context=context))
    )
    return results[0]


async def test_select_gives_a_table_with_metadata() -> None:
    res = await call(
        SQLTool(), {"query": "SELECT Name, Age FROM singer ORDER BY Age DESC LIMIT 2"}, {"db_path": SINGER}
    )
    assert not res.is_error
    lines = res.text.splitlines()
    assert lines[0].split(" | ") == ["Name", "Age"] or lines[0].replace(" ", "").split("|") == ["Name", "Age"]
    assert lines[-1] == "(2 rows)"
    conn = sqlite3.connect(DATA_DIR / SINGER)
    expected = conn.execute("SELECT Name, Age FROM singer ORDER BY Age DESC LIMIT 2").fetchall()
    assert res.metadata["columns"] == ["Name", "Age"]
    assert res.metadata["rows"] == [list(r) for r in expected]
    assert res.metadata["row_count"] == 2
    assert expected[0][0] in lines[2]


async def test_row_cap_and_total_count() -> None:
    tool = SQLTool(max_rows=3)
    res = await call(
        tool, {"query": "SELECT Name FROM country"}, {"db_path": "spider_dev_sample/database/world_1/world_1.sqlite"}
    )
    assert len(res.metadata["rows"]) == 3
    assert res.metadata["row_count"] == 239
    assert "239 rows in total; showing the first 3" in res.text


async def test_counting_stops_past_max_count_and_says_so() -> None:
    context = {"db_path": "spider_dev_sample/database/world_1/world_1.sqlite"}
    res = await call(SQLTool(max_rows=3, max_count=100), {"query": "SELECT Name FROM country"}, context)
    assert res.text.splitlines()[-1] == "(more than 100 rows; showing the first 3. Add LIMIT or WHERE to see others.)"
    assert (len(res.metadata["rows"]), res.metadata["row_count"], res.metadata["row_count_exact"]) == (3, 101, False)
    exact = await call(SQLTool(max_rows=3, max_count=239), {"query": "SELECT Name FROM country"}, context)
    assert "(239 rows in total; showing the first 3." in exact.text
    assert (exact.metadata["row_count"], exact.metadata["row_count_exact"]) == (239, True)
    every = await call(SQLTool(max_rows=3, max_count=None), {"query": "SELECT Name FROM country"}, context)
    assert (every.metadata["row_count"], every.metadata["row_count_exact"]) == (239, True)
    few = await call(SQLTool(max_rows=300, max_count=10), {"query": "SELECT Name FROM country"}, context)
    assert (len(few.metadata["rows"]), few.metadata["row_count"]) == (239, 239)  # the kept rows are counted


async def test_by_default_counting_stops_past_100000_rows(tmp_path: Path) -> None:
    """Counting a `SELECT *` row by row took about a second per million rows, and on a larger
    table the whole `query_timeout`: the model got a timeout instead of rows."""
    path = tmp_path / "big.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        conn.execute(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 150000) "
            "INSERT INTO t SELECT i, 'v' || i FROM s"
        )
    conn.close()
    res = await call(SQLTool(root=tmp_path, query_timeout=60), {"query": "SELECT * FROM t"}, {"db_path": path.name})
    assert res.text.endswith("(more than 100000 rows; showing the first 50. Add LIMIT or WHERE to see others.)")
    assert (len(res.metadata["rows"]), res.metadata["row_count"], res.metadata["row_count_exact"]) == (
        50,
        100001,
        False,
    )


async def test_huge_output_is_capped_by_characters() -> None:
    tool = SQLTool(max_rows=10_000, max_chars=1000, max_cell_chars=30)
    query = "SELECT printf('%.500c', 'x') AS wide, c.* FROM country c"
    res = await call(tool, {"query": query}, {"db_path": "spider_dev_sample/database/world_1/world_1.sqlite"})
    assert not res.is_error
    assert len(res.text) <= 1000
    # A row at 30 characters a cell does not fit beside the header: the cells are cut narrower.
    assert "239 rows in total; showing the first 1; cells cut to" in res.text
    assert "to fit 1000 characters. Select fewer columns" in res.text
    assert max(len(line) for line in res.text.splitlines()[:-1]) < 1000
    assert "x" * 30 not in res.text  # cells are cut
    narrow = await call(
        tool,
        {"query": "SELECT Code, Name FROM country"},
        {"db_path": "spider_dev_sample/database/world_1/world_1.sqlite"},
    )
    assert len(narrow.text) <= 1000
    assert "239 rows in total; showing the first" in narrow.text and "capped at 1000 characters" in narrow.text


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({}, "query: Field required"),
        ({"query": 42}, "valid string"),
        ({"query": ""}, "at least 1 character"),
        ({"query": "SELECT 1", "db": "x"}, "'db'"),
        ({"query": "SELECT " + "1," * 20_000 + "1"}, "at most 20000"),
    ],
)
async def test_malformed_arguments(arguments: dict[str, object], needle: str) -> None:
    res = await call(SQLTool(), arguments, {"db_path": SINGER})
    assert res.is_error and "Invalid arguments for tool 'sql'" in res.text and needle in res.text


@pytest.mark.parametrize(
    ("context", "needle"),
    [
        ({}, "names no database"),
        ({"db_path": "../../../etc/passwd"}, "outside the allowed database root"),
        ({"db_path": "/etc/hostname"}, "outside the allowed database root"),
        ({"db_path": "nope.sqlite"}, "does not exist"),
        ({"db_path": SINGER, "engine": "oracle"}, "Unknown SQL engine"),
    ],
)
async def test_bad_task_context(context: dict[str, object], needle: str) -> None:
    res = await call(SQLTool(), {"query": "SELECT 1"}, context)
    assert res.is_error and needle in res.text


async def test_sql_errors_are_observations() -> None:
    res = await call(SQLTool(), {"query": "SELECT nope FROM singer"}, {"db_path": SINGER})
    assert res.is_error and "no such column: nope" in res.text
    res = await call(SQLTool(), {"query": "SELEC 1"}, {"db_path": SINGER})
    assert res.is_error and "syntax error" in res.text.lower()


async def test_hostile_sql_never_changes_a_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(DATA_DIR / SINGER, tmp_path / "db.sqlite")
    bundled_before = _digest(SPIDER_DB / "concert_singer")
    tmp_before = _digest(tmp_path)
    tools = [SQLTool(query_timeout=0.3), SQLTool(query_timeout=0.3, root=tmp_path, immutable=False)]
    contexts = [{"db_path": SINGER}, {"db_path": "db.sqlite"}]
    for tool, ctx in zip(tools, contexts):
        for sql in HOSTILE:
            res = await call(tool, {"query": sql}, ctx)
            assert res.is_error, sql
            assert any(
                k in res.text for k in ("Only read queries", "Only one SQL statement", "not allowed", "stopped")
            ), res.text
    for tool, ctx in zip(
        [SQLTool(query_timeout=60), SQLTool(query_timeout=60, root=tmp_path, immutable=False)], contexts
    ):
        endless = await call(tool, {"query": ENDLESS}, ctx)
        assert endless.text.endswith("(more than 100000 rows; showing the first 50. Add LIMIT or WHERE to see others.)")
    assert _digest(SPIDER_DB / "concert_singer") == bundled_before
    assert _digest(tmp_path) == tmp_before
    ok = await call(tools[1], {"query": "SELECT count(*) FROM singer"}, contexts[1])
    assert ok.metadata["rows"] == [[6]]


async def test_dialect_option_transpiles_mysql() -> None:
    tool = SQLTool(dialect="mysql")
    res = await call(
        tool, {"query": "SELECT CONCAT(`Name`, '!') AS n FROM `singer` ORDER BY `Age` LIMIT 1"}, {"db_path": SINGER}
    )
    assert not res.is_error, res.text
    assert res.metadata["rows"][0][0].endswith("!")
    assert "`" not in res.metadata["sql"]


async def test_tool_level_database_default(tmp_path: Path) -> None:
    tool = SQLTool(root=DATA_DIR, db_path=SINGER)
    res = await call(tool, {"query": "SELECT count(*) AS n FROM stadium"}, {})
    assert res.metadata["rows"] == [[9]]


# ---------------------------------------------------------------------------- DuckDB


@pytest.fixture
def duck_db(tmp_path: Path) -> Path:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install 'toolenv-sql[duckdb]')")
    path = tmp_path / "shop.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE items AS SELECT range AS id, 'item' || range::VARCHAR AS name FROM range(500)")
    conn.close()
    return path


async def test_duckdb_select(duck_db: Path) -> None:
    tool = SQLTool(root=duck_db.parent, max_rows=5)
    res = await call(tool, {"query": "SELECT id, name FROM items ORDER BY id"}, {"db_path": duck_db.name})
    assert not res.is_error, res.text
    assert res.metadata["engine"] == "duckdb"
    assert res.metadata["rows"][:2] == [[0, "item0"], [1, "item1"]]
    assert res.metadata["row_count"] == 500
    capped = await call(
        SQLTool(root=duck_db.parent, max_rows=5, max_count=20),
        {"query": "SELECT id FROM items"},
        {"db_path": duck_db.name},
    )
    assert (capped.metadata["row_count"], capped.metadata["row_count_exact"]) == (21, False)
    assert "(more than 20 rows; showing the first 5." in capped.text


async def test_duckdb_mysql_dialect(duck_db: Path) -> None:
    tool = SQLTool(root=duck_db.parent, dialect="mysql")
    res = await call(tool, {"query": "SELECT COUNT(*) AS n FROM `items` WHERE `id` < 10"}, {"db_path": duck_db.name})
    assert res.metadata["rows"] == [[10]]


async def test_duckdb_hostile_sql_never_changes_a_byte(duck_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(duck_db.parent)
    before = _digest(duck_db.parent)
    tool = SQLTool(root=duck_db.parent, query_timeout=0.5)
    hostile = [
        *(h.replace("singer", "items") for h in HOSTILE),
        "COPY items TO 'out.csv'",
        "SELECT * FROM read_csv('/etc/passwd')",
        "INSTALL httpfs",
        "SET enable_external_access = true",
    ]
    for sql in hostile:
        res = await call(tool, {"query": sql}, {"db_path": duck_db.name})
        assert res.is_error, sql
    endless = await call(SQLTool(root=duck_db.parent, query_timeout=60), {"query": ENDLESS}, {"db_path": duck_db.name})
    duckdb = pytest.importorskip("duckdb")
    if int(duckdb.__version__.split(".")[0]) >= 2:
        assert endless.text.endswith("(more than 100000 rows; showing the first 50. Add LIMIT or WHERE to see others.)")
    else:
        assert endless.is_error
        assert endless.text.startswith("DuckDB error: Out of Memory Error")
        limit = "(a query may use 512 MiB for DuckDB's data, 2 GiB in all: select fewer or shorter values)"
        assert endless.text.endswith(limit)
    assert _digest(duck_db.parent) == before


def test_duckdb_engine_layer_alone(duck_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolenv_sql.errors import SQLError
    from toolenv_sql.executor import run_query

    monkeypatch.chdir(duck_db.parent)
    before = _digest(duck_db.parent)
    for sql in [
        "INSERT INTO items VALUES (1000, 'x')",
        "DROP TABLE items",
        "ATTACH 'other.duckdb' AS o",
        "COPY items TO 'out.csv'",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SET enable_external_access = true",
    ]:
        with pytest.raises(SQLError, match="DuckDB error"):
            run_query(duck_db, "duckdb", sql)
    with pytest.raises(SQLError, match="stopped"):
        run_query(duck_db, "duckdb", "SELECT count(*) FROM range(1000000000000) a", timeout=0.3)
    assert run_query(duck_db, "duckdb", "SELECT count(*) FROM items").rows == [(500,)]
    assert _digest(duck_db.parent) == before


# ---------------------------------------------------------------------------- reported edge cases


async def test_a_trailing_comment_after_the_semicolon_runs_the_query() -> None:
    for query in ["SELECT count(*) FROM singer; -- count them", "SELECT count(*) FROM singer; /* done */"]:
        res = await call(SQLTool(), {"query": query}, {"db_path": SINGER})
        assert not res.is_error, res.text
        assert res.metadata["rows"] == [[6]] and res.metadata["sql"] == "SELECT count(*) FROM singer"
    res = await call(
        SQLTool(), {"query": "SELECT count(*) FROM singer; -- note\nDELETE FROM singer"}, {"db_path": SINGER}
    )
    assert res.is_error and "found 2" in res.text


def _wide_db(folder: Path, columns: int, rows: int) -> str:
    conn = sqlite3.connect(folder / "wide.sqlite")
    conn.execute("CREATE TABLE w (" + ", ".join(f"column_{i} TEXT" for i in range(columns)) + ")")
    values = [[f"r{r}c{i}-" + "v" * 40 for i in range(columns)] for r in range(rows)]
    conn.executemany(f"INSERT INTO w VALUES ({', '.join('?' * columns)})", values)
    conn.commit()
    conn.close()
    return "wide.sqlite"


@pytest.mark.parametrize("max_chars", [4000, 1000])
async def test_a_wide_result_stays_within_max_chars_and_shows_a_row(tmp_path: Path, max_chars: int) -> None:
    db = _wide_db(tmp_path, columns=60, rows=5)
    res = await call(SQLTool(root=tmp_path, max_chars=max_chars), {"query": "SELECT * FROM w"}, {"db_path": db})
    assert not res.is_error, res.text
    assert len(res.text) <= max_chars
    lines = res.text.splitlines()
    assert lines[0].startswith("column_0") and lines[2].startswith("r0c0-")  # a row is shown, cells cut
    footer = lines[-1]
    assert footer.startswith("(5 rows in total; showing the first ") and "Select fewer columns" in footer
    assert "showing the first 0" not in footer and "LIMIT" not in footer
    assert res.metadata["row_count"] == 5 and len(res.metadata["rows"][0]) == 60  # metadata keeps everything


async def test_too_many_columns_leave_out_the_last_ones(tmp_path: Path) -> None:
    db = _wide_db(tmp_path, columns=500, rows=1)
    res = await call(SQLTool(root=tmp_path), {"query": "SELECT * FROM w"}, {"db_path": db})
    assert len(res.text) <= 4000
    lines = res.text.splitlines()
    assert len(lines) == 4 and lines[2].startswith("r0c0")
    assert "of 500 columns shown" in lines[-1] and "Select fewer columns" in lines[-1]
    assert lines[-1].startswith("(1 row; ")


async def test_syntax_and_pragma_errors_are_plain(tmp_path: Path) -> None:
    cases = {
        "SELECT Name FROM singer WHERE Age >": "incomplete expression near '>' (line 1, column 35)",
        "SELECT * FROM singer JOIN": "expected table name after 'JOIN', but the query ends there",
        "SELECT 'abc": "unterminated string literal",
        "SELECT name FROM pragma_table_info('singer')": "pragma_table_info() is not supported here",
        "SELECT * FROM pragma_compile_options": "PRAGMA functions are not allowed: pragma_compile_options()",
    }
    for query, needle in cases.items():
        res = await call(SQLTool(), {"query": query}, {"db_path": SINGER})
        assert res.is_error and needle in res.text, res.text
        assert "<class" not in res.text and "<Token" not in res.text and "not authorized" not in res.text


async def test_a_max_chars_past_the_default_output_limit_reaches_the_model_whole() -> None:
    """`max_chars=20000` is the text the model sees: the caller's default output cap (8,192) must
    not cut a hole in the middle of the table under a footer that counts the rows as shown."""
    world = "spider_dev_sample/database/world_1/world_1.sqlite"
    res = await call(SQLTool(max_chars=20_000, max_rows=200), {"query": "SELECT * FROM country"}, {"db_path": world})
    assert not res.is_error
    assert "characters truncated" not in res.text
    assert 8192 < len(res.text) <= 20_000
    shown = int(res.text.rsplit("showing the first ", 1)[1].split()[0])
    assert len(res.text.splitlines()) == 2 + shown + 1  # header, rule, the rows the footer counts, footer


def test_limits_given_explicitly_still_cap_the_output() -> None:
    assert SQLTool(max_chars=20_000, max_output_chars=9000).limits.max_output_chars == 9000
    assert SQLTool().limits.max_output_chars == 8192
