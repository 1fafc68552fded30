"""Reward hacking: outputs that try to earn the shared rewards without doing the task."""

from __future__ import annotations

import pytest

import toolenv
from toolenv import tool


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def _components(actions: list[str], reward: dict[str, float]) -> dict[str, float]:
    env = toolenv.ToolEnv(tools=[add], tasks=[{"question": "2+3?", "answer": "5"}], reward=reward, max_turns=4)
    env.reset(seed=0)
    components: dict[str, float] = {}
    try:
        for action in actions:
            _, _, term, trunc, info = env.step(action)
            components = info["reward_components"]
            if term or trunc:
                break
    finally:
        env.close()
    return components


@pytest.mark.parametrize("empty", ["<answer></answer>", "<answer>  \n </answer>"])
def test_an_empty_answer_earns_no_format_reward(empty: str) -> None:
    assert _components([empty], {"format": 1.0})["format"] == 0.0
    assert _components([CALL, empty], {"format": 1.0})["format"] == 0.0


def test_an_empty_answer_scores_no_partial_format_reward() -> None:
    reward = toolenv.rewards.FormatReward(partial=True)
    env = toolenv.ToolEnv(tools=[add], tasks=[{"question": "2+3?", "answer": "5"}], reward=reward, max_turns=4)
    env.reset(seed=0)
    try:
        env.step(CALL)
        _, _, term, _, info = env.step("<answer></answer>")
    finally:
        env.close()
    assert term and info["reward_components"]["format"] == 0.0


def test_a_real_answer_still_earns_the_format_reward() -> None:
    assert _components([CALL, "<answer>5</answer>"], {"format": 1.0})["format"] == 1.0
    assert _components(["<answer>0</answer>"], {"format": 1.0})["format"] == 1.0


@pytest.mark.parametrize("empty", ["<answer></answer>", "<answer> \n</answer>"])
def test_an_empty_answer_does_not_dodge_the_answer_avoidance_penalty(empty: str) -> None:
    """An empty answer ends the episode but answers nothing: without this, a policy learns to
    write `<answer></answer>` instead of running out of turns and escapes the penalty."""
    reward = {"answer_avoidance_penalty": 1.0, "penalties": 1.0}
    assert _components([empty], reward) == {"answer_avoidance_penalty": -1.0, "penalties": -1.0}
    assert _components([CALL, "<answer>5</answer>"], reward) == {"answer_avoidance_penalty": 0.0, "penalties": 0.0}
    assert _components([CALL] * 4, reward) == {"answer_avoidance_penalty": -1.0, "penalties": -1.0}
