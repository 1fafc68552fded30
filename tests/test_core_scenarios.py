"""Scenarios an agentic-RL user meets in the core loop: an agent failing in any way ends its
own episode only, never the rollout; `--retry-errors` reruns only what this run runs; calls a
trainer parsed itself (ids missing, arguments as JSON text) run as the env's own would; and a
turn of several calls, one failing, or calls with the answer, comes back in call order."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path

import pytest
from _examples import load_example
from pydantic import BaseModel

import toolenv
from toolenv.agent import Agent, AgentAction, EnvInfo
from toolenv.env import ToolEnv
from toolenv.runner import rollout
from toolenv.trajectory import read_trajectories
from toolenv.types import ParsedAction, ToolCall

from .conftest import Add, Sleep

example = load_example("rollout_example")


class SpawnFails(Agent):
    """The scripted agent, whose per-episode copy cannot be made for the second episode
    (a connection per episode that a flaky server refuses)."""

    name = "scripted"

    def __init__(self) -> None:
        self.spawned = 0

    def spawn(self) -> Agent:
        self.spawned += 1
        if self.spawned == 2:
            raise ConnectionError("could not open a session (simulated)")
        return copy.copy(self)

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        return await example.ScriptedAgent().act(observation, messages, env_info)


def test_an_agent_that_cannot_spawn_ends_that_episode_not_the_run(tmp_path: Path) -> None:
    res = rollout(example.ENV_ID, SpawnFails(), out=tmp_path, concurrency=1)
    assert res.new == 4 and res.new_errors == 1
    errors = [t for t in res.trajectories if t.error is not None]
    assert len(errors) == 1 and "could not open a session" in (errors[0].error or "")
    assert not errors[0].success and errors[0].turns == []
    assert len(read_trajectories(tmp_path / "trajectories.jsonl", strict=True)) == 4
    assert res.summary.episodes == 4 and res.summary.episode_errors == 1


class LeaksCancellation(Agent):
    """The scripted agent whose client, on one task, lets out the CancelledError of a request
    task it cancelled itself (its own timeout), as some HTTP clients do."""

    name = "scripted"

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        if env_info.task.id == "price":
            request = asyncio.ensure_future(asyncio.sleep(10))
            await asyncio.sleep(0)
            request.cancel()
            await request  # raises the request's CancelledError: the step was never cancelled
        return await example.ScriptedAgent().act(observation, messages, env_info)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10 cannot tell a leaked CancelledError from a stop")
@pytest.mark.parametrize("episode_timeout", [None, 30.0])
def test_an_agent_leaking_its_own_cancellation_ends_that_episode_not_the_run(
    tmp_path: Path, episode_timeout: float | None
) -> None:
    res = rollout(example.ENV_ID, LeaksCancellation(), out=tmp_path, concurrency=2, episode_timeout=episode_timeout)
    by_id = {t.task.id: t for t in res.trajectories}
    assert res.new == 4 and res.new_errors == 1
    assert "CancelledError" in (by_id["price"].error or "") and not by_id["price"].success
    assert all(t.success for k, t in by_id.items() if k != "price")
    assert not res.summary.interrupted


def test_calls_given_parsed_with_some_ids_missing_get_ids_no_other_call_has() -> None:
    """A trainer's own parser may give ids to some calls only: each tool message must still
    answer one call, so a filled-in id never repeats one the turn already has."""
    env = ToolEnv([Add()], [{"question": "2+3?", "answer": "5"}])
    env.reset(seed=0)
    parsed = ParsedAction(
        tool_calls=[
            ToolCall(name="add", arguments={"a": 1, "b": 1}, id="call_1"),
            ToolCall(name="add", arguments={"a": 2, "b": 2}),
            ToolCall(name="add", arguments={"a": 3, "b": 3}),
        ]
    )
    _, _, _, _, info = env.step("three sums", parsed=parsed)
    ids = [c.id for c in info["messages"][0].tool_calls]
    assert ids[0] == "call_1" and len(set(ids)) == 3 and all(ids)
    answered = {m.tool_call_id: m.content for m in info["messages"][1:]}
    assert answered == {ids[0]: "2", ids[1]: "4", ids[2]: "6"}
    env.close()


class FailsOn(Agent):
    """The scripted agent, failing every turn of one task (its server down)."""

    name = "scripted"

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        if env_info.task.id == self.task_id:
            raise ConnectionError("server down (simulated)")
        return await example.ScriptedAgent().act(observation, messages, env_info)


def test_retry_errors_keeps_the_errors_of_episodes_this_run_does_not_rerun(tmp_path: Path) -> None:
    """`--retry-errors -n 1` reruns the errors among the first task's episodes; an errored
    episode of a task left out of this run is not rerun, so its line stays (and counts)."""
    rollout(example.ENV_ID, FailsOn("price"), out=tmp_path, samples=2)
    res = rollout(example.ENV_ID, FailsOn("sum-1"), out=tmp_path, samples=2, n=1, retry_errors=True)
    assert (res.new, res.skipped) == (0, 2)
    kept = read_trajectories(tmp_path / "trajectories.jsonl", strict=True)
    assert sorted(t.key for t in kept if t.error) == [("price", 0), ("price", 1)]
    assert res.summary.episodes == 8 and res.summary.episode_errors == 2
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, samples=1, retry_errors=True)
    assert (res.new, res.skipped) == (1, 3)  # price's sample 0 reruns; its sample 1 is no work of this run
    kept = read_trajectories(tmp_path / "trajectories.jsonl", strict=True)
    assert sorted(t.key for t in kept if t.error) == [("price", 1)] and len(kept) == 8


def test_calls_given_parsed_with_arguments_as_openai_json_text_run() -> None:
    """verl's and OpenAI's tool calls carry their arguments as JSON text: given so through
    `parsed=`, the call runs with them, and the turn's messages hold them as an object."""
    env = ToolEnv([Add()], [{"question": "2+3?", "answer": "5"}])
    env.reset(seed=0)
    parsed = ParsedAction(tool_calls=[ToolCall(name="add", arguments='{"a": 2, "b": 3}', id="c0")])  # type: ignore[arg-type]
    obs, _, _, _, info = env.step("sum", parsed=parsed)
    assert info["tool_results"][0].text == "5" and not info["tool_results"][0].is_error
    assert info["messages"][0].tool_calls[0].arguments == {"a": 2, "b": 3}
    assert info["messages"][0].to_openai()["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    env.close()


@pytest.mark.parametrize("arguments", [None, [2, 3], "not json", '"text"', "[2, 3]"])
def test_call_arguments_that_are_no_object_are_an_error_result_not_a_crash(arguments: object) -> None:
    """Arguments that are no JSON object (a trainer's parser gave None, a list, bad JSON text)
    fail that call with one clear message, as any other bad call does; the step goes on."""
    env = ToolEnv([Add()], [{"question": "2+3?", "answer": "5"}])
    env.reset(seed=0)
    parsed = ParsedAction(
        tool_calls=[
            ToolCall(name="add", arguments=arguments, id="c0"),  # type: ignore[arg-type]
            ToolCall(name="add", arguments={"a": 1, "b": 1}, id="c1"),
        ]
    )
    _, _, term, trunc, info = env.step("sum", parsed=parsed)
    bad, good = info["tool_results"]
    assert bad.is_error and "must be a JSON object" in bad.text and "Expected arguments: a, b." in bad.text
    assert "'{'" not in bad.text and "\n" not in bad.text
    assert good.text == "2" and not (term or trunc)
    env.close()


class Crash(toolenv.Tool):
    """A backend call that fails after a moment."""

    name = "crash"

    class Args(BaseModel):
        pass

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        await asyncio.sleep(0.01)
        raise RuntimeError("backend exploded")


def test_a_turn_of_several_calls_one_failing_then_calls_with_the_answer() -> None:
    """Search-R1-style turns: results come back in call order (the slow call first, though it
    ends last), a failing call is one error result among them, and a turn that calls a tool
    and answers ends the episode with that call's result as the last observation and the
    final reward scored on it."""
    env = ToolEnv([Add(), Sleep(), Crash()], [{"question": "2+3?", "answer": "5"}], max_turns=3)
    env.reset(seed=0)
    turn = "".join(
        f"<tool_call>{json.dumps(c)}</tool_call>"
        for c in (
            {"name": "sleep", "arguments": {"seconds": 0.05}},
            {"name": "crash", "arguments": {}},
            {"name": "add", "arguments": {"a": 2, "b": 3}},
        )
    )
    obs, reward, term, trunc, info = env.step(turn)
    results = info["tool_results"]
    assert [(r.name, r.is_error) for r in results] == [("sleep", False), ("crash", True), ("add", False)]
    assert "backend exploded" in results[1].text
    assert obs.endswith("</tool_response>\n<tool_response>\n5\n</tool_response>") and obs.index("slept") < obs.index(
        "exploded"
    )
    calls = info["messages"][0].tool_calls
    assert [m.tool_call_id for m in info["messages"][1:]] == [c.id for c in calls]
    assert (reward, term, trunc) == (0.0, False, False)
    last = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>\n<answer>5</answer>'
    obs, reward, term, trunc, info = env.step(last)
    assert (term, trunc, reward, info["answer"]) == (True, False, 1.0, "5")
    assert obs == "<tool_response>\n2\n</tool_response>"
    assert info["episode_stats"] == {"return": 1.0, "turns": 2, "tool_calls": 4, "tool_errors": 1}
    env.close()
