"""A tool entry `{"tool": reference, "tool_kwargs": {...}}` gives a referenced tool its arguments
from text (a command line, YAML, JSON), as a verl tool config does: before, a `tools` list could
only name a tool, built with its defaults (`PythonTool(preload=...)` needed a factory module)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

import toolenv
from toolenv.cli import main
from toolenv.registry import resolve_tool, resolve_tools, resolved_tools

_SERIAL = itertools.count()

TOOLS = '''
from pydantic import BaseModel

import toolenv


class Echo(toolenv.Tool):
    """Say the text back, after a prefix."""

    name = "echo"

    class Args(BaseModel):
        text: str

    def __init__(self, prefix: str = "", **limits):
        super().__init__(**limits)
        self.prefix = prefix

    async def run(self, args, ctx):
        return toolenv.ToolResult(text=self.prefix + args.text)


def echoes(prefixes=("a",)):
    """Several tools, as mcp_tools(...) returns them."""
    tools = [Echo(prefix=p) for p in prefixes]
    for i, tool in enumerate(tools):
        tool.name = f"echo{i}"
    return tools


READY = Echo()
'''

CALL = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"kwarg_tools_{next(_SERIAL)}"
    (tmp_path / f"{name}.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_an_entry_builds_its_tool_with_its_arguments(mod: str) -> None:
    assert resolve_tool({"tool": f"{mod}:Echo", "tool_kwargs": {"prefix": ">> "}}).prefix == ">> "
    assert resolve_tool({"tool": f"{mod}:Echo"}).prefix == ""  # no arguments: the defaults
    assert resolve_tool({"tool": f"{mod}:Echo", "tool_kwargs": {"prefix": "a"}}, prefix="b").prefix == "b"
    (tool,) = resolve_tools({"tool": f"{mod}:Echo", "tool_kwargs": {"prefix": "x"}})
    assert tool.prefix == "x"
    tools = resolve_tools({"tool": f"{mod}:echoes", "tool_kwargs": {"prefixes": ["1", "2"]}})
    assert [(t.name, t.prefix) for t in tools] == [("echo0", "1"), ("echo1", "2")]  # a factory of several


def test_a_tool_env_and_a_tools_list_take_entries(mod: str) -> None:
    entry = {"tool": f"{mod}:Echo", "tool_kwargs": {"prefix": ">> "}}
    env = toolenv.ToolEnv(tools=[entry], tasks=[{"question": "q"}])
    env.reset(seed=0)
    obs = env.step(CALL)[0]
    assert ">> hi" in obs, obs
    env.close()
    kwargs = resolved_tools({"tools": [entry, f"{mod}:Echo"], "max_turns": 2})
    assert [t.prefix for t in kwargs["tools"]] == [">> ", ""] and kwargs["max_turns"] == 2


def test_check_takes_an_entry_on_the_command_line(mod: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = {"tools": [{"tool": f"{mod}:Echo", "tool_kwargs": {"prefix": "> "}}], "tasks": [{"question": "q"}]}
    code = main(["check", "toolenv/ToolEnv-v0", "--kwargs", json.dumps(spec)])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"tool_kwargs": {"prefix": "a"}}, "has no 'tool' key"),
        ({"tool": "{mod}:Echo", "prefix": "a"}, "has unknown key(s) 'prefix'"),
        ({"tool": "{mod}:Echo", "tool_kwargs": ["a"]}, "'tool_kwargs' must be a mapping of arguments"),
        ({"tool": {"tool": "{mod}:Echo"}}, "'tool' must be a reference, not another entry"),
        ({"tool": "{mod}:READY", "tool_kwargs": {"prefix": "a"}}, "is a tool instance: it takes no arguments"),
        ({"tool": "{mod}:Echo", "tool_kwargs": {"nope": 1}}, "got unknown tool limit 'nope'"),
    ],
)
def test_a_wrong_entry_is_refused_saying_what_to_write(mod: str, entry: dict[str, object], why: str) -> None:
    def filled(value: object) -> object:
        if isinstance(value, str):
            return value.replace("{mod}", mod)
        if isinstance(value, dict):
            return {k: filled(v) for k, v in value.items()}
        return value

    with pytest.raises((ValueError, TypeError)) as err:
        toolenv.ToolEnv(tools=[filled(entry)], tasks=[{"question": "q"}])  # type: ignore[list-item]
    assert why in str(err.value), str(err.value)
