"""`system_prompt=""` (explicitly empty) leaves the system message out of the chat form of the
prompt, and prepends nothing to the text form: a prompt that carries its own instructions (a
Search-R1 checkpoint's, trained on one user message) goes out as it is. `None` keeps the default."""

from __future__ import annotations

import gymnasium as gym
import pytest

from toolenv.env import ToolEnv

from .conftest import Add

TASK = {"id": "t", "question": "2+3?", "answer": "5"}
OWN = "Answer inside <answer></answer>. Use <tool_call> to add. Question: 2+3?\n"


def make(**kw: object) -> ToolEnv:
    return ToolEnv(tools=[Add()], tasks=[TASK], **kw)  # type: ignore[arg-type]


def prompt(env: ToolEnv, **options: object) -> tuple[str, list[tuple[str, str]]]:
    """The text and chat forms of the first observation, as `reset` gives them and the episode records them."""
    obs, info = env.reset(seed=0, options=dict(options) or None)
    assert env.episode is not None and env.episode.messages == info["messages"]
    return obs, [(m.role, m.content) for m in info["messages"]]


def test_none_keeps_the_system_message_with_the_instructions() -> None:
    env = make()
    text, chat = prompt(env)
    instructions = env.parser.instructions(env.tools)
    assert chat == [("system", instructions), ("user", "2+3?")]
    assert text == f"{instructions}\n\nQuestion: 2+3?\n"


def test_empty_drops_the_system_message_and_prepends_nothing() -> None:
    env = make(system_prompt="")
    text, chat = prompt(env)
    assert chat == [("user", "2+3?")]
    assert text == "Question: 2+3?\n"  # the template without the instructions and the blank lines after them


def test_empty_with_native_tools_leaves_out_the_answer_instructions_too() -> None:
    text, chat = prompt(make(system_prompt=""), native_tools=True)
    assert chat == [("user", "2+3?")] and text == "Question: 2+3?\n"


def test_empty_with_a_tasks_own_prompt_sends_that_prompt_alone() -> None:
    env = ToolEnv(tools=[Add()], tasks=[{**TASK, "prompt": OWN}], system_prompt="")
    text, chat = prompt(env)
    assert chat == [("user", OWN)] and text == OWN
    default = ToolEnv(tools=[Add()], tasks=[{**TASK, "prompt": OWN}])
    assert [role for role, _ in prompt(default)[1]] == ["system", "user"]  # None: as before


def test_empty_with_a_template_of_ones_own_renders_it_without_the_instructions() -> None:
    template = "Schema: {schema}\n\n{instructions}\n\nQuestion: {question}\n"
    env = ToolEnv(
        tools=[Add()], tasks=[{**TASK, "context": {"schema": "t(a)"}}], system_prompt="", prompt_template=template
    )
    text, chat = prompt(env)
    assert chat == [("user", "Schema: t(a)\n\n\n\nQuestion: 2+3?")]
    assert text == "Schema: t(a)\n\n\n\nQuestion: 2+3?\n"
    assert env.parser.instructions(env.tools) not in text


def test_a_non_empty_system_prompt_still_leads_the_instructions() -> None:
    env = make(system_prompt="Be brief.")
    text, chat = prompt(env)
    instructions = env.parser.instructions(env.tools)
    assert chat == [("system", f"Be brief.\n\n{instructions}"), ("user", "2+3?")]
    assert text.startswith(f"Be brief.\n\n{instructions}")


def test_hotpotqa_with_an_empty_system_prompt_is_search_r1s_single_user_message() -> None:
    """The reviewer's case: Search-R1 trains on `[{"role": "user", "content": SEARCH_R1_PROMPT}]`."""
    envs = pytest.importorskip("toolenv_search.envs")
    env = gym.make("toolenv/HotpotQA-v0", system_prompt="", limit=1).unwrapped
    text, chat = prompt(env)
    question = env.tasks[0].context["question"]
    assert chat == [("user", envs.SEARCH_R1_PROMPT.format(question=question))]
    assert text == chat[0][1]  # the text form, as Search-R1's base-model rollouts see it
    env.close()
