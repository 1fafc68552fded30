"""Native tool calls that the env's parser cannot write still reach the env as calls.

The `openai` agent renders a server's `tool_calls` in the env parser's format; a call that format
cannot write (HumanEval's codeblock parser writes only `python(code=str)`, a tags parser has no tag
for a tool) falls back to a Hermes block, which that env does not read. The agent hands the env the
calls themselves (`AgentAction.parsed`), so the model hears the tool's own error, not "No tool call",
and the trajectory records the call. Against a server on 127.0.0.1 that refuses a history OpenAI's
API would refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _strict_openai import native_call, native_rollout, reply
from _tools import Add
from pydantic import BaseModel

import toolenv
from toolenv.env import NO_ACTION
from toolenv.export import chat_messages
from toolenv.parsers import get_parser
from toolenv.trajectory import Trajectory
from toolenv_agents.openai_compat import native_turn

#: The tags parser warns that the prompt cannot offer `add`; in native mode the API's `tools` does.
pytestmark = pytest.mark.filterwarnings("ignore:the tags parser has no tag for tool")


class Lookup(toolenv.Tool):
    """Look a word up."""

    name = "search"

    class Args(BaseModel):
        query: str

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        return toolenv.ToolResult(text=f"found {args.query}")


def raw_call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    """A `tool_calls` entry whose arguments text is sent as it is (not JSON, say)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def read_back(out: Path) -> list[Trajectory]:
    """The run's trajectories as `toolenv view`, `export` and a resumed run read them."""
    return [Trajectory.model_validate_json(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


async def test_humaneval_native_call_with_bad_arguments_gets_the_tools_error(tmp_path: Path) -> None:
    """HumanEval-v0's codeblock parser cannot write a `python` call with a misspelt argument, nor
    one whose arguments are not JSON: the model gets the tool's validation error and an error
    naming its arguments, not "No tool call"; a good call runs as before."""
    script = [
        reply(None, [native_call("python", {"cod": "print(1)"}, "srv_1")]),
        reply(None, [raw_call("python", "{not json", "srv_2")]),
        reply("Trying again.", [native_call("python", {"code": "print(6 * 7)"}, "srv_3")]),
        reply("<answer>\ndef f():\n    return 1\n</answer>"),
    ]
    out = tmp_path / "run"
    server, traj = await native_rollout(script, "toolenv/HumanEval-v0", env_kwargs={"max_turns": 6}, out=out)
    assert traj.error is None and len(traj.turns) == 4 and traj.terminated
    misspelt, not_json, good = traj.turns[:3]
    # The misspelt argument: the call is recorded and the tool's validation names the argument.
    assert [(c.name, c.arguments, c.id) for c in misspelt.parsed.tool_calls] == [
        ("python", {"cod": "print(1)"}, "srv_1")
    ]
    assert NO_ACTION not in misspelt.observation
    assert misspelt.results[0].is_error and "'cod'" in misspelt.results[0].text and "code" in misspelt.results[0].text
    # Arguments that are not JSON: an error that names the tool and quotes what was sent.
    assert NO_ACTION not in not_json.observation
    assert not_json.parsed.errors and "python" in not_json.parsed.errors[0] and "{not json" in not_json.parsed.errors[0]
    assert "{not json" in not_json.observation
    # A good call runs as before, with the model's text beside it.
    assert [(c.name, c.arguments, c.id) for c in good.parsed.tool_calls] == [
        ("python", {"code": "print(6 * 7)"}, "srv_3")
    ]
    assert not good.results[0].is_error and "42" in good.results[0].text
    assert good.action == "Trying again.\n```python\nprint(6 * 7)\n```"
    # The tool's answers went back to the server under the calls' own ids.
    answered = [m["tool_call_id"] for m in server.accepted[-1]["messages"] if m["role"] == "tool"]
    assert answered == ["srv_1", "srv_3"]
    # The file reads back as it was written, and exports the call the model made with its answer.
    (recorded,) = read_back(out)
    assert [[c.arguments for c in t.parsed.tool_calls] for t in recorded.turns] == [
        [{"cod": "print(1)"}],
        [],
        [{"code": "print(6 * 7)"}],
        [],
    ]
    msgs = chat_messages(recorded)
    at = next(i for i, m in enumerate(msgs) if m.get("tool_calls"))
    assert msgs[at]["tool_calls"][0]["id"] == "srv_1" and json.loads(
        msgs[at]["tool_calls"][0]["function"]["arguments"]
    ) == {"cod": "print(1)"}
    assert (
        msgs[at + 1]["role"] == "tool"
        and msgs[at + 1]["tool_call_id"] == "srv_1"
        and "'cod'" in msgs[at + 1]["content"]
    )
    # Replayed (`--agent replay`), the native turns run as the calls the env ran, not their text.
    from toolenv.runner import arollout
    from toolenv_agents.replay import ReplayAgent

    replay = ReplayAgent(out / "trajectories.jsonl")
    (again,) = (await arollout("toolenv/HumanEval-v0", replay, n=1, env_kwargs={"max_turns": 6})).trajectories
    assert again.error is None and [t.observation for t in again.turns] == [t.observation for t in recorded.turns]
    assert [t.parsed for t in again.turns] == [t.parsed for t in recorded.turns]
    assert [t.agent_metadata.get("native_tool_calls") for t in again.turns] == [1, 1, 1, None]


def tags_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(
        tools=[Lookup(), Add()], tasks=[{"id": "t1", "question": "2+3?", "answer": "5"}], parser="tags", max_turns=5
    )


async def test_tags_env_runs_a_native_call_to_a_tool_it_has_no_tag_for() -> None:
    """The tags parser has a tag for `search` but none for `add`: the `add` call runs, a call to a
    tool the env lacks gets the unknown-tool error, and a `search` call works as before."""
    script = [
        reply(None, [native_call("add", {"a": 2, "b": 3}, "srv_1")]),
        reply(None, [native_call("calc", {"x": "2+3"}, "srv_2")]),
        reply(None, [native_call("search", {"query": "five"}, "srv_3")]),
        reply("<answer>5</answer>"),
    ]
    server, traj = await native_rollout(script, tags_env)
    assert traj.error is None and traj.reward == 1.0
    add, calc, search = traj.turns[:3]
    assert [(c.name, c.id) for c in add.parsed.tool_calls] == [("add", "srv_1")]
    assert [(r.text, r.is_error) for r in add.results] == [("5", False)]
    assert [(c.name, c.id) for c in calc.parsed.tool_calls] == [("calc", "srv_2")]
    assert calc.results[0].is_error and "Unknown tool 'calc'" in calc.results[0].text
    assert search.action == "<search>five</search>"
    assert [(r.text, r.is_error) for r in search.results] == [("found five", False)]
    assert all(NO_ACTION not in t.observation for t in traj.turns)


async def test_native_calls_beside_a_call_and_an_answer_in_the_content() -> None:
    """The env runs what the rendered turn held: a call the model wrote in its content first (under
    an id of its own, not one of the server's), then the native calls; an answer in the content ends
    the episode as before."""
    script = [
        reply(
            "<search>two</search>",
            [native_call("add", {"a": 2, "b": 3}, "call_0"), native_call("search", {"query": "x"}, "call_0")],
        ),
        reply("<answer>5</answer>", [native_call("add", {"a": 1, "b": 1}, "srv_9")]),
    ]
    server, traj = await native_rollout(script, tags_env)
    first, last = traj.turns
    assert [(c.name, c.arguments) for c in first.parsed.tool_calls] == [
        ("search", {"query": "two"}),
        ("add", {"a": 2, "b": 3}),
        ("search", {"query": "x"}),
    ]
    assert len({c.id for c in first.parsed.tool_calls}) == 3
    assert [r.text for r in first.results] == ["found two", "5", "found x"]
    assert last.parsed.answer == "5" and [r.text for r in last.results] == ["2"]
    assert traj.terminated and traj.reward == 1.0
    sent = json.dumps(server.accepted[-1]["messages"])
    assert "found two" in sent and "found x" in sent


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"code": "1"}', None),  # encoded twice (some models do): the object it holds
        ("{not json", "its arguments are not valid JSON (got: {not json)"),
        ([1, 2], "its arguments are an array, not a JSON object (got: [1, 2])"),
        (5, "its arguments are a number, not a JSON object (got: 5)"),
        ("x" * 500, "... (500 characters))"),
    ],
)
def test_native_arguments_that_hold_no_object_are_an_error_naming_them(arguments: Any, expected: str | None) -> None:
    """A call's arguments must be an object (a trajectory's calls are read back as objects): other
    arguments are a parse error naming the call and what it sent, cut short when long."""
    parsed = native_turn("", [{"name": "python", "arguments": arguments, "id": "srv_1"}], get_parser("codeblock"))
    if expected is None:
        assert [(c.name, c.arguments, c.id) for c in parsed.tool_calls] == [("python", {"code": "1"}, "srv_1")]
        assert parsed.errors == []
    else:
        (error,) = parsed.errors
        assert parsed.tool_calls == [] and error.startswith("Tool call 1 (python): ") and expected in error
        assert len(error) < 400
