"""`toolenv export` of text-mode runs: each env reply is the observation the model read, as it read it.

The runs are the real `openai` agent against a scripted OpenAI-compatible server on 127.0.0.1: the
messages it sent at its last turn are what the model saw, and the export must be those, then the
last action."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _strict_openai import StrictServer

import toolenv
from toolenv.export import chat_messages, export_chat
from toolenv.runner import arollout
from toolenv.trajectory import Trajectory

openai_compat = pytest.importorskip("toolenv_agents.openai_compat", reason="the reference agents (agents/)")

TASK = [{"id": "t", "question": "2+3?", "answer": "5"}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture
def serve() -> Iterator[Any]:
    """Scripted OpenAI-compatible servers on 127.0.0.1 (`_strict_openai`), each answering with the
    next chat choice; `accepted` keeps the request bodies (what the model was given)."""
    servers: list[StrictServer] = []

    def start(choices: list[dict[str, Any]]) -> StrictServer:
        servers.append(StrictServer([{"choices": [{"index": 0, **c}]} for c in choices]))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def said(content: str | None, finish: str = "stop", tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A chat choice; `stop_reason: None` says the model ended it (no stop string to put back)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"message": message, "finish_reason": finish, "stop_reason": None}


async def run(server: StrictServer, make_env: Any, tool_calling: str = "text") -> Trajectory:
    agent = openai_compat.OpenAIAgent(model="tiny", base_url=server.url, tool_calling=tool_calling, backoff=0.01)  # type: ignore[arg-type]
    (t,) = (await arollout(make_env, agent, n=1)).trajectories
    assert t.error is None, t.error
    return t


def _seen_then_last(t: Trajectory, server: StrictServer) -> list[dict[str, Any]]:
    """What the model read at its last turn (the last request's messages), then its last action."""
    return [*server.accepted[-1]["messages"], {"role": "assistant", "content": t.turns[-1].action}]


# ---------------------------------------------------------------------- Search-R1 (tags)
@toolenv.tool
def search(query: str) -> str:
    """Search the corpus."""
    return f'Doc 1(Title: "{query.strip()}") five'


def tags_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[search], tasks=TASK, parser="tags", max_turns=4)


async def test_a_search_r1_run_exports_each_observation_as_the_user_message_the_model_read(serve: Any) -> None:
    """Search-R1's format in text mode: the model read each `<information>...</information>`
    observation (a parse error's too) as a user message. The export is exactly those messages and
    no `tool` message, which would answer a call no assistant message declares."""
    server = serve(
        [said("<search> five", finish="length"), said("<search> five </search>"), said("<answer>5</answer>")]
    )
    t = await run(server, tags_env)
    assert t.success and t.turns[0].parsed.errors and t.turns[1].parsed.tool_calls
    msgs = chat_messages(t)
    assert msgs == _seen_then_last(t, server)
    replies = [m for m in msgs[len(t.prompt_messages) :] if m["role"] != "assistant"]
    assert [m["content"] for m in replies] == [t.turns[0].observation, t.turns[1].observation]
    assert replies[0]["content"].startswith("<information>") and replies[1]["content"].startswith("<information>Doc 1")
    assert all(m["role"] == "user" and set(m) == {"role", "content"} for m in replies)
    weighted = chat_messages(t, weights=True)
    assert [m.get("weight") for m in weighted if m["role"] == "assistant"] == [0, 1, 1]
    assert [{k: v for k, v in m.items() if k != "weight"} for m in weighted] == msgs


def _declared_answers(msgs: list[dict[str, Any]]) -> None:
    """Every `tool` message answers a call the assistant message before it declared."""
    declared: set[str] = set()
    for m in msgs:
        if m["role"] == "assistant":
            declared = {c["id"] for c in m.get("tool_calls") or []}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in declared, m


async def test_structured_calls_keep_tool_messages_answering_the_declared_calls(serve: Any) -> None:
    """`calls="structured"` writes each call in the assistant's `tool_calls`: its results stay
    `tool` messages answering them by id (the target template writes both in its own format)."""
    server = serve([said("<search> five </search>"), said("<answer>5</answer>")])
    t = await run(server, tags_env)
    msgs = chat_messages(t, calls="structured")
    roles = [m["role"] for m in msgs[len(t.prompt_messages) :]]
    assert roles == ["assistant", "tool", "assistant"]
    _declared_answers(msgs)
    assert msgs[-2]["content"] == t.turns[0].results[0].text


# ---------------------------------------------------------------------- Hermes blocks written as text
@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def hermes_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[add], tasks=TASK, max_turns=4)


