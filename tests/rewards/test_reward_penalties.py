"""Action-level penalties and per-turn rewards, as they flow through `ToolEnv.step`."""

from __future__ import annotations

from typing import Any

import pytest

import toolenv
from toolenv import tool
from toolenv.episode import Episode, Turn
from toolenv.rewards import (
    ActionPenalties,
    AnswerAvoidancePenalty,
    InvalidCallPenalty,
    ToolCallPenalty,
    ToolSuccessBonus,
    TurnReward,
    get_reward,
)


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@tool
def boom(x: int) -> str:
    """Always fails."""
    raise RuntimeError("kaput")


def call(name: str, **args: Any) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def episode(actions: list[str], reward: Any, max_turns: int = 4) -> list[tuple[float, dict[str, float], bool, bool]]:
    """(reward, components, terminated, truncated) of every step."""
    env = toolenv.ToolEnv(
        tools=[add, boom], tasks=[{"question": "2+3?", "answer": "5"}], reward=reward, max_turns=max_turns
    )
    env.reset(seed=0)
    out = []
    try:
        for a in actions:
            _, r, term, trunc, info = env.step(a)
            out.append((float(r), info["reward_components"], term, trunc))
            if term or trunc:
                break
    finally:
        env.close()
    return out


def test_tool_call_penalty_is_charged_on_the_turn_of_the_calls() -> None:
    steps = episode(
        [call("add", a=1, b=2) + call("add", a=3, b=4), call("add", a=2, b=3), "<answer>5</answer>"],
        {"tool_call_penalty": 0.1},
    )
    assert [s[1]["tool_call_penalty"] for s in steps] == [-2.0, -1.0, 0.0]
    assert [s[0] for s in steps] == pytest.approx([-0.2, -0.1, 0.0])


def test_free_calls_are_not_charged() -> None:
    steps = episode(
        [call("add", a=1, b=2) + call("add", a=3, b=4), call("add", a=2, b=3), "<answer>5</answer>"],
        ToolCallPenalty(-0.5, free_calls=2),
    )
    assert [s[0] for s in steps] == [0.0, -0.5, 0.0]


def test_invalid_call_penalty_counts_parse_errors_tool_errors_and_empty_turns() -> None:
    steps = episode(
        [
            "<tool_call>{not json</tool_call>" + call("add", a=1, b=1),  # one parse error
            call("boom", x=1) + call("add", a="x", b=1) + call("nope"),  # exception, bad args, unknown tool
            "just chatting",  # no action at all
            "<answer>5</answer>",
        ],
        "invalid_call_penalty",
    )
    assert [s[1]["invalid_call_penalty"] for s in steps] == [-1.0, -3.0, -1.0, 0.0]


def test_invalid_call_penalty_parts_can_be_switched_off() -> None:
    reward = InvalidCallPenalty(-2.0, tool_errors=False, no_action=False)
    steps = episode(["<tool_call>{x</tool_call>", call("boom", x=1), "hmm", "<answer>5</answer>"], reward)
    assert [s[0] for s in steps] == [-2.0, 0.0, 0.0, 0.0]


def test_answer_avoidance_only_when_truncated_without_answer() -> None:
    steps = episode([call("add", a=1, b=2)] * 3, {"answer_avoidance_penalty": 2.0}, max_turns=3)
    assert [s[1]["answer_avoidance_penalty"] for s in steps] == [0.0, 0.0, -1.0]
    assert steps[-1][3] is True and steps[-1][0] == -2.0
    answered = episode([call("add", a=1, b=2), "<answer>wrong</answer>"], AnswerAvoidancePenalty(-3.0))
    assert [s[0] for s in answered] == [0.0, 0.0]


def test_each_penalty_has_its_own_weight_and_component() -> None:
    spec = {"exact_match": 1.0, "tool_call_penalty": 0.1, "invalid_call_penalty": 0.5, "answer_avoidance_penalty": 1.0}
    steps = episode([call("add", a=2, b=3) + "<tool_call>{</tool_call>", "<answer>5</answer>"], spec)
    first, last = steps
    assert first[1] == {
        "exact_match": 0.0,
        "tool_call_penalty": -1.0,
        "invalid_call_penalty": -1.0,
        "answer_avoidance_penalty": 0.0,
    }
    assert first[0] == pytest.approx(-0.1 - 0.5)
    assert last[1]["exact_match"] == 1.0 and last[0] == 1.0


def test_combined_penalties_component() -> None:
    reward = ActionPenalties(per_call=-0.1, per_invalid=-0.5, no_answer=-1.0)
    steps = episode([call("add", a=2, b=3) + call("boom", x=0), call("add", a=1, b=1)], reward, max_turns=2)
    assert [s[1]["penalties"] for s in steps] == pytest.approx([-0.2 - 0.5, -0.1 - 1.0])
    assert get_reward("penalties").parts["penalties"][0].__class__ is ActionPenalties


