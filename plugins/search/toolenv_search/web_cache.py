"""A persistent query → passages cache in SQLite, so web-search training runs are reproducible.

One connection per database file is shared by the process (guarded by a lock:
SQLite calls are short and local, so they run inline rather than in threads); a
forked child opens its own. The cache only saves work: a file SQLite cannot read is set
aside, and an entry or a call that fails is a miss, never a failed search.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import ClassVar

from toolenv_search.backend import Passage

__all__ = ["ResultCache", "cache_key"]

_log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    query TEXT NOT NULL,
    requested INTEGER NOT NULL,
    passages TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def cache_key(engine: str, region: str, safesearch: str, query: str) -> str:
    """The cache key of one query under one search configuration."""
    raw = json.dumps([engine, region, safesearch, " ".join(query.split()).lower()])
    return hashlib.sha256(raw.encode()).hexdigest()


class ResultCache:
    """Stored search results; a hit needs at least as many results requested as now wanted."""

    # One connection per (process, file): a child forked after a cache was made (Gymnasium's
    # AsyncVectorEnv forks once it made an env in the parent) opens its own, as SQLite requires.
    _shared: ClassVar[dict[tuple[int, Path], tuple[sqlite3.Connection, threading.Lock]]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()
        self.connection()  # create the file and its table now: a bad path fails here, not mid-episode

    def connection(self) -> sqlite3.Connection:
        """This process's connection to the cache file (opened on first use in each process)."""
        return self._locked()[0]

    def _locked(self) -> tuple[sqlite3.Connection, threading.Lock]:
        key = (os.getpid(), self.path)
        found = self._shared.get(key)
        if found is None:
            with self._shared_lock:
                found = self._shared.get(key)
                if found is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        conn = self._open()
                    except sqlite3.OperationalError:  # locked, unwritable, a directory: not the file's fault
                        raise
                    except sqlite3.DatabaseError as exc:  # SQLITE_NOTADB, SQLITE_CORRUPT: the file is unreadable
                        conn = self._set_aside(exc)
                    found = self._shared[key] = (conn, threading.Lock())
        return found

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_aside(self, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
        """Move a cache file SQLite cannot read to `<name>.corrupt` and start an empty one.

        A cache only saves work: losing its entries beats an env that cannot be made.
        """
        aside = self.path.with_name(self.path.name + ".corrupt")
        with contextlib.suppress(FileNotFoundError):  # another process set it aside first
            os.replace(self.path, aside)
        for suffix in ("-wal", "-shm"):  # the journal of the old file belongs to it, not to the new one
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{self.path}{suffix}")
        _log.warning("web-search cache %s is unreadable (%s); moved it to %s, starting anew", self.path, exc, aside)
        return self._open()

    def get(self, key: str, topk: int) -> list[Passage] | None:
        """The cached passages (at most `topk`), or None on a miss (an unreadable entry is one)."""
        conn, lock = self._locked()
        try:
            with lock:
                row = conn.execute("SELECT requested, passages FROM results WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:  # damaged pages, a lock held too long: the search goes to the web instead
            _log.warning("web-search cache %s could not be read (%s)", self.path, exc)
            return None
        if row is None or int(row[0]) < topk:
            return None
        try:
            return [Passage.model_validate(p) for p in json.loads(row[1])][:topk]
        except (ValueError, TypeError):  # a damaged entry (ValidationError is a ValueError): fetched again
            return None

    def put(self, key: str, query: str, requested: int, passages: list[Passage]) -> None:
        """Store the results of one query (replacing an earlier entry); a store that fails is only logged."""
        blob = json.dumps([p.model_dump() for p in passages], ensure_ascii=False)
        conn, lock = self._locked()
        try:
            with lock:
                conn.execute(
                    "INSERT OR REPLACE INTO results (key, query, requested, passages, created) VALUES (?, ?, ?, ?, ?)",
                    (key, query, requested, blob, time.time()),
                )
        except sqlite3.Error as exc:  # the results were fetched: a store that fails must not lose them
            _log.warning("web-search cache %s could not store a result (%s)", self.path, exc)

    def __len__(self) -> int:
        conn, lock = self._locked()
        with lock:
            return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])


def _after_fork_in_child() -> None:
    # Another thread may have held the lock at the fork. The parent's connections stay referenced,
    # never closed here: closing one in the child could checkpoint or unlock the parent's database.
    ResultCache._shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
