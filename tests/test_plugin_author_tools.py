"""What a plugin author hits when writing tools: cache settings, dict results, error messages."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import toolenv
from toolenv import ResultCache, Task, ToolCall, ToolCaller, ToolResult


class Lookup(toolenv.Tool):
    """Look a key up (counts its runs)."""

    name = "h8_lookup"

    class Args(BaseModel):
        key: str

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.runs: list[str] = []

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
        self.runs.append(args.key)
        return ToolResult(text=f"value of {args.key}")


async def _call(caller: ToolCaller, name: str, episode: str = "e1", **arguments: Any) -> Any:
    (result,), (record,) = await caller.invoke_for(
        [ToolCall(id="c", name=name, arguments=arguments)], Task(id="t", question="q"), episode, 0, {}
    )
    return result, record


async def test_cache_settings_from_a_config_give_the_shared_cache() -> None:
    """`tool_kwargs: {"cache": {"maxsize": 10}}` built, then every call failed with
    AttributeError: 'dict' object has no attribute 'call'."""
    first, second = Lookup(cache={"maxsize": 10, "scope": "shared"}), Lookup(cache={"maxsize": 10, "scope": "shared"})
    assert isinstance(first.cache, ResultCache) and first.cache is second.cache  # one per process and settings
    assert isinstance(Lookup(cache=True).cache, ResultCache)
    result, _ = await _call(ToolCaller([first]), "h8_lookup", key="a")
    again, record = await _call(ToolCaller([second]), "h8_lookup", episode="e2", key="a")
    assert result.text == again.text == "value of a" and record.cached
    assert first.runs == ["a"] and second.runs == []


def test_a_function_tool_takes_cache_settings_too() -> None:
    def shout(text: str) -> str:
        return text.upper()

    assert isinstance(toolenv.tool(cache={"maxsize": 3})(shout).cache, ResultCache)


@pytest.mark.parametrize("bad", ["yes", 10, ["maxsize", 10]])
def test_a_cache_that_is_no_cache_is_refused_when_built(bad: object) -> None:
    with pytest.raises(TypeError, match=r"cache must be a ResultCache, True or a mapping of its settings") as err:
        Lookup(cache=bad)
    assert "\n" not in str(err.value) and "'h8_lookup'" in str(err.value)


def test_unknown_cache_settings_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match=r"unknown cache setting\(s\) size: expected maxsize, ttl, scope"):
        Lookup(cache={"size": 10})


def test_a_class_attribute_cache_that_is_no_cache_is_refused_by_the_caller() -> None:
    class Cached(Lookup):
        cache = {"maxsize": 10}  # type: ignore[assignment]  # noqa: RUF012 - the mistake under test

    with pytest.raises(TypeError, match=r"tool 'h8_lookup' \(Cached\): cache must be a ResultCache or None"):
        ToolCaller([Cached()])


async def test_a_function_tools_dict_or_list_result_is_json_text() -> None:
    """A dict result reached the model as Python repr: `{'city': 'Oslo', 'rainy': True, 'alerts': None}`."""

    @toolenv.tool
    def weather(city: str) -> dict[str, Any]:
        return {"city": city, "rainy": True, "alerts": None, "note": "køld"}

    @toolenv.tool
    def cities() -> list[str]:
        return ["Oslo", "Bergen"]

    @toolenv.tool
    def odd() -> dict[str, Any]:
        return {"when": {1, 2}}  # JSON has no set: the text falls back to str

    caller = ToolCaller([weather, cities, odd])
    assert (await _call(caller, "weather", city="Oslo"))[0].text == (
        '{"city": "Oslo", "rainy": true, "alerts": null, "note": "køld"}'
    )
    assert (await _call(caller, "cities"))[0].text == '["Oslo", "Bergen"]'
    assert (await _call(caller, "odd"))[0].text == "{'when': {1, 2}}"


class NoArgs(toolenv.Tool):
    """No Args class."""

    name = "h8_noargs"

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
        return ToolResult(text="hi")


class NoName(toolenv.Tool):
    """I forgot the name."""

    class Args(BaseModel):
        x: int = 0


def test_a_tool_without_args_or_name_is_refused_in_one_readable_line() -> None:
    with pytest.raises(
        TypeError, match=r"tool 'h8_noargs' \(NoArgs\) has no Args: give its class an inner `class Args\(BaseModel\)`"
    ):
        ToolCaller([NoArgs()])
    with pytest.raises(ValueError, match=r"<NoName ''> has no name: set `name = \.\.\.` on its class"):
        ToolCaller([NoName()])
