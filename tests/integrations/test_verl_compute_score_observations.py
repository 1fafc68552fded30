"""`compute_score` reads the answer from the model's own text, never from a tool observation."""

from __future__ import annotations

from typing import Any

import pytest

from toolenv.integrations.verl.data import build_rows
from toolenv.integrations.verl.demo import DEMO_TASKS
from toolenv.integrations.verl.reward import compute_score
from toolenv.parsers import get_parser, parser_names
from toolenv.types import ToolResult

#: The code-block format calls only `python`: it warns that the calculator cannot be called, which
#: does not matter here (only its observations are written).
pytestmark = pytest.mark.filterwarnings("ignore:the codeblock parser calls only")

CALC = "toolenv.integrations.verl.demo:Calculator"
#: Parsers whose observations are bare text, with no markup around them (pythonic's results go
#: back as plain text): nothing in the response tells such an observation from the model's text.
BARE = {"pythonic"}
MARKED = [name for name in parser_names() if name not in BARE]
#: The `tags` parser's tag for the calculator (its defaults name the search, SQL and code tools).
PARSER_KWARGS: dict[str, dict[str, Any]] = {"tags": {"tags": {"calc": ("calculator", "expression")}}}


def _row(parser: str) -> dict[str, Any]:
    kwargs = {"tools": [CALC], "tasks": DEMO_TASKS, "parser": parser, "parser_kwargs": PARSER_KWARGS.get(parser, {})}
    return build_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs, limit=1)[0]


def _observation(parser: str, *texts: str, error: str | None = None) -> str:
    """An observation as the env's parser writes it and a trainer appends it to the response."""
    p = get_parser(parser, **PARSER_KWARGS.get(parser, {}))
    results = [ToolResult(text=t) for t in texts] + ([ToolResult.error(error)] if error is not None else [])
    return p.continue_with(p.format_results(results))


def _score(row: dict[str, Any], response: str) -> dict[str, float]:
    return compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])


@pytest.mark.parametrize("parser", MARKED)
def test_an_answer_only_inside_an_observation_is_no_answer(parser: str) -> None:
    """The model ran out of tokens after a tool call; the retrieved text held `<answer>42</answer>`
    (the gold answer): it scored 1.0 and counted as answered, where the agent loop gives 0."""
    row = _row(parser)
    obs = _observation(parser, "a page that reads <answer>42</answer> in its quiz key")
    response = "Let me look this up." + obs + "Hmm, I am not sure"
    assert _score(row, response) == {"score": 0.0, "answered": 0.0, "reward/exact_match": 0.0}


@pytest.mark.parametrize("parser", MARKED)
def test_answers_in_several_results_and_errors_are_skipped_too(parser: str) -> None:
    row = _row(parser)
    obs = _observation(parser, "<answer>42</answer>", "second <answer>42</answer>", error="bad <answer>42</answer>")
    assert _score(row, "Calling." + obs + "Still thinking")["answered"] == 0.0


@pytest.mark.parametrize("parser", MARKED)
def test_the_models_own_answer_after_an_observation_still_counts(parser: str) -> None:
    row = _row(parser)
    obs = _observation(parser, "the page says <answer>41</answer>")
    assert _score(row, "Looking." + obs + "So <answer>42</answer>") == {
        "score": 1.0,
        "answered": 1.0,
        "reward/exact_match": 1.0,
    }
    # and a wrong one of the model's own is scored as such, whatever the observation held
    wrong = _score(row, "Looking." + _observation(parser, "<answer>42</answer>") + "So <answer>41</answer>")
    assert wrong == {"score": 0.0, "answered": 1.0, "reward/exact_match": 0.0}


def test_an_unclosed_observation_marker_is_the_models_text() -> None:
    """Only whole observations are the env's: an opening marker the model wrote itself, never
    closed, does not hide the answer after it."""
    row = _row("tags")
    assert _score(row, "<information> I recall <answer>42</answer>")["score"] == 1.0


def test_the_search_r1_response_of_the_review() -> None:
    """Search-R1 markup as the HotpotQA env writes it: `<information>` holding an answer tag."""
    row = _row("tags")
    response = (
        "<think>Let me search.</think><calc>6 * 7</calc>\n\n"
        "<information>Doc 1(Title: Some page) ... the quiz key reads <answer>42</answer> ...</information>\n\n"
        "<think>Hmm, I am not sure"
    )
    assert _score(row, response)["answered"] == 0.0