async def test_a_hermes_text_mode_run_exports_the_tool_response_blocks_the_model_read(
    serve: Any, tmp_path: Path
) -> None:
    """`<tool_call>` blocks written as text (`tool_calling="text"`): the model read the observation,
    `<tool_response>` blocks, as a user message, and after a turn with no call the env's
    no-action reply in the same form. The file holds the same messages."""
    server = serve([said(CALL), said("Let me think."), said("<answer>5</answer>")])
    t = await run(server, hermes_env)
    msgs = chat_messages(t)
    assert msgs == _seen_then_last(t, server)
    assert msgs[len(t.prompt_messages) + 1] == {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}
    assert all(m["role"] != "tool" for m in msgs)
    assert export_chat([t], tmp_path / "sft.jsonl") == 1
    (line,) = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert line["messages"] == msgs


async def test_native_tool_calling_keeps_the_messages_it_sent(serve: Any) -> None:
    """The `openai` agent's native mode sends the env's messages: a call's result as a `tool`
    message answering it, and after a turn without a native call (0 recorded) the reply as a user
    message of the env's text alone, not the observation's `<tool_response>` form."""
    native = [{"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    server = serve([said("Let me think."), said(None, tool_calls=native), said("<answer>5</answer>")])
    t = await run(server, hermes_env, tool_calling="native")
    assert [turn.agent_metadata["native_tool_calls"] for turn in t.turns] == [0, 1, 0]
    msgs = chat_messages(t)
    seen = server.accepted[-1]["messages"]
    start = len(t.prompt_messages)
    assert msgs[start + 1] == seen[start + 1] and msgs[start + 1]["role"] == "user"  # the no-action reply as sent
    assert msgs[start + 1]["content"] == t.turns[0].results[0].text != t.turns[0].observation
    assert msgs[start + 3] == {"role": "tool", "content": "5", "name": "add", "tool_call_id": "call_0"}
    _declared_answers(msgs)


# ---------------------------------------------------------------------- images
@toolenv.tool
def snap(label: str) -> toolenv.ToolResult:
    """Show a small picture."""
    from PIL import Image

    colour = {"a": (255, 0, 0), "b": (0, 0, 255)}[label]
    return toolenv.ToolResult(
        text=f"picture {label}", images=[toolenv.ToolImage.from_pil(Image.new("RGB", (8, 6), colour))]
    )


def _snap(label: str) -> str:
    return f'<tool_call>{{"name": "snap", "arguments": {{"label": "{label}"}}}}</tool_call>'


async def test_a_text_mode_turns_images_go_with_its_observation(serve: Any, tmp_path: Path) -> None:
    """A text-mode turn's result images go, in order, in the user message of its observation, as the
    agent sent them; in the file (TRL's vision layout) a placeholder per image, then the observation."""
    pytest.importorskip("PIL", reason="the picture tool needs Pillow")
    two = _snap("a") + _snap("b") + '<tool_call>{"name": "snap", "arguments": </tool_call>'
    server = serve([said(_snap("a")), said(two), said("<answer>5</answer>")])
    t = await run(server, lambda: toolenv.ToolEnv(tools=[snap], tasks=TASK, max_turns=4))
    assert t.turns[1].parsed.errors and len(t.turns[1].results) == 3
    msgs = chat_messages(t)
    assert msgs == _seen_then_last(t, server)
    start = len(t.prompt_messages)
    second = msgs[start + 3]["content"]
    shown = [im.data_url() for r in t.turns[1].results for im in r.images]
    assert [p["image_url"]["url"] for p in second[:-1]] == shown and len(shown) == 2
    assert second[-1] == {"type": "text", "text": t.turns[1].observation}
    out = tmp_path / "sft.jsonl"
    assert export_chat([t], out) == 1
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    replies = [m for m in line["messages"][start:] if m["role"] != "assistant"]
    assert [m["role"] for m in replies] == ["user", "user"]
    assert replies[1]["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": t.turns[1].observation},
    ]
    files = [(out.parent / name).read_bytes() for name in line["images"]]
    assert files == [im.data for turn in t.turns[:2] for r in turn.results for im in r.images]


class _MessagesAgent(toolenv.Agent):
    """Writes a Hermes call as text, but (as the `transformers` agent) gives its model the env's
    messages, and says so on every action."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: Any) -> toolenv.AgentAction:
        text = CALL if env_info.turn == 0 else "<answer>5</answer>"
        return toolenv.AgentAction(text=text, metadata={"replies": "messages"})


async def test_an_agent_that_sends_the_env_messages_says_so_and_keeps_tool_messages() -> None:
    (t,) = (await arollout(hermes_env, _MessagesAgent(), n=1)).trajectories
    assert t.agent != "transformers"  # not told apart by its name
    reply = chat_messages(t)[len(t.prompt_messages) + 1]
    assert reply["role"] == "tool" and reply["content"] == "5" and reply["name"] == "add"
    t.turns[0].agent_metadata.pop("replies")
    assert chat_messages(t)[len(t.prompt_messages) + 1] == {
        "role": "user",
        "content": "<tool_response>\n5\n</tool_response>",
    }
