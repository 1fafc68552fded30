"""Cancelling `execute` frees what its query holds at once: the pool thread and the connection."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from toolenv_sql import executor
from toolenv_sql.errors import SQLError
from toolenv_sql.executor import execute

RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture
def numbers_db(tmp_path: Path) -> Path:
    path = tmp_path / "numbers.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE n (i INTEGER)")
        conn.executemany("INSERT INTO n VALUES (?)", [(i,) for i in range(100)])
    conn.close()
    return path


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadPoolExecutor]:
    """The executor's query pool, with a single thread: a query that runs on holds it."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolenv-sql-test")
    monkeypatch.setattr(executor, "_pool", (os.getpid(), pool))
    yield pool
    pool.shutdown(wait=False, cancel_futures=True)


def _record_runs(
    monkeypatch: pytest.MonkeyPatch, connection: type[Any]
) -> tuple[threading.Event, list[BaseException | None], list[Any]]:
    """Wrap `connection.run`: an event set when a query starts, how each query ended (None: it
    returned) and the connections used."""
    started = threading.Event()
    ended: list[BaseException | None] = []
    used: list[Any] = []
    real_run = connection.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        used.append(self)
        started.set()
        try:
            result = real_run(self, *args, **kwargs)
        except BaseException as exc:
            ended.append(exc)
            raise
        ended.append(None)
        return result

    monkeypatch.setattr(connection, "run", run)
    return started, ended, used


async def _cancel_when_started(
    task: asyncio.Future[Any], started: threading.Event, one_thread: ThreadPoolExecutor
) -> None:
    """Cancel `task` once its query runs, see the cancel raised, and wait until the pool's one
    thread is free again (bounded only so that a failure does not hang)."""
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, started.wait, 30)  # it runs on the pool's one thread
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(loop.run_in_executor(one_thread, lambda: None), 60)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[BaseException | None]]]:
    """An event set when a SQLite query starts, and how each query ended (None: it returned)."""
    started, ended, used = _record_runs(monkeypatch, executor._SQLiteConnection)
    yield started, ended
    for conn in used:  # should a test fail, its runaway query must not outlive it
        with contextlib.suppress(sqlite3.Error):
            conn.conn.interrupt()


async def test_cancelling_execute_stops_its_sqlite_query(
    numbers_db: Path, one_thread: ThreadPoolExecutor, runs: tuple[threading.Event, list[BaseException | None]]
) -> None:
    """A cancelled call (the tool's guard fired, the episode was abandoned) used to leave its
    query running to its own timeout, holding a pool thread and its connection: with enough
    cancelled episodes every thread was busy. Now the query is interrupted at once."""
    started, ended = runs
    task = asyncio.ensure_future(execute(numbers_db, "sqlite", RUNAWAY, timeout=600, inline_budget=0))
    await _cancel_when_started(task, started, one_thread)
    (stopped,) = ended
    assert isinstance(stopped, SQLError)
    # The same thread and connection answer the next query.
    res = await execute(numbers_db, "sqlite", "SELECT count(*) FROM n", timeout=30, inline_budget=0)
    assert res.rows == [(100,)] and len(ended) == 2 and ended[1] is None


async def test_cancelling_execute_stops_an_in_process_duckdb_query(
    tmp_path: Path, one_thread: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where DuckDB runs in the caller's process (no RLIMIT_AS: Windows), a cancel interrupts it too."""
    duckdb = pytest.importorskip("duckdb")
    from toolenv_sql import duckdb_worker

    monkeypatch.setattr(duckdb_worker, "AVAILABLE", False)
    path = tmp_path / "empty.duckdb"
    duckdb.connect(str(path)).close()
    started, ended, used = _record_runs(monkeypatch, executor._DuckDBConnection)
    runaway = "SELECT count(*) FROM range(1000000000000) a WHERE a.range % 7 = 3"
    task = asyncio.ensure_future(execute(path, "duckdb", runaway, timeout=600))
    try:
        await _cancel_when_started(task, started, one_thread)
        (stopped,) = ended
        assert isinstance(stopped, SQLError)
        res = await execute(path, "duckdb", "SELECT 42", timeout=30)
        assert res.rows == [(42,)]
    finally:
        for conn in used:  # should the test fail, its runaway query must not outlive it
            conn.conn.interrupt()
