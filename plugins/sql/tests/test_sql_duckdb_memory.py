"""DuckDB queries run in worker processes: memory bombs stay there, stuck workers are killed and replaced.

DuckDB's own memory_limit does not cover strings built by scalar functions, and
`interrupt()` is not honoured inside one long scalar call: in-process, `repeat('x', 2e9)`
took 3.9 GB of the caller and `lpad('', 1.5e9, 'x')` overshot its timeout. These tests
read the caller's peak RSS (`VmHWM`) and the worker's `/proc/<pid>/limits`, never timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install 'toolenv-sql[duckdb]')")

from toolenv_sql import duckdb_worker, executor  # noqa: E402
from toolenv_sql.errors import QueryTimeout, SQLError  # noqa: E402
from toolenv_sql.executor import QueryResult, execute, run_query  # noqa: E402

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists() or not duckdb_worker.AVAILABLE,
    reason="DuckDB worker processes need resource.RLIMIT_AS; the checks read Linux's /proc",
)

COUNT = "SELECT count(*) FROM items"


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("duck") / "shop.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute(
        """
        CREATE TABLE items AS SELECT
            range AS id,
            'item' || range::VARCHAR AS name,
            (range * 1.25)::DECIMAL(8, 2) AS price,
            DATE '2024-01-01' + range::INTEGER AS sold,
            TIMESTAMP '2024-01-01 10:00:00' + to_minutes(range) AS seen,
            [range, range + 1] AS pair,
            {'n': range, 's': 'x'} AS props,
            MAP {'k': range} AS m,
            '00000000-0000-0000-0000-00000000000' || (range % 10)::VARCHAR AS uid_text,
            to_days(range::INTEGER) AS span,
            'ab'::BLOB AS raw,
            CASE WHEN range % 7 = 0 THEN NULL ELSE range END AS maybe
        FROM range(500)
        """
    )
    conn.close()
    return path


def _kib(pid: int | str, key: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmHWM: peak resident memory; VmSize: address space)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{key} not in /proc/{pid}/status")


def _peak_rss_kib() -> int:
    """This process's peak RSS since the last `_reset_peak_rss()`."""
    return _kib("self", "VmHWM")


def _reset_peak_rss() -> None:
    """Start the peak over at the current RSS (Linux 4.0+; elsewhere the lifetime peak is kept,
    which still catches a first bomb)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _address_space_limit(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max address space"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no address-space line")


def _one_worker(shop: Path) -> int:
    """Start afresh with a single worker (after a query) and return its pid."""
    duckdb_worker.shutdown()
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]
    pids = duckdb_worker.worker_pids()
    assert len(pids) == 1
    return pids[0]


def _stopped_worker(shop: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, threading.Event]:
    """A single worker, stopped (SIGSTOP), and an event set once a request has been sent to it."""
    old = _one_worker(shop)
    os.kill(old, signal.SIGSTOP)
    sent = threading.Event()
    real_send = duckdb_worker._Worker.send

    def send(self: Any, request: tuple[Any, ...]) -> None:
        real_send(self, request)
        sent.set()

    monkeypatch.setattr(duckdb_worker._Worker, "send", send)
    return old, sent


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # a zombie no one reaped yet


BOMBS = [
    "SELECT repeat('x', 2000000000) AS s",
    "SELECT repeat('x', 100000000) FROM range(40)",
    "SELECT length(lpad('', 1500000000, 'x'))",
    "SELECT length(printf('%1500000000d', 1))",
    "SELECT length(string_agg(repeat('x', 1000000), '')) FROM range(3000)",  # DuckDB's own limit
]


@pytest.mark.parametrize("bomb", BOMBS)
def test_a_memory_bomb_stays_in_the_worker_and_the_next_query_works(shop: Path, bomb: str) -> None:
    """In-process these took 3-8 GB of the caller (or finished after 2 s of allocating): now the
    caller's peak RSS does not move, the error is one readable line, and the database still answers."""
    _reset_peak_rss()
    before = _peak_rss_kib()
    with pytest.raises(SQLError) as info:
        run_query(shop, "duckdb", bomb, timeout=1.0, max_rows=5)
    message = str(info.value)
    assert "\n" not in message
    if isinstance(info.value, QueryTimeout):
        assert message.startswith("The query ran longer than 1 s and was stopped.")
    else:
        assert message.startswith("DuckDB error:") and "memory" in message.lower()
        assert "2 GiB in all" in message or "more memory than a query may use (2 GiB)" in message
        assert "SET memory_limit" not in message  # DuckDB's advice cannot be followed here
    assert _peak_rss_kib() < before + 100 * 1024
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]


