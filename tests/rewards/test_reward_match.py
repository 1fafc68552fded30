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


def _verl_scorer(name: str) -> object:
    """One of verl's `reward_score` modules, loaded from its file: they use only the standard
    library, and importing the `verl` package would load torch first."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / "reward_score" / f"{name}.py"
    module_spec = importlib.util.spec_from_file_location(f"_verl_{name}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _docs_table(title: str) -> list[list[str]]:
    """The rows of the table in docs/rewards.md whose header starts with `title`."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "rewards.md").read_text()
    rows = []
    for line in text[text.index(title) :].splitlines()[2:]:  # past the header and its rule
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_docs_number_quirks_are_search_r1s_and_ours() -> None:
    """docs/rewards.md: every row of the numbers table, by this package and by verl's copy of
    Search-R1's `qa_em` it says it scores as."""
    qa_em = _verl_scorer("search_r1_like_qa_em")
    rows = _docs_table("| prediction | gold | `exact_match` | why |")
    assert len(rows) == 7
    for predictions, golds, score, _ in rows:
        for p, g in zip(predictions.split(", "), golds.split(", "), strict=True):
            p, g = p.strip("`"), g.strip("`")
            assert exact_match(p, g) == float(score), (p, g)
            assert qa_em.em_check(p, [g]) == int(score), (p, g)  # type: ignore[attr-defined]


def test_the_docs_account_of_verls_math_scorers_holds() -> None:
    """docs/rewards.md says what verl's `gsm8k` scorer reads (the number right after `#### `,
    so `#### $5` reads none; commas removed; compared as text) and what `math` normalises."""
    gsm8k = _verl_scorer("gsm8k").compute_score  # type: ignore[attr-defined]
    assert gsm8k("#### 1,000", "1000") == 1.0
    assert gsm8k("#### 0.50", "0.5") == 0 and gsm8k("#### -5", "5") == 0
    assert gsm8k("#### $5", "5") == 0 and gsm8k("#### $5", "$5") == 0
    math = _verl_scorer("math_reward").compute_score  # type: ignore[attr-defined]
    assert math("so \\boxed{1} then \\boxed{\\frac{1}{2}}", "0.5") == 1.0  # the last box
    assert math("\\boxed{5\\text{ cm}}", "5") == 1.0


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("Montre\u0301al", "Montr\u00e9al"),  # decomposed (NFD, as macOS files hold it) and composed
        ("Andre\u0301 the Giant", "Andr\u00e9 the Giant"),
        ("the\u0301", "th\u00e9"),  # "thé" decomposed: no article "the" to drop from it
    ],
)
def test_canonically_equivalent_unicode_matches(prediction: str, gold: str) -> None:
    """Two spellings of one text (a composed é and e plus a combining accent) are the same
    answer: they scored 0, and a decomposed "thé" even lost an article "the" to normalisation."""
    assert exact_match(prediction, gold) == 1.0 and exact_match(gold, prediction) == 1.0
    assert token_f1(prediction, gold) == 1.0
