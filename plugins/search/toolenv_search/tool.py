"""The `search` tool: one query in, Search-R1-formatted passages out, from any `SearchBackend`."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from toolenv import Tool, ToolContext, ToolLimits, ToolResult
from toolenv_search.backend import Passage, SearchBackend, SearchError
from toolenv_search.backends import make_backend

__all__ = ["MAX_TOPK", "SearchTool", "format_passages"]

MAX_TOPK = 20


# What `str.splitlines` breaks on, with the spaces around it.
_LINE_BREAKS = re.compile(r"\s*[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]\s*")
# Format-neutral: the call's syntax was fine (only its query was blank), and the env's
# action format (tags, JSON tool calls, ...) is not the tool's to know.
_EMPTY_QUERY = 'The search query is empty. Put what to look for in the query, e.g. "capital of France".'
# Backends that wait on a service over the network: a timeout there is the service not answering, and
# the caller's default advice ("Try a simpler or smaller request.") would send the model after its query.
_REMOTE_BACKENDS = frozenset({"http", "duckduckgo"})
_REMOTE_TIMEOUT_HINT = (
    "The search service did not answer: try the search again, or answer from what you have found so far."
)


def _one_line(text: str) -> str:
    return _LINE_BREAKS.sub(" ", text).strip() if _LINE_BREAKS.search(text) else text


def format_passages(passages: Sequence[Passage]) -> str:
    """Search-R1's layout: one `Doc i(Title: "...") text` line per passage (line breaks inside become spaces).

    Search-R1 prints the first line of a wiki-18 `contents`, the title in quotes, so the
    title is quoted here too: a Search-R1 checkpoint reads what it was trained on.
    """
    return "\n".join(f'Doc {i}(Title: "{_one_line(p.title)}") {_one_line(p.text)}' for i, p in enumerate(passages, 1))


class SearchArgs(BaseModel):
    """Arguments of the `search` tool."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(description="What to search for: a short keyword query.")
    topk: int | None = Field(
        default=None, ge=1, le=MAX_TOPK, description="How many passages to return (the tool's default when omitted)."
    )


class SearchTool(Tool):
    """Search a knowledge source and return the most relevant passages.

    Args:
        backend: a `SearchBackend`, or a name (`bm25`, `http`, `duckduckgo`) built with `backend_options`.
        topk: passages per query when the call does not say.
        max_query_chars: longer queries are refused with an error observation.
        backend_options: keyword arguments for the named backend (e.g. `{"url": ...}` for `http`).
        limits: the caller's guards (`ToolLimits`).
        **limit_overrides: single `ToolLimits` fields to change.
    """

    name = "search"
    # Set apart from the docstring, whose Args section documents the constructor, not the call.
    description = "Search a knowledge source and return the most relevant passages."
    Args: ClassVar[type[BaseModel]] = SearchArgs
    limits = ToolLimits(timeout=30.0, max_output_chars=16384)

    def __init__(
        self,
        backend: SearchBackend | str = "bm25",
        *,
        topk: int = 3,
        max_query_chars: int = 1000,
        backend_options: Mapping[str, Any] | None = None,
        limits: ToolLimits | None = None,
        **limit_overrides: Any,
    ) -> None:
        super().__init__(limits=limits, **limit_overrides)
        if not 1 <= topk <= MAX_TOPK:
            raise ValueError(f"topk must be between 1 and {MAX_TOPK}, got {topk}")
        self.backend: SearchBackend = (
            make_backend(backend, **dict(backend_options or {})) if isinstance(backend, str) else backend
        )
        self.topk = topk
        self.max_query_chars = max_query_chars
        if self.backend.name in _REMOTE_BACKENDS and type(self).timeout_hint is Tool.timeout_hint:
            self.timeout_hint = _REMOTE_TIMEOUT_HINT  # a subclass's own hint is left as it is

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        query = " ".join(str(args.query).split())
        if not query:
            return ToolResult.error(_EMPTY_QUERY)
        if len(query) > self.max_query_chars:
            return ToolResult.error(
                f"The search query is too long ({len(query)} characters; at most {self.max_query_chars}). "
                "Search with a few keywords instead."
            )
        topk = args.topk or self.topk
        try:
            results = await self.backend.search([query], topk)
        except SearchError as exc:
            # The retriever's fault, retryable or not (an index that will not load): no invalid-call penalty.
            return ToolResult.error(
                f"Search failed: {exc}", retryable=exc.retryable, backend=self.backend.name, infra_error=True
            )
        hits = results[0] if results else []
        meta = {
            "query": query,
            "backend": self.backend.name,
            "doc_ids": [p.id for p in hits],
            "titles": [p.title for p in hits],
        }
        if not hits:
            return ToolResult(text=f"No results found for: {query}", metadata=meta)
        return ToolResult(text=format_passages(hits), metadata=meta)

    async def close(self) -> None:
        """Release the backend's connections for the running loop."""
        await self.backend.aclose()

    def breaker_key(self) -> Hashable:
        """Search tools fail together when they share a backend: its kind, and its URL for HTTP."""
        return (super().breaker_key(), self.backend.name, getattr(self.backend, "url", None))

    def __repr__(self) -> str:
        return f"<SearchTool backend={self.backend.name!r} topk={self.topk}>"
