"""The `oracle` and `replay` agents, through the rollout runner and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

import toolenv
from toolenv.registry import entries
from toolenv.runner import rollout
from toolenv_agents.oracle import OracleAgent
from toolenv_agents.replay import ReplayAgent, load_replay

ROOT = Path(__file__).resolve().parents[2]
CALL = '<tool_call>{"name": "add", "arguments": {"a": %d, "b": %d}}</tool_call>'


class Add(toolenv.Tool):
    """Add two integers."""

    name = "add"

    class Args(BaseModel):
        a: int
        b: int

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        return toolenv.ToolResult(text=str(args.a + args.b))


TASKS = [{"id": "t1", "question": "2+3?", "answer": "5"}, {"id": "t2", "question": "10+4?", "answer": "14"}]
ENV_KW = {"tools": [Add()], "tasks": TASKS}


def test_oracle_function_on_the_core_env() -> None:
    def oracle(task: toolenv.Task, turn: int, observation: str) -> str:
        a, b = (int(x) for x in task.question.rstrip("?").split("+"))
        return CALL % (a, b) if turn == 0 else f"<answer>{observation.split()[1]}</answer>"

    res = rollout("toolenv/ToolEnv-v0", OracleAgent(oracle=oracle), env_kwargs=ENV_KW)
    assert res.summary.success_rate == 1.0 and res.summary.tool_calls_per_episode == 1.0


def test_oracle_without_plugin_is_an_episode_error() -> None:
    res = rollout("toolenv/ToolEnv-v0", "oracle", env_kwargs=ENV_KW, n=1)
    assert "no oracle named 'ToolEnv-v0'" in (res.trajectories[0].error or "")


ORACLES = sorted({e.name for e in entries("oracles")} & {e.name for e in entries("envs")})


@pytest.mark.skipif(not ORACLES, reason="no env plugin with an oracle is installed")
@pytest.mark.parametrize("name", ORACLES)
def test_oracle_solves_installed_envs(name: str, tmp_path: Path) -> None:
    res = rollout(f"toolenv/{name}", "oracle", n=3, concurrency=3, out=tmp_path)
    assert [t.error for t in res.trajectories] == [None, None, None]
    assert res.summary.success_rate == 1.0 and res.summary.mean_reward == 1.0


def test_replay_file_and_missing_actions(tmp_path: Path) -> None:
    path = tmp_path / "actions.jsonl"
    path.write_text(
        json.dumps({"task_id": "t1", "actions": [CALL % (2, 3), "<answer>5</answer>"]})
        + "\n"
        + json.dumps({"task_id": "t2", "actions": [CALL % (10, 4)]})
        + "\n"
    )
    res = rollout("toolenv/ToolEnv-v0", ReplayAgent(path), env_kwargs=ENV_KW)
    by_id = {t.task.id: t for t in res.trajectories}
    assert by_id["t1"].success and by_id["t1"].turns[0].results[0].text == "5"
    assert "none for turn 1" in (by_id["t2"].error or "") and len(by_id["t2"].turns) == 1
    # A trajectories file written by a rollout replays too.
    rollout("toolenv/ToolEnv-v0", ReplayAgent(path), env_kwargs=ENV_KW, out=tmp_path / "run")
    table = load_replay(tmp_path / "run" / "trajectories.jsonl")
    assert table["t1"] == [CALL % (2, 3), "<answer>5</answer>"]


def test_replay_rejects_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "t1", "actions": ["x"]}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        ReplayAgent(path)


def test_cli_replay_on_example_env(tmp_path: Path) -> None:
    actions = tmp_path / "a.jsonl"
    actions.write_text(json.dumps({"task_id": "sum-1", "actions": ["<answer>5</answer>"]}) + "\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "examples"))
    cmd = [
        sys.executable,
        "-m",
        "toolenv.cli",
        "rollout",
        "rollout_example:rollout_example/Calc-v0",
        "--agent",
        "replay",
        "--agent-arg",
        f"path={actions}",
        "-n",
        "1",
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    traj = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text())
    assert traj["agent"] == "replay" and traj["reward"] == 1.0 and traj["success"] is True
