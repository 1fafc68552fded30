"""A persistent query → passages cache in SQLite, so web-search training runs are reproducible.

One connection per database file is shared by the process (guarded by a lock:
SQLite calls are short and local, so they run inline rather than in threads).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path

from toolenv_search.backend import Passage

__all__ = ["ResultCache", "cache_key"]

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

    _shared: dict[Path, tuple[sqlite3.Connection, threading.Lock]] = {}  # noqa: RUF012 - process-wide on purpose
    _shared_lock = threading.Lock()

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()
        with self._shared_lock:
            found = self._shared.get(self.path)
            if found is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(_SCHEMA)
                found = self._shared[self.path] = (conn, threading.Lock())
        self._conn, self._lock = found

    def get(self, key: str, topk: int) -> list[Passage] | None:
        """The cached passages (at most `topk`), or None on a miss."""
        with self._lock:
            row = self._conn.execute("SELECT requested, passages FROM results WHERE key = ?", (key,)).fetchone()
        if row is None or int(row[0]) < topk:
            return None
        return [Passage.model_validate(p) for p in json.loads(row[1])][:topk]

    def put(self, key: str, query: str, requested: int, passages: list[Passage]) -> None:
        """Store the results of one query (replacing an earlier entry)."""
        blob = json.dumps([p.model_dump() for p in passages], ensure_ascii=False)
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO results (key, query, requested, passages, created) VALUES (?, ?, ?, ?, ?)",
                (key, query, requested, blob, time.time()),
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])
