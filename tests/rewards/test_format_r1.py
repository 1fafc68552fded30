"""`FormatReward(require_think=True)` against the R1 format it cites: reasoning, then the action,
and nothing else (open-r1's `^<think>.*?</think>\\s*<answer>.*?</answer>$`)."""

from __future__ import annotations

import pytest

import toolenv
from toolenv import tool
from toolenv.rewards import FormatReward


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def score(actions: list[str], parser_kwargs: dict[str, object] | None = None) -> float:
    env = toolenv.ToolEnv(
        tools=[add],
        tasks=[{"question": "2+3?", "answer": "5"}],
        reward=FormatReward(require_think=True),
        parser_kwargs=parser_kwargs or {},
    )
    env.reset(seed=0)
    try:
        for action in actions:
            _, _, term, trunc, info = env.step(action)
            if term or trunc:
                break
        return float(info["reward_components"]["format"])
    finally:
        env.close()


PARSERS = [None, {"reasoning": True}]


@pytest.mark.parametrize("parser_kwargs", PARSERS)
@pytest.mark.parametrize(
    "actions",
    [
        ["<think>\nreason\n</think>\n<answer>\n5\n</answer><think>more</think>"],  # reasoning after the answer
        ["<think>\nreason\n</think>\n<answer>\n5\n</answer>\nor maybe 6, 7, 8..."],  # free text after the answer
        ["<think>sum</think>Let me add.\n<answer>5</answer>"],  # free text between reasoning and answer
        [f"<think>need the sum</think>{CALL}\nand then I will answer", "<think>5</think><answer>5</answer>"],
        [f"<think>need the sum</think>{CALL}<think>more</think>", "<think>5</think><answer>5</answer>"],
        ["x</think><answer>5</answer> trailing"],  # reasoning the prompt opened, then text after the answer
    ],
)
def test_require_think_wants_nothing_but_reasoning_then_the_action(
    actions: list[str], parser_kwargs: dict[str, object] | None
) -> None:
    assert score(actions, parser_kwargs) == 0.0


@pytest.mark.parametrize("parser_kwargs", PARSERS)
@pytest.mark.parametrize(
    "actions",
    [
        ["<think>\nreason\n</think>\n<answer>\n5\n</answer>"],
        ["<think>\nreason\n</think>\n<answer>\n5\n</answer>\n\n"],
        [f"<think>need the sum</think>\n{CALL}", "<think>got 5</think>\n<answer>5</answer>"],
        [f"<think>two calls</think>\n{CALL}\n{CALL}\n", "<think>got 5</think><answer>5</answer>"],
        [f"need the sum</think>\n{CALL}", "got 5\n</think>\n<answer>5</answer>"],  # the prompt opened it
    ],
)
def test_require_think_still_takes_reasoning_then_actions(
    actions: list[str], parser_kwargs: dict[str, object] | None
) -> None:
    assert score(actions, parser_kwargs) == 1.0