def test_the_worker_runs_under_an_address_space_cap_with_room_to_spare(shop: Path) -> None:
    run_query(shop, "duckdb", COUNT)
    pids = duckdb_worker.worker_pids()
    assert pids and os.getpid() not in pids
    for pid in pids:
        assert _address_space_limit(pid) == (str(duckdb_worker.MEMORY_CAP),) * 2
        # At rest (Python, duckdb, an open database) a worker uses well under half of its cap.
        assert _kib(pid, "VmSize") * 1024 < duckdb_worker.MEMORY_CAP // 2


def test_a_stuck_worker_is_killed_and_replaced(shop: Path) -> None:
    """A worker that does not answer (stopped here; a long scalar call in life) is SIGKILLed
    at timeout + grace, the caller gets the usual timeout error, and a new worker takes over."""
    old = _one_worker(shop)
    os.kill(old, signal.SIGSTOP)
    with pytest.raises(QueryTimeout, match=r"^The query ran longer than 0.5 s and was stopped"):
        run_query(shop, "duckdb", COUNT, timeout=0.5)
    assert _gone(old)
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]
    (new,) = duckdb_worker.worker_pids()
    assert new != old


@pytest.mark.parametrize(
    ("signum", "message"),
    [
        (
            signal.SIGKILL,
            "DuckDB error: the query process was killed by signal 9 (SIGKILL) (out of memory on this machine, "
            "or stopped from outside) before it answered. Run",
        ),
        (signal.SIGTERM, "DuckDB error: the query process was killed by signal 15 (SIGTERM) before it answered. Run"),
        # An abort is what an allocation that fails outside DuckDB's reach ends in: memory.
        (
            signal.SIGABRT,
            "DuckDB error: the query needed more memory than a query may use (2 GiB) and was stopped."
            " Select fewer or shorter values. (The query process was killed by signal 6 (SIGABRT).)",
        ),
    ],
)
def test_a_worker_that_dies_mid_query_is_a_clear_error_and_is_replaced(
    shop: Path, monkeypatch: pytest.MonkeyPatch, signum: int, message: str
) -> None:
    """Killed while it runs a query: an SQLError saying what happened, not a hang. Every death
    used to be reported as the query needing too much memory, a kill from outside too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))  # the worker (started next) leaves no core file
    try:
        old, sent = _stopped_worker(shop, monkeypatch)
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    outcome: list[BaseException | QueryResult] = []

    def query() -> None:
        try:
            outcome.append(run_query(shop, "duckdb", COUNT, timeout=60))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=query)
    thread.start()
    assert sent.wait(30)
    os.kill(old, signum)
    os.kill(old, signal.SIGCONT)  # (a stopped process only gets SIGKILL)
    thread.join(30)
    (error,) = outcome
    assert isinstance(error, SQLError) and not isinstance(error, QueryTimeout)
    assert str(error).startswith(message) and "\n" not in str(error)
    assert _gone(old)
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]
    assert duckdb_worker.worker_pids() != [old]


def test_a_worker_killed_while_idle_is_replaced_without_an_error(shop: Path) -> None:
    old = _one_worker(shop)
    os.kill(old, signal.SIGKILL)
    os.waitid(os.P_PID, old, os.WEXITED | os.WNOWAIT)  # dead (not yet reaped)
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]
    assert duckdb_worker.worker_pids() != [old] and _gone(old)


def _in_process(shop: Path, sql: str, max_rows: int | None) -> QueryResult | str:
    try:
        return executor._connection(shop, "duckdb", True).run(sql, 5.0, max_rows, None)
    except SQLError as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize(
    ("sql", "max_rows"),
    [
        ("SELECT * FROM items ORDER BY id", 10),
        ("SELECT * FROM items ORDER BY id DESC", None),
        ("SELECT sum(price), min(sold), max(seen), list(pair[1] ORDER BY id)[:3] FROM items", 5),
        ("SELECT uid_text::UUID AS u, span, raw FROM items WHERE id < 3 ORDER BY id", 5),
        ("SELECT nope FROM items", 5),
        ("SELECT 1 / 0, 'a' + 1", 5),
        ("SELECT * FROM items", 0),
    ],
)
def test_ordinary_results_and_errors_are_those_of_an_in_process_query(
    shop: Path, sql: str, max_rows: int | None
) -> None:
    try:
        got: QueryResult | str = run_query(shop, "duckdb", sql, max_rows=max_rows)
    except SQLError as exc:
        got = f"{type(exc).__name__}: {exc}"
    assert got == _in_process(shop, sql, max_rows)
    assert duckdb_worker.worker_pids()  # and it did go through a worker


def test_values_keep_their_python_types(shop: Path) -> None:
    sql = "SELECT price, sold, seen, pair, props, m, uid_text::UUID, span, raw, maybe FROM items WHERE id = 7"
    (row,) = run_query(shop, "duckdb", sql).rows
    assert row == (
        decimal.Decimal("8.75"),
        datetime.date(2024, 1, 8),
        datetime.datetime(2024, 1, 1, 10, 7),
        [7, 8],
        {"n": 7, "s": "x"},
        {"k": 7},
        uuid.UUID("00000000-0000-0000-0000-000000000007"),
        datetime.timedelta(days=7),
        b"ab",
        None,
    )
    assert duckdb_worker.worker_pids()


def test_queries_from_many_threads_share_a_few_workers(shop: Path) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                res = run_query(shop, "duckdb", f"SELECT count(*) FROM items WHERE id < {i}")
                assert res.rows == [(i,)]
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert 0 < len(duckdb_worker.worker_pids()) <= duckdb_worker._pool_now().size


async def test_execute_waits_for_a_worker_without_blocking_the_event_loop(shop: Path) -> None:
    old = _one_worker(shop)
    os.kill(old, signal.SIGSTOP)  # the query cannot finish before the worker is killed
    task = asyncio.ensure_future(execute(shop, "duckdb", COUNT, timeout=0.5))
    await asyncio.sleep(0)  # the task's first step runs: had it blocked the loop, it would be done
    assert not task.done()
    with pytest.raises(QueryTimeout):
        await task
    res = await execute(shop, "duckdb", COUNT)
    assert res.rows == [(500,)] and duckdb_worker.worker_pids() != [old]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_worker(shop: Path) -> None:
    parent_workers = duckdb_worker.worker_pids() or [_one_worker(shop)]
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            ok = run_query(shop, "duckdb", COUNT).rows == [(500,)]
            mine = duckdb_worker.worker_pids()
            code = 0 if ok and mine and not set(mine) & set(parent_workers) else 2
            duckdb_worker.shutdown()
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert duckdb_worker.worker_pids() == parent_workers
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]


SCRIPT = """
import sys
from pathlib import Path
from toolenv_sql import duckdb_worker
from toolenv_sql.executor import run_query
print("script body ran", flush=True)
print(run_query(Path(sys.argv[1]), "duckdb", "SELECT count(*) FROM items").rows[0][0], flush=True)
print(*duckdb_worker.worker_pids(), flush=True)
if sys.argv[2] == "hang":
    sys.stdin.read()
