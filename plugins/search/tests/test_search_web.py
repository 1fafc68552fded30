"""The DuckDuckGo backend: the persistent cache, offline mode, and failing fast with no network."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import sqlite3
from pathlib import Path

import pytest

from toolenv import Task, ToolCall, ToolCaller, ToolContext
from toolenv_search.backend import Passage, SearchError
from toolenv_search.tool import SearchTool
from toolenv_search.web import DuckDuckGoBackend
from toolenv_search.web_cache import ResultCache, cache_key

SEEDED = [
    Passage(id="https://example.org/paris", title="Paris", text="Paris is the capital of France."),
    Passage(id="https://example.org/france", title="France", text="France is a country in Europe."),
]


def seed(path: Path, query: str, requested: int = 5) -> None:
    ResultCache(path).put(cache_key("duckduckgo", "wt-wt", "moderate", query), query, requested, SEEDED)


async def test_cached_query_is_answered_without_the_network(tmp_path: Path) -> None:
    db = tmp_path / "web.sqlite"
    seed(db, "capital of France")
    backend = DuckDuckGoBackend(cache_path=db)

    def no_network(query: str, topk: int) -> list[Passage]:
        raise AssertionError("the cache should have answered")

    backend._fetch = no_network  # type: ignore[method-assign]
    # Whitespace and case do not change the key.
    [hits] = await backend.search(["  Capital   of france "], 1)
    assert hits == SEEDED[:1]
    tool = SearchTool(backend)
    results, _ = await ToolCaller([tool]).invoke(
        [ToolCall(name="search", arguments={"query": "capital of France"}, id="a")], ToolContext(task=Task())
    )
    assert results[0].text == (
        'Doc 1(Title: "Paris") Paris is the capital of France.\nDoc 2(Title: "France") France is a country in Europe.'
    )


async def test_cache_persists_across_backends_and_misses_when_more_are_wanted(tmp_path: Path) -> None:
    db = tmp_path / "web.sqlite"
    fetched: list[tuple[str, int]] = []

    def fake_fetch(query: str, topk: int) -> list[Passage]:
        fetched.append((query, topk))
        return SEEDED[:topk]

    first = DuckDuckGoBackend(cache_path=db, rate_limit=100)
    first._fetch = fake_fetch  # type: ignore[method-assign]
    assert await first.search(["eiffel tower"], 2) == [SEEDED]
    second = DuckDuckGoBackend(cache_path=db, offline=True)
    assert await second.search(["eiffel tower"], 1) == [SEEDED[:1]]
    with pytest.raises(SearchError, match="offline"):
        await second.search(["eiffel tower"], 3)  # only 2 were asked for before
    assert fetched == [("eiffel tower", 2)]
    assert len(ResultCache(db)) == 1


async def test_offline_miss_is_an_error(tmp_path: Path) -> None:
    backend = DuckDuckGoBackend(cache_path=tmp_path / "w.sqlite", offline=True)
    with pytest.raises(SearchError, match="no cached web results for 'never seen'"):
        await backend.search(["never seen"], 3)


def closed_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_no_network_gives_a_quick_error_observation(tmp_path: Path) -> None:
    pytest.importorskip("ddgs")
    # All traffic goes to a closed port on 127.0.0.1 (a dead proxy): the network is unreachable
    # here whether or not the machine has one, and nothing ever leaves loopback.
    proxy = f"http://127.0.0.1:{closed_loopback_port()}"
    backend = DuckDuckGoBackend(cache_path=tmp_path / "w.sqlite", timeout=2.0, rate_limit=50, proxy=proxy)
    tool = SearchTool(backend)
    # The guard only keeps a broken test from hanging the suite; the backend's own timeout is 2 s.
    results, _ = await asyncio.wait_for(
        ToolCaller([tool]).invoke(
            [ToolCall(name="search", arguments={"query": "toolenv offline test"}, id="a")], ToolContext(task=Task())
        ),
        timeout=30,
    )
    assert results[0].is_error
    assert results[0].text.startswith("Search failed: web search")
    assert results[0].retryable
    assert len(ResultCache(tmp_path / "w.sqlite")) == 0  # failures are not cached


def test_missing_ddgs_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ddgs", None)  # makes `import ddgs` fail
    backend = DuckDuckGoBackend(cache_path=tmp_path / "w.sqlite")
    with pytest.raises(SearchError, match=r"pip install 'toolenv-search\[web\]'"):
        backend._fetch("q", 3)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_worker_never_uses_its_parents_sqlite_connection(tmp_path: Path) -> None:
    """Gymnasium's AsyncVectorEnv makes one env in the parent, then forks its workers: a cache
    object made before the fork must open its own connection in each child, since SQLite
    connections carried across fork() can corrupt the database (sqlite.org/howtocorrupt.html)."""
    db = tmp_path / "web.sqlite"
    backend = DuckDuckGoBackend(cache_path=db)  # made in the parent, as by a vector env's env_fn
    seed(db, "capital of France")
    parent_conn = backend.cache.connection()
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)

    def child() -> None:
        mine = backend.cache.connection()
        fresh = ResultCache(db).connection()
        backend.cache.put(cache_key("duckduckgo", "wt-wt", "moderate", "from child"), "from child", 1, SEEDED[1:])
        writer.send((mine is parent_conn, fresh is parent_conn, mine is fresh))

    proc = ctx.Process(target=child)
    proc.start()
    got = reader.recv() if reader.poll(60) else None
    proc.join(60)
    assert proc.exitcode == 0
    assert got == (False, False, True)
    # The parent's connection still works and sees the child's entry.
    assert backend.cache.get(cache_key("duckduckgo", "wt-wt", "moderate", "from child"), 1) == SEEDED[1:]
    assert len(backend.cache) == 2


async def test_a_corrupt_cache_file_is_set_aside_not_fatal(tmp_path: Path) -> None:
    """A cache file that is not SQLite (a crash mid-copy, another program's file) only costs its entries.

    It made the backend's constructor raise `sqlite3.DatabaseError: file is not a database`,
    so `gym.make(..., backend="duckduckgo")` failed until someone found and deleted the file.
    """
    db = tmp_path / "web.sqlite"
    db.write_bytes(b"not a database, whatever it once was\n" * 200)
    backend = DuckDuckGoBackend(cache_path=db, offline=True)
    with pytest.raises(SearchError, match="offline mode"):
        await backend.search(["capital of France"], 1)
    assert (tmp_path / "web.sqlite.corrupt").read_bytes().startswith(b"not a database")  # kept for a look
    seed(db, "capital of France")
    assert await backend.search(["capital of France"], 1) == [SEEDED[:1]]


async def test_a_damaged_cache_entry_is_a_miss(tmp_path: Path) -> None:
    """An entry whose stored passages do not load is fetched again (and replaced), not a failed search."""
    db = tmp_path / "web.sqlite"
    seed(db, "capital of France")
    key = cache_key("duckduckgo", "wt-wt", "moderate", "capital of France")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE results SET passages = ? WHERE key = ?", ('[{"id": 1, "tit', key))
    backend = DuckDuckGoBackend(cache_path=db)
    fetched: list[str] = []

    def fetch(query: str, topk: int) -> list[Passage]:
        fetched.append(query)
        return SEEDED[:topk]

    backend._fetch = fetch  # type: ignore[method-assign]
    assert await backend.search(["capital of France"], 2) == [SEEDED]
    assert fetched == ["capital of France"]
    assert ResultCache(db).get(key, 2) == SEEDED


async def test_a_cache_damaged_inside_only_costs_its_entries(tmp_path: Path) -> None:
    """A file that opens but whose pages are damaged ("database disk image is malformed" on a read
    or a write) is a miss and a skipped store: the search itself still answers."""
    db = tmp_path / "web.sqlite"
    cache = ResultCache(db)
    for i in range(300):
        cache.put(f"k{i}", "q", 3, [Passage(id=str(i), text="x" * 200)])
    cache.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    ResultCache._shared.pop((os.getpid(), db.resolve()))[0].close()  # as a new process, open it afresh below
    with db.open("r+b") as fh:  # keep the header and the schema page, damage the rest
        fh.seek(8192)
        fh.write(b"Z" * (db.stat().st_size - 8192))
    backend = DuckDuckGoBackend(cache_path=db)
    backend._fetch = lambda query, topk: SEEDED[:topk]  # type: ignore[method-assign]
    assert await backend.search(["capital of France", "k150"], 2) == [SEEDED, SEEDED]
