"""DuckDB queries in worker processes whose memory the OS caps and which are killed past their deadline.

DuckDB's `memory_limit` covers only its buffer manager: a string built by a scalar
function (`repeat('x', 2e9)`, `lpad`, `printf('%1500000000d', 1)`) is allocated
outside it, and `interrupt()` is not honoured inside one long scalar call. Run
in-process, such a query took 3-8 GB of the caller's memory and overshot its timeout
by 60-200 %. So every DuckDB query runs in one of a few long-lived worker processes:

* each worker caps its address space with `RLIMIT_AS` (`MEMORY_CAP`, 2 GiB by
  default, `TOOLENV_SQL_DUCKDB_MEMORY_MB` overrides it) and gives DuckDB a
  `memory_limit` of a quarter of it (at most 512 MiB); an allocation past the cap
  fails inside the worker, which DuckDB reports as an "Out of Memory Error";
* a query's timeout counts from its call (`executor._Call`): the caller waits for
  a free worker until then, then for the answer until then + `_GRACE`, then SIGKILLs
  the worker and raises `QueryTimeout`. Starting a worker does not count, but may
  take the query's timeout at most (5 s at least, `_START_MIN`): one that is not
  ready by then is killed and the caller gets `QueryTimeout`. A worker that dies gives an
  `SQLError` saying how (signal or exit code), or that the query needed more memory
  than a query may use when it aborted. The next query
  starts a fresh worker. A worker also ends itself `_GRACE` after that, should its
  caller be gone. A caller that gives up (a cancelled `execute`) kills the worker
  running its query, or being started for it;
* `TOOLENV_SQL_DUCKDB_WORKERS` workers at most (default: min(4, CPUs)) are started
  lazily. They ignore SIGINT, are SIGKILLed at exit, leave when their pipe closes,
  and a forked child starts its own;
* each worker spills into its own folder in the system's temporary directory (at
  most `MEMORY_CAP` bytes), which the caller removes with the worker (or the worker,
  should the caller be gone): DuckDB's default, `<database>.tmp/` beside the
  database, kept what a killed worker left.

Workers are started with `subprocess` (fork+exec) and talk over a socket pair
wrapped in `multiprocessing.connection.Connection` (pickled messages). Not with a
`multiprocessing` spawn or forkserver context: those import the parent's `__main__`
script again in the child, so a training script without an `if __name__ ==
"__main__"` guard would run again (load its model, build its envs) in every worker.
Not `ProcessPoolExecutor` either: it cannot kill one stuck task, and a worker that
dies breaks the whole pool (every pending future fails with `BrokenProcessPool`).

Where `resource.RLIMIT_AS` does not exist (Windows), or with
`TOOLENV_SQL_DUCKDB_MEMORY_MB=0`, queries run in the caller's process as before
(`AVAILABLE` is False): memory is then bounded by nothing but the query's timeout.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import importlib.util
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from toolenv_sql.errors import QueryTimeout, SQLError
from toolenv_sql.executor import QueryResult, _Call

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

__all__ = ["AVAILABLE", "MEMORY_CAP", "run", "shutdown", "worker_pids"]


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


# Address space a worker may use. At rest a worker maps about 270 MiB (Python, duckdb,
# sqlglot, one open database) and 350 MiB with the 8 databases it keeps open (measured with
# duckdb 2.0.1, CPython 3.11, x86-64 Linux); DuckDB's memory_limit is a quarter of the cap,
# so a query has over 1 GiB to spare. A worker past half its cap after a query is replaced.
MEMORY_CAP = _env_int("TOOLENV_SQL_DUCKDB_MEMORY_MB", 2048) * 2**20
AVAILABLE = resource is not None and hasattr(resource, "RLIMIT_AS") and MEMORY_CAP > 0
# Seconds the caller waits past a query's timeout (the worker interrupts the query at the
# timeout itself) before it kills the worker.
_GRACE = 1.0
# How a worker's watchdog ends it (`os._exit`): its query ran past the deadline.
_WATCHDOG_EXIT = 70
# Seconds a new worker may take to start: the query's timeout, but at least `_START_MIN`
# (a start takes 0.2-0.8 s: a shorter timeout would never see a worker) and at most
# `_START_TIMEOUT`. One not ready by then is killed.
_START_MIN = 5.0
_START_TIMEOUT = 60.0
# Open databases a worker keeps (each is a DuckDB instance with its own buffer pool).
_WORKER_CONNECTIONS = 8
# The child's entry point: read the parent's sys.path, the cap and its spill folder, then serve.
_BOOTSTRAP = (
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:], cap, spill = conn.recv()\n"
    "from toolenv_sql.duckdb_worker import serve\n"
    "serve(conn, cap, spill)\n"
)


def _size_text(size: int) -> str:
    return f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size // 2**20} MiB"


def _memory_error() -> SQLError:
    return SQLError(
        f"DuckDB error: the query needed more memory than a query may use ({_size_text(MEMORY_CAP)})"
        " and was stopped. Select fewer or shorter values."
    )


def _timeout_error(timeout: float) -> QueryTimeout:
    from toolenv_sql.executor import _timeout_error as error

    return error(timeout)


def _not_started_error(timeout: float) -> QueryTimeout:
    from toolenv_sql.executor import _not_started_error as error

    return error(timeout, "every DuckDB query process was")


def _cancelled_error() -> SQLError:
    return SQLError("The query was cancelled.")


def _slow_start_error(wait: float) -> QueryTimeout:
    return QueryTimeout(
        f"The query did not start within {wait:g} s: a new DuckDB query process was not ready in time. Run it again."
    )


# ---------------------------------------------------------------------------- the worker side


def serve(conn: Connection, cap: int, spill: str | None = None) -> None:
    """Answer `(path, sql, timeout, max_rows, count_to)` requests on `conn` until it closes;
    DuckDB spills into the folder `spill` (at most `cap` bytes), which goes with the worker
    should the caller be gone (the caller removes it otherwise)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if resource is not None and cap > 0:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
        with contextlib.suppress(ValueError, OSError):  # refused (macOS?): the deadline kill still holds
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from toolenv_sql import executor

    executor._MAX_CONNECTIONS_PER_THREAD = _WORKER_CONNECTIONS
    executor._DUCKDB_MEMORY_LIMIT = limit = min(512 * 2**20, cap // 4)
    executor._DUCKDB_MEMORY_NOTE = f"{_size_text(limit)} for DuckDB's data, {_size_text(cap)} in all"
    if spill is not None:
        executor._DUCKDB_SPILL.update(temp_directory=spill, max_temp_directory_size=f"{max(cap, 2**20) // 2**20}MiB")
    watchdog = _Watchdog(spill)
    watchdog.start()
    conn.send(("ready", None))
    while True:
        try:
            path, sql, timeout, max_rows, count_to = conn.recv()
        except (EOFError, OSError):
            _remove(spill)  # the caller is gone (perhaps killed): no one else will
            return
        kind, value = _answer(executor, watchdog, Path(path), sql, timeout, max_rows, count_to)
        # After an allocation failed, or once freed memory stays mapped (glibc and DuckDB keep
        # it: ~1.9 GiB after one Out of Memory Error), leave: a fresh worker has all its room.
        retire = kind == "memory" or (kind == "error" and "Out of Memory" in str(value)) or _address_space() > cap // 2
        try:
            try:
                conn.send((kind, value, retire))
            except MemoryError:
                retire = True
                conn.send(("memory", None, retire))
            except (OSError, EOFError):
                raise
            except Exception as exc:  # noqa: BLE001 - a value pickle cannot carry
                message = f"DuckDB error: the result cannot be sent back ({type(exc).__name__}: {exc})"
                conn.send(("error", SQLError(message), retire))
        except (OSError, EOFError, MemoryError):
            _remove(spill)
            return  # the caller is gone, or no memory is left even for the reply
        if retire:
            return


def _remove(spill: str | None) -> None:
    if spill is not None:
        shutil.rmtree(spill, ignore_errors=True)


def _address_space() -> int:
    """Bytes of address space this process has mapped (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


class _Watchdog(threading.Thread):
    """Ends the worker when a query outlives its deadline, should the caller (who kills it
    at timeout + `_GRACE`) be gone. One thread for all queries: a Timer each cost ~0.2 ms."""

    def __init__(self, spill: str | None = None) -> None:
        super().__init__(name="toolenv-sql-watchdog", daemon=True)
        self.cond = threading.Condition()
        self.deadline = math.inf
        self.spill = spill

    def run(self) -> None:
        with self.cond:
            while True:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    _remove(self.spill)
                    os._exit(_WATCHDOG_EXIT)
                self.cond.wait(None if left == math.inf else left)

    def arm(self, seconds: float) -> None:
        with self.cond:
            self.deadline = time.monotonic() + seconds
            self.cond.notify()

    def disarm(self) -> None:
        with self.cond:
            self.deadline = math.inf


def _answer(
    executor: Any, watchdog: _Watchdog, path: Path, sql: str, timeout: float, max_rows: int | None, count_to: int | None
) -> Any:
    watchdog.arm(timeout + 2 * _GRACE)
    try:
        return ("ok", executor._connection(path, "duckdb", True).run(sql, timeout, max_rows, count_to))
    except SQLError as exc:
        return ("error", exc)
    except MemoryError:
        return ("memory", None)
    except Exception as exc:  # noqa: BLE001 - anything else is the query's error, not the worker's end
        return ("error", SQLError(f"DuckDB error: {type(exc).__name__}: {exc}"))
    finally:
        watchdog.disarm()


# ---------------------------------------------------------------------------- the caller side


class _WorkerDied(Exception):
    """The worker's pipe closed before it answered."""


class _SlowStart(Exception):
    """A new worker did not say it was ready in time."""


class _Worker:
    """One worker process and the parent's end of its socket pair."""

    def __init__(self, call: _Call | None = None) -> None:
        """Start a worker for `call`, which waits for it at most its timeout (within
        `_START_MIN` and `_START_TIMEOUT`) and kills it should its caller give up meanwhile."""
        # DuckDB's temporary directory: made here (mode 0700), it is this worker's alone.
        self.spill = tempfile.mkdtemp(prefix="toolenv-sql-duckdb-")
        try:
            self._start(call)
        except BaseException:
            shutil.rmtree(self.spill, ignore_errors=True)
            raise

    def _start(self, call: _Call | None) -> None:
        parent_end, child_end = socket.socketpair()
        with parent_end, child_end:
            env = dict(os.environ)
            # glibc gives each thread a 64 MiB malloc arena, all counted by RLIMIT_AS.
            env.setdefault("MALLOC_ARENA_MAX", "2")
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _BOOTSTRAP, str(child_end.fileno())],
                    pass_fds=(child_end.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,  # (stderr stays: a worker's traceback is worth seeing)
                    env=env,
                )
            except OSError as exc:
                raise SQLError(f"DuckDB error: the query process could not start ({exc}).") from None
            self.conn = Connection(parent_end.detach())
        wait = _START_TIMEOUT if call is None else min(_START_TIMEOUT, max(_START_MIN, call.timeout))
        if call is not None:
            call.on_cancel(self.stop)  # a caller that gives up does not wait for the start
        try:
            self.conn.send((sys.path, MEMORY_CAP, self.spill))
            if not self.conn.poll(wait):
                raise _SlowStart
            self.conn.recv()
        except (_SlowStart, EOFError, OSError) as exc:
            self.kill()
            if call is not None and call.cancelled:
                raise _cancelled_error() from None
            if isinstance(exc, _SlowStart):
                raise _slow_start_error(wait) from None
            reason = str(exc) or f"{type(exc).__name__}; see its error output"
            raise SQLError(f"DuckDB error: the query process could not start ({reason}).") from None
        finally:
            if call is not None:
                call.on_cancel(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, request: tuple[Any, ...]) -> None:
        self.conn.send(request)

    def answer(self, wait: float) -> tuple[str, Any, bool] | None:
        """The worker's reply `(kind, value, retiring)`, or None if it gave none within `wait` seconds."""
        if not self.conn.poll(wait):
            return None
        try:
            reply: tuple[str, Any, bool] = self.conn.recv()
        except (EOFError, OSError):
            raise _WorkerDied from None
        return reply

    def stop(self) -> None:
        """SIGKILL the process (from any thread): whoever waits on its pipe sees it close."""
        if self.proc.returncode is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGKILL)

    def reap(self, wait: float) -> int:
        """Wait up to `wait` s for the process to end (then kill it) and reap it: its exit code
        (-N: killed by signal N)."""
        deadline = time.monotonic() + wait
        delay = 0.0005
        while True:
            try:
                pid, status = os.waitpid(self.pid, 0 if time.monotonic() > deadline else os.WNOHANG)
            except ChildProcessError:  # reaped by `Popen` meanwhile, which knows its code
                return self.proc.wait()
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode
            if time.monotonic() > deadline:  # its pipe closed, yet it lives on: it goes now
                self.stop()
            else:
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def kill(self) -> None:
        """Kill and reap the process, close its pipe and remove its spill folder."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()
        shutil.rmtree(self.spill, ignore_errors=True)


class _Pool:
    """Up to `size` workers, started on demand; a caller takes an idle one or waits for one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pid = os.getpid()
        self.cond = threading.Condition()
        self.idle: list[_Worker] = []
        self.workers: set[_Worker] = set()
        self.starting = 0
        self.closed = False
        self.queue: collections.deque[object] = collections.deque()  # callers waiting, first first

    def _wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def _acquire(self, call: _Call) -> _Worker:
        """An idle worker, or a new one, before `call`'s deadline (a start moves the deadline on).

        Callers are served in the order they came: a thread that has just released a worker
        and asks again would otherwise take it back before a waiter woke, again and again."""
        turn = object()
        call.on_cancel(self._wake)
        try:
            with self.cond:
                self.queue.append(turn)
                try:
                    while True:
                        if self.closed:
                            raise SQLError("DuckDB error: the query processes were shut down.")
                        if call.cancelled:
                            raise _cancelled_error()
                        if self.queue[0] is turn:
                            while self.idle:
                                worker = self.idle.pop()
                                if worker.alive():
                                    return worker
                                self.workers.discard(worker)  # died while idle (killed from outside)
                                worker.kill()
                            if len(self.workers) + self.starting < self.size:
                                self.starting += 1
                                break
                        left = call.left()
                        if left <= 0:
                            raise _not_started_error(call.timeout)
                        self.cond.wait(left)
                finally:
                    self.queue.remove(turn)
                    self.cond.notify_all()  # the next in line may go
        finally:
            call.on_cancel(None)
        started = time.monotonic()
        try:
            worker = _Worker(call)
        finally:
            with self.cond:
                self.starting -= 1
                self.cond.notify_all()
        call.deadline += time.monotonic() - started  # the system's start-up, not the query's time
        with self.cond:
            if not self.closed:
                self.workers.add(worker)
                return worker
        worker.kill()
        raise SQLError("DuckDB error: the query processes were shut down.")

    def _release(self, worker: _Worker, keep: bool) -> None:
        with self.cond:
            keep = keep and not self.closed
            if keep:
                self.idle.append(worker)
            else:
                self.workers.discard(worker)
            self.cond.notify_all()  # (only the first in line may take it)
        if not keep:
            worker.kill()

    def _sent(
        self, path: str, sql: str, call: _Call, max_rows: int | None, count_to: int | None
    ) -> tuple[_Worker, float]:
        """A worker the query was sent to (another one if the first had died while idle), and
        the seconds it was given: what is left of `call`'s time."""
        for _attempt in range(2):
            worker = self._acquire(call)
            left = call.left()
            if left <= 0:  # (a start that takes the whole time moves the deadline on)
                self._release(worker, keep=True)
                raise _not_started_error(call.timeout)
            try:
                worker.send((path, sql, left, max_rows, count_to))
                return worker, left
            except OSError:  # it died since its last query (killed from outside): this one never reached it
                self._release(worker, keep=False)
        raise SQLError("DuckDB error: the query process ended before it got the query.")

    def run(self, path: str, sql: str, call: _Call, max_rows: int | None, count_to: int | None) -> QueryResult:
        worker, left = self._sent(path, sql, call, max_rows, count_to)
        keep = False
        try:
            call.on_cancel(worker.stop)  # a caller that gives up frees the worker
            try:
                reply = worker.answer(left + _GRACE)
            except _WorkerDied:
                if call.cancelled:
                    raise _cancelled_error() from None
                if self.closed:
                    raise SQLError("DuckDB error: the query processes were shut down.") from None
                raise _death_error(worker, call.timeout) from None
            finally:
                call.on_cancel(None)
            if reply is None:
                raise _timeout_error(call.timeout)
            kind, value, retiring = reply
            keep = not retiring and not call.cancelled  # (a cancel may have killed it after it answered)
            if kind == "ok":
                assert isinstance(value, QueryResult)
                return value
            if kind == "error":
                if isinstance(value, QueryTimeout):  # it stopped at the seconds it was given: name the whole timeout
                    raise _timeout_error(call.timeout)
                raise value
            raise _memory_error()
        finally:
            self._release(worker, keep)

    def close(self) -> None:
        """Kill every worker; a busy one's caller gets an error, reaps it and closes its pipe
        (closing a pipe another thread waits on is not safe)."""
        with self.cond:
            self.closed = True
            idle = list(self.idle)
            busy = [worker for worker in self.workers if worker not in idle]
            self.workers.clear()
            self.idle.clear()
            self.cond.notify_all()
        for worker in idle:
            worker.kill()
        for worker in busy:
            worker.stop()