"""


def test_a_script_without_a_main_guard_runs_once_and_its_workers_end_with_it(shop: Path, tmp_path: Path) -> None:
    """Workers are not spawned with multiprocessing, which would run the script again in each."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(shop), "exit"], capture_output=True, text=True, timeout=120, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[:2] == ["script body ran", "500"] and len(lines) == 3
    workers = [int(pid) for pid in lines[2].split()]
    assert workers and all(_gone(pid) for pid in workers)  # killed at exit


def test_workers_leave_when_their_parent_is_killed(shop: Path, tmp_path: Path) -> None:
    """... and take their spill folders with them (the killed parent cannot)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(shop), "hang"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert proc.stdout is not None
    assert [proc.stdout.readline().strip() for _ in range(2)] == ["script body ran", "500"]
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    assert workers
    proc.kill()  # no atexit: the workers see their pipe close
    proc.wait()
    proc.stdout.close()
    assert proc.stdin is not None
    proc.stdin.close()
    for pid in workers:
        for _ in range(600):  # up to 30 s
            if _gone(pid):
                break
            threading.Event().wait(0.05)
        assert _gone(pid)
    assert list(scratch.iterdir()) == []


def test_without_the_worker_queries_run_in_process(shop: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where RLIMIT_AS does not exist (Windows): the old in-process path, with the same results."""
    duckdb_worker.shutdown()
    monkeypatch.setattr(duckdb_worker, "AVAILABLE", False)
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]
    assert duckdb_worker.worker_pids() == []
    bomb = "SELECT length(string_agg(repeat('x', 1000000), '')) FROM range(3000)"  # DuckDB's own limit
    one_line = r"^DuckDB error: Out of Memory Error: [^\n]*\(a query may use 512 MiB for DuckDB's data: select "
    with pytest.raises(SQLError, match=one_line + r"fewer or shorter values\)$"):
        run_query(shop, "duckdb", bomb)


