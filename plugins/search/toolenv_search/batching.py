"""Coalescing concurrent searches into one backend call.

When 1,024 envs in one event loop each search at about the same moment, one request
with 64 queries costs far less than 64 requests. A `Batcher` holds each search
for at most `wait` seconds (or until `max_batch` queries are waiting), sends them
together, and hands each caller its own slice of the answer. When the server refuses
the batch or answers it unreadably, each caller's queries are sent again on their own,
so that one episode's bad query fails that episode only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from toolenv_search.backend import Passage, SearchError

__all__ = ["Batcher"]

SendFn = Callable[[list[str], int], Awaitable[list[list[Passage]]]]
_Item = tuple[list[str], "asyncio.Future[list[list[Passage]]]"]


class Batcher:
    """Groups `submit` calls with the same `topk` made within `wait` seconds (one event loop only)."""

    def __init__(self, send: SendFn, *, wait: float, max_batch: int) -> None:
        self.send = send
        self.wait = wait
        self.max_batch = max_batch
        self._pending: dict[int, list[_Item]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # requests sent, for tests and stats

    async def submit(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """The passages for `queries`, sent in the next batch."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[list[Passage]]] = loop.create_future()
        items = self._pending.setdefault(topk, [])
        items.append((queries, fut))
        if sum(len(q) for q, _ in items) >= self.max_batch:
            self._flush(topk)
        elif topk not in self._timers:
            self._timers[topk] = loop.call_later(self.wait, self._flush, topk)
        return await fut

    def _flush(self, topk: int) -> None:
        timer = self._timers.pop(topk, None)
        if timer is not None:
            timer.cancel()
        items = self._pending.pop(topk, [])
        if items:
            task = asyncio.get_running_loop().create_task(self._send(items, topk))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, items: list[_Item], topk: int) -> None:
        live = [(q, f) for q, f in items if not f.done()]  # callers that timed out are dropped
        if not live:
            return
        self.batches += 1
        try:
            results = await self.send([q for qs, _ in live for q in qs], topk)
        except SearchError as exc:
            if not exc.retryable and len(live) > 1:
                # A refusal or an unreadable answer may be one caller's queries' fault: send each alone,
                # so that only its own caller fails. (A retryable failure is the server's state, shared by all.)
                await asyncio.gather(*(self._send_alone(qs, f, topk) for qs, f in live))
                return
            for _, f in live:
                if not f.done():  # each caller gets its own exception object
                    f.set_exception(SearchError(str(exc), retryable=exc.retryable))
            return
        except Exception as exc:  # noqa: BLE001 - delivered to every waiting caller
            for _, f in live:
                if not f.done():
                    f.set_exception(SearchError(f"{type(exc).__name__}: {exc}"))
            return
        start = 0
        for qs, f in live:
            if not f.done():
                f.set_result(results[start : start + len(qs)])
            start += len(qs)

    async def _send_alone(self, queries: list[str], fut: asyncio.Future[list[list[Passage]]], topk: int) -> None:
        """One caller's queries in a request of their own, the outcome to its future only."""
        if fut.done():
            return
        self.batches += 1
        try:
            results = await self.send(queries, topk)
        except SearchError as exc:
            if not fut.done():
                fut.set_exception(SearchError(str(exc), retryable=exc.retryable))
            return
        except Exception as exc:  # noqa: BLE001 - delivered to its caller
            if not fut.done():
                fut.set_exception(SearchError(f"{type(exc).__name__}: {exc}"))
            return
        if not fut.done():
            fut.set_result(results)
