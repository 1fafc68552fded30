"""Spider's and Chinook's system prompt names the answer form of the env's parser.

A SkyRL text2sql port answers in `<solution>…</solution>` (`parser_kwargs={"answer_tag": "solution"}`):
a prompt saying `<answer>…</answer>` in its first sentence and `<solution>…</solution>` in the
parser's instructions names two tags, and a model that follows the first scores 0.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

from toolenv import ToolEnv
from toolenv.parsers import TagParser
from toolenv_sql.envs import SYSTEM_PROMPT, make_chinook_env, make_spider_env, system_prompt


def system_message(env: ToolEnv) -> str:
    _, info = env.reset(seed=0)
    head = info["messages"][0]
    assert head.role == "system"
    return str(head.content)


def test_a_custom_answer_tag_is_the_only_answer_form_the_prompt_names() -> None:
    env = make_spider_env(limit=1, parser_kwargs={"answer_tag": "solution"})
    text = system_message(env)
    assert "<answer>" not in text
    assert "inside <solution>...</solution>;" in text  # the prompt's own sentence, not only the parser's


def test_a_parser_object_with_its_own_tag_is_named_too() -> None:
    parser = TagParser(tags={"sql": ("sql", "query")}, answer_tag="final")
    env = gym.make("toolenv/Chinook-v0", parser=parser, limit=1).unwrapped
    assert isinstance(env, ToolEnv)
    text = system_message(env)
    assert "<answer>" not in text and "inside <final>...</final>;" in text
    env.close()


@pytest.mark.parametrize("parser", ["hermes", "qwen3_xml", "harmony"])
def test_a_format_that_reads_no_answer_tag_is_not_told_to_write_one(parser: str) -> None:
    env = make_spider_env(limit=1, parser=parser, parser_kwargs={"answer_tag": False})
    assert env.system_prompt is not None and "<answer>" not in env.system_prompt
    if parser != "hermes":  # hermes's own tool instructions still say <answer> (toolenv/parsers/hermes.py)
        assert "<answer>" not in system_message(env)


def test_the_default_prompt_is_unchanged() -> None:
    assert system_message(make_spider_env(limit=1)).startswith(SYSTEM_PROMPT)
    assert system_message(make_spider_env(limit=1, parser="hermes")).startswith(SYSTEM_PROMPT)


def test_a_dialect_and_an_answer_tag_together() -> None:
    text = system_message(make_spider_env(limit=1, dialect="mysql", parser_kwargs={"answer_tag": "solution"}))
    assert "in MySQL inside <solution>...</solution>;" in text and "<answer>" not in text
    assert system_prompt("mysql", answer_markup="<solution>...</solution>") in text


def test_the_answer_tool_rewrite_still_finds_its_phrase() -> None:
    """TRL's rows replace the prompt's answer form with a call of the answer tool."""
    env = make_spider_env(limit=1, parser_kwargs={"answer_tag": "solution"})
    text = system_message(env)
    assert env.answer_tool_rewrites and all(phrase in text for phrase in env.answer_tool_rewrites)


def test_a_model_that_follows_the_prompt_scores(tmp_path: Any) -> None:
    env = make_chinook_env(limit=1, parser_kwargs={"answer_tag": "solution"})
    env.reset(seed=0)
    gold = env.tasks[0].context["gold_sql"]
    _, reward, term, _, _ = env.step(f"<solution>{gold}</solution>")
    env.close()
    assert (term, reward) == (True, 1.0)
