"""Live web search through `ddgs` (the maintained successor of duckduckgo-search).

Polite and reproducible: calls are rate-limited (asyncio-throttle, shared by all
backends in a loop) and every answer is kept in a SQLite cache, so a rerun of a
training job reads the same results without touching the network. ddgs is an
optional extra (`toolenv-search[web]`) and is imported only on a cache miss.
"""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path
from typing import Any

from asyncio_throttle.throttler import Throttler

from toolenv_search.backend import Passage, SearchError
from toolenv_search.cachedir import default_cache_dir
from toolenv_search.web_cache import ResultCache, cache_key

__all__ = ["DuckDuckGoBackend"]

_THROTTLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Throttler]] = weakref.WeakKeyDictionary()


def _throttler(rate: float) -> Throttler:
    per_loop = _THROTTLERS.setdefault(asyncio.get_running_loop(), {})
    if rate not in per_loop:
        per_loop[rate] = Throttler(rate_limit=1, period=1.0 / rate)
    return per_loop[rate]


class DuckDuckGoBackend:
    """Web search results (title, URL, snippet) from DuckDuckGo via ddgs.

    Args:
        cache_path: SQLite file of cached results (default `<cache dir>/web_search.sqlite`).
        timeout: seconds before one web search is abandoned.
        rate_limit: web requests per second, across all backends in the event loop.
        region: ddgs region option (part of the cache key).
        safesearch: ddgs safe-search option (part of the cache key).
        engine: the ddgs engine (`duckduckgo`; ddgs also knows `brave`, `wikipedia`, ...).
        offline: answer from the cache only; a miss is an error observation.
        proxy: an HTTP/SOCKS proxy URL for ddgs (default: ddgs reads `$DDGS_PROXY`).
    """

    name = "duckduckgo"

    def __init__(
        self,
        *,
        cache_path: str | Path | None = None,
        timeout: float = 5.0,
        rate_limit: float = 1.0,
        region: str = "wt-wt",
        safesearch: str = "moderate",
        engine: str = "duckduckgo",
        offline: bool = False,
        proxy: str | None = None,
    ) -> None:
        if rate_limit <= 0:
            raise ValueError(f"rate_limit must be positive, got {rate_limit}")
        self.cache = ResultCache(cache_path if cache_path is not None else default_cache_dir() / "web_search.sqlite")
        self.timeout = timeout
        self.rate_limit = rate_limit
        self.region = region
        self.safesearch = safesearch
        self.engine = engine
        self.offline = offline
        self.proxy = proxy

    def _fetch(self, query: str, topk: int) -> list[Passage]:
        try:
            from ddgs import DDGS
            from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException
        except ImportError:
            raise SearchError("web search is not installed: pip install 'toolenv-search[web]'") from None
        try:
            rows: list[dict[str, Any]] = DDGS(proxy=self.proxy, timeout=max(1, round(self.timeout))).text(
                query, region=self.region, safesearch=self.safesearch, max_results=topk, backend=self.engine
            )
        except (RatelimitException, TimeoutException) as exc:
            raise SearchError(f"web search is busy or slow ({_short(exc)}); try again later", retryable=True) from None
        except DDGSException as exc:
            if "no results" in str(exc).lower():
                return []
            raise SearchError(f"web search failed ({_short(exc)})", retryable=True) from None
        except Exception as exc:  # noqa: BLE001 - ddgs' HTTP layer raises its own error types
            raise SearchError(f"web search failed ({type(exc).__name__}: {_short(exc)})", retryable=True) from None
        return [
            Passage(id=str(r.get("href", "")), title=str(r.get("title", "")), text=str(r.get("body", "")))
            for r in rows[:topk]
        ]

    async def _one(self, query: str, topk: int) -> list[Passage]:
        key = cache_key(self.engine, self.region, self.safesearch, query)
        cached = self.cache.get(key, topk)
        if cached is not None:
            return cached
        if self.offline:
            raise SearchError(f"no cached web results for {query!r} (offline mode)")
        async with _throttler(self.rate_limit):
            pass
        try:
            # The worker thread may linger after a timeout, but the episode moves on at once.
            passages = await asyncio.wait_for(asyncio.to_thread(self._fetch, query, topk), self.timeout + 1.0)
        except (TimeoutError, asyncio.TimeoutError):
            raise SearchError(f"web search did not answer within {self.timeout:g} s", retryable=True) from None
        self.cache.put(key, query, topk, passages)
        return passages

    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """Results per query, from the cache when possible, else from the web."""
        return [await self._one(q, topk) for q in queries]

    async def aclose(self) -> None:
        """Nothing to release: the cache connection is shared for the process."""

    def __repr__(self) -> str:
        return f"<DuckDuckGoBackend cache={str(self.cache.path)!r}>"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."