# ---------------------------------------------------------------------------- under load


@pytest.fixture
def one_worker_pool(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A pool of one worker (restored to the default afterwards)."""
    duckdb_worker.shutdown()
    monkeypatch.setenv("TOOLENV_SQL_DUCKDB_WORKERS", "1")
    yield
    duckdb_worker.shutdown()


def _wait_until_gone(pid: int) -> bool:
    """True once `pid` has ended (polled for up to 30 s: the worker is killed by another thread)."""
    for _ in range(600):
        if _gone(pid):
            return True
        threading.Event().wait(0.05)
    return _gone(pid)


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_the_wait_for_a_busy_worker_counts_against_the_timeout(
    shop: Path, one_worker_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeout counts from the call, as the docs say (the caller waits at most timeout + 1 s):
    a query queued behind a stuck one gets a timeout error saying it never started. It used to
    wait for the stuck query's whole timeout, then run (12 queued 1 s queries took up to 6 s)."""
    old, sent = _stopped_worker(shop, monkeypatch)
    thread, outcome = _in_thread(lambda: run_query(shop, "duckdb", COUNT, timeout=8))
    assert sent.wait(30)  # the stuck worker has the first query
    with pytest.raises(QueryTimeout, match=r"^The query did not start within 0.5 s: .*busy") as info:
        run_query(shop, "duckdb", COUNT, timeout=0.5)
    assert "\n" not in str(info.value)
    thread.join(60)
    assert isinstance(outcome[0], QueryTimeout)  # the stuck one ran out of time in its own right
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]