def test_tool_success_bonus_is_a_per_turn_reward() -> None:
    steps = episode(
        [call("add", a=1, b=2) + call("boom", x=1) + call("add", a=2, b=2), call("boom", x=2), "<answer>5</answer>"],
        {"tool_success": 0.25, "exact_match": 1.0},
    )
    assert [s[1]["tool_success"] for s in steps] == [2.0, 0.0, 0.0]
    assert [s[0] for s in steps] == [0.5, 0.0, 1.0]
    capped = episode([call("add", a=1, b=2) * 3, "<answer>5</answer>"], ToolSuccessBonus(1.0, max_per_turn=1))
    assert capped[0][0] == 1.0


async def test_turn_reward_from_async_function_and_episode_return() -> None:
    seen: list[int] = []

    async def length_bonus(ep: Episode, turn: Turn) -> float:
        seen.append(len(ep.turns))
        return 0.01 * len(turn.action)

    env = toolenv.ToolEnv(
        tools=[add],
        tasks=[{"question": "q", "answer": "5"}],
        reward=[(TurnReward(length_bonus, name="length"), 1.0), ("exact_match", 1.0)],
    )
    await env.areset(seed=0)
    a1, a2 = call("add", a=2, b=3), "<answer>5</answer>"
    _, r1, *_ = await env.astep(a1)
    _, r2, term, _, info = await env.astep(a2)
    await env.aclose()
    assert seen == [1, 2]
    assert r1 == pytest.approx(0.01 * len(a1))
    assert info["reward_components"] == pytest.approx({"length": 0.01 * len(a2), "exact_match": 1.0})
    assert info["episode_stats"]["return"] == pytest.approx(float(r1) + float(r2))
    assert term is True


def test_sync_turn_reward() -> None:
    reward = TurnReward(lambda ep, turn: -1.0 if turn.parsed.errors else 0.0, name="strict")
    steps = episode(["<tool_call>{</tool_call>", "<answer>5</answer>"], reward)
    assert [s[1] for s in steps] == [{"strict": -1.0}, {"strict": 0.0}]


def test_a_penalty_that_charged_nothing_is_zero_not_minus_zero() -> None:
    """`-0.1 * 0` is -0.0, which logs, trajectories and reports showed as `-0.0`."""
    import math

    env = toolenv.ToolEnv(
        tools=[add],
        tasks=[{"question": "2+3?", "answer": "5"}],
        reward=[(ToolCallPenalty(-0.1), 1.0), (InvalidCallPenalty(-0.1), 1.0), (ToolSuccessBonus(0.1), 1.0)],
    )
    env.reset(seed=0)
    zeros = []
    for action in (call("add", a=2, b=3), "no action", "<answer>5</answer>"):
        *_, info = env.step(action)
        zeros += [v for v in info["reward_components"].values() if v == 0.0]
    assert len(zeros) == 6 and all(math.copysign(1.0, v) == 1.0 for v in zeros), zeros
    env.close()


def test_amounts_from_a_config_as_text_score_as_numbers() -> None:
    """A config may give an amount as text (`per_call: "-0.5"`, as weights may be): the penalty
    multiplied the text, so the first tool call ended the step with a TypeError mid-training."""
    spec = {
        "tool_call_penalty": {"per_call": "-0.5", "free_calls": "1"},
        "tool_success": {"per_success": "0.25"},
        "answer_avoidance_penalty": {"penalty": "-2"},
    }
    steps = episode([call("add", a=1, b=2), call("add", a=1, b=2)], spec, max_turns=2)
    assert [s[1] for s in steps] == [
        {"tool_call_penalty": 0.0, "tool_success": 0.25, "answer_avoidance_penalty": 0.0},
        {"tool_call_penalty": -0.5, "tool_success": 0.25, "answer_avoidance_penalty": -2.0},
    ]


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ({"tool_call_penalty": {"per_call": float("nan")}}, "tool_call_penalty's per_call must be a finite number"),
        ({"tool_call_penalty": {"per_call": "cheap"}}, "tool_call_penalty's per_call must be a finite number"),
        ({"tool_call_penalty": {"free_calls": 1.5}}, "tool_call_penalty's free_calls must be a whole number"),
        ({"invalid_call_penalty": {"per_invalid": float("inf")}}, "per_invalid must be a finite number"),
        ({"answer_avoidance_penalty": {"penalty": None}}, "penalty must be a finite number"),
        ({"penalties": {"no_answer": float("nan")}}, "no_answer must be a finite number"),
        ({"tool_success": {"max_per_turn": "two"}}, "tool_success's max_per_turn must be a whole number"),
    ],
)
def test_an_amount_that_is_no_finite_number_is_refused_when_built(reward: Any, message: str) -> None:
    """Not at the first step whose amount is non-zero (a NaN there ends the step with an error)."""
    with pytest.raises(ValueError, match=message):
        get_reward(reward)
