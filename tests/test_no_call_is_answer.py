"""`no_call_is_answer`: a turn without a tool call ends the episode with its text as the answer,
as ReTool/ToRL-style math recipes with a code tool run (the model answers by not calling it)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from _tools import Add

import toolenv

TASKS = [{"id": "t", "question": "2+3?", "answer": "5"}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def make(**kw: object) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, reward="exact_match", max_turns=4, **kw)  # type: ignore[arg-type]


def test_a_reply_without_a_call_is_the_answer() -> None:
    env = make(no_call_is_answer=True)
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step(CALL)
    assert [r.text for r in info["tool_results"]] == ["5"]
    assert (reward, term, trunc) == (0.0, False, False)
    obs, reward, term, trunc, info = env.step("  5\n")
    assert (obs, reward, term, trunc) == ("", 1.0, True, False)
    assert info["action"].answer == "5" and info["action"].text == ""
    assert env.episode is not None and env.episode.answer == "5"


def test_off_by_default_the_episode_goes_on_with_the_no_action_observation() -> None:
    env = make()
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step("5")
    assert (term, trunc) == (False, False) and info["action"].answer is None
    assert "No tool call and no final answer" in obs


@pytest.mark.parametrize(
    "action",
    [
        "",  # an empty turn is no answer
        "   \n",
        '<tool_call>{"name": "add", "arguments": {"a": 2,}</tool_call>',  # a malformed call is a parse error
    ],
)
def test_an_empty_or_malformed_turn_is_not_an_answer(action: str) -> None:
    env = make(no_call_is_answer=True)
    env.reset(seed=0)
    _, reward, term, trunc, info = env.step(action)
    assert (term, trunc) == (False, False) and info["action"].answer is None
    assert all(r.is_error for r in info["tool_results"])


def test_a_tagged_answer_and_a_call_still_read_as_before() -> None:
    env = make(no_call_is_answer=True)
    env.reset(seed=0)
    _, _, term, _, info = env.step(CALL)
    assert not term and [c.name for c in info["action"].tool_calls] == ["add"]
    _, reward, term, _, info = env.step("I am sure. <answer>5</answer>")
    assert term and reward == 1.0 and info["action"].answer == "5"


def test_gym_make_takes_it() -> None:
    env = gym.make("toolenv/ToolEnv-v0", tools=[Add()], tasks=TASKS, no_call_is_answer=True)
    try:
        env.reset(seed=0)
        _, reward, term, _, _ = env.step("5")
        assert term and reward == 1.0
    finally:
        env.close()


def test_the_answer_is_the_reply_after_the_thinking() -> None:
    """A reasoning model's hedges inside `<think>` are not its answer: a box there must not score."""
    env = make(no_call_is_answer=True)
    env.reset(seed=0)
    _, reward, term, _, info = env.step("<think>maybe 6, or \\boxed{5}</think>\nIt is 4.")
    assert term and reward == 0.0
    assert info["action"].answer == "It is 4." and info["action"].text == "<think>maybe 6, or \\boxed{5}</think>"


@pytest.mark.parametrize("action", ["", "<think>I wonder.</think>\n"])
def test_a_turn_of_nothing_or_only_thinking_says_to_call_or_answer(action: str) -> None:
    from toolenv.env import NO_ACTION_NO_CALL

    env = make(no_call_is_answer=True)
    env.reset(seed=0)
    obs, _, term, _, info = env.step(action)
    assert not term and info["action"].answer is None
    assert [r.text for r in info["tool_results"]] == [NO_ACTION_NO_CALL] and "<answer>" not in NO_ACTION_NO_CALL
    assert NO_ACTION_NO_CALL in obs
