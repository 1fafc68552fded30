"""The "no tool call and no final answer" observation names the answer form of the env's parser.

A parser reading `<final>…</final>` (docs/parsers.md's `TagParser(answer_tag="final")`) with an
env that tells the model to write `<answer>…</answer>` sends a model that obeys into the same
error again, until `max_turns`.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from _tools import Add

import toolenv
from toolenv.env import NO_ACTION
from toolenv.parsers import TagParser, get_parser, parser_names
from toolenv.parsers.base import ActionParser

TASKS = [{"question": "2+3?", "answer": "5"}]


def no_action_text(parser: Any, **kw: Any) -> str:
    """The env's reply to a turn with neither a call nor an answer."""
    with warnings.catch_warnings():  # a parser with no tag for `add` says so; beside the point here
        warnings.simplefilter("ignore", UserWarning)
        env = toolenv.ToolEnv(tools=[Add()], tasks=TASKS, reward="exact_match", max_turns=4, parser=parser, **kw)
    env.reset(seed=0)
    try:
        _, _, term, trunc, info = env.step("hmm, let me think")
    finally:
        env.close()
    assert not (term or trunc)
    [result] = info["tool_results"]
    assert result.is_error and result.name == "parser"
    return str(result.text)


def test_a_custom_answer_tag_is_the_one_the_message_names() -> None:
    parser = TagParser(tags={"add": ("add", "a")}, answer_tag="final")
    text = no_action_text(parser)
    assert "<final>...</final>" in text and "<answer>" not in text


def test_a_model_that_obeys_the_message_ends_the_episode() -> None:
    env = toolenv.ToolEnv(
        tools=[Add()],
        tasks=TASKS,
        reward="exact_match",
        max_turns=4,
        parser=TagParser(tags={"add": ("add", "a")}, answer_tag="final"),
    )
    env.reset(seed=0)
    _, _, _, _, info = env.step("hmm")
    message = info["tool_results"][0].text
    written = message[message.index("<final>") :].split("</final>")[0].replace("...", "5") + "</final>"
    _, reward, term, _, _ = env.step(written)
    env.close()
    assert (term, reward) == (True, 1.0)


def test_a_wrapped_parser_names_the_inner_parsers_answer_form() -> None:
    parser = get_parser(TagParser(tags={"add": ("add", "a")}, answer_tag="final"), reasoning=True)
    assert "<final>...</final>" in no_action_text(parser)


@pytest.mark.parametrize("name", ["tags", "hermes", "qwen3_xml", "pythonic"])
def test_the_default_answer_form_keeps_the_default_message(name: str) -> None:
    parser = get_parser(name, tags={"add": ("add", "a")}) if name == "tags" else name
    assert no_action_text(parser) == NO_ACTION


@pytest.mark.parametrize("name", parser_names())
def test_every_parser_kind_names_its_own_answer_form(name: str) -> None:
    parser = get_parser(name)
    text = no_action_text(parser)
    assert text.startswith("No tool call and no final answer found in your reply.")
    assert parser.answer_instructions() in text or text == NO_ACTION


@pytest.mark.parametrize(
    "name", [n for n in parser_names() if n != "tags" and "answer_tag" in vars(get_parser(n))]
)  # the tags parser always has an answer tag
def test_a_format_that_reads_no_answer_tag_is_not_told_to_write_one(name: str) -> None:
    parser = get_parser(name, answer_tag=False)
    text = no_action_text(parser)
    assert "<answer>" not in text
    assert parser.answer_instructions() in text  # harmony's final channel, or nothing at all


def test_a_harmony_answer_is_asked_for_in_the_final_channel() -> None:
    assert "final channel" in no_action_text("harmony")


def test_answer_markup_is_the_parsers_answer_tags() -> None:
    assert TagParser(answer_tag="final").answer_markup() == "<final>...</final>"
    assert get_parser("tags").answer_markup() == "<answer>...</answer>"
    assert get_parser("hermes").answer_markup() == "<answer>...</answer>"
    assert get_parser("codeblock").answer_markup() == "<answer>...</answer>"
    assert get_parser("hermes", answer_tag=False).answer_markup() is None
    assert get_parser("harmony", answer_tag=False).answer_markup() is None  # the final channel's plain text
    assert get_parser(TagParser(answer_tag="final"), reasoning=True).answer_markup() == "<final>...</final>"


def test_a_parser_of_ones_own_without_answer_instructions_names_no_answer_tag() -> None:
    class Bare(ActionParser):
        def parse(self, text: str) -> toolenv.ParsedAction:
            return toolenv.ParsedAction(text=text)

        def instructions(self, tools: Any) -> str:
            return "Reply."

        def format_results(self, results: Any) -> str:
            return "\n".join(r.text for r in results)

    assert Bare().answer_markup() is None
    assert "<answer>" not in no_action_text(Bare())
