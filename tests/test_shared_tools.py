"""A tool object several envs hold: the last env (or ToolCaller) closed closes it, once.

One tool object given to several envs (`ToolEnv(tools=[t])` twice, a factory returning envs
that share `t`, a `tools` reference to a Tool instance, an `@toolenv.tool` function, a
vector env's envs) used to be closed by every env's close: closing one env closed it under
the others (a stateful code tool lost their interpreters), and a vector env closed it once per env.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
from typing import Any

import pytest
from pydantic import BaseModel

import toolenv
from toolenv import caller as caller_module
from toolenv.caller import ToolCaller
from toolenv.types import Task, ToolCall
from toolenv.vector import ToolVectorEnv

from .conftest import TASKS

CALL = '<tool_call>{"name": "remember", "arguments": {}}</tool_call>'


class Remember(toolenv.Tool):
    """A stateful tool: a count per episode while open; `close` ends every episode's count."""

    name = "remember"

    class Args(BaseModel):
        pass

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.closed = 0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        if self.closed:
            return toolenv.ToolResult.error("closed")
        self.counts[ctx.episode_id] = self.counts.get(ctx.episode_id, 0) + 1
        return toolenv.ToolResult(text=str(self.counts[ctx.episode_id]))

    async def release(self, ctx: toolenv.ToolContext) -> None:
        self.counts.pop(ctx.episode_id, None)

    async def close(self) -> None:
        self.closed += 1
        self.counts.clear()


