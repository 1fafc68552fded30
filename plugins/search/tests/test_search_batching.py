"""Coalescing concurrent searches: the Batcher alone, and HTTPBackend batching against real servers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from toolenv_search.backend import Passage, SearchError
from toolenv_search.batching import Batcher
from toolenv_search.http_backend import _CLIENTS, HTTPBackend


class Recorder:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.fail = fail

    async def send(self, queries: list[str], topk: int) -> list[list[Passage]]:
        self.calls.append((list(queries), topk))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return [[Passage(id=q, text=f"k={topk}")] for q in queries]


async def test_concurrent_submits_share_one_call() -> None:
    rec = Recorder()
    batcher = Batcher(rec.send, wait=0.05, max_batch=64)
    results = await asyncio.gather(*(batcher.submit([f"q{i}"], 3) for i in range(10)))
    assert [r[0][0].id for r in results] == [f"q{i}" for i in range(10)]
    assert rec.calls == [([f"q{i}" for i in range(10)], 3)]


async def test_max_batch_and_topk_split_batches() -> None:
    rec = Recorder()
    batcher = Batcher(rec.send, wait=0.05, max_batch=4)
    jobs = [batcher.submit([f"a{i}"], 3) for i in range(6)] + [batcher.submit(["b0", "b1"], 5)]
    results = await asyncio.gather(*jobs)
    assert results[-1] == [[Passage(id="b0", text="k=5")], [Passage(id="b1", text="k=5")]]
    assert sorted(len(q) for q, _ in rec.calls) == [2, 2, 4]
    assert {k for _, k in rec.calls} == {3, 5}


async def test_failure_reaches_every_caller() -> None:
    batcher = Batcher(Recorder(SearchError("down", retryable=True)).send, wait=0.01, max_batch=64)
    outcomes = await asyncio.gather(*(batcher.submit([f"q{i}"], 3) for i in range(3)), return_exceptions=True)
    assert all(isinstance(o, SearchError) and str(o) == "down" and o.retryable for o in outcomes)
    assert len({id(o) for o in outcomes}) == 3
    bug = Batcher(Recorder(KeyError("x")).send, wait=0.01, max_batch=64)
    with pytest.raises(SearchError, match="KeyError"):
        await bug.submit(["q"], 3)


async def test_cancelled_caller_is_dropped() -> None:
    rec = Recorder()
    batcher = Batcher(rec.send, wait=0.05, max_batch=64)
    gone = asyncio.ensure_future(batcher.submit(["gone"], 3))
    kept = asyncio.ensure_future(batcher.submit(["kept"], 3))
    await asyncio.sleep(0)
    gone.cancel()
    assert (await kept)[0][0].id == "kept"
    assert rec.calls == [(["kept"], 3)]


async def test_http_batches_across_backends(bm25_server: str) -> None:
    plain = HTTPBackend(bm25_server)
    queries = ["Constantin Medien", "VIVA Poland", "Pete Doherty", "the of a", "Jonny Craig singer"]
    want = [(await plain.search([q], 2))[0] for q in queries]
    backends = [HTTPBackend(bm25_server, batch_wait=0.05) for _ in queries]
    got = await asyncio.gather(*(b.search([q], 2) for b, q in zip(backends, queries)))
    assert [[p.id for p in g[0]] for g in got] == [[p.id for p in w] for w in want]
    for b in [plain, *backends]:
        await b.aclose()


async def test_http_batch_is_one_request(bad_server: Any) -> None:
    bad_server.modes = ["500"]
    backends = [HTTPBackend(bad_server.url, batch_wait=0.05, retries=0) for _ in range(4)]
    outcomes = await asyncio.gather(*(b.search([f"q{i}"], 3) for i, b in enumerate(backends)), return_exceptions=True)
    assert all(isinstance(o, SearchError) and "HTTP 500" in str(o) for o in outcomes)
    assert bad_server.requests == 1
    assert bad_server.bodies == [{"queries": ["q0", "q1", "q2", "q3"], "topk": 3, "return_scores": True}]
    for b in backends:
        await b.aclose()


async def test_batched_backends_close_their_shared_client(bm25_server: str) -> None:
    """The last backend to close closes the loop's pool, whichever backend's batcher sent the requests.

    The batcher sends through the first backend; a search after that backend closed
    counted it as a user again, so the pool was never closed.
    """
    first, second = HTTPBackend(bm25_server, batch_wait=0.01), HTTPBackend(bm25_server, batch_wait=0.01)
    await asyncio.gather(first.search(["VIVA Poland"], 1), second.search(["Pete Doherty"], 1))
    client = _CLIENTS[asyncio.get_running_loop()][(second.timeout, second.max_connections)].client
    await first.aclose()
    [[hit]] = await second.search(["Jonny Craig singer"], 1)
    assert hit.title == "Jonny Craig"
    await second.aclose()
    assert client.is_closed


async def test_one_refused_query_fails_only_its_own_episode(app_server: Any) -> None:
    """A batch the server refuses (4xx) or answers unreadably may be one episode's query's fault:
    each caller's queries are then sent alone, so the other episodes of the batch get their passages.

    Before, every episode that happened to share the request got the one bad query's error.
    """
    bodies: list[list[str]] = []

    async def retrieve(request: Request) -> JSONResponse:
        queries = (await request.json())["queries"]
        bodies.append(queries)
        if any(len(q) > 40 for q in queries):  # a retriever with a query-length limit, as some deployments have
            return JSONResponse({"detail": "query too long"}, status_code=400)
        docs = [[{"document": {"id": q, "contents": f'"{q}"\ntext'}, "score": 1.0}] for q in queries]
        return JSONResponse({"result": docs})

    app = Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"])])
    with app_server(app) as url:
        backends = [HTTPBackend(url, batch_wait=0.05, retries=0) for _ in range(4)]
        queries = ["alpha", "beta", "a query far too long for this retriever to take", "gamma"]
        outcomes = await asyncio.gather(*(b.search([q], 1) for b, q in zip(backends, queries)), return_exceptions=True)
        for b in backends:
            await b.aclose()
    assert [o[0][0].id if isinstance(o, list) else type(o).__name__ for o in outcomes] == [
        "alpha",
        "beta",
        "SearchError",
        "gamma",
    ]
    assert "HTTP 400" in str(outcomes[2])
    assert bodies[0] == queries  # tried together first
    assert sorted(map(tuple, bodies[1:])) == sorted((q,) for q in queries)


async def test_isolating_callers_is_for_refusals_not_for_a_server_that_is_down() -> None:
    """A retryable failure (down, overloaded, timing out) would fail each caller alone too: no resend."""
    rec = Recorder(SearchError("down", retryable=True))
    batcher = Batcher(rec.send, wait=0.01, max_batch=64)
    await asyncio.gather(*(batcher.submit([f"q{i}"], 3) for i in range(3)), return_exceptions=True)
    assert len(rec.calls) == 1
