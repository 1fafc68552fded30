"""Query execution on read-only connections, cached per worker thread and database.

SQLite connections must stay on the thread that made them, so queries run on a
small process-wide thread pool whose threads each keep their own connections
(one pool however many envs exist). Every connection is opened read-only; SQLite
also gets an authorizer that denies anything but reading, a length limit and a
progress-handler deadline (and its few functions whose one call could outlast any deadline
are replaced by bounded ones: `_BoundedFunctions`); DuckDB gets external access disabled and a watchdog
that interrupts it at the deadline.

DuckDB's memory_limit does not cover values built by scalar functions, and its
interrupt does not stop one long scalar call, so on POSIX a DuckDB query runs in a
worker process with a capped address space that is killed past its deadline
(`duckdb_worker`); a pool thread waits for it, so `execute` never blocks the loop.

A hop to a worker thread costs ~0.1-0.2 ms, ten times a typical Spider query, so
SQLite queries first run on the calling thread with a tiny budget (2 ms by
default); only one that outlives it is interrupted and re-run on the pool.

SQLite spills a large sort, DISTINCT or subquery to unlinked temporary files in the host's
temporary directory (one query wrote 1.9 GB within 5 s), so on Linux the progress handler
also sums those files' size (`_sqlite_temp_bytes`) and stops the query past a cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import sqlite3
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from toolenv_sql.errors import QueryTimeout, SQLError
from toolenv_sql.guard import DENIED_FUNCTIONS

__all__ = ["QueryResult", "execute", "run_query", "sqlite_uri"]

# Connections per worker thread; the least recently used one is closed past this.
_MAX_CONNECTIONS_PER_THREAD = 32
# SQLite calls the progress handler every this many virtual-machine instructions.
_PROGRESS_STEPS = 1000
# Largest string/blob a query may build (bytes); stops `zeroblob(1e12)`-style memory bombs.
_MAX_VALUE_BYTES = 10_000_000
# Text and blob bytes one result row may hold: a query of many columns gets a smaller value
# cap (this / its columns), or `SELECT b, b, b, ...` over one 10 MB value takes 10 MB a column.
_MAX_ROW_BYTES = 64_000_000
# SQLite's most columns in a result (SQLITE_LIMIT_COLUMN's default): assumed when unknown.
_MAX_COLUMNS = 2000
_WIDTHS_PER_CONNECTION = 1024
_FETCH_BATCH = 256
# Bytes of text and blob values kept in a result's rows at most (inside DuckDB's lists, structs
# and maps too, where other items count 8 bytes each); rows past it are only counted.
# Each value is capped (above), but a few wide columns over many rows would otherwise pile up
# gigabytes (kept rows also go into `ToolResult.metadata`).
_MAX_KEPT_BYTES = 16_000_000
# sqlite3_limit() categories (C API constants; the sqlite3 module names them from Python 3.11 on).
_SQLITE_LIMIT_LENGTH = 0
_SQLITE_LIMIT_ATTACHED = 7
_SQLITE_LIMIT_LIKE_PATTERN_LENGTH = 8
# One call of a built-in SQLite function is one VM step, which neither the progress handler
# nor interrupt() stops: `trim(X, Y)` scans Y for each character of X, `instr` and `replace`
# compare Y at each place in X, so at the value cap one call ran for hours (inline, on the
# event loop). Such a call may do this much work (length times length) at most: ~0.2 s.
_MAX_CALL_WORK = 100_000_000
# Longest LIKE/GLOB pattern (bytes): matching costs up to the value's length times the
# pattern's (SQLite's default of 50,000 allowed minutes per call; 100 is under 1 s at 10 MB).
_MAX_LIKE_PATTERN = 100
_SQLITE_BUSY = 5
# Disk space SQLite's temporary files may take in this process at once (MiB; 0: no cap).
_TEMP_CAP_ENV = "TOOLENV_SQL_SQLITE_TEMP_MB"
_TEMP_CAP_MB = 256
# Seconds a query runs before its first temp-space check, and at least between two checks
# (the sorter wrote ~400 MB/s here, so a check overshoots the cap by ~10 MB); a slower scan
# (many open files) spaces them out so that checking takes at most 1/`_TEMP_CHECK_SHARE`.
_TEMP_CHECK_EVERY = 0.025
_TEMP_CHECK_SHARE = 20
# How SQLite names its temporary files (SQLITE_TEMP_FILE_PREFIX); it unlinks them at once, so
# only its open file descriptors show them (/proc/self/fd, Linux).
_TEMP_PREFIX = "etilqs_"
_FD_DIR = "/proc/self/fd"
# Seconds between tries while another connection holds a lock (doubling up to the max).
_LOCK_PAUSE = 0.001
_LOCK_PAUSE_MAX = 0.05

_SQLITE_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
# Without `Connection.setlimit` (Python 3.10) the value-size cap cannot be set, so the two
# functions whose one job is building a value as large as asked are refused instead.
# (printf's width is left alone: text-to-SQL uses it, and 3.11+ make it return NULL past the cap.)
_SIZE_BOMBS = frozenset() if hasattr(sqlite3.Connection, "setlimit") else frozenset({"zeroblob", "randomblob"})


@dataclass(frozen=True)
class QueryResult:
    """Columns, the first rows, and how many rows the query produced in all (or at least, when
    `exact_count` is False: counting stopped there, see `run_query`'s `count_all` and `count_limit`)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    row_count: int
    exact_count: bool = True

    @property
    def truncated(self) -> bool:
        """True when `rows` holds fewer rows than the query produced."""
        return self.row_count > len(self.rows)


# ---------------------------------------------------------------------------- SQLite


def sqlite_uri(path: Path, *, immutable: bool = True) -> str:
    """A read-only `file:` URI for `path` (percent-encoded, so a path cannot add URI parameters;
    a relative path is taken from the working directory)."""
    return Path(os.path.abspath(path)).as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")


def _authorizer(action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None) -> int:
    """Allow reading and harmless functions; deny every write, PRAGMA, ATTACH/DETACH and transaction."""
    if action in _SQLITE_ALLOWED:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION:
        name = (arg2 or "").lower()
        return sqlite3.SQLITE_DENY if name in DENIED_FUNCTIONS or name in _SIZE_BOMBS else sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _length(value: Any) -> int:
    """Characters or bytes of a function argument as SQLite sees it (a number as its text)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    return 0 if value is None else len(str(value))


class _BoundedFunctions:
    """SQLite's `instr`, `replace` and two-argument `trim`/`ltrim`/`rtrim`, answering as the
    built-ins do but refusing a call whose work is past `_MAX_CALL_WORK` (see there).

    Text arguments are handled in Python (its `find`/`replace` take linear time); any other
    (NULL, numbers, blobs) go to SQLite's own function on a private in-memory connection, so
    every type conversion stays SQLite's.
    """

    def __init__(self) -> None:
        self.refused: str | None = None  # why the last call was refused: the query's error
        self._builtin = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        setlimit = getattr(self._builtin, "setlimit", None)  # Python >= 3.11
        if setlimit is not None:
            setlimit(_SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)

    def install(self, conn: sqlite3.Connection) -> None:
        """Make these the functions `conn`'s queries call."""
        conn.create_function("instr", 2, self.instr, deterministic=True)
        conn.create_function("replace", 3, self.replace, deterministic=True)
        for name, strip in (("trim", str.strip), ("ltrim", str.lstrip), ("rtrim", str.rstrip)):
            conn.create_function(name, 2, functools.partial(self.trim, name, strip), deterministic=True)

    def close(self) -> None:
        self._builtin.close()

    def _refuse(self, message: str) -> NoReturn:
        self.refused = message
        raise ValueError(message)

    def _bounded(self, name: str, work: int) -> None:
        if work > _MAX_CALL_WORK:
            self._refuse(
                f"{name}() over values this long could run past any timeout (about {work:,} steps, "
                f"{_MAX_CALL_WORK:,} at most): use shorter values"
            )

    def _call_builtin(self, name: str, *args: Any) -> Any:
        self._bounded(name, _length(args[0]) * _length(args[1]))
        try:
            return self._builtin.execute(f"SELECT {name}({', '.join('?' * len(args))})", args).fetchone()[0]
        except sqlite3.Error as exc:
            self._refuse(str(exc))

    def instr(self, x: Any, y: Any) -> Any:
        if isinstance(x, str) and isinstance(y, str):
            return x.find(y) + 1
        return self._call_builtin("instr", x, y)

    def replace(self, x: Any, y: Any, z: Any) -> Any:
        if not (isinstance(x, str) and isinstance(y, str) and isinstance(z, str)):
            return self._call_builtin("replace", x, y, z)
        if not y:
            return x
        if len(z) > len(y) and len(x) + x.count(y) * (len(z) - len(y)) > _MAX_VALUE_BYTES:
            self._refuse("string or blob too big")  # (before Python builds it)
        return x.replace(y, z)

    def trim(self, name: str, strip: Callable[[str, str], str], x: Any, y: Any) -> Any:
        if not (isinstance(x, str) and isinstance(y, str)):
            return self._call_builtin(name, x, y)
        chars = "".join(dict.fromkeys(y))  # each character once: the work is len(x) times this
        self._bounded(name, len(x) * len(chars))
        return strip(x, chars)


def _temp_cap() -> int:
    """Bytes of SQLite temporary files allowed in this process (0: no cap), from `_TEMP_CAP_ENV`
    (read at each check, so it can change while the process runs)."""
    return _parse_temp_cap(os.environ.get(_TEMP_CAP_ENV, ""))


@functools.lru_cache(maxsize=8)
def _parse_temp_cap(value: str) -> int:
    """`value` (MiB) in bytes; an unreadable one warns once and keeps the default (raising here,
    inside SQLite's progress handler, would only tell the model its query was interrupted)."""
    try:
        return max(0, int(value)) * 2**20 if value.strip() else _TEMP_CAP_MB * 2**20
    except ValueError:
        warnings.warn(f"{_TEMP_CAP_ENV}={value!r} is not a whole number of MiB; using {_TEMP_CAP_MB}", stacklevel=2)
        return _TEMP_CAP_MB * 2**20


def _sqlite_temp_bytes() -> int | None:
    """Disk space SQLite's temporary files open in this process take now (all connections:
    which one a file belongs to cannot be told); None where /proc/self/fd is missing."""
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return None
    total = 0
    for name in names:
        link = f"{_FD_DIR}/{name}"
        try:
            if os.path.basename(os.readlink(link)).startswith(_TEMP_PREFIX):
                total += os.stat(link).st_blocks * 512  # the unlinked file itself, through /proc
        except OSError:
            continue  # closed meanwhile, or not a file
    return total


def _temp_space_error(cap: int) -> SQLError:
    return SQLError(
        f"The query needed more than {cap // 2**20} MiB of temporary disk space (to sort, group or"
        " deduplicate many rows or long values) and was stopped. Add WHERE conditions, or select"
        " fewer or shorter columns."
    )


def _locked(exc: sqlite3.OperationalError) -> bool:
    """True when `exc` is SQLITE_BUSY: another connection holds a lock the query needs."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return bool(code & 0xFF == _SQLITE_BUSY)
    return str(exc).startswith("database is locked")


class _SQLiteConnection:
    """One read-only SQLite connection with a per-query deadline checked by the progress handler."""

    def __init__(self, path: Path, immutable: bool) -> None:
        self.deadline = math.inf
        self._call: _Call | None = None  # the running query's call, whose caller may give up on it
        self._temp_check_at = math.inf  # when the running query's next temp-space check is due
        self._temp_over: int | None = None  # the cap the running query's temp files went past
        # timeout=0: no busy wait inside SQLite, which sees neither the deadline nor a cancel and,
        # inline, held the event loop (5 s by default); `run` waits for a lock instead.
        self.conn = sqlite3.connect(sqlite_uri(path, immutable=immutable), uri=True, isolation_level=None, timeout=0)
        if hasattr(self.conn, "enable_load_extension"):  # absent when Python is built without it
            self.conn.enable_load_extension(False)
        setlimit = getattr(self.conn, "setlimit", None)  # Python >= 3.11
        if setlimit is not None:
            setlimit(_SQLITE_LIMIT_ATTACHED, 0)
            setlimit(_SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
            setlimit(_SQLITE_LIMIT_LIKE_PATTERN_LENGTH, _MAX_LIKE_PATTERN)
        self._functions = _BoundedFunctions()
        self._functions.install(self.conn)
        self.conn.set_authorizer(_authorizer)
        self.conn.set_progress_handler(self._progress, _PROGRESS_STEPS)
        self._setlimit = setlimit
        self._widths: OrderedDict[str, int] = OrderedDict()  # SQL text → result columns

    def _past_deadline(self) -> int:
        call = self._call
        return 1 if time.monotonic() > self.deadline or (call is not None and call.cancelled) else 0

    def _progress(self) -> int:
        """The progress handler: 1 (stop) past the deadline, on a cancel, or past the temp cap."""
        if self._past_deadline():
            return 1
        if time.monotonic() < self._temp_check_at:
            return 0
        return self._check_temp_space()

    def _check_temp_space(self) -> int:
        """1 if SQLite's temporary files are past the cap (kept for the rest of the query); the
        next check is scheduled so that checking costs at most 1/`_TEMP_CHECK_SHARE` of the time."""
        if self._temp_over is not None:
            return 1
        start = time.monotonic()
        cap = _temp_cap()
        used = _sqlite_temp_bytes() if cap else None
        if used is None:  # no cap, or no way to measure: no more checks for this query
            self._temp_check_at = math.inf
            return 0
        if used > cap:
            self._temp_over = cap
            return 1
        now = time.monotonic()
        self._temp_check_at = now + max(_TEMP_CHECK_EVERY, _TEMP_CHECK_SHARE * (now - start))
        return 0

    def interrupt(self) -> None:
        """Stop the running query now (from any thread); it raises an "interrupted" error."""
        with contextlib.suppress(sqlite3.Error):
            self.conn.interrupt()

    def _columns(self, sql: str) -> int:
        """How many columns `sql` returns, learnt without computing a row (`_MAX_COLUMNS` if unknown)."""
        width = self._widths.get(sql)
        if width is None:
            try:
                probe = self.conn.execute(f"SELECT * FROM (\n{_statement_body(sql)}\n) LIMIT 0")
                width = len(probe.description or ()) or _MAX_COLUMNS
                probe.close()
            except (sqlite3.Error, sqlite3.Warning, OverflowError, ValueError) as exc:
                if isinstance(exc, sqlite3.OperationalError) and _locked(exc):
                    raise  # `run` waits for the lock and asks again
                # The real query then fails the same way, or runs with a small cap; not kept, as
                # the failure may pass (the deadline).
                return _MAX_COLUMNS
            self._widths[sql] = width
            while len(self._widths) > _WIDTHS_PER_CONNECTION:
                self._widths.popitem(last=False)
        return width

    def _cap_values(self, sql: str) -> None:
        """Cap each value so that a whole result row stays within `_MAX_ROW_BYTES` (3.11+)."""
        if self._setlimit is not None:
            cap = min(_MAX_VALUE_BYTES, _MAX_ROW_BYTES // self._columns(sql))
            self._setlimit(_SQLITE_LIMIT_LENGTH, cap)

    def run(
        self, sql: str, timeout: float, max_rows: int | None, count_to: int | None, call: _Call | None = None
    ) -> QueryResult:
        """Run `sql` within `timeout` s, or until `call`'s caller gives up (the progress handler
        sees it: a cancel that came before the query started still stops it)."""
        now = time.monotonic()
        self.deadline = now + timeout
        self._temp_check_at = now + _TEMP_CHECK_EVERY
        self._temp_over = None
        self._call = call
        if call is not None:
            call.on_cancel(self.interrupt)  # a caller that gives up frees this thread and connection at once
        try:
            pause = _LOCK_PAUSE
            while True:
                try:
                    self._cap_values(sql)
                    self._functions.refused = None
                    cur = self.conn.execute(sql)
                    columns = [d[0] for d in cur.description or ()]
                    result = _drain(columns, cur, max_rows, count_to)  # one row at a time: no batch of big rows
                    cur.close()
                    break
                except sqlite3.OperationalError as exc:
                    if not _locked(exc) or self._past_deadline():
                        raise
                # A writer holds a lock (a database updated meanwhile, `immutable=False`): wait
                # for it until the deadline or a cancel.
                time.sleep(max(0.0, min(pause, self.deadline - time.monotonic())))
                pause = min(2 * pause, _LOCK_PAUSE_MAX)
        except sqlite3.OperationalError as exc:
            refused = self._functions.refused
            if refused is None and str(exc) == "user-defined function raised exception":
                # The functions above are the only ones: Python could not read a text argument.
                refused = "instr(), replace() and two-argument trim() need text that is valid UTF-8"
            if refused is not None:  # (SQLite says only "user-defined function raised exception")
                raise _engine_error("SQLite", Exception(refused)) from None
            if self._temp_over is not None:
                raise _temp_space_error(self._temp_over) from None
            if self._past_deadline() or str(exc) == "interrupted":
                raise _timeout_error(timeout) from None
            raise _engine_error("SQLite", exc) from None
        # sqlite3.Warning is not an sqlite3.Error: Python 3.10 raises it for SQL text that
        # cannot be encoded (a lone surrogate), where 3.11+ raise UnicodeEncodeError.
        except (sqlite3.Error, sqlite3.Warning, OverflowError, ValueError) as exc:
            raise _engine_error("SQLite", exc) from None
        finally:
            if call is not None:
                call.on_cancel(None)
            self.deadline = self._temp_check_at = math.inf
            self._call = None
        return result

    def close(self) -> None:
        self.conn.close()
        self._functions.close()


# ---------------------------------------------------------------------------- DuckDB


_DUCKDB_CONFIG: dict[str, str | int | float | list[str]] = {
    "enable_external_access": False,  # no files, ATTACH, COPY, INSTALL or LOAD
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "threads": 1,
    "lock_configuration": True,  # SET cannot undo the above
}
# Where DuckDB spills, and how much: a DuckDB worker process sets its own folder (removed
# with the worker) and caps it. In-process, DuckDB's default (`<database>.tmp/`) stays.
_DUCKDB_SPILL: dict[str, str] = {}
# DuckDB's buffer-manager limit (bytes), and how the "Out of Memory" error states what a
# query may use. A DuckDB worker process (duckdb_worker.py) sets both from its memory cap.
_DUCKDB_MEMORY_LIMIT = 512 * 2**20
_DUCKDB_MEMORY_NOTE = "512 MiB for DuckDB's data"


@functools.cache
def _duckdb_config() -> dict[str, str | int | float | list[str]]:
    """`_DUCKDB_CONFIG`, plus `async_threads=1` where DuckDB has that setting (2.0.1 does): its
    default, 8 I/O threads per open database, maps ~70 MiB more per database (stacks, malloc
    arenas), which counts against a worker's address-space cap."""
    import duckdb

    config = dict(_DUCKDB_CONFIG)
    with duckdb.connect(":memory:", config={"threads": 1}) as probe:
        names = {row[0] for row in probe.execute("SELECT name FROM duckdb_settings()").fetchall()}
    if "async_threads" in names:
        config["async_threads"] = 1
    return config


