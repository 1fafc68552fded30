"""`Tool.timeout_hint`: what the model is told to do when a tool times out.

The caller's advice ("Try a simpler or smaller request.") fits a tool whose work grows with
the request (code, SQL); a tool that waits on a remote service says so instead.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any, ClassVar

from pydantic import BaseModel

import toolenv
from toolenv import Task, Tool, ToolCall, ToolCaller, ToolContext, ToolLimits, ToolResult, tool

SERVICE_HINT = "The lookup service did not answer: try again later."


class _NoArgs(BaseModel):
    pass


class Lookup(Tool):
    """Look something up in a remote service."""

    name = "lookup"
    Args: ClassVar[type[BaseModel]] = _NoArgs
    limits = ToolLimits(timeout=0.05)
    timeout_hint = SERVICE_HINT

    def __init__(self, *, raises: bool = False, **limits: Any) -> None:
        super().__init__(**limits)
        self.raises = raises

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(0)
        if self.raises:  # its own client's timeout, not the caller's deadline
            raise TimeoutError("read timed out")
        await asyncio.sleep(30)
        return ToolResult(text="late")


async def _call(t: Tool) -> ToolResult:
    (result,), _ = await ToolCaller([t]).invoke([ToolCall(name=t.name, id="a")], ToolContext(task=Task()))
    return result


async def test_the_callers_deadline_gives_the_tools_own_hint() -> None:
    result = await _call(Lookup())
    assert result.is_error and result.retryable
    assert result.text == f"Tool 'lookup' timed out after 0.05 s. {SERVICE_HINT}"


async def test_a_timeout_the_tool_raised_itself_gives_its_hint() -> None:
    result = await _call(Lookup(raises=True, timeout=None))
    assert result.is_error and result.retryable
    assert result.text == f"Tool 'lookup' timed out. {SERVICE_HINT}"


async def test_the_default_hint_is_unchanged_and_set_per_instance() -> None:
    assert Tool.timeout_hint == "Try a simpler or smaller request."

    @tool(timeout=0.05)
    async def fetch() -> str:
        await asyncio.sleep(30)
        return "late"

    assert (await _call(fetch)).text == "Tool 'fetch' timed out after 0.05 s. Try a simpler or smaller request."
    fetch.timeout_hint = "The feed did not answer: try again."
    assert (await _call(fetch)).text == "Tool 'fetch' timed out after 0.05 s. The feed did not answer: try again."
    assert toolenv.tool(lambda: "x").timeout_hint == Tool.timeout_hint  # another tool keeps the default


async def test_a_hint_over_several_lines_is_kept_to_one() -> None:
    """An error observation is one line (the record keeps its first line as the error)."""
    t = Lookup()
    t.timeout_hint = "The lookup service\n  did not answer.\n"
    (result,), (record,) = await ToolCaller([t]).invoke([ToolCall(name="lookup", id="a")], ToolContext(task=Task()))
    assert result.text == "Tool 'lookup' timed out after 0.05 s. The lookup service did not answer."
    assert record.error == result.text


def test_a_function_tools_hint_survives_pickling() -> None:
    copy = pickle.loads(pickle.dumps(_remote_fn))
    assert copy.timeout_hint == "The remote did not answer."


@tool
def _remote_fn() -> str:
    return "x"


_remote_fn.timeout_hint = "The remote did not answer."
