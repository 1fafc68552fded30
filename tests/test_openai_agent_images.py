"""Images and the `openai` agent: what each API mode sends, and what `toolenv export` writes of it.

The runs are the real agent against scripted OpenAI-compatible servers on 127.0.0.1
(`_strict_openai`): the request bodies the server accepted are what the model was given."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _strict_openai import StrictServer, native_call, reply

import toolenv
from toolenv.export import chat_messages, export_chat
from toolenv.runner import arollout
from toolenv.trajectory import Trajectory
from toolenv.types import Message

openai_compat = pytest.importorskip("toolenv_agents.openai_compat", reason="the reference agents (agents/)")

TASKS = [{"id": "a", "question": "What is shown?", "answer": "5"}, {"id": "b", "question": "And here?", "answer": "5"}]
SNAP = '<tool_call>\n{"name": "snap", "arguments": {"label": "a"}}\n</tool_call>'
BROKEN = '<tool_call>{"name": "snap", "arguments": </tool_call>'


def _picture(size: tuple[int, int] = (40, 30)) -> toolenv.ToolImage:
    from PIL import Image

    return toolenv.ToolImage.from_pil(Image.new("RGB", size, (200, 30, 30)))


@toolenv.tool
def snap(label: str) -> toolenv.ToolResult:
    """Show a small picture."""
    return toolenv.ToolResult(text=f"picture {label}", images=[_picture()])


def snap_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[snap], tasks=TASKS, max_turns=4)


@pytest.fixture
def serve() -> Iterator[Any]:
    """Scripted servers on 127.0.0.1, shut down after the test."""
    servers: list[StrictServer] = []

    def start(script: list[dict[str, Any]]) -> StrictServer:
        servers.append(StrictServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def completion(text: str) -> dict[str, Any]:
    """A `/completions` response with one choice that the model ended itself."""
    return {"choices": [{"index": 0, "text": text, "finish_reason": "stop", "stop_reason": None}]}


async def _run(server: StrictServer, make_env: Any, n: int, **agent_args: Any) -> list[Trajectory]:
    agent = openai_compat.OpenAIAgent(model="m", base_url=server.url, backoff=0.01, max_retries=0, **agent_args)
    try:
        result = await arollout(make_env, agent, n=n, concurrency=1)
    finally:
        await agent.aclose()
    return result.trajectories


# ---------------------------------------------------------------------- completions mode
async def test_completions_mode_refuses_an_episode_whose_tool_results_carry_images(serve: Any) -> None:
    """A text prompt cannot hold an image: the episode whose tool result carries one ends with an
    error saying to use api=chat, before any request leaves without it; the run goes on."""
    server = serve([completion(SNAP), completion(SNAP), completion("<answer>5</answer>")])
    trajectories = await _run(server, snap_env, n=2, api="completions")
    assert [t.task.id for t in trajectories] == ["a", "b"]  # the run went on to the second episode
    for t in trajectories:
        assert t.error is not None and "api=chat" in t.error and "image" in t.error, t.error
        assert "\n" not in t.error.strip()
    # One request per episode (turn 0, text only); the turn that would have dropped the picture never left
    assert len(server.accepted) == 2 and all("prompt" in body for body in server.accepted)


async def test_completions_mode_refuses_an_image_in_the_prompt(serve: Any) -> None:
    """VisualSearch's prompt shows the overview image: no request is sent at all."""
    pytest.importorskip("toolenv_vision", reason="the vision plugin (plugins/vision)")
    server = serve([completion("<answer>x</answer>")] * 2)
    trajectories = await _run(server, "toolenv/VisualSearch-v0", n=2, api="completions")
    assert len(trajectories) == 2 and server.accepted == []
    assert all(t.error is not None and "api=chat" in t.error for t in trajectories)


async def test_completions_mode_still_runs_a_text_only_episode(serve: Any) -> None:
    """The refusal is about images only: a text env runs as before."""

    @toolenv.tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    server = serve([completion(call), completion("<answer>5</answer>")])
    (t,) = await _run(
        server, lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS[:1], max_turns=4), n=1, api="completions"
    )
    assert t.error is None and t.success and len(server.accepted) == 2


# ---------------------------------------------------------------------- native mode and its export
def _shape(messages: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, str]] | str]]:
    """Each message as its role and content: the text, or its parts as (kind, text or image URL)."""
    out: list[tuple[str, list[tuple[str, str]] | str]] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = [
                ("image", p["image_url"]["url"]) if p["type"] == "image_url" else ("text", p["text"]) for p in content
            ]
            out.append((m["role"], parts))
        else:
            out.append((m["role"], content or ""))
    return out


async def _native_snap(serve: Any) -> tuple[StrictServer, Trajectory]:
    """A native episode: a crop-like call beside a broken one (a parse error), then the answer."""
    server = serve([reply(BROKEN, [native_call("snap", {"label": "a"}, "call_a")]), reply("<answer>5</answer>")])
    (t,) = await _run(server, snap_env, n=1)
    assert t.error is None, t.error
    return server, t