class _DuckDBConnection:
    """One read-only DuckDB connection; a watcher thread interrupts a query at its deadline, or
    when its caller gives up."""

    def __init__(self, path: Path) -> None:
        try:
            import duckdb
        except ImportError:
            raise SQLError("This database needs DuckDB: pip install 'toolenv-sql[duckdb]'.") from None
        self._duckdb = duckdb
        config = {**_duckdb_config(), "memory_limit": f"{_DUCKDB_MEMORY_LIMIT // 2**20}MiB", **_DUCKDB_SPILL}
        try:
            self.conn = duckdb.connect(str(path), read_only=True, config=config)
        except duckdb.Error as exc:
            raise _engine_error("DuckDB", exc) from None
        self._lock = threading.Lock()  # an interrupt lands only while its query's `run` lasts

    def _watch(self, timeout: float, stop: threading.Event, done: threading.Event) -> None:
        """At the deadline or `stop`, interrupt until the query ends: DuckDB ignores an interrupt
        that comes before the query started (a cancel just after the call, a tiny timeout)."""
        stop.wait(timeout)
        while True:
            with self._lock:
                if done.is_set():
                    return
                with contextlib.suppress(self._duckdb.Error):
                    self.conn.interrupt()
            done.wait(0.01)

    def run(
        self, sql: str, timeout: float, max_rows: int | None, count_to: int | None, call: _Call | None = None
    ) -> QueryResult:
        """Run `sql` within `timeout` s, or until `call`'s caller gives up."""
        stop, done = threading.Event(), threading.Event()
        threading.Thread(target=self._watch, args=(timeout, stop, done), name="toolenv-sql-duckdb", daemon=True).start()
        if call is not None:
            call.on_cancel(stop.set)
        start = time.monotonic()
        try:
            cur = self.conn.execute(sql)
            columns = [d[0] for d in cur.description or ()]
            result = _drain(columns, _batches(cur.fetchmany), max_rows, count_to)
        except self._duckdb.InterruptException:
            raise _timeout_error(timeout) from None
        except self._duckdb.Error as exc:
            if time.monotonic() - start >= timeout:
                raise _timeout_error(timeout) from None
            message = str(exc)
            if message.startswith("Out of Memory Error"):  # its advice (SET memory_limit …) cannot be followed
                message = message.splitlines()[0].rstrip()
                raise SQLError(
                    f"DuckDB error: {message} (a query may use {_DUCKDB_MEMORY_NOTE}: select fewer or shorter values)"
                ) from None
            raise _engine_error("DuckDB", exc) from None
        finally:
            if call is not None:
                call.on_cancel(None)
            with self._lock:
                done.set()
            stop.set()  # the watcher leaves
        return result

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------------------- shared


