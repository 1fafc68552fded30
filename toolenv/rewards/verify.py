"""Tool-verified rewards: check the answer by calling one of the env's own tools.

Code tasks run the answer against tests in the sandbox, SQL tasks run the
predicted query, and so on: the tool that served the episode also scores it, with the
same limits and error handling, but in a context of its own (see `ToolVerified`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from toolenv._tool import ToolContext
from toolenv.episode import Episode, new_episode_id
from toolenv.rewards.base import Reward, record_reward_info
from toolenv.types import ToolCall, ToolResult

__all__ = ["ToolVerified"]

BuildArgs = Callable[[Episode], "Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None"]
JudgeFn = Callable[[ToolResult], "float | Awaitable[float]"]


def _arguments(args: Mapping[str, Any]) -> dict[str, Any]:
    """`args` as keyword arguments.

    Raises:
        TypeError, ValueError: `args` is not a mapping of argument names (e.g. a string).
    """
    kwargs = dict(args)
    if not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"argument names must be strings, got {list(kwargs)!r}")
    return kwargs


def _default_judge(result: ToolResult) -> float:
    return 0.0 if result.is_error else 1.0


async def _call_fresh(episode: Episode, tool: str, arguments: dict[str, Any]) -> ToolResult:
    """`tool(**arguments)` in a context of its own: a new id and empty state, released afterwards.

    Not the episode's context (`episode.call_tool`): the policy wrote to its state and sessions
    (a stateful interpreter whose `print` it replaced), and a check run there scores what the
    policy arranged rather than the answer. The new id keeps the tool from finding the episode's
    session by id (the code tool names its session after it).
    """
    ctx = ToolContext(task=episode.task, episode_id=f"verify-{new_episode_id()}", turn=len(episode.turns))
    try:
        results, _ = await episode.caller.invoke([ToolCall(name=tool, arguments=arguments, id="verify")], ctx)
    finally:
        await episode.caller.release(ctx)  # what the check opened (its sandbox session); failures logged
    return results[0]


class ToolVerified(Reward):
    """Final reward from calling `tool` with `build_args(episode)` and scoring the result.

    The call runs in a fresh context, not the episode's: a new `ToolContext` (its own
    `episode_id`, empty `state`), so a stateful tool starts a new session (the code tool a new
    sandbox process) that the policy never touched, and the tool's `release` frees it right
    after the call. The task is the episode's (`ep.task.context` reaches the tool as usual).

    Args:
        tool: name of one of the env's tools.
        build_args: the tool's arguments for this episode (e.g. the answer plus the
            task's tests), sync or async; returning None skips the call and scores 0.
        judge: score of the `ToolResult` (sync or async); by default 1.0 unless it is an error.
        score_errors: pass failed tool results to `judge` too (by default they score 0).
        require_answer: score 0 without calling the tool when the episode has no answer or a
            blank one (`<answer></answer>`).
        name: the component name.

    Nothing raises: a failure in `build_args` (or arguments that are not a mapping of
    names), the tool or `judge` (or a NaN or infinite score) scores 0 and is kept in
    `reward_info(episode)[name]`.
    """

    def __init__(
        self,
        tool: str,
        build_args: BuildArgs,
        judge: JudgeFn = _default_judge,
        *,
        score_errors: bool = False,
        require_answer: bool = True,
        name: str = "tool_verified",
    ) -> None:
        self.tool = tool
        self.build_args = build_args
        self.judge = judge
        self.score_errors = score_errors
        self.require_answer = require_answer
        self.name = name

    async def final(self, episode: Episode) -> float:
        if self.require_answer and (episode.answer is None or not episode.answer.strip()):  # `<answer></answer>`
            record_reward_info(episode, self.name, score=0.0, error=None, skipped="no answer")
            return 0.0
        try:
            args = self.build_args(episode)
            if inspect.isawaitable(args):
                args = await args
            kwargs = None if args is None else _arguments(args)
        except Exception as exc:  # noqa: BLE001 - a reward never breaks the episode
            return self._fail(episode, f"build_args failed: {type(exc).__name__}: {exc}")
        if kwargs is None:
            record_reward_info(episode, self.name, score=0.0, error=None, skipped="build_args returned None")
            return 0.0
        result = await _call_fresh(episode, self.tool, kwargs)
        if result.is_error and not self.score_errors:
            return self._fail(episode, f"tool {self.tool!r} failed: {result.text[:500]}", result)
        try:
            value = self.judge(result)
            if inspect.isawaitable(value):
                value = await value
            score = float(value)
        except Exception as exc:  # noqa: BLE001
            return self._fail(episode, f"judge failed: {type(exc).__name__}: {exc}", result)
        if not math.isfinite(score):  # would end the step with an error (see `WeightedSum.total`)
            return self._fail(episode, f"judge returned {score!r}; a reward must be a finite number", result)
        record_reward_info(episode, self.name, score=score, error=None, tool_output=result.text[:500])
        return score

    def _fail(self, episode: Episode, error: str, result: ToolResult | None = None) -> float:
        output = result.text[:500] if result is not None else None
        record_reward_info(episode, self.name, score=0.0, error=error, tool_output=output)
        return 0.0
