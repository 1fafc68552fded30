"""A remote env runs a turn given already parsed (native tool calls) as a local env does: the
calls go over the wire (feature `parsed`), so a call the env's format cannot write still runs."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("starlette", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
pytest.importorskip("uvicorn", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")

from _remote import asgi_server, make_env, older_server, serving

from toolenv.remote import RemoteToolEnv
from toolenv.types import ParsedAction, ToolCall

# Text the hermes parser reads as no call (a rendering in a format it does not read), beside the
# calls themselves, as the `openai` agent hands them over.
TEXT = "```python\nadd(2, 3)\n```"
PARSED = ParsedAction(tool_calls=[ToolCall(name="add", arguments={"a": 2, "b": 3}, id="srv_1")])
MISSPELT = ParsedAction(tool_calls=[ToolCall(name="add", arguments={"a": 2, "c": 3}, id="srv_2")])


async def test_a_parsed_turn_runs_on_the_server_as_given() -> None:
    with serving(make_env) as u:
        env = RemoteToolEnv(u)
        try:
            await env.areset(options={"task_id": "t1"})
            obs, _, term, _, info = await env.astep(TEXT, parsed=PARSED)
            assert not term and [r.text for r in info["tool_results"]] == ["5"]
            assert [(c.name, c.id) for c in info["action"].tool_calls] == [("add", "srv_1")]
            assert env.episode is not None and env.episode.turns[-1].action == TEXT  # the text is recorded
            _, _, _, _, info = await env.astep(TEXT, parsed=MISSPELT)  # the tool's own validation error
            (bad,) = info["tool_results"]
            assert bad.is_error and "add" in bad.text and "'c'" in bad.text, bad.text
            _, reward, term, _, _ = await env.astep("<answer>5</answer>")
            assert term and reward == 1.0
        finally:
            await env.aclose()


async def test_a_server_without_the_feature_gets_the_text_alone() -> None:
    """An older server (no `parsed` in its features, unknown fields refused) is sent the text, which
    it parses: the step still runs, as it did before the feature."""
    from toolenv.remote.server import create_app

    bodies: list[bytes] = []
    with asgi_server(older_server(create_app(make_env), features=b"replay, prompt", bodies=bodies)) as u:
        env: Any = RemoteToolEnv(u)
        try:
            await env.areset(options={"task_id": "t1"})
            _, _, _, _, info = await env.astep(TEXT, parsed=PARSED)
            assert info["action"].tool_calls == [] and info["tool_results"][0].is_error  # parsed from the text
        finally:
            await env.aclose()
    assert bodies and not any(b'"parsed"' in b for b in bodies)