def _statement_body(sql: str) -> str:
    """`sql` without what follows its last token (a `;`, comments), so that it can sit inside
    parentheses: `SELECT 1; -- done` made the width probe fail, and a query of unknown width
    gets the smallest value cap (values past it came back NULL). sqlglot's tokenizer knows
    SQLite's quoting and comments."""
    import sqlglot
    from sqlglot import TokenType

    try:
        tokens = [t for t in sqlglot.tokenize(sql, read="sqlite") if t.token_type != TokenType.SEMICOLON]
    except Exception:  # noqa: BLE001 - a text the tokenizer cannot read: probed as it is
        return sql
    return sql[: tokens[-1].end + 1] if tokens else sql


def _batches(fetchmany: Any) -> Iterator[Any]:
    """The rows `fetchmany` gives, batch after batch."""
    while batch := fetchmany(_FETCH_BATCH):
        yield from batch


_TEXT = (str, bytes, bytearray, memoryview)
_SIZED = (*_TEXT, list, tuple, dict)


def _value_bytes(value: Any) -> int:
    """Bytes `value` holds: text and blobs by length; inside a list, struct or map (DuckDB) any
    other item counts 8 bytes, so a nested value cannot carry gigabytes past the cap unseen."""
    if isinstance(value, _TEXT):
        return len(value)
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple)):
        return sum(_value_bytes(item) if isinstance(item, _SIZED) else 8 for item in value)
    return 0


