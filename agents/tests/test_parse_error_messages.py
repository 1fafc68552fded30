"""The `openai` agent after a turn the env cannot parse, against a server on 127.0.0.1 that
refuses tool messages as OpenAI's API does (400 for a `tool` message answering no call).

The env answers a parse error with a user message (`info["messages"]`); the agent must send the
next request in a form a strict server takes, in native and in text mode, and the model must be
told what was wrong.
"""

from __future__ import annotations

from typing import Any

import pytest
from _strict_openai import native_call, reply, strict_server
from _tools import Add

import toolenv
from toolenv.runner import arollout
from toolenv_agents.openai_compat import OpenAIAgent

BROKEN = '<tool_call>{"name": "add", "arguments": {"a": 2,}</tool_call>'
GOOD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def make_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Add()], tasks=[{"id": "t1", "question": "2+3?", "answer": "5"}])


def bad_arguments_call(call_id: str) -> dict[str, Any]:
    """A native call whose arguments are not JSON (the model stopped mid-object)."""
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": '{"a": 2,'}}


NATIVE_SCRIPT = [
    reply(BROKEN),  # the server's tool parser could not read the call: it comes back as text
    reply(None, [bad_arguments_call("srv_1")]),
    reply("Adding.", [native_call("add", {"a": 2, "b": 3}, "srv_2")]),
    reply("<answer>5</answer>"),
]
TEXT_SCRIPT = [reply(BROKEN), reply(GOOD), reply("<answer>5</answer>")]


@pytest.mark.parametrize(("tool_calling", "script"), [("native", NATIVE_SCRIPT), ("text", TEXT_SCRIPT)])
async def test_a_malformed_turn_then_a_good_call_pass_a_strict_server(tool_calling: str, script: list[Any]) -> None:
    with strict_server(script) as server:
        agent = OpenAIAgent(model="m", base_url=server.url, tool_calling=tool_calling, backoff=0.01)  # type: ignore[arg-type]
        res = await arollout(make_env, agent, n=1)
        await agent.aclose()
    traj = res.trajectories[0]
    assert server.refused == [], server.refused[0][1]
    assert traj.error is None and traj.reward == 1.0 and len(server.accepted) == len(script)
    assert [bool(t.parsed.errors) for t in traj.turns] == [True] * (len(script) - 2) + [False, False]
    # Each parse error reached the model, in the request after its turn, as a user message.
    for turn, body in zip(traj.turns, server.accepted[1:], strict=False):
        for error in turn.parsed.errors:
            assert any(m["role"] == "user" and error in str(m["content"]) for m in body["messages"])
    # The good call's result went back: answering the call by id (native), or as the observation (text).
    last = server.accepted[-1]["messages"]
    if tool_calling == "native":
        assert [(m["tool_call_id"], m["content"]) for m in last if m["role"] == "tool"] == [("srv_2", "5")]
    else:
        assert (
            not [m for m in last if m["role"] == "tool"]
            and "<tool_response>\n5\n</tool_response>" in last[-1]["content"]
        )
