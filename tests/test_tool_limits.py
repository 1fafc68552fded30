"""`ToolEnv(tool_limits=...)`: a config sets the limits of an env's tools, on copies."""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
import pytest
from pydantic import BaseModel

import toolenv
from toolenv import ToolEnv, ToolLimits, ToolResult


class Slow(toolenv.Tool):
    """Wait, then answer."""

    name = "slow"
    limits = ToolLimits(timeout=30)

    class Args(BaseModel):
        seconds: float = 0.0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
        await asyncio.sleep(args.seconds)
        return ToolResult(text="done")


class Echo(toolenv.Tool):
    """Echo."""

    name = "echo"

    class Args(BaseModel):
        text: str = ""

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
        return ToolResult(text=args.text)


TASKS = [{"question": "q", "answer": "a"}]


def test_limits_by_name_and_for_all_on_copies() -> None:
    slow, echo = Slow(), Echo()
    env = ToolEnv(
        tools=[slow, echo],
        tasks=TASKS,
        tool_limits={"*": {"max_output_chars": 100}, "slow": {"timeout": 0.05, "retries": 1}},
    )
    by_name = {t.name: t for t in env.tools}
    assert by_name["slow"].limits.timeout == 0.05 and by_name["slow"].limits.retries == 1
    assert by_name["slow"].limits.max_output_chars == 100 and by_name["echo"].limits.max_output_chars == 100
    assert by_name["echo"].limits.timeout == echo.limits.timeout  # untouched fields are kept
    # The objects given are unchanged: another env sharing them keeps its own limits.
    assert slow.limits.timeout == 30 and slow.limits.retries == 0 and echo.limits.max_output_chars == 8192
    assert by_name["slow"] is not slow and type(by_name["slow"]) is Slow
    env.reset(seed=0)
    obs, *_ = env.step('<tool_call>{"name": "slow", "arguments": {"seconds": 5}}</tool_call>')
    assert "timed out after 0.05 s" in obs
    env.close()


def test_no_overrides_keeps_the_same_objects() -> None:
    echo = Echo()
    assert ToolEnv(tools=[echo], tasks=TASKS).tools[0] is echo
    assert ToolEnv(tools=[echo], tasks=TASKS, tool_limits={}).tools[0] is echo
    assert ToolEnv(tools=[echo], tasks=TASKS, tool_limits={"echo": {}}).tools[0] is echo


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"search": {"timeout": 1}},
            r"tool_limits names no tool of this env: 'search' \(its tools: echo; '\*' means all\)",
        ),
        ({"echo": {"timeout": -1}}, r"tool_limits for 'echo': timeout: Input should be greater than 0"),
        ({"echo": {"timeut": 1}}, r"tool_limits for 'echo': timeut: Extra inputs are not permitted"),
        # A value that is not a mapping of limits (`echo: 5`, `echo:` in YAML) was a bare
        # "TypeError: 'int' object is not a mapping", naming neither the tool nor the setting.
        ({"echo": 5}, r"tool_limits for 'echo' must map limit names to values \(timeout: 5, ...\), got 5"),
        ({"*": None}, r"tool_limits for '\*' must map limit names to values \(timeout: 5, ...\), got None"),
        (["echo"], r"tool_limits must map tool names \(or '\*'\) to their limits, got \['echo'\]"),
    ],
)
def test_bad_limits_are_one_clear_error(limits: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ToolEnv(tools=[Echo()], tasks=TASKS, tool_limits=limits)


def test_a_plugin_env_takes_them_through_gym_make() -> None:
    pytest.importorskip("toolenv_sql", reason="the SQL plugin (toolenv-sql) is not installed")
    env = gym.make("toolenv/Chinook-v0", tool_limits={"sql": {"timeout": 3, "breaker_threshold": 5}})
    (tool,) = env.unwrapped.tools
    assert (tool.limits.timeout, tool.limits.breaker_threshold) == (3, 5)
    env.close()


def test_a_trainers_env_kwargs_set_limits_and_a_shared_cache() -> None:
    # What verl's agent loop and SkyRL's pool do with a YAML's env_kwargs (JSON-only values).
    pytest.importorskip("toolenv_search", reason="the search plugin (toolenv-search) is not installed")
    from toolenv.integrations.verl.envs import make_env

    kwargs = {"tool_limits": {"search": {"timeout": 10, "breaker_threshold": 5}}, "cache": {"maxsize": 321}}
    first, second = make_env("toolenv/HotpotQA-v0", kwargs), make_env("toolenv/HotpotQA-v0", kwargs)
    (a,), (b,) = first.tools, second.tools
    assert (a.limits.timeout, a.limits.breaker_threshold) == (10, 5)
    assert a.cache is not None and a.cache is b.cache and a.cache.maxsize == 321


def test_tool_keyword_limits_are_checked_by_name_and_value() -> None:
    """`Tool(**limits)` names a misspelt limit and the known ones; a bad value is one clear
    error (no pydantic serializer warning on the way)."""
    import warnings

    assert Slow(timeout=5, retries=2).limits == ToolLimits(timeout=5, retries=2)
    with pytest.raises(
        TypeError, match=r"tool 'echo' \(Echo\) got unknown tool limit 'timeot'; known limits: timeout, "
    ):
        Echo(timeot=5)
    with pytest.raises(TypeError, match=r"tool 'f' \(FunctionTool\) got unknown tool limits 'retry', 'rate'"):
        toolenv.tool(name="f", retry=1, rate=2)(lambda: "x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a serializer warning would fail here
        with pytest.raises(ValueError, match=r"tool 'echo' \(Echo\) limits: timeout: Input should be a valid number"):
            Echo(timeout="abc")
        with pytest.raises(ValueError, match=r"retries: Input should be greater than or equal to 0"):
            Echo(limits=ToolLimits(timeout=1), retries=-1)


def test_an_infinite_timeout_means_none() -> None:
    """`timeout: .inf` in a config (or `float("inf")`) waits as long as the call takes; it made
    every call that waited fail with "ValueError: cannot convert float NaN to integer"."""
    env = ToolEnv(tools=[Echo(), Slow()], tasks=TASKS, tool_limits={"slow": {"timeout": float("inf")}})
    env.reset(seed=0)
    _, _, _, _, info = env.step('<tool_call>{"name": "slow", "arguments": {"seconds": 0.01}}</tool_call>')
    env.close()
    assert info["tool_calls"][0].error is None
    assert Slow(timeout=float("inf")).limits.timeout is None
