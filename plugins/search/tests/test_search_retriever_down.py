"""A retriever that fails or hangs is reported truthfully: how often it was tried, and that the
service (not the request) was at fault. Real servers on 127.0.0.1 (conftest's `bad_server`)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from toolenv import Task, Tool, ToolCall, ToolCaller, ToolContext, ToolResult
from toolenv.caller import ToolCallRecord
from toolenv_search.backend import SearchError
from toolenv_search.http_backend import HTTPBackend
from toolenv_search.tool import SearchTool

REMOTE_HINT = "The search service did not answer: try the search again, or answer from what you have found so far."


async def _search(tool: SearchTool) -> tuple[ToolResult, ToolCallRecord]:
    (result,), (record,) = await ToolCaller([tool]).invoke(
        [ToolCall(name="search", arguments={"query": "capital of France"}, id="a")], ToolContext(task=Task())
    )
    await tool.close()
    return result, record


async def test_a_dead_retriever_says_how_often_it_was_tried(bad_server: Any) -> None:
    bad_server.modes = ["500"]
    result, record = await _search(SearchTool(HTTPBackend(bad_server.url, retries=2, backoff=0.01)))
    assert bad_server.requests == 3
    assert result.is_error and result.retryable and "\n" not in result.text
    assert result.text == (
        f"Search failed: the retrieval server at {bad_server.url}/retrieve (tried 3 times) answered HTTP 500: "
        "index exploded"
    )
    assert record.error == result.text


@pytest.mark.parametrize(
    ("mode", "cause"),
    [
        ("close", "could not reach the retrieval server at {url}/retrieve (tried 2 times) ("),
        ("hang", "the retrieval server at {url}/retrieve (tried 2 times) did not answer within 0.3 s"),
        ("429", "the retrieval server at {url}/retrieve (tried 2 times) answered HTTP 429: rate limit exceeded"),
    ],
)
async def test_every_retried_failure_says_how_often_it_was_tried(bad_server: Any, mode: str, cause: str) -> None:
    bad_server.modes = [mode]
    backend = HTTPBackend(bad_server.url, timeout=0.3, retries=1, backoff=0.01)
    with pytest.raises(SearchError) as info:
        await backend.search(["q"], 3)
    await backend.aclose()
    assert bad_server.requests == 2
    assert cause.format(url=bad_server.url) in str(info.value)


async def test_one_attempt_is_not_counted(bad_server: Any) -> None:
    """Without retries, or when the failure is not retried (an answer that is not JSON), the text is as before."""
    bad_server.modes = ["500"]
    result, _ = await _search(SearchTool(HTTPBackend(bad_server.url, retries=0)))
    assert (
        result.text
        == f"Search failed: the retrieval server at {bad_server.url}/retrieve answered HTTP 500: index exploded"
    )
    bad_server.modes = ["garbage"]
    result, _ = await _search(SearchTool(HTTPBackend(bad_server.url, retries=2, backoff=0.01)))
    assert "tried" not in result.text and "not JSON" in result.text


async def test_a_flaky_retriever_that_recovers_is_no_error(bad_server: Any) -> None:
    bad_server.modes = ["500", "ok"]
    result, _ = await _search(SearchTool(HTTPBackend(bad_server.url, retries=2, backoff=0.01)))
    assert not result.is_error and result.text.startswith('Doc 1(Title: "Paris")')
    assert bad_server.requests == 2


async def test_batched_searches_say_how_often_they_were_tried(bad_server: Any) -> None:
    bad_server.modes = ["500"]
    result, _ = await _search(SearchTool(HTTPBackend(bad_server.url, retries=2, backoff=0.01, batch_wait=0.005)))
    assert bad_server.requests == 3
    assert "(tried 3 times) answered HTTP 500" in result.text


async def test_a_hung_retriever_is_not_blamed_on_the_request(bad_server: Any) -> None:
    """The tool's own timeout fires while the retriever hangs: the model is told the service did
    not answer, not to "try a simpler or smaller request"."""
    bad_server.modes = ["hang"]
    start = time.monotonic()
    result, record = await _search(SearchTool(HTTPBackend(bad_server.url, timeout=20, retries=0), timeout=0.3))
    assert time.monotonic() - start < 10  # the tool's 0.3 s timeout, not the backend's 20 s
    assert result.is_error and result.retryable
    assert result.text == f"Tool 'search' timed out after 0.3 s. {REMOTE_HINT}"
    assert record.error == result.text


def test_only_remote_backends_change_the_hint() -> None:
    assert SearchTool("http", backend_options={"url": "http://127.0.0.1:9"}).timeout_hint == REMOTE_HINT
    assert SearchTool("duckduckgo").timeout_hint == REMOTE_HINT
    assert SearchTool("bm25").timeout_hint == Tool.timeout_hint


def test_a_subclass_keeps_its_own_hint() -> None:
    class Mine(SearchTool):
        timeout_hint = "Mine did not answer."

    assert Mine("http", backend_options={"url": "http://127.0.0.1:9"}).timeout_hint == "Mine did not answer."