def _row_bytes(row: Any) -> int:
    return sum(_value_bytes(v) for v in row if isinstance(v, _SIZED))


def _drain(columns: list[str], rows: Iterable[Any], max_rows: int | None, count_to: int | None) -> QueryResult:
    """Keep the first `max_rows` rows (within `_MAX_KEPT_BYTES`) and count the rest, stopping one row
    past `count_to` (None: every row)."""
    kept: list[tuple[Any, ...]] = []
    count = size = 0
    full = max_rows == 0
    for row in rows:
        count += 1
        if not full:
            size += _row_bytes(row)
            full = size > _MAX_KEPT_BYTES
            if not full:
                kept.append(tuple(row))
                full = max_rows is not None and len(kept) >= max_rows
        if count_to is not None and count > count_to:
            return QueryResult(columns, kept, count, exact_count=False)
    return QueryResult(columns, kept, count)


def _count_to(max_rows: int | None, count_all: bool, count_limit: int | None) -> int | None:
    """The row past which `_drain` stops counting."""
    if not count_all:
        return max_rows
    if count_limit is None:
        return None
    if count_limit < 0:
        raise ValueError(f"count_limit must be >= 0, got {count_limit}")
    return count_limit if max_rows is None else max(count_limit, max_rows)


def _timeout_error(timeout: float) -> QueryTimeout:
    return QueryTimeout(
        f"The query ran longer than {timeout:g} s and was stopped. Simplify it, add WHERE conditions or a LIMIT."
    )


