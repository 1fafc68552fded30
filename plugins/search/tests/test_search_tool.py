"""The `search` tool through the real caller: formatting, bad inputs and backend swapping."""

from __future__ import annotations

import json
from pathlib import Path

import toolenv
from toolenv import Task, ToolCall, ToolCaller, ToolContext
from toolenv.parsers import TagParser
from toolenv_search.backend import Passage, SearchError
from toolenv_search.bm25 import BM25Backend
from toolenv_search.tool import SearchTool, format_passages


class FixedBackend:
    """A backend with canned answers: the tool must not care which backend it has."""

    name = "fixed"

    def __init__(self, error: SearchError | None = None) -> None:
        self.error = error
        self.calls: list[tuple[list[str], int]] = []

    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        self.calls.append((queries, topk))
        if self.error is not None:
            raise self.error
        return [[Passage(id=f"{q}-{i}", title=f"T{i}", text=f"text {i}") for i in range(topk)] for q in queries]

    async def aclose(self) -> None:
        pass


async def call(tool: SearchTool, **arguments: object) -> toolenv.ToolResult:
    results, _ = await ToolCaller([tool]).invoke(
        [ToolCall(name="search", arguments=dict(arguments), id="c0")], ToolContext(task=Task())
    )
    return results[0]


def test_format_is_search_r1s() -> None:
    text = format_passages([Passage(id="1", title="A", text="alpha"), Passage(id="2", title="B", text="beta")])
    assert text == 'Doc 1(Title: "A") alpha\nDoc 2(Title: "B") beta'


async def test_passages_with_line_breaks_stay_one_line_each(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    records = [
        {"id": "a", "title": "Aurora\nborealis", "text": "Northern lights.\n\nSeen near the poles.\r\n  Green."},
        {"id": "b", "title": "Tide", "text": "Tides follow the moon.\u2028Twice a day."},
        {"id": "c", "title": "Plain", "text": "Aurora  and tide  with  double spaces."},
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    tool = SearchTool(BM25Backend(corpus, cache_dir=tmp_path / "cache"), topk=3)
    result = await call(tool, query="aurora tide moon poles")
    assert not result.is_error, result.text
    lines = result.text.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"Doc {i}(Title: ") for i, line in enumerate(lines, 1))
    bodies = {line.split("(", 1)[1] for line in lines}
    assert bodies == {
        'Title: "Aurora borealis") Northern lights. Seen near the poles. Green.',
        'Title: "Tide") Tides follow the moon. Twice a day.',
        'Title: "Plain") Aurora  and tide  with  double spaces.',  # other spacing is kept
    }


async def test_empty_query_hint_has_no_tag_syntax() -> None:
    # The tool cannot know the env's action format; the hint names the argument instead of a tag.
    result = await call(SearchTool(FixedBackend()), query=" ")
    assert result.is_error and "<search>" not in result.text and "in the query" in result.text


async def test_tags_parser_wraps_results_in_information(tmp_path: Path) -> None:
    tool = SearchTool(BM25Backend(cache_dir=tmp_path))
    result = await call(tool, query="Constantin Medien German media group")
    assert not result.is_error
    assert result.text.startswith('Doc 1(Title: "Constantin Medien") Constantin Medien AG')
    assert result.text.count("\nDoc ") == 2  # default topk 3
    assert result.metadata["doc_ids"][0] == "hp-f93b09ca3d5f"
    obs = TagParser().format_results([result])
    assert obs.startswith('<information>Doc 1(Title: "Constantin Medien")') and obs.endswith("</information>")


async def test_topk_argument_and_default() -> None:
    backend = FixedBackend()
    tool = SearchTool(backend, topk=2)
    assert (await call(tool, query="q")).text.count("Doc ") == 2
    assert (await call(tool, query="q", topk=5)).text.count("Doc ") == 5
    assert backend.calls == [(["q"], 2), (["q"], 5)]


async def test_empty_query_is_an_error_observation() -> None:
    backend = FixedBackend()
    result = await call(SearchTool(backend), query="   \n\t ")
    assert result.is_error and "query is empty" in result.text
    assert backend.calls == []


async def test_huge_query_is_an_error_observation() -> None:
    backend = FixedBackend()
    result = await call(SearchTool(backend, max_query_chars=1000), query="word " * 100_000)
    assert result.is_error
    assert "too long (499999 characters; at most 1000)" in result.text
    assert backend.calls == []


async def test_bad_arguments_are_error_observations() -> None:
    tool = SearchTool(FixedBackend())
    for args in ({}, {"query": "x", "topk": 0}, {"query": "x", "topk": 500}, {"query": "x", "extra": 1}):
        result = await call(tool, **args)
        assert result.is_error and "Invalid arguments for tool 'search'" in result.text, args


async def test_backend_failure_becomes_error_observation() -> None:
    tool = SearchTool(FixedBackend(SearchError("the index is on fire", retryable=False)))
    result = await call(tool, query="anything")
    assert result.is_error
    assert result.text == "Search failed: the index is on fire"


async def test_no_hits_is_a_plain_observation(tmp_path: Path) -> None:
    result = await call(SearchTool(BM25Backend(cache_dir=tmp_path)), query="the of and")
    assert not result.is_error
    assert result.text == "No results found for: the of and"


def test_backend_by_name_and_plugin_entry_point() -> None:
    tool = toolenv.load_tool("search", backend="http", backend_options={"url": "http://127.0.0.1:9/"})
    assert isinstance(tool, SearchTool)
    assert tool.backend.name == "http"
    assert tool.schema()["function"]["name"] == "search"
    assert set(tool.schema()["function"]["parameters"]["properties"]) == {"query", "topk"}
    assert SearchTool().backend.name == "bm25"


def test_the_model_sees_what_the_tool_does_not_how_to_construct_it() -> None:
    """The class docstring's Args section documents the constructor; the schema the model reads
    (prompt, verl, SkyRL, TRL) must not carry it."""
    description = SearchTool().schema()["function"]["description"]
    assert description == "Search a knowledge source and return the most relevant passages."
    assert "backend_options" not in description
