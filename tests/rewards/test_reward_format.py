"""The format reward scored through real ToolEnv episodes."""

from __future__ import annotations

import pytest

import toolenv
from toolenv import tool
from toolenv.rewards import FormatReward, get_reward, has_block


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def run(actions: list[str], reward: toolenv.Reward | str, max_turns: int = 4) -> tuple[float, dict[str, float]]:
    env = toolenv.ToolEnv(tools=[add], tasks=[{"question": "2+3?", "answer": "5"}], reward=reward, max_turns=max_turns)
    env.reset(seed=0)
    total, components = 0.0, {}
    try:
        for a in actions:
            _, r, term, trunc, info = env.step(a)
            total += float(r)
            components = info["reward_components"]
            if term or trunc:
                break
    finally:
        env.close()
    return total, components


def test_clean_episode_scores_one() -> None:
    total, comps = run([CALL, "<answer>5</answer>"], "format")
    assert comps == {"format": 1.0}
    assert total == 1.0


def test_parse_error_anywhere_scores_zero() -> None:
    total, comps = run(["<tool_call>{bad json</tool_call>", CALL, "<answer>5</answer>"], "format")
    assert comps["format"] == 0.0 and total == 0.0


def test_turn_without_action_scores_zero() -> None:
    total, _ = run(["I am thinking about it.", "<answer>5</answer>"], "format")
    assert total == 0.0


def test_truncation_without_answer_scores_zero_unless_not_required() -> None:
    assert run([CALL, CALL], "format", max_turns=2)[0] == 0.0
    assert run([CALL, CALL], FormatReward(require_answer=False), max_turns=2)[0] == 1.0


def test_tool_error_is_not_a_format_error() -> None:
    # Wrong argument types are the tool's business; the action itself was well formed.
    bad_args = '<tool_call>{"name": "add", "arguments": {"a": "x", "b": 1}}</tool_call>'
    assert run([bad_args, "<answer>5</answer>"], "format")[0] == 1.0


def test_require_think_block() -> None:
    reward = FormatReward(require_think=True)
    good = [f"<think>need the sum</think>{CALL}", "<think>got 5</think><answer>5</answer>"]
    assert run(good, reward)[0] == 1.0
    missing = [f"<think>need the sum</think>{CALL}", "<answer>5</answer>"]
    assert run(missing, reward)[0] == 0.0
    empty = ["<think>  </think>" + CALL, "<think>x</think><answer>5</answer>"]
    assert run(empty, reward)[0] == 0.0


def test_partial_credit_is_fraction_of_good_turns() -> None:
    reward = FormatReward(partial=True)
    total, _ = run(["<tool_call>{bad</tool_call>", CALL, "<answer>5</answer>"], reward)
    assert total == pytest.approx(2 / 3)


def test_format_combines_with_exact_match_by_weight() -> None:
    spec = get_reward({"exact_match": 1.0, "format": 0.5})
    total, comps = run([CALL, "<answer>5</answer>"], spec)
    assert comps == {"exact_match": 1.0, "format": 1.0}
    assert total == 1.5
    total, comps = run([CALL, "<answer>6</answer>"], spec)
    assert comps == {"exact_match": 0.0, "format": 1.0}
    assert total == 0.5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>a</think>", True),
        ("<think></think><think> b </think>", True),
        ("<think>  </think>", False),
        ("<think>never closed", False),
        ("<think>" * 10_000 + "x", False),
        ("no block", False),
    ],
)
def test_has_block(text: str, expected: bool) -> None:
    assert has_block(text, "think") is expected


def test_invalid_think_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="not a valid tag name"):
        FormatReward(think_tag="a b")


def test_require_think_accepts_reasoning_the_generation_prompt_opened() -> None:
    """Qwen3-thinking, DeepSeek-R1 and GLM templates end the prompt with `<think>`: the turn then
    starts inside the reasoning and holds only its `</think>`, as vLLM's reasoning parsers read it."""
    reward = FormatReward(require_think=True)
    opened = [f"need the sum</think>\n{CALL}", "got 5\n</think>\n<answer>5</answer>"]
    assert run(opened, reward)[0] == 1.0
    for reasoning in (True, False):
        parser_kwargs = {"reasoning": True} if reasoning else {}
        env = toolenv.ToolEnv(
            tools=[add], tasks=[{"question": "2+3?", "answer": "5"}], reward=reward, parser_kwargs=parser_kwargs
        )
        env.reset(seed=0)
        _, r, term, _, _ = env.step("got 5</think><answer>5</answer>")
        env.close()
        assert term and r == 1.0
    empty = [f"  </think>{CALL}", "got 5</think><answer>5</answer>"]
    assert run(empty, reward)[0] == 0.0


@pytest.mark.parametrize(
    "action",
    [
        "<answer>5</answer><think>x</think>",  # reasoning after the answer
        "<answer>5 <think>x</think></answer>",  # a think block nested in the answer
        "<think><answer>5</answer></think>",  # the answer nested in the reasoning, nothing after it
        "<think>x<answer>5</answer></think>",
        "<answer>5</answer></think>",  # "reasoning the prompt opened" that is only the answer
        "<think><think>x</think></think><answer>5</answer>",  # nested think blocks
        "Sure.<think>x</think><answer>5</answer>",  # something before the reasoning
    ],
)
def test_require_think_wants_reasoning_first_then_the_action(action: str) -> None:
    """R1-style (open-r1's `^<think>.*?</think>...`, Search-R1's `is_valid_sequence`): a turn opens
    with its reasoning and acts after it. A `<think>` block anywhere in the text earned the
    format reward, also one nested in the answer or after it, and so did an answer in it."""
    assert run([action], FormatReward(require_think=True))[0] == 0.0


@pytest.mark.parametrize(
    "action",
    [
        "<think>x</think><answer>5</answer>",
        "\n<think>\nx\n</think>\n\n<answer>5</answer>",
        "x</think><answer>5</answer>",  # the generation prompt opened the reasoning
    ],
)
def test_require_think_accepts_reasoning_first(action: str) -> None:
    assert run([action], FormatReward(require_think=True))[0] == 1.0