def _cancelled_error() -> SQLError:
    return SQLError("The query was cancelled.")


def _not_started_error(timeout: float, what: str) -> QueryTimeout:
    return QueryTimeout(f"The query did not start within {timeout:g} s: {what} busy with other queries. Run it again.")


class _Call:
    """One query's deadline, counted from when it was asked for (so time spent waiting for a
    pool thread or a DuckDB worker counts), and whether its caller has given up on it."""

    __slots__ = ("_lock", "_stop", "cancelled", "deadline", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.cancelled = False
        self._stop: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def left(self) -> float:
        """Seconds until the deadline (0 or less once it has passed)."""
        return self.deadline - time.monotonic()

    def on_cancel(self, stop: Callable[[], None] | None) -> None:
        """Call `stop` (from the cancelling thread) if the caller gives up; None clears it, after
        which no `stop` runs any more. Called at once if the caller has given up already."""
        with self._lock:
            self._stop = stop
            if stop is not None and self.cancelled:
                stop()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._stop is not None:
                self._stop()


def _engine_error(engine: str, exc: BaseException) -> SQLError:
    message = str(exc).strip() or type(exc).__name__
    if "authoriz" in message:
        message += " (the database is read-only: only reading queries are allowed)"
    elif "too big" in message:
        message += (
            f" (a value may hold {_MAX_VALUE_BYTES:,} bytes, and a whole row {_MAX_ROW_BYTES:,}:"
            " select fewer or shorter values)"
        )
    return SQLError(f"{engine} error: {message}")


_Connection = _SQLiteConnection | _DuckDBConnection
_local = threading.local()


def _connection(path: Path, engine: str, immutable: bool) -> _Connection:
    cache: OrderedDict[tuple[str, str, bool], _Connection] | None = getattr(_local, "connections", None)
    if cache is None or _local.pid != os.getpid():
        # New thread, or a forked child: connections must not cross fork, so start afresh.
        cache = _local.connections = OrderedDict()
        _local.pid = os.getpid()
    name = str(path)
    if not os.path.isabs(name):  # (the working directory may change between calls)
        name = os.path.abspath(name)
    key = (engine, name, immutable)
    conn = cache.get(key)
    if conn is not None:
        cache.move_to_end(key)
        return conn
    try:
        conn = _DuckDBConnection(Path(name)) if engine == "duckdb" else _SQLiteConnection(Path(name), immutable)
    except sqlite3.Error as exc:
        raise _engine_error("SQLite", exc) from None
    cache[key] = conn
    while len(cache) > _MAX_CONNECTIONS_PER_THREAD:
        cache.popitem(last=False)[1].close()
    return conn


def run_query(
    path: Path,
    engine: str,
    sql: str,
    *,
    timeout: float = 5.0,
    max_rows: int | None = None,
    count_all: bool = True,
    count_limit: int | None = None,
    immutable: bool = True,
) -> QueryResult:
    """Run `sql` on this thread's read-only connection to `path` (blocking); a DuckDB
    query runs in a worker process instead (see `duckdb_worker`).

    Args:
        timeout: seconds before the query is interrupted, counted from this call (time spent
            waiting for a free DuckDB worker counts, starting a new one does not but is given
            up after `timeout`, 5 s at least; a DuckDB query gets 1 s more before its worker
            is killed).
        max_rows: rows kept in the result (None keeps all).
        count_all: count every row (True) or stop one row past `max_rows`.
        count_limit: with `count_all`, stop counting one row past this many (at least `max_rows`):
            `SELECT *` on a table of millions of rows then answers in milliseconds, not seconds.
            A result whose count stopped early has `exact_count` False.
        immutable: open SQLite with `immutable=1` (no locking; the file must not change meanwhile).

    Raises:
        SQLError: the engine refused or failed the query, or it timed out.
    """
    count_to = _count_to(max_rows, count_all, count_limit)
    return _run(path, engine, sql, _Call(timeout), max_rows, count_to, immutable)


def _run(
    path: Path, engine: str, sql: str, call: _Call, max_rows: int | None, count_to: int | None, immutable: bool
) -> QueryResult:
    """`run_query` within what is left of `call`'s time."""
    if call.cancelled:
        raise _cancelled_error()
    if engine == "duckdb":
        from toolenv_sql import duckdb_worker

        if duckdb_worker.AVAILABLE:
            return duckdb_worker.run(path, sql, call, max_rows, count_to)
    left = call.left()
    if left <= 0:  # it waited its whole time for a pool thread
        raise _not_started_error(call.timeout, "every query thread was")
    try:
        return _connection(path, engine, immutable).run(sql, left, max_rows, count_to, call)
    except QueryTimeout:
        if call.cancelled:
            raise _cancelled_error() from None
        raise _timeout_error(call.timeout) from None


_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _forget_pool_in_child() -> None:
    # A child inherits the pool object but not its threads, and maybe a held lock.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def _executor() -> ThreadPoolExecutor:
    """The process-wide query pool (made again in a forked child, whose threads did not survive)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            workers = int(os.environ.get("TOOLENV_SQL_WORKERS", "0")) or min(8, (os.cpu_count() or 1) + 2)
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=workers, thread_name_prefix="toolenv-sql"))
        return _pool[1]


async def execute(
    path: Path,
    engine: str,
    sql: str,
    *,
    timeout: float = 5.0,
    max_rows: int | None = None,
    count_all: bool = True,
    count_limit: int | None = None,
    immutable: bool = True,
    inline_budget: float = 0.002,
) -> QueryResult:
    """`run_query` awaited from any event loop, without blocking it for more than `inline_budget` s.

    A SQLite query first runs on the loop's thread for at most `inline_budget`
    seconds; past that it is interrupted and run on the shared worker pool with
    the rest of its `timeout`. `inline_budget=0` always uses the pool. The timeout
    counts from this call: time spent waiting for a pool thread or a DuckDB worker
    counts too, so a SQLite query ends within `timeout` and a DuckDB one within
    `timeout` + 1 s, plus the start of a new worker if it needs one (which does not
    count, but is given up after `timeout`, 5 s at least). Cancelling the call stops its query at
    once: a SQLite query is interrupted, a DuckDB worker running (or starting for) it
    is killed, so neither holds a pool thread any longer.
    """
    call = _Call(timeout)
    if engine == "sqlite" and inline_budget > 0:
        try:
            return run_query(
                path,
                engine,
                sql,
                timeout=min(inline_budget, timeout),
                max_rows=max_rows,
                count_all=count_all,
                count_limit=count_limit,
                immutable=immutable,
            )
        except QueryTimeout:
            if inline_budget >= timeout:
                raise
    job = functools.partial(
        _run, path, engine, sql, call, max_rows, _count_to(max_rows, count_all, count_limit), immutable
    )
    try:
        return await asyncio.get_running_loop().run_in_executor(_executor(), job)
    except asyncio.CancelledError:
        call.cancel()  # no one waits for the answer: free the worker, do not keep the interpreter's exit waiting
        raise