async def test_cancelling_execute_stops_its_duckdb_query(
    shop: Path, one_worker_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled `execute` (the tool's guard fired, the episode was cancelled, `asyncio.run`
    ended) kills the worker running its query: it used to run on for its whole timeout, holding
    the worker, and the interpreter's exit waited for the pool thread stuck on it."""
    old, sent = _stopped_worker(shop, monkeypatch)  # the query never finishes by itself
    task = asyncio.ensure_future(execute(shop, "duckdb", COUNT, timeout=600))
    assert await asyncio.get_running_loop().run_in_executor(None, sent.wait, 30)  # the worker has it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.get_running_loop().run_in_executor(None, _wait_until_gone, old)
    res = await execute(shop, "duckdb", COUNT, timeout=30)
    assert res.rows == [(500,)] and duckdb_worker.worker_pids() != [old]


def test_a_script_that_ends_with_a_query_in_flight_exits_and_leaves_no_worker(shop: Path, tmp_path: Path) -> None:
    """`asyncio.run` cancels the pending query at the end of `main`; the worker is killed, so the
    interpreter does not wait out the query's timeout (here 600 s) joining the pool thread."""
    script = tmp_path / "train.py"
    script.write_text(
        "import asyncio, os, signal, sys, threading\n"
        "from pathlib import Path\n"
        "from toolenv_sql import duckdb_worker\n"
        "from toolenv_sql.executor import execute\n"
        "sent, send = threading.Event(), duckdb_worker._Worker.send\n"
        "duckdb_worker._Worker.send = lambda self, request: (send(self, request), sent.set())\n"
        "async def main():\n"
        "    await execute(Path(sys.argv[1]), 'duckdb', 'SELECT 1')\n"
        "    (pid,) = duckdb_worker.worker_pids()\n"
        "    os.kill(pid, signal.SIGSTOP)\n"
        "    print(pid, flush=True)\n"
        "    sent.clear()\n"
        "    asyncio.ensure_future(execute(Path(sys.argv[1]), 'duckdb', 'SELECT 2', timeout=600))\n"
        "    await asyncio.get_running_loop().run_in_executor(None, sent.wait, 30)\n"
        "asyncio.run(main())\n"
    )
    try:
        done = subprocess.run([sys.executable, str(script), str(shop)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        with contextlib.suppress(ValueError, IndexError, OSError):  # the stopped worker would stay for good
            os.kill(int((exc.stdout or b"").split()[0]), signal.SIGKILL)
        pytest.fail("the interpreter waited for the cancelled query at exit")
    assert done.returncode == 0, done.stderr
    assert _gone(int(done.stdout.split()[0]))


def _spill_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_spill_files_stay_out_of_the_database_folder_and_go_with_their_worker(
    tmp_path: Path, one_worker_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB spilled into `<db>.tmp/` beside the database (the data set's folder, perhaps
    read-only), and a worker killed mid-spill left its files there for good (125 MB from one
    killed sort). Now each worker spills into its own folder in the system's temporary
    directory, and that folder goes when the worker does."""
    folder, scratch = tmp_path / "data", tmp_path / "scratch"
    folder.mkdir()
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    db = folder / "empty.duckdb"
    duckdb.connect(str(db)).close()
    monkeypatch.setattr(duckdb_worker, "MEMORY_CAP", 1024 * 2**20)  # DuckDB gets 256 MiB: the sort spills
    sql = (
        "SELECT count(*), sum(rn * (x % 1000)) FROM (SELECT x, row_number() OVER (ORDER BY y) AS rn"
        " FROM (SELECT range AS x, md5(range::VARCHAR) AS y FROM range(20000000)))"
    )
    assert run_query(db, "duckdb", "SELECT 1").rows == [(1,)]
    (pid,) = duckdb_worker.worker_pids()
    thread, outcome = _in_thread(lambda: run_query(db, "duckdb", sql, timeout=300))
    for _ in range(1200):  # up to 60 s for the sort to spill
        if _spill_files(scratch) or thread.join(0.05) or not thread.is_alive():
            break
    assert _spill_files(scratch), outcome  # it spilled, and into the system's temporary directory
    os.kill(pid, signal.SIGKILL)
    thread.join(60)
    assert isinstance(outcome[0], SQLError)
    assert list(scratch.iterdir()) == []  # the killed worker's files went with it
    assert sorted(p.name for p in folder.iterdir()) == ["empty.duckdb"]
    assert run_query(db, "duckdb", "SELECT 1").rows == [(1,)]
    duckdb_worker.shutdown()
    assert list(scratch.iterdir()) == []


def _text_bytes(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_bytes(k) + _text_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_text_bytes(v) for v in value)
    return 0


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT [repeat('x', 9000000)] AS l FROM range(40)",  # text inside a list
        "SELECT {'a': repeat('x', 9000000)} AS s FROM range(40)",  # inside a struct
        "SELECT MAP {range::VARCHAR: repeat('x', 9000000)} AS m FROM range(40)",  # inside a map
        "SELECT [[repeat('x', 3000000), repeat('y', 3000000)], [repeat('z', 3000000)]] FROM range(40)",
    ],
)
def test_text_inside_lists_structs_and_maps_counts_towards_the_kept_bytes(shop: Path, sql: str) -> None:
    """The rows kept hold at most 16 MB of text: nested values counted for nothing, so these
    brought 360 MB back into the caller (peak RSS 67 MB -> 770 MB), past the worker's cap."""
    _reset_peak_rss()
    before = _peak_rss_kib()
    try:
        res = run_query(shop, "duckdb", sql, max_rows=50)
    except SQLError as exc:
        # DuckDB 1.5 (the last for Python 3.10) builds a batch of these maps in over 2 GiB: the
        # worker's own cap stops it first, which keeps the caller's memory as safe.
        assert "needed more memory than a query may use" in str(exc) and "MAP" in sql, exc
        assert duckdb.__version__.startswith("1."), duckdb.__version__
    else:
        assert res.row_count == 40
        assert 0 < len(res.rows) < 40
        assert _text_bytes(res.rows) <= executor._MAX_KEPT_BYTES
    assert _peak_rss_kib() < before + 100 * 1024


def test_long_lists_of_numbers_count_towards_the_kept_bytes(shop: Path) -> None:
    """Each item of a list counts (8 bytes): ten lists of a million numbers are 10 M Python objects."""
    # Making (and counting past the cap) 10 M Python ints took 5-10 s on a loaded 2-CPU machine: the
    # default 5 s timeout failed the test on load, not on what it checks.
    res = run_query(shop, "duckdb", "SELECT range(1000000) AS l FROM range(10)", max_rows=50, timeout=60)
    assert res.row_count == 10
    assert 0 < len(res.rows) < 10
    assert res.rows[0][0][:3] == [0, 1, 2]


def test_threads_sharing_one_worker_take_turns(shop: Path, one_worker_pool: Any) -> None:
    """Workers go to callers in the order they asked: a thread that just finished a query used to
    take the worker straight back (6,534 queries to 1 in 5 s), starving the threads waiting for it,
    which ran out of time without starting."""
    _one_worker(shop)
    first_done = threading.Event()
    counts = [0, 0, 0]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            if i == 0:
                while not first_done.is_set():  # takes the worker again and again
                    run_query(shop, "duckdb", COUNT, timeout=30)
                    counts[0] += 1
            else:
                run_query(shop, "duckdb", COUNT, timeout=30)
                counts[i] += 1
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    hog = threading.Thread(target=work, args=(0,))
    hog.start()
    others = [threading.Thread(target=work, args=(i,)) for i in (1, 2)]
    for t in others:
        t.start()
    for t in others:
        t.join(120)
    first_done.set()
    hog.join(120)
    assert not errors
    assert counts[1:] == [1, 1]  # served in turn, while the hog kept asking


# ---------------------------------------------------------------------------- starting and dying


def _hanging_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, start_timeout: float = 60.0) -> Path:
    """New workers never say they are ready (a start stuck on a slow disk, a hung import); the
    file returned gets each one's pid."""
    pids = tmp_path / "starting.pids"
    bootstrap = (
        "import os, time\n"
        f"with open({str(pids)!r}, 'a') as out:\n"
        "    out.write(f'{os.getpid()}\\n')\n"
        "time.sleep(600)\n"
    )
    monkeypatch.setattr(duckdb_worker, "_BOOTSTRAP", bootstrap)
    monkeypatch.setattr(duckdb_worker, "_START_TIMEOUT", start_timeout)
    return pids


def _started_pids(pids: Path) -> list[int]:
    """The pids written to `pids` (polled for up to 30 s until there is one)."""
    for _ in range(600):
        if pids.exists() and pids.read_text().endswith("\n"):
            return [int(line) for line in pids.read_text().split()]
        threading.Event().wait(0.05)
    raise AssertionError("no worker started")


def test_a_start_that_hangs_is_bounded_by_the_query_timeout_and_cleaned_up(
    shop: Path, tmp_path: Path, one_worker_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new worker that never became ready held its caller 60 s, whatever the query's timeout:
    now it waits the timeout (5 s at least, as a start takes 0.2-0.8 s), gets a timeout error,
    and the stuck process and its spill folder are gone."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with monkeypatch.context() as patch:
        pids = _hanging_starts(patch, tmp_path, start_timeout=20.0)  # (60 s, whatever the query's timeout)
        with pytest.raises(QueryTimeout, match=r"^The query did not start within 5 s: .*process") as info:
            run_query(shop, "duckdb", COUNT, timeout=0.5)
        assert "\n" not in str(info.value)
    (pid,) = _started_pids(pids)
    assert _gone(pid) and list(scratch.iterdir()) == []
    assert run_query(shop, "duckdb", COUNT, timeout=30).rows == [(500,)]  # the next start is a good one


def test_a_timeout_shorter_than_a_start_still_gets_a_worker(shop: Path, one_worker_pool: Any) -> None:
    """The start is given at least 5 s: bounded by a 0.1 s timeout, no worker would ever be ready."""
    assert run_query(shop, "duckdb", COUNT, timeout=0.1).rows == [(500,)]
    assert duckdb_worker.worker_pids()


async def test_cancelling_execute_while_its_worker_starts_kills_the_start(
    shop: Path, tmp_path: Path, one_worker_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool's guard fired while a new worker started: the pool thread waited on for the start."""
    loop = asyncio.get_running_loop()
    with monkeypatch.context() as patch:
        pids = _hanging_starts(patch, tmp_path)
        task = asyncio.ensure_future(execute(shop, "duckdb", COUNT, timeout=600))
        (pid,) = await loop.run_in_executor(None, _started_pids, pids)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await loop.run_in_executor(None, _wait_until_gone, pid)
    res = await execute(shop, "duckdb", COUNT, timeout=30)
    assert res.rows == [(500,)]


def test_a_worker_started_from_a_large_process_and_killed_is_not_called_out_of_memory(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's `ru_maxrss` counts the resident memory of the process it was forked from (Linux
    keeps the larger across exec), so a worker of a large trainer or test process looked as if it
    had filled half its cap, and any kill was reported as a memory error (CI's full suite, with
    torch loaded). The cap is lowered, after the worker started, to twice this process's peak."""
    old, sent = _stopped_worker(shop, monkeypatch)
    monkeypatch.setattr(duckdb_worker, "MEMORY_CAP", 2 * _kib("self", "VmHWM") * 1024)
    thread, outcome = _in_thread(lambda: run_query(shop, "duckdb", COUNT, timeout=60))
    assert sent.wait(30)
    os.kill(old, signal.SIGTERM)
    os.kill(old, signal.SIGCONT)
    thread.join(30)
    (error,) = outcome
    assert isinstance(error, SQLError) and not isinstance(error, QueryTimeout)
    assert str(error).startswith("DuckDB error: the query process was killed by signal 15 (SIGTERM) before it answered")
    monkeypatch.undo()
    assert run_query(shop, "duckdb", COUNT).rows == [(500,)]


@pytest.mark.parametrize(
    ("code", "error", "message"),
    [
        (3, SQLError, r"^DuckDB error: the query process exited with code 3 before it answered"),
        (duckdb_worker._WATCHDOG_EXIT, QueryTimeout, r"^The query ran longer than 30 s and was stopped"),
    ],
)
def test_a_worker_that_exits_mid_query_gives_its_exit_code(
    shop: Path, one_worker_pool: Any, monkeypatch: pytest.MonkeyPatch, code: int, error: type, message: str
) -> None:
    """... or, for the exit of its own watchdog (its query outlived the deadline), the timeout error."""
    exits = (
        "import os, sys\n"
        "from multiprocessing.connection import Connection\n"
        "conn = Connection(int(sys.argv[1]))\n"
        "conn.recv()\n"
        "conn.send(('ready', None))\n"
        "conn.recv()\n"
        f"os._exit({code})\n"
    )
    with monkeypatch.context() as patch:
        patch.setattr(duckdb_worker, "_BOOTSTRAP", exits)
        with pytest.raises(error, match=message):
            run_query(shop, "duckdb", COUNT, timeout=30)
    assert run_query(shop, "duckdb", COUNT, timeout=30).rows == [(500,)]