def _death_error(worker: _Worker, timeout: float) -> SQLError:
    """What ended a worker before it answered. Its own watchdog: the query's timeout. Memory,
    when it aborted (what an allocation that failed outside DuckDB's reach ends in); otherwise
    the signal or exit code as it is (killed from outside, a crash; a SIGKILL may also be the
    system's out-of-memory killer, which nothing here can tell apart: the worker's `ru_maxrss`
    counts the memory of the process it was forked from, so a worker of a large trainer would
    look as if it had filled its cap)."""
    code = worker.reap(5)
    if code == _WATCHDOG_EXIT:  # (its caller, late, had not killed it at the deadline + `_GRACE` yet)
        return _timeout_error(timeout)
    if code < 0:
        number = -code
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"SIG{number}"
        how = f"was killed by signal {number} ({name})"
    else:
        how = f"exited with code {code}"
    if code == -signal.SIGABRT:
        return SQLError(f"{_memory_error()} (The query process {how}.)")
    maybe = " (out of memory on this machine, or stopped from outside)" if code == -signal.SIGKILL else ""
    return SQLError(f"DuckDB error: the query process {how}{maybe} before it answered. Run the query again.")


_pool: _Pool | None = None
_pool_lock = threading.Lock()
_inherited: list[_Worker] = []  # a forked child's copies of the parent's workers, never used