async def test_native_mode_sends_a_results_images_after_the_tool_messages(serve: Any) -> None:
    """The agent's layout (what the export must write): the tool message's text, then its images in a
    user message `Images from snap:`, then the parse error; no image in a tool message."""
    server, t = await _native_snap(serve)
    sent = server.accepted[-1]["messages"]
    shape = _shape(sent)
    assert [role for role, _ in shape] == ["system", "user", "assistant", "tool", "user", "user"]
    url = t.turns[0].results[0].images[0].data_url()
    assert shape[3] == ("tool", "picture a")
    assert shape[4] == ("user", [("image", url), ("text", "Images from snap:")])
    assert shape[5][0] == "user" and "not valid JSON" in str(shape[5][1])


@pytest.mark.parametrize("calls", ["text", "structured"])
async def test_native_export_writes_the_messages_the_model_saw(serve: Any, calls: str) -> None:
    """`chat_messages` of a native run: after the prompt, the same messages as the last request sent,
    with the same text parts in the same order (assistant messages aside: the export writes the
    turn's calls, the agent the server's ids)."""
    server, t = await _native_snap(serve)
    sent = _shape(server.accepted[-1]["messages"])
    exported = _shape(chat_messages(t, calls=calls))  # type: ignore[arg-type]
    assert [role for role, _ in exported] == [role for role, _ in sent] + ["assistant"]
    assert [m for m in exported[:-1] if m[0] != "assistant"] == [m for m in sent if m[0] != "assistant"]


async def test_native_export_file_has_the_sent_parts_and_images_in_order(serve: Any, tmp_path: Path) -> None:
    """TRL's vision layout of the same run: each message's parts are the sent ones (a placeholder for
    each image), and the `images` column names the pictures in the order the model saw them."""
    server, t = await _native_snap(serve)
    out = tmp_path / "sft.jsonl"
    assert export_chat([t], out, calls="structured") == 1
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    sent = [m for m in _shape(server.accepted[-1]["messages"]) if m[0] != "assistant"]
    written = []
    for m in line["messages"]:
        if m["role"] == "assistant":
            continue
        parts = [("image", "") if p["type"] == "image" else ("text", p["text"]) for p in m["content"]]
        written.append((m["role"], parts))
    expected = [
        (role, [(k, "" if k == "image" else v) for k, v in c] if isinstance(c, list) else [("text", c)])
        for role, c in sent
    ]
    assert written == expected
    shown = [*t.prompt_messages[1].images, *t.turns[0].results[0].images]
    assert [(out.parent / name).read_bytes() for name in line["images"]] == [im.data for im in shown]


# ---------------------------------------------------------------------- Message.to_openai
def test_to_openai_refuses_images_in_a_tool_message() -> None:
    """OpenAI's tool messages hold text only: a tool message with images is refused, naming the helper
    that moves them, rather than sent as a request the API refuses (or with the images dropped)."""
    tool = Message(role="tool", content="picture a", name="snap", tool_call_id="c0", images=[_picture()])
    with pytest.raises(ValueError, match="move_tool_images"):
        tool.to_openai()
    assert Message(role="tool", content="picture a", tool_call_id="c0").to_openai() == {
        "role": "tool",
        "content": "picture a",
        "tool_call_id": "c0",
    }
    user = Message(role="user", content="look", images=[_picture()]).to_openai()
    assert [p["type"] for p in user["content"]] == ["image_url", "text"]  # images stay in user messages


def test_move_tool_images_puts_them_in_a_user_message_after_the_tool_messages() -> None:
    """Each tool message's images, in order, in a user message of their own after the turn's tool
    messages and before what follows; every message then converts with `to_openai`."""
    from toolenv.export import move_tool_images

    a, b = _picture((10, 10)), _picture((20, 20))
    turn = [
        Message(role="assistant", content=""),
        Message(role="tool", content="one", name="snap", tool_call_id="c0", images=[a]),
        Message(role="tool", content="two", name="look", tool_call_id="c1"),
        Message(role="tool", content="three", tool_call_id="c2", images=[b]),
        Message(role="user", content="error"),
    ]
    moved = move_tool_images(turn)
    assert [(m.role, m.content, len(m.images)) for m in moved] == [
        ("assistant", "", 0),
        ("tool", "one", 0),
        ("tool", "two", 0),
        ("tool", "three", 0),
        ("user", "Images from snap:", 1),
        ("user", "Images from the tool:", 1),
        ("user", "error", 0),
    ]
    assert moved[4].images == [a] and moved[5].images == [b]
    assert [(m.name, m.tool_call_id) for m in moved[1:4]] == [("snap", "c0"), ("look", "c1"), (None, "c2")]
    assert all(not isinstance(m.to_openai()["content"], list) for m in moved if m.role == "tool")
    assert turn[1].images == [a]  # the input is left as it was
