"""`Tool.release`: each episode's per-tool resources are freed exactly once, after its rewards."""

from __future__ import annotations

import asyncio
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
    verify = ToolVerified("counter", lambda ep: {}, judge=lambda r: float(r.text == "1"))
    env = make(tool, reward=[(verify, 1.0)])
    env.reset(seed=0)
    env.step(CALL)
    assert tool.released() == []
    _, reward, terminated, _, _ = env.step("<answer>5</answer>")
    episode_id = env.episode.episode_id  # type: ignore[union-attr]
    # The verifying call ran in a fresh state of its own (the policy's state cannot sway it),
    # released at once, before the episode's own release.
    assert terminated and reward == 1.0
    (run, check_release, episode_release) = tool.events[-3:]
    check_id = run[1]
    assert check_id != episode_id
    assert run == ("run", check_id, 1) and check_release == ("release", check_id, 1)
    assert episode_release == ("release", episode_id, 1)
    env.reset()
    assert tool.released() == [check_id, episode_id]  # the finished episode is not released twice
    env.close()
    assert tool.released() == [check_id, episode_id, env.episode.episode_id]  # type: ignore[union-attr]


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


class Closing(Counter):
    """A Counter that counts its `close` calls too."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


def test_close_after_async_use_releases_and_closes_once() -> None:
    tool = Closing()
    env = make(tool)

    async def use() -> str:
        await env.areset(seed=0)
        await env.astep(CALL)
        return env.episode.episode_id  # type: ignore[union-attr]

    episode_id = asyncio.run(use())
    env.close()  # the sync loop was never made: close must still release and close
    assert tool.released() == [episode_id] and tool.closed == 1
    env.close()  # Gymnasium: closing a closed env has no effect
    assert tool.closed == 1


def test_close_of_an_env_never_reset_closes_its_tools() -> None:
    tool = Closing()
    make(tool).close()
    assert tool.closed == 1


async def test_close_inside_a_running_loop_closes_and_after_aclose_does_nothing() -> None:
    tool = Closing()
    env = make(tool)
    await env.areset(seed=0)
    env.close()  # a notebook cell, or a `with env:` block in async code: on a worker thread
    assert tool.closed == 1 and len(tool.released()) == 1
    other = Closing()
    env = make(other)
    await env.areset(seed=0)
    await env.aclose()
    env.close()  # nothing left to do
    await env.aclose()
    assert other.closed == 1 and len(other.released()) == 1


def test_a_step_interrupted_mid_tool_does_not_resume_in_the_next_step() -> None:
    class Interrupted(Counter):
        """Ctrl-C arrives while the first call waits (a KeyboardInterrupt out of the loop); that
        call would go on once a later call lets it."""

        resume: asyncio.Event | None = None

        async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
            if self.resume is None:
                self.resume = asyncio.Event()

                def interrupt() -> None:
                    raise KeyboardInterrupt

                asyncio.get_running_loop().call_soon(interrupt)
                self.events.append(("waiting", ctx.episode_id, 0))
                await self.resume.wait()
            else:
                self.resume.set()
                for _ in range(3):  # loop iterations in which a waiting call could go on
                    await asyncio.sleep(0)
            return await super().run(args, ctx)

    tool = Interrupted()
    env = make(tool, max_turns=10)
    env.reset(seed=0)
    with pytest.raises(KeyboardInterrupt):
        env.step(CALL)
    obs, *_ = env.step(CALL)
    assert obs == "<tool_response>\n1\n</tool_response>"
    assert [e[0] for e in tool.events] == ["waiting", "run"]  # the interrupted call never ran on
    assert len(env.episode.turns) == 1  # type: ignore[union-attr]
    env.close()


def test_a_failed_reset_leaves_no_released_episode_to_step() -> None:
    tool = Counter()
    env = make(tool)
    env.reset(seed=0)
    env.step(CALL)
    with pytest.raises(KeyError, match="no task with id"):
        env.reset(options={"task_id": "nope"})
    assert len(tool.released()) == 1  # the abandoned episode was released...
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        env.step(CALL)  # ... so it cannot be stepped on, its tools running after their release
    assert [e[0] for e in tool.events] == ["run", "release"]
    env.close()


@pytest.mark.parametrize("ending", ["end_episode", "close"])
def test_an_episode_ended_by_end_episode_or_close_cannot_be_stepped(ending: str) -> None:
    """`end_episode()` and `close()` release an unfinished episode's tools (close closes them too):
    a step after them ran the tools again in the released (or closed) episode, and its end then
    released nothing, leaving what those calls made behind."""
    tool = Closing()
    env = make(tool, max_turns=3)
    env.reset(seed=0)
    env.step(CALL)
    getattr(env, ending)()
    with pytest.raises(RuntimeError, match=r"call reset\(\)"):
        env.step(CALL)
    assert [e[0] for e in tool.events] == ["run", "release"]
    env.reset(seed=0)  # a new episode steps as usual
    assert env.step(CALL)[0] == "<tool_response>\n1\n</tool_response>"
    env.close()
