"""Fixtures of the search plugin tests: a private index cache and retrieval servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from toolenv_search.bm25 import BM25Backend
from toolenv_search.server import create_app


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Indexes and web caches go to a per-session temporary dir, never the user's cache."""
    path = tmp_path_factory.getbasetemp() / "toolenv-cache"
    monkeypatch.setenv("TOOLENV_CACHE_DIR", str(path))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def bm25_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real uvicorn server with the bundled BM25 index, in a thread; yields its base URL."""
    backend = BM25Backend(cache_dir=tmp_path_factory.mktemp("server-cache"))
    with serve_app(create_app(backend)) as url:
        yield url


@contextlib.contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test retrieval server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def app_server() -> Callable[[Any], contextlib.AbstractContextManager[str]]:
    """`serve_app` for tests that need a server of their own settings."""
    return serve_app


@dataclass
class BadServer:
    """A raw HTTP server on 127.0.0.1 that misbehaves as told, one mode per request."""

    modes: list[str]
    url: str = ""
    requests: int = 0
    bodies: list[dict[str, object]] = field(default_factory=list)


def _response(status: str, body: bytes, ctype: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


GOOD_BODY = json.dumps(
    {"result": [[{"document": {"id": "d1", "contents": '"Paris"\nParis is the capital of France.'}, "score": 3.5}]]}
).encode()


@pytest.fixture
async def bad_server() -> AsyncIterator[BadServer]:
    state = BadServer(modes=["ok"])
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(h.split(b":", 1)[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0
            )
            body = await reader.readexactly(length)
            state.bodies.append(json.loads(body))
            mode = state.modes[min(state.requests, len(state.modes) - 1)]
            state.requests += 1
            if mode == "close":
                pass  # drop the connection without answering
            elif mode == "slow":  # answers, after a while
                await asyncio.sleep(0.6)
                writer.write(_response("200 OK", GOOD_BODY))
            elif mode == "hang":
                await asyncio.sleep(60)
            elif mode == "500":
                writer.write(_response("500 Internal Server Error", b'{"detail": "index exploded"}'))
            elif mode == "429":
                writer.write(_response("429 Too Many Requests", b'{"detail": "rate limit exceeded"}'))
            elif mode == "garbage":
                writer.write(_response("200 OK", b"<html>\x00\xff not json", "text/html"))
            elif mode == "badgzip":  # says gzip, is not: httpx fails decoding the body
                head_end = b"\r\nContent-Encoding: gzip\r\n\r\n"
                writer.write(_response("200 OK", b"not gzip").replace(b"\r\n\r\n", head_end, 1))
            elif mode == "badshape":
                writer.write(_response("200 OK", b'{"result": [[{"document": 42}]]}'))
            elif mode == "ok":
                writer.write(_response("200 OK", GOOD_BODY))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            handlers.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}"
    yield state
    server.close()
    for t in list(handlers):
        t.cancel()
    await asyncio.gather(*handlers, return_exceptions=True)
    await server.wait_closed()
