"""`Tool.release`: each episode's per-tool resources are freed exactly once, after its rewards."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import BaseModel

import toolenv
from toolenv.rewards import ToolVerified

from .conftest import TASKS, Add

CALL = '<tool_call>{"name": "counter", "arguments": {}}</tool_call>'


class Counter(toolenv.Tool):
    """Count calls in the episode's state; remember which episodes were released."""

    name = "counter"

    class Args(BaseModel):
        pass

    def __init__(self, fail_release: bool = False) -> None:
        super().__init__()
        self.fail_release = fail_release
        self.events: list[tuple[str, str, Any]] = []

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
        self.events.append(("run", ctx.episode_id, ctx.state["calls"]))
        return toolenv.ToolResult(text=str(ctx.state["calls"]))

    async def release(self, ctx: toolenv.ToolContext) -> None:
        self.events.append(("release", ctx.episode_id, ctx.state.get("calls", 0)))
        if self.fail_release:
            raise RuntimeError("cleanup broke")

    def released(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "release"]


def make(tool: Counter, **kwargs: Any) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[tool, Add()], tasks=TASKS, task_order="sequential", **kwargs)


def test_answer_releases_once_after_the_final_reward() -> None:
    tool = Counter()
    verify = ToolVerified("counter", lambda ep: {}, judge=lambda r: float(r.text == "2"))
    env = make(tool, reward=[(verify, 1.0)])
    env.reset(seed=0)
    env.step(CALL)
    assert tool.released() == []
    _, reward, terminated, _, _ = env.step("<answer>5</answer>")
    episode_id = env.episode.episode_id  # type: ignore[union-attr]
    # The verifying call (the episode's second) ran before the release, in the same state.
    assert terminated and reward == 1.0
    assert tool.events[-2:] == [("run", episode_id, 2), ("release", episode_id, 2)]
    env.reset()
    assert tool.released() == [episode_id]  # the finished episode is not released twice
    env.close()
    assert tool.released() == [episode_id, env.episode.episode_id]  # type: ignore[union-attr]


def test_truncation_abandoning_reset_and_close_each_release() -> None:
    tool = Counter()
    env = make(tool, max_turns=2)
    env.reset(seed=0)
    first = env.episode.episode_id  # type: ignore[union-attr]
    env.step(CALL)
    _, _, _, truncated, _ = env.step(CALL)
    assert truncated and tool.released() == [first]
    env.reset()
    second = env.episode.episode_id  # type: ignore[union-attr]
    env.step(CALL)
    env.reset()  # abandons the second episode mid-way
    third = env.episode.episode_id  # type: ignore[union-attr]
    assert tool.released() == [first, second]
    env.end_episode()
    env.end_episode()  # idempotent
    env.close()
    assert tool.released() == [first, second, third]


def test_tools_without_release_are_not_called_and_failures_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    tool = Counter(fail_release=True)
    env = make(tool)
    assert [t.name for t in env.caller._releasing] == ["counter"]  # Add keeps the default: skipped
    env.reset(seed=0)
    with caplog.at_level(logging.WARNING, logger="toolenv"):
        obs, _, terminated, _, info = env.step("<answer>5</answer>")
    assert terminated and info["reward_components"] == {"exact_match": 1.0}
    assert "failed to release" in caplog.text and "cleanup broke" in caplog.text
    env.close()


async def test_vector_env_releases_every_finished_episode() -> None:
    tool = Counter()
    venv = toolenv.ToolVectorEnv([lambda: make(tool, max_turns=1)] * 3)
    await venv.areset(seed=0)
    await venv.astep([CALL] * 3)  # every episode truncates: all three released
    assert len(set(tool.released())) == 3
    await venv.astep([CALL] * 3)  # autoreset step
    await venv.astep([CALL] * 3)
    await venv.aclose()
    assert len(tool.released()) == len(set(tool.released())) == 6
