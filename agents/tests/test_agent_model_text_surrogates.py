"""The `openai` agent makes a reply's lone UTF-16 surrogates (half an emoji a server cut, sent as
the JSON escape `\\udcff`) U+FFFD as it reads the reply: its history goes back to the server on
the next turn, which httpx sends as UTF-8 and could not encode ("surrogates not allowed")."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _strict_openai import StrictServer, strict_server
from pydantic import BaseModel

import toolenv
from toolenv.runner import arollout
from toolenv_agents.openai_compat import OpenAIAgent

LONE = "\udcff"


class Echo(toolenv.Tool):
    """Say the query back."""

    name = "echo"

    class Args(BaseModel):
        q: str

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        return toolenv.ToolResult(text=f"heard {args.q}")


@pytest.fixture
def serve() -> Iterator[Callable[[list[dict[str, Any]]], StrictServer]]:
    """Scripted OpenAI-compatible servers on 127.0.0.1 (`_strict_openai`), shut down after the test;
    their JSON is ASCII-escaped, so a lone surrogate travels as `\\udcff`, as servers send it."""
    with contextlib.ExitStack() as stack:
        yield lambda script: stack.enter_context(strict_server(script))


def make_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Echo()], tasks=[{"id": "t", "question": "Say hi", "answer": "hi"}])


def chat(message: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}]}


CALL = '<tool_call>{"name": "echo", "arguments": {"q": "x' + LONE + '"}}</tool_call>'


async def test_chat_text_mode_sends_its_history_with_u_fffd(serve: Any) -> None:
    server = serve([chat({"content": f"I {LONE} ask " + CALL}), chat({"content": "<answer>hi</answer>"})])
    res = await arollout(make_env, OpenAIAgent(model="m", base_url=server.url, tool_calling="text", backoff=0.01), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0
    assert traj.turns[0].action == "I \ufffd ask " + CALL.replace(LONE, "\ufffd")
    assert traj.turns[0].results[0].text == "heard x\ufffd"
    sent = server.accepted[1]["messages"]
    assert [m["role"] for m in sent][-2:] == ["assistant", "user"] and sent[-2]["content"] == traj.turns[0].action


async def test_completions_mode_sends_its_prompt_with_u_fffd(serve: Any) -> None:
    done = {"choices": [{"index": 0, "text": "<answer>hi</answer>", "finish_reason": "stop"}]}
    server = serve([{"choices": [{"index": 0, "text": f"I {LONE} ask " + CALL, "finish_reason": "stop"}]}, done])
    res = await arollout(make_env, OpenAIAgent(model="m", base_url=server.url, api="completions", backoff=0.01), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0
    assert "I \ufffd ask " + CALL.replace(LONE, "\ufffd") in server.accepted[1]["prompt"]


async def test_native_mode_sends_content_reasoning_and_calls_back_with_u_fffd(serve: Any) -> None:
    """The model's own content and reasoning go back with their call (looked up by the action's
    text, which the agent and the env must agree on), its arguments decoded with an escaped half emoji."""
    call = {"id": "srv_1", "type": "function", "function": {"name": "echo", "arguments": '{"q": "x\\ud83d"}'}}
    first = chat({"content": f"Let me {LONE}", "reasoning_content": f"think {LONE}", "tool_calls": [call]})
    server = serve([first, chat({"content": "<answer>hi</answer>"})])
    res = await arollout(make_env, OpenAIAgent(model="m", base_url=server.url, backoff=0.01), n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.reward == 1.0
    assert traj.turns[0].results[0].text == "heard x\ufffd"
    assert traj.turns[0].agent_metadata["reasoning"] == "think \ufffd"
    assistant = next(m for m in server.accepted[1]["messages"] if m["role"] == "assistant")
    assert assistant["content"] == "Let me \ufffd" and assistant["reasoning_content"] == "think \ufffd"
    assert assistant["tool_calls"][0]["id"] == "srv_1"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"q": "x\ufffd"}
