"""SQLite's temporary files (a sort or a subquery's rows spilled to disk) are capped per process:
a query past `TOOLENV_SQL_SQLITE_TEMP_MB` is stopped with a readable error, within the cap."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest

from toolenv import Task, ToolCall, ToolCaller, ToolContext
from toolenv_sql import DATA_DIR, SQLTool
from toolenv_sql.datasets import spider_tasks
from toolenv_sql.errors import QueryTimeout, SQLError
from toolenv_sql.executor import run_query

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="the temp-space check reads /proc")

CHINOOK = DATA_DIR / "chinook/Chinook_Sqlite.sqlite"
MIB = 2**20
#: The reviewer's query: endless rows of 8 KB strings sorted, so SQLite's sorter spills to disk
#: (about 1.4-1.9 GB within a 5 s timeout before the cap). The strings come from `printf`'s
#: width (`zeroblob`, the reviewer's, is refused where `sqlite3` has no `setlimit`: Python 3.10).
SPILL_FOREVER = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "SELECT count(*) FROM (SELECT x, substr(printf('%8000d', x), x % 7) AS y FROM c ORDER BY y, x)"
)
#: 20,000 rows of ~1 KB sorted: about 20 MB spilled, then a result.
SPILL_SOME = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) "
    "SELECT count(*), sum(length(y)) FROM (SELECT x, substr(printf('%1000d', x), x % 7) AS y FROM c ORDER BY y, x)"
)
T = TypeVar("T")


def _temp_bytes() -> int:
    """Disk space of the SQLite temporary files (unlinked `etilqs_*`) this process holds open."""
    total = 0
    for name in os.listdir("/proc/self/fd"):
        link = f"/proc/self/fd/{name}"
        try:
            if os.path.basename(os.readlink(link)).startswith("etilqs_"):
                total += os.stat(link).st_blocks * 512
        except OSError:
            continue
    return total


@contextmanager
def _peak_temp() -> Iterator[list[int]]:
    """Sample `_temp_bytes` every 5 ms meanwhile; the list holds the peak."""
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], _temp_bytes())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield peak
    finally:
        stop.set()
        watcher.join()


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.monotonic()
    return fn(), time.monotonic() - start


def test_a_spilling_sort_is_stopped_at_the_cap_with_a_readable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLENV_SQL_SQLITE_TEMP_MB", "16")
    with _peak_temp() as peak, pytest.raises(SQLError) as info:
        _, elapsed = _timed(lambda: run_query(CHINOOK, "sqlite", SPILL_FOREVER, timeout=4.0))
    assert not isinstance(info.value, QueryTimeout)
    assert str(info.value).startswith("The query needed more than 16 MiB of temporary disk space")
    assert "and was stopped" in str(info.value)
    assert peak[0] < 16 * MIB + 48 * MIB, f"{peak[0] / MIB:.0f} MiB of temp files"  # loosely: a check's overshoot
    assert _temp_bytes() == 0  # SQLite removed them when the query stopped


def test_a_query_spilling_under_the_cap_runs_to_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLENV_SQL_SQLITE_TEMP_MB", "128")
    with _peak_temp() as peak:
        res = run_query(CHINOOK, "sqlite", SPILL_SOME, timeout=20.0)
    assert res.rows[0][0] == 20000 and res.rows[0][1] > 19_000_000
    assert peak[0] > 4 * MIB  # it did spill (else this would not test the check)


def test_a_cap_of_zero_leaves_temp_space_unbounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLENV_SQL_SQLITE_TEMP_MB", "0")
    with _peak_temp() as peak, pytest.raises(QueryTimeout):
        run_query(CHINOOK, "sqlite", SPILL_FOREVER, timeout=0.5)
    assert peak[0] > 0


def test_spider_gold_queries_still_run_under_a_small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLENV_SQL_SQLITE_TEMP_MB", "1")
    for task in list(spider_tasks())[::5]:
        path = DATA_DIR / task.context["db_path"]
        assert run_query(path, "sqlite", task.context["gold_sql"], max_rows=50).columns


async def test_the_tool_tells_the_model_why_its_query_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLENV_SQL_SQLITE_TEMP_MB", "16")
    caller = ToolCaller([SQLTool(query_timeout=4.0)])
    context = ToolContext(Task(context={"db_path": "chinook/Chinook_Sqlite.sqlite"}))
    with _peak_temp() as peak:
        results, _ = await caller.invoke([ToolCall(name="sql", arguments={"query": SPILL_FOREVER}, id="c0")], context)
    assert results[0].is_error
    assert "needed more than 16 MiB of temporary disk space" in results[0].text
    assert peak[0] < 64 * MIB


def test_an_unreadable_cap_warns_and_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLENV_SQL_SQLITE_TEMP_MB", "16MB")
    with pytest.warns(UserWarning, match="TOOLENV_SQL_SQLITE_TEMP_MB='16MB' is not a whole number of MiB; using 256"):
        res = run_query(CHINOOK, "sqlite", SPILL_SOME, timeout=20.0)  # ~20 MB: past 16 MiB, under 256
    assert res.rows[0][0] == 20000
