"""Answer matching: exact match and token F1 (SQuAD normalisation) as rewards see them."""

from __future__ import annotations

import pytest

import toolenv
from toolenv import tool
from toolenv.rewards import exact_match, token_f1


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def _final(answer_action: str, gold: str, reward: str) -> float:
    env = toolenv.ToolEnv(tools=[add], tasks=[{"question": "Which option?", "answer": gold}], reward=reward)
    env.reset(seed=0)
    try:
        _, r, terminated, _, _ = env.step(answer_action)
        assert terminated
        return float(r)
    finally:
        env.close()


@pytest.mark.parametrize("gold", ["A", "(A)", "The"])
@pytest.mark.parametrize("prediction", ["", "  ", "an", "An.", "?", "B"])
def test_a_gold_that_is_only_an_article_is_not_matched_by_an_empty_or_other_answer(gold: str, prediction: str) -> None:
    """SQuAD's normalisation drops articles, so the multiple-choice gold "A" normalises to ""
    and every empty answer, "an" or "?" matched it: a policy learns to answer nothing."""
    assert exact_match(prediction, gold) == 0.0
    assert token_f1(prediction, gold) == 0.0


@pytest.mark.parametrize(("prediction", "gold"), [("A", "A"), ("a.", "A"), ("(A)", "A"), (" The ", "the")])
def test_a_gold_that_is_only_an_article_matches_itself(prediction: str, gold: str) -> None:
    """And the right option scores: token F1 gave "A" against "A" 0 (no tokens left on either side)."""
    assert exact_match(prediction, gold) == 1.0
    assert token_f1(prediction, gold) == 1.0


def test_other_golds_score_as_search_r1_and_squad_do() -> None:
    """Only a gold that normalises to nothing is read differently."""
    assert exact_match("The Eiffel Tower", "eiffel tower") == 1.0
    assert exact_match("a Paris", "Paris") == 1.0
    assert exact_match("", "Paris") == 0.0
    assert token_f1("the cat sat", "a cat") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert exact_match("1,000", "1000") == 1.0
    assert token_f1("yes indeed", "yes") == 0.0


@pytest.mark.parametrize("reward", ["exact_match", "f1"])
def test_an_empty_answer_earns_nothing_against_option_a_in_the_env(reward: str) -> None:
    assert _final("<answer></answer>", "A", reward) == 0.0
    assert _final("<answer>the</answer>", "A", reward) == 0.0
    assert _final("<answer>A</answer>", "A", reward) == 1.0


@pytest.mark.parametrize("gold", ["", "  "])
@pytest.mark.parametrize("prediction", ["", " ", "Paris"])
def test_a_blank_gold_is_matched_by_nothing(gold: str, prediction: str) -> None:
    """A dataset's missing answer written as "" is no gold: an empty answer does not earn it."""
    assert exact_match(prediction, gold) == 0.0
    assert token_f1(prediction, gold) == 0.0
