"""`toolenv export` of a native-tool-calling run without `--tools` warns that its rows list no tools."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolenv.cli import main

AGENT = '''
import json
import toolenv
from toolenv.agent import AgentAction


class NativeAgent(toolenv.Agent):
    """Calls `add` as an API's native tool call would (the openai agent records how many), then answers."""

    name = "h8native"

    async def act(self, observation, messages, env_info):
        if env_info.turn == 0:
            call = {"name": "add", "arguments": {"a": 2, "b": 3}}
            return AgentAction(text=f"<tool_call>{json.dumps(call)}</tool_call>", metadata={"native_tool_calls": 1})
        return AgentAction(text="<answer>5</answer>", metadata={"native_tool_calls": 0})


class TextAgent(NativeAgent):
    """The same turns, written as text."""

    name = "h8text"

    async def act(self, observation, messages, env_info):
        action = await super().act(observation, messages, env_info)
        return AgentAction(text=action.text)


@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)
'''
TASKS = [{"id": "sum", "question": "2+3?", "answer": "5"}]


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "h8_export_agents.py").write_text(AGENT)
    sys.path.insert(0, str(tmp_path))
    yield "h8_export_agents"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("h8_export_agents", None)


def _export(tmp_path: Path, module: str, agent: str, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    run = tmp_path / agent
    env_args = ["--env-arg", f"tools={json.dumps([f'{module}:add'])}", "--env-arg", f"tasks={json.dumps(TASKS)}"]
    assert (
        main(
            [
                "rollout",
                "toolenv/ToolEnv-v0",
                *env_args,
                "--agent",
                f"{module}:{agent}",
                "--no-progress",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / f"{agent}.jsonl"), *extra]) == 0
    return [x for x in capsys.readouterr().err.splitlines() if x.startswith("toolenv export: warning:")]


def test_a_native_run_exported_without_tools_warns_once(
    tmp_path: Path, agents: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (warning,) = _export(tmp_path, agents, "NativeAgent", capsys)
    assert "native tool calls" in warning and "--tools ENV_ID" in warning


def test_no_warning_with_tools_or_for_a_text_run(
    tmp_path: Path, agents: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _export(tmp_path, agents, "NativeAgent", capsys, "--tools", "toolenv/ToolEnv-v0") == []
    assert _export(tmp_path, agents, "TextAgent", capsys) == []
