"""The one interface every search backend implements, and the passage it returns.

Like an httpx transport, a backend is the swappable part: the `search` tool, the
retrieval server and the environments only ever see `SearchBackend`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Passage", "SearchBackend", "SearchError"]


class Passage(BaseModel):
    """One retrieved passage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Stable id of the passage in its corpus (a URL for web results).")
    title: str = Field(default="", description="Title of the page or article.")
    text: str = Field(default="", description="The passage text.")
    score: float | None = Field(default=None, description="Retrieval score; higher is better. None when unknown.")


class SearchError(Exception):
    """A backend could not answer. The message is shown to the model, so it says what to do.

    `retryable` marks transient failures (timeouts, 5xx, dropped connections).
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@runtime_checkable
class SearchBackend(Protocol):
    """Answers a batch of queries with the top `topk` passages of each, best first."""

    name: str

    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """One ranked passage list per query, in query order.

        Raises:
            SearchError: the backend failed; the message is worded for the model.
        """
        ...

    async def aclose(self) -> None:
        """Release connections held for the running event loop."""
        ...
