from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

import toolenv
from toolenv import ToolContext, ToolLimits, tool
from toolenv.types import Task, ToolResult


def ctx() -> ToolContext:
    return ToolContext(task=Task(id="t"))


def test_subclass_uses_docstring_and_exports_schema(add_tool: toolenv.Tool) -> None:
    s = add_tool.schema()
    assert s["type"] == "function"
    fn = s["function"]
    assert fn["name"] == "add" and fn["description"] == "Add two integers."
    assert fn["parameters"]["required"] == ["a", "b"]
    assert fn["parameters"]["properties"]["a"] == {"description": "first addend", "type": "integer"}


def test_tool_decorator_async_function() -> None:
    @tool
    async def greet(name: Annotated[str, Field(description="who")], times: int = 1) -> str:
        """Greet someone."""
        return " ".join(["hi " + name] * times)

    assert greet.name == "greet" and greet.description == "Greet someone."
    props = greet.schema()["function"]["parameters"]
    assert props["required"] == ["name"] and props["properties"]["name"]["description"] == "who"
    args = greet.Args.model_validate({"name": "bo", "times": 2})
    assert asyncio.run(greet.run(args, ctx())).text == "hi bo hi bo"


def test_tool_decorator_sync_runs_off_the_loop() -> None:
    seen: list[str] = []

    @tool(name="where", timeout=5)
    def where_am_i(ctx: ToolContext) -> str:
        seen.append(threading.current_thread().name)
        return ctx.task.id

    assert where_am_i.limits.timeout == 5
    assert "ctx" not in where_am_i.Args.model_fields
    out = asyncio.run(where_am_i.run(where_am_i.Args(), ctx()))
    assert out.text == "t"
    assert seen and seen[0] != threading.main_thread().name


def test_tool_decorator_rejects_varargs() -> None:
    with pytest.raises(TypeError, match="cannot be described"):

        @tool
        def bad(*xs: int) -> str:
            return ""


def test_tool_result_passthrough() -> None:
    @tool
    def img() -> ToolResult:
        return ToolResult(text="x", metadata={"k": 1})

    assert asyncio.run(img.run(img.Args(), ctx())).metadata == {"k": 1}


def test_limits_override_per_instance(add_tool: toolenv.Tool) -> None:
    t = type(add_tool)(timeout=2.5, retries=3)
    assert t.limits.timeout == 2.5 and t.limits.retries == 3
    assert type(add_tool).limits.timeout == 30.0
    with pytest.raises(ValueError):
        type(add_tool)(timeout=-1)
    assert ToolLimits(rate_limit=5).rate_limit == 5


class Nested(BaseModel):
    tags: list[str] = Field(description="labels")


class Search(toolenv.Tool):
    """Search with options."""

    name = "search2"

    class Args(BaseModel):
        query: str
        topk: int | None = Field(default=None, description="how many")
        mode: Literal["fast", "exact"] = "fast"
        filters: list[Nested] = Field(default_factory=list)

    async def run(self, args: Args, ctx: ToolContext) -> ToolResult:  # type: ignore[override]
        return ToolResult(text=args.query)


def test_flat_schema_keeps_items_enum_optional() -> None:
    s = Search().schema()["function"]["parameters"]
    assert "$defs" in s and "anyOf" in s["properties"]["topk"]
    flat = Search().flat_schema()["function"]["parameters"]
    assert "$defs" not in flat
    assert flat["properties"]["topk"]["type"] == ["integer", "null"]
    assert flat["properties"]["topk"]["description"] == "how many"
    assert flat["properties"]["mode"]["enum"] == ["fast", "exact"]
    items = flat["properties"]["filters"]["items"]
    assert items["properties"]["tags"] == {"description": "labels", "items": {"type": "string"}, "type": "array"}
    assert "anyOf" not in str(flat) and "$ref" not in str(flat)


def test_schema_is_built_once_per_args_model_and_handed_out_as_a_fresh_copy(add_tool: toolenv.Tool) -> None:
    from toolenv._schema import _parameters

    first = add_tool.schema()
    first["function"]["parameters"]["properties"].clear()  # a caller editing its copy...
    second = add_tool.schema()
    assert set(second["function"]["parameters"]["properties"]) == {"a", "b"}  # ...changes no other
    assert second["function"]["parameters"]["properties"]["a"]["description"] == "first addend"
    hits = _parameters.cache_info().hits
    type(add_tool)().schema()
    assert _parameters.cache_info().hits == hits + 1  # another instance, same Args: no rebuild
