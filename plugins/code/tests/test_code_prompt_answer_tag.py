"""The bundled code tasks ask for the answer in the parser's own tags: told `<answer>` by an env
whose parser reads `<final>`, a model that obeys writes no answer at all."""

from __future__ import annotations

import pytest

from toolenv.parsers import TagParser
from toolenv_code.envs import make_humaneval_env, make_mbpp_env


def test_the_default_parser_keeps_the_answer_tag() -> None:
    env = make_humaneval_env(limit=1)
    try:
        obs, _ = env.reset(seed=0)
        assert "inside <answer>...</answer>" in obs
    finally:
        env.close()


def test_a_tag_parser_with_another_answer_tag_is_named_and_its_answer_scores() -> None:
    env = make_humaneval_env(limit=1, parser=TagParser({"python": ("python", "code")}, answer_tag="final"))
    try:
        obs, _ = env.reset(seed=0)
        assert "inside <final>...</final>" in obs and "<answer>" not in obs
        solution = env.unwrapped.tasks[0].answers[0]
        _, reward, terminated, _, _ = env.step(f"<final>\n{solution}\n</final>")
        assert terminated and reward == pytest.approx(1.0)
    finally:
        env.close()


def test_a_format_without_answer_tags_names_none() -> None:
    env = make_mbpp_env(limit=1, parser="hermes", parser_kwargs={"answer_tag": False})
    try:
        obs, _ = env.reset(seed=0)
        assert "<answer>" not in obs and "as your final answer;" in obs
    finally:
        env.close()


def test_your_own_tasks_are_left_as_written() -> None:
    task = {"id": "t", "question": "Write f() inside <answer>...</answer>.", "answer": "def f(): pass"}
    env = make_humaneval_env(tasks=[task], parser=TagParser({"python": ("python", "code")}, answer_tag="final"))
    try:
        obs, _ = env.reset(seed=0)
        assert "Write f() inside <answer>...</answer>." in obs
    finally:
        env.close()