class Same(Remember):
    """Equal to every other `Same` and unhashable: holders must be counted by identity."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same)


def make(tool: toolenv.Tool) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[tool], tasks=TASKS, max_turns=8)


def test_closing_one_env_leaves_a_tool_another_env_holds_open() -> None:
    tool = Remember()
    a, b = make(tool), make(tool)
    a.reset(seed=0)
    b.reset(seed=0)
    b.step(CALL)
    a.step(CALL)
    a.close()
    assert tool.closed == 0
    obs, *_ = b.step(CALL)
    assert "2" in obs  # b's episode kept its state
    b.close()
    assert tool.closed == 1  # the last env holding it closes it
    a.close()
    b.close()
    assert tool.closed == 1


def test_closing_releases_the_episode_from_a_shared_tool() -> None:
    tool = Remember()
    a, b = make(tool), make(tool)
    a.reset(seed=0)
    a.step(CALL)
    b.reset(seed=0)
    b.step(CALL)
    a_id = a.episode.episode_id  # type: ignore[union-attr]
    a.close()
    assert a_id not in tool.counts and len(tool.counts) == 1  # a's episode released, b's kept
    b.close()


def test_an_env_reset_after_close_holds_its_tools_again() -> None:
    tool = Remember()
    a, b = make(tool), make(tool)
    a.close()
    a.reset(seed=0)  # reopened: a holds the tool again
    b.close()
    assert tool.closed == 0
    obs, *_ = a.step(CALL)
    assert "1" in obs and "closed" not in obs
    a.close()
    assert tool.closed == 1


def test_an_env_whose_close_failed_holds_its_tools_again_on_reset() -> None:
    class Fails(Remember):
        name = "fails"

        async def close(self) -> None:
            await super().close()
            raise OSError("cannot close")

    tool, shared = Fails(), Remember()
    a = toolenv.ToolEnv(tools=[tool, shared], tasks=TASKS)
    b = make(shared)
    with pytest.raises(OSError):
        a.close()
    a.reset(seed=0)
    b.close()
    assert shared.closed == 0  # a holds it again
    with pytest.raises(OSError):
        a.close()
    assert shared.closed == 1


def test_tools_that_define_eq_or_are_unhashable_are_counted_by_identity() -> None:
    one, two = Same(), Same()
    a, b = make(one), make(two)
    a.close()
    assert (one.closed, two.closed) == (1, 0)
    b.close()
    assert (one.closed, two.closed) == (1, 1)


async def test_callers_sharing_a_tool_close_it_once_and_leave_no_count_behind() -> None:
    tool = Remember()
    first, second = ToolCaller([tool]), ToolCaller([tool])
    await first.aclose()
    assert tool.closed == 0
    (result,), _ = await second.invoke([ToolCall(name="remember")], toolenv.ToolContext(task=Task()))
    assert result.text == "1"
    await second.aclose()
    assert tool.closed == 1
    assert id(tool) not in caller_module._HOLDERS


async def test_a_caller_collected_unclosed_lets_go_of_its_tools() -> None:
    tool = Remember()
    dropped = ToolCaller([tool])
    kept = ToolCaller([tool])
    del dropped
    gc.collect()
    await kept.aclose()
    assert tool.closed == 1
    assert id(tool) not in caller_module._HOLDERS


async def test_copies_of_a_caller_each_hold_the_tools() -> None:
    tool = Remember()
    original = ToolCaller([tool])
    copied = copy.copy(original)
    await original.aclose()
    assert tool.closed == 0
    await copied.aclose()
    assert tool.closed == 1


def test_a_vector_env_closes_each_shared_tool_once() -> None:
    tool = Remember()
    venv = ToolVectorEnv([lambda: make(tool)] * 3)
    venv.reset(seed=0)
    venv.step([CALL] * 3)
    venv.close()
    assert tool.closed == 1


def test_a_throwaway_env_for_a_verl_row_leaves_the_pooled_envs_tool_open() -> None:
    """`_row_prompt_differs` builds an env to read a row's prompt and closes it: with a `tools`
    reference to a Tool instance, that closed the tool the pooled envs hold."""
    from toolenv.integrations.verl._turns import _row_prompt_differs
    from toolenv.integrations.verl.envs import make_env

    SHARED.closed = 0
    kwargs = {"tools": [f"{__name__}:SHARED"], "tasks": TASKS, "max_turns": 8}
    pooled = make_env("toolenv/ToolEnv-v0", kwargs)
    obs, info = pooled.reset(seed=0)
    pooled.step(CALL)
    row = {**kwargs, "system_prompt": "Be brief."}
    assert asyncio.run(_row_prompt_differs("toolenv/ToolEnv-v0", row, pooled.episode.task, info["messages"]))  # type: ignore[union-attr]
    assert SHARED.closed == 0
    obs, *_ = pooled.step(CALL)
    assert "2" in obs
    pooled.close()
    assert SHARED.closed == 1


#: One instance, referenced as `"<this module>:SHARED"`: every env made from the reference holds it.
SHARED = Remember()


# ---------------------------------------------------------------------- the code plugin's stateful python tool
def _python(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_closing_one_env_keeps_the_other_envs_python_session() -> None:
    toolenv_code = pytest.importorskip("toolenv_code")
    tool = toolenv_code.PythonTool(stateful=True)
    a, b = make(tool), make(tool)
    a.reset(seed=0)
    b.reset(seed=0)
    b.step(_python("x = 41"))
    a.step(_python("y = 1"))
    a.close()
    obs, *_ = b.step(_python("print(x + 1)"))
    assert "42" in obs and "restarted" not in obs
    b.close()


def test_closing_a_copy_of_the_python_tool_leaves_the_originals_sessions() -> None:
    """`tool_limits` steps a shallow copy of the tool: one made while the original had an
    episode open got that episode's session too, and closing the copy's env ended it."""
    toolenv_code = pytest.importorskip("toolenv_code")
    tool = toolenv_code.PythonTool(stateful=True)
    a = make(tool)
    a.reset(seed=0)
    a.step(_python("x = 41"))
    b = toolenv.ToolEnv(tools=[tool], tasks=TASKS, tool_limits={"python": {"retries": 1}})
    b.close()
    obs, *_ = a.step(_python("print(x + 1)"))
    assert "42" in obs and "restarted" not in obs
    a.close()
