"""A remote retriever speaking the Search-R1 retrieval API, over a pooled `httpx.AsyncClient`.

One client (one connection pool) is kept per event loop and client settings and
shared by every `HTTPBackend` in that loop, so a vector env of 1,024 envs opens
one pool, not 1,024. Connect errors, dropped connections, timeouts, 5xx, 408
and 429 answers are retried with exponential backoff; what still fails becomes a
`SearchError` worded for the model, saying how many times the server was tried.
With `batch_wait > 0`, concurrent searches of all backends with the same settings
in a loop go out together in one request.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import weakref
from typing import Any

import httpx

from toolenv._tls import tls_context
from toolenv_search.backend import Passage, SearchError
from toolenv_search.batching import Batcher
from toolenv_search.protocol import parse_result

__all__ = ["HTTPBackend"]

_Key = tuple[float, int]
# Transient by definition (RFC 9110 408, RFC 6585 429): a gateway or a busy retriever shedding load.
_TRANSIENT_4XX = frozenset({408, 429})


class _SharedClient:
    __slots__ = ("client", "users")

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.users = 0


# Clients belong to one loop (their connections are bound to it): loop -> settings -> client.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, _SharedClient]] = weakref.WeakKeyDictionary()
# Batchers likewise: loop -> (url and every setting that shapes a request) -> batcher.
_BATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[object, ...], Batcher]] = (
    weakref.WeakKeyDictionary()
)


class HTTPBackend:
    """Search through a retrieval server (`toolenv serve-search`, or Search-R1's own).

    Args:
        url: the server's base URL (`/retrieve` is appended unless the URL already ends with it).
        timeout: seconds for one request (connect, read and write each; waiting for a free pooled
            connection is not counted).
        retries: extra attempts after a transient failure.
        backoff: first retry delay in seconds; doubles each attempt (with jitter).
        max_connections: connection pool size shared by all backends with the same settings in a loop.
        batch_wait: seconds a search may wait for others to share its request (0 = send at once).
        max_batch: queries per request at most when batching.

    Raises:
        ValueError: the URL is not an http:// or https:// one.
    """

    name = "http"

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 0.2,
        max_connections: int = 64,
        batch_wait: float = 0.0,
        max_batch: int = 64,
    ) -> None:
        base = url.rstrip("/")
        if httpx.URL(base).scheme not in ("http", "https"):  # else every search fails, as if the server were down
            raise ValueError(f"the retrieval server URL must start with http:// or https://, got {url!r}")
        self.url = base if base.endswith("/retrieve") else base + "/retrieve"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_connections = max_connections
        self.batch_wait = batch_wait
        self.max_batch = max_batch
        self._loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def _client(self, *, register: bool = True) -> httpx.AsyncClient:
        """The loop's shared client; `register` counts this backend as one of its users (once per loop)."""
        loop = asyncio.get_running_loop()
        per_loop = _CLIENTS.setdefault(loop, {})
        key = (self.timeout, self.max_connections)
        shared = per_loop.get(key)
        if shared is None or shared.client.is_closed:
            client = httpx.AsyncClient(
                # No pool timeout: a request queued behind the pool's busy connections has not reached the
                # server, so it is not "the server did not answer" (the tool's own timeout bounds the call).
                timeout=httpx.Timeout(self.timeout, pool=None),
                limits=httpx.Limits(
                    max_connections=self.max_connections, max_keepalive_connections=self.max_connections
                ),
                verify=tls_context(),
            )
            shared = per_loop[key] = _SharedClient(client)
        if register and loop not in self._loops:
            self._loops.add(loop)
            shared.users += 1
        return shared.client

    async def _post_once(self, client: httpx.AsyncClient, body: dict[str, Any], attempt: int = 1) -> Any:
        """One POST, the `attempt`-th: a transient failure names how many were made (a retryable
        error is raised only by the last attempt), so a flaky server reads apart from a dead one."""
        where = self.url if attempt <= 1 else f"{self.url} (tried {attempt} times)"
        try:
            resp = await client.post(self.url, json=body)
        except httpx.TimeoutException:
            raise SearchError(
                f"the retrieval server at {where} did not answer within {self.timeout:g} s", retryable=True
            ) from None
        except httpx.TransportError as exc:  # connect errors, dropped connections, protocol errors
            raise SearchError(
                f"could not reach the retrieval server at {where} ({type(exc).__name__}: {exc})", retryable=True
            ) from None
        except httpx.DecodingError as exc:  # a body its Content-Encoding does not decode: not a transport error
            raise SearchError(f"the retrieval server sent a response that could not be decoded ({exc})") from None
        if resp.status_code >= 500 or resp.status_code in _TRANSIENT_4XX:
            raise SearchError(
                f"the retrieval server at {where} answered HTTP {resp.status_code}{_reason(resp)}", retryable=True
            )
        if resp.status_code >= 400:
            raise SearchError(f"the retrieval server refused the request: HTTP {resp.status_code} {resp.text[:200]}")
        try:
            return resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise SearchError(f"the retrieval server sent a response that is not JSON: {resp.text[:120]!r}") from None

    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """POST the queries to `/retrieve` (batched with others when `batch_wait` > 0)."""
        if not queries:
            return []
        if self.batch_wait <= 0:
            return await self._send(queries, topk)
        self._client()  # count this backend as a user of the loop's client, so its aclose is balanced
        per_loop = _BATCHERS.setdefault(asyncio.get_running_loop(), {})
        key = (
            self.url,
            self.timeout,
            self.retries,
            self.backoff,
            self.max_connections,
            self.batch_wait,
            self.max_batch,
        )
        batcher = per_loop.get(key)
        if batcher is None:
            # It sends for every backend with these settings: through the pool, never as this backend's user
            # (one that closed would count again, and the pool would outlive its last user).
            send = functools.partial(self._send, register=False)
            batcher = per_loop[key] = Batcher(send, wait=self.batch_wait, max_batch=self.max_batch)
        return await batcher.submit(queries, topk)

    async def _send(self, queries: list[str], topk: int, *, register: bool = True) -> list[list[Passage]]:
        """One POST, retrying transient failures with backoff."""
        client = self._client(register=register)
        body = {"queries": queries, "topk": topk, "return_scores": True}
        # A hand-written loop: httpx's own transport retries cover connect errors only, not 5xx or read timeouts.
        attempt = 0
        while True:
            try:
                payload = await self._post_once(client, body, attempt + 1)
                break
            except SearchError as exc:
                if not exc.retryable or attempt >= self.retries:
                    raise
            delay = self.backoff * 2**attempt
            attempt += 1
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
        try:
            rows = parse_result(payload, len(queries))
        except ValueError as exc:
            raise SearchError(f"the retrieval server sent a malformed response ({exc})") from None
        # A server that answers its own number of passages (some forks ignore `topk`) would show the model
        # more than it asked for; `topk` 0 asks for the server's default, which is left as it is.
        return [row[:topk] for row in rows] if topk > 0 else rows

    async def aclose(self) -> None:
        """Stop using this loop's shared client; the last user closes it."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if loop not in self._loops:
            return
        self._loops.discard(loop)
        per_loop = _CLIENTS.get(loop, {})
        key = (self.timeout, self.max_connections)
        shared = per_loop.get(key)
        if shared is None:
            return
        shared.users -= 1
        if shared.users <= 0:
            del per_loop[key]
            await shared.client.aclose()

    def __repr__(self) -> str:
        return f"<HTTPBackend url={self.url!r}>"


def _reason(resp: httpx.Response) -> str:
    """`: <why>` from an error body (`{"error": ...}` from ours, `{"detail": ...}` from FastAPI's), else ""."""
    try:
        body = resp.json()
    except ValueError:
        return ""
    why = body.get("error", body.get("detail")) if isinstance(body, dict) else None
    if not isinstance(why, str) or not why.strip():
        return ""
    why = " ".join(why.split())
    return f": {why if len(why) <= 200 else why[:197] + '...'}"
