"""Backend lookup by name, for configs and the command line (`backend="http"`).

Imports are deferred so that naming `bm25` never imports httpx's retry code or
ddgs, and naming `duckduckgo` never builds an index.
"""

from __future__ import annotations

from typing import Any

from toolenv_search.backend import SearchBackend

__all__ = ["BACKEND_NAMES", "make_backend"]

BACKEND_NAMES = ("bm25", "http", "duckduckgo")


def make_backend(name: str, **options: Any) -> SearchBackend:
    """Build the backend called `name` with its keyword `options`.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name == "bm25":
        from toolenv_search.bm25 import BM25Backend

        return BM25Backend(**options)
    if name == "http":
        from toolenv_search.http_backend import HTTPBackend

        return HTTPBackend(**options)
    if name in ("duckduckgo", "ddg"):
        from toolenv_search.web import DuckDuckGoBackend

        return DuckDuckGoBackend(**options)
    raise ValueError(f"unknown search backend {name!r}; known backends: {', '.join(BACKEND_NAMES)}")