def _pool_now() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            size = _env_int("TOOLENV_SQL_DUCKDB_WORKERS", 0) or min(4, os.cpu_count() or 1)
            _pool = _Pool(size)
        return _pool


def _forget_pool_in_child() -> None:
    # The child must not talk over the parent's sockets: close its copies (so a worker still
    # sees its pipe close when the parent ends) and keep the objects, which are not its children.
    global _pool, _pool_lock
    if _pool is not None:
        for worker in list(_pool.workers):
            worker.conn.close()
            _inherited.append(worker)
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def shutdown() -> None:
    """Kill this process's workers (at exit, too); the next query starts new ones."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


atexit.register(shutdown)


def worker_pids() -> list[int]:
    """Process ids of this process's live workers."""
    pool = _pool
    if pool is None or pool.pid != os.getpid():
        return []
    with pool.cond:
        return sorted(w.pid for w in pool.workers)


@functools.cache
def _duckdb_installed() -> bool:
    return importlib.util.find_spec("duckdb") is not None


def run(path: Path, sql: str, call: _Call, max_rows: int | None, count_to: int | None) -> QueryResult:
    """Run a DuckDB query in a worker process (blocking) within `call`'s time; raises `SQLError`
    or `QueryTimeout`."""
    if not _duckdb_installed():
        raise SQLError("This database needs DuckDB: pip install 'toolenv-sql[duckdb]'.")
    return _pool_now().run(os.path.abspath(path), sql, call, max_rows, count_to)
