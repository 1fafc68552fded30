"""A turn the parser cannot read (or with no call and no answer) comes back in `info["messages"]`
as a user message: a `tool` message answers a call, by its id, and a parse error answers none.

Chat agents send the env's messages to a model server or a chat template as they are: a `tool`
message without a call before it is refused by OpenAI's API (HTTP 400) and by gpt-oss's and
Cohere's templates, and Gemma 4's and Phi-3's templates drop its text without a word.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from _strict_openai import reply, strict_server

import toolenv
from toolenv.agent import AgentAction, AgentError, EnvInfo
from toolenv.env import NO_ACTION
from toolenv.runner import arollout

from .conftest import TASKS, Add

BROKEN = '<tool_call>{"name": "add", "arguments": {"a": 2,}</tool_call>'
GOOD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def make_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Add()], tasks=[{"id": "t1", "question": "2+3?", "answer": "5"}])


def unanswering_tool_messages(messages: list[toolenv.Message]) -> list[toolenv.Message]:
    """The `tool` messages that answer no call of the assistant message before them."""
    out, open_ids = [], set[str]()
    for m in messages:
        if m.role == "tool":
            if m.tool_call_id not in open_ids:
                out.append(m)
            open_ids.discard(m.tool_call_id or "")
        else:
            open_ids = {c.id for c in m.tool_calls or ()} if m.role == "assistant" else set()
    return out


# ---------------------------------------------------------------------- the rule
def test_a_parse_error_comes_back_as_a_user_message() -> None:
    env = toolenv.ToolEnv(tools=[Add()], tasks=TASKS)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(BROKEN)
    error = info["tool_results"][0].text
    assert "not valid JSON" in error
    assert [(m.role, m.content) for m in info["messages"]] == [("assistant", BROKEN), ("user", error)]
    # The text observation is the parser's formatting of the same results, as before.
    assert obs == env.parser.format_results(info["tool_results"]) and error in obs


def test_a_turn_with_a_good_call_and_a_broken_one_answers_the_call_by_id_then_the_error_as_user() -> None:
    env = toolenv.ToolEnv(tools=[Add()], tasks=TASKS)
    env.reset(seed=0)
    _, _, _, _, info = env.step(f"{GOOD}\n{BROKEN}")
    assistant, tool, user = info["messages"]
    assert assistant.role == "assistant" and [c.name for c in assistant.tool_calls or ()] == ["add"]
    assert tool.role == "tool" and tool.content == "5" and tool.name == "add"
    assert tool.tool_call_id == (assistant.tool_calls or [])[0].id
    assert user.role == "user" and "not valid JSON" in user.content and user.tool_call_id is None


def test_a_turn_with_no_call_and_no_answer_gets_its_reminder_as_a_user_message() -> None:
    env = toolenv.ToolEnv(tools=[Add()], tasks=TASKS, render_mode="ansi")
    env.reset(seed=0)
    _, _, _, _, info = env.step("I am thinking about it.")
    assert [(m.role, m.content) for m in info["messages"]] == [
        ("assistant", "I am thinking about it."),
        ("user", NO_ACTION),
    ]
    ep = env.episode
    assert ep is not None and unanswering_tool_messages(ep.messages) == []
    assert f"[user] {NO_ACTION}" in (env.render() or "")


# ---------------------------------------------------------------------- a strict server
class PlainChatAgent(toolenv.Agent):
    """A chat agent as a user writes one: the env's messages go to the server as they are
    (`Message.to_openai`), and the model writes the env's call format in its reply."""

    name = "plain-chat"

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        body = {"model": "m", "messages": [m.to_openai() for m in messages]}
        async with httpx.AsyncClient(timeout=10) as client:
            resp = await client.post(f"{self.base_url}/chat/completions", json=body)
        if resp.status_code != 200:
            raise AgentError(f"HTTP {resp.status_code}: {resp.text}")
        return AgentAction(text=resp.json()["choices"][0]["message"]["content"])


def script() -> list[dict[str, Any]]:
    """A malformed call, then a good call beside a malformed one, then the answer."""
    return [reply(BROKEN), reply(f"{GOOD}\n{BROKEN}"), reply("<answer>5</answer>")]


async def test_a_chat_agent_sending_the_envs_messages_as_they_are_passes_a_strict_server() -> None:
    with strict_server(script()) as server:
        res = await arollout(make_env, PlainChatAgent(server.url), n=1)
    traj = res.trajectories[0]
    assert server.refused == [], server.refused[0][1]
    assert traj.error is None and traj.reward == 1.0 and len(server.accepted) == 3
    # The model was told what was wrong: the parse error reached it as a user message.
    second = server.accepted[1]["messages"]
    assert second[-1]["role"] == "user" and "not valid JSON" in second[-1]["content"]


# ---------------------------------------------------------------------- real chat templates
#: TRL's copies of the models' own chat templates: those the old messages broke (gpt-oss and
#: Cohere 2 raise, Gemma 4 and Phi-3.5 drop the error's text) and two that took them (kept working).
TEMPLATES = ["gptoss", "cohere2", "gemma4", "phi3_5", "qwen3", "llama3_1"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("transformers", reason="the template tests need transformers")
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    return AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("tok"), with_model=False))


def template_messages(messages: list[toolenv.Message]) -> list[dict[str, Any]]:
    """The messages as chat templates take them: calls' arguments as objects, not JSON text."""
    out = []
    for m in messages:
        d = m.to_openai()
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]
        out.append(d)
    return out


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_episode_renders_with_real_chat_templates_and_keeps_each_error(tokenizer: Any, template: str) -> None:
    trl = pytest.importorskip("trl", reason="the real chat templates come with trl (pip install toolenv[trl])")
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{template}.jinja").read_text("utf-8")
    env = make_env()
    env.reset(seed=0)
    env.step(BROKEN)
    env.step(f"{GOOD}\n{BROKEN}")
    ep = env.episode
    assert ep is not None
    errors = [r.text for t in ep.turns for r in t.results if r.is_error]
    assert len(errors) == 2
    rendered = tokenizer.apply_chat_template(
        template_messages(ep.messages), tools=env.tool_schemas(), tokenize=False, add_generation_prompt=True
    )
    # Llama 3.1's template writes a tool result as JSON text: an error may come escaped so.
    assert all(e in rendered or json.dumps(e) in rendered for e in errors), f"{template} dropped a parse error"
