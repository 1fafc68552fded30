"""The `oracle` and `replay` agents, through the rollout runner and the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _tools import Add

import toolenv
from toolenv.registry import entries
from toolenv.runner import rollout
from toolenv_agents.oracle import OracleAgent
from toolenv_agents.replay import ReplayAgent, load_replay, load_replay_samples

ROOT = Path(__file__).resolve().parents[2]
CALL = '<tool_call>{"name": "add", "arguments": {"a": %d, "b": %d}}</tool_call>'


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
    assert "name that one: --agent-arg env=NAME" in (res.trajectories[0].error or "")  # says what to type


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


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _killed_run(tmp_path: Path) -> Path:
    """A real run's trajectories file (t1, then t2) whose last line a kill cut in the middle."""
    actions = "".join(
        json.dumps({"task_id": t["id"], "actions": [f"<answer>{t['answer']}</answer>"]}) + "\n" for t in TASKS
    )
    out = tmp_path / "run"
    rollout("toolenv/ToolEnv-v0", ReplayAgent(_write(tmp_path / "a.jsonl", actions)), env_kwargs=ENV_KW, out=out)
    path = out / "trajectories.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert [json.loads(line)["task"]["id"] for line in lines] == ["t1", "t2"]
    path.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    return path


def test_replay_of_a_killed_run_skips_its_cut_last_line_with_a_warning(tmp_path: Path) -> None:
    """A run killed mid-write replays: its partial last line is left out, with a warning naming
    it, as `toolenv view`, `export` and resuming the run leave it out."""
    path = _killed_run(tmp_path)
    with pytest.warns(UserWarning, match=rf"{re.escape(str(path))}:2: left out a partial last line"):
        agent = ReplayAgent(path)
    res = rollout("toolenv/ToolEnv-v0", agent, env_kwargs=ENV_KW)
    by_id = {t.task.id: t for t in res.trajectories}
    assert by_id["t1"].success and by_id["t1"].error is None
    assert (by_id["t2"].error or "").endswith("trajectories.jsonl has no actions for task 't2'")


def test_replay_skips_a_last_line_cut_inside_a_character(tmp_path: Path) -> None:
    """A kill inside a multi-byte character leaves bytes that are not UTF-8: still a partial last line."""
    good = json.dumps({"task_id": "t1", "actions": ["<answer>5</answer>"]}) + "\n"
    cut = json.dumps({"task_id": "t2", "actions": ["é"]}, ensure_ascii=False).encode()[:-4]
    path = tmp_path / "a.jsonl"
    path.write_bytes(good.encode() + cut)
    with pytest.warns(UserWarning, match=r"a\.jsonl:2: left out a partial last line"):
        assert load_replay(path) == {"t1": ["<answer>5</answer>"]}
    path.write_bytes(good.encode() + cut + b'"]}\n')  # a whole line with a byte that is not UTF-8
    with pytest.raises(ValueError, match=r"a\.jsonl:2: not valid JSON \(bytes that are not UTF-8\)"):
        load_replay(path)


def test_replay_refuses_a_bad_line_that_is_not_the_last(tmp_path: Path) -> None:
    """Only the last line can be cut by a kill: a malformed one before it stays an error, and so
    does a malformed last line that ends in a newline (a write that finished)."""
    good = json.dumps({"task_id": "t1", "actions": ["x"]}) + "\n"
    path = _write(tmp_path / "a.jsonl", '{"task_id": "t2", "act\n' + good)
    with pytest.raises(ValueError, match=r"a\.jsonl:1: not valid JSON"):
        ReplayAgent(path)
    _write(path, good + '{"task_id": "t2", "act\n')
    with pytest.raises(ValueError, match=r"a\.jsonl:2: not valid JSON"):
        ReplayAgent(path)
    _write(path, good + '{"task_id": "t2"}')
    with pytest.raises(ValueError, match=r"a\.jsonl:2: expected"):  # whole JSON, the wrong shape: not a cut
        ReplayAgent(path)


def test_cli_replays_a_killed_run(tmp_path: Path) -> None:
    """`toolenv rollout --agent replay` of a killed run's file: exit 0, one warning line naming the cut line."""
    path = _killed_run(tmp_path)
    tasks = _write(tmp_path / "tasks.jsonl", "".join(json.dumps(t) + "\n" for t in TASKS))
    cmd = [sys.executable, "-m", "toolenv.cli", "rollout", "toolenv/ToolEnv-v0", "--agent", "replay"]
    cmd += ["--agent-arg", f"path={path}", "--tasks", str(tasks), "--out", str(tmp_path / "again"), "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    warned = [line for line in out.stderr.splitlines() if "left out a partial last line" in line]
    assert warned == [
        f"toolenv rollout: warning: {path}:2: left out a partial last line (a run killed mid-write; resuming reruns it)"
    ]
    assert "warnings.warn" not in out.stderr and "UserWarning" not in out.stderr  # one line, not Python's two


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


def _answers_run(tmp_path: Path, samples: int) -> Path:
    """A real run's trajectories file, `samples` per task, each sample answering its own number
    (`<answer>t1-s0</answer>`...), so a replay shows which recorded sample it played."""
    lines = "".join(
        json.dumps({"task_id": t["id"], "sample": s, "actions": [f"<answer>{t['id']}-s{s}</answer>"]}) + "\n"
        for t in TASKS
        for s in range(samples)
    )
    out = tmp_path / "recorded"
    agent = ReplayAgent(_write(tmp_path / "script.jsonl", lines))
    rollout("toolenv/ToolEnv-v0", agent, env_kwargs=ENV_KW, samples=samples, out=out)
    return out / "trajectories.jsonl"


def _played(res: toolenv.RolloutResult) -> dict[tuple[str, int], str | None]:
    return {(t.task.id, t.sample): (t.turns[0].action if t.turns else t.error) for t in res.trajectories}


def test_replay_plays_each_sample_its_own_recorded_trajectory(tmp_path: Path) -> None:
    """A recorded GRPO group (several samples per task) replays sample k as the recorded sample k,
    at any concurrency, and says which one it played."""
    path = _answers_run(tmp_path, samples=3)
    recorded = {(t["task"]["id"], t["sample"]): t["turns"][0]["action"] for t in map(json.loads, path.open())}
    assert len(set(recorded.values())) == 6  # six different recorded actions
    res = rollout("toolenv/ToolEnv-v0", ReplayAgent(path), env_kwargs=ENV_KW, samples=3, concurrency=4)
    assert _played(res) == recorded
    assert all(t.turns[0].agent_metadata["replayed_sample"] == t.sample for t in res.trajectories)


def test_replay_says_when_a_recorded_sample_is_missing(tmp_path: Path) -> None:
    """A sample the file does not hold is an error naming it, not another sample's actions."""
    path = tmp_path / "a.jsonl"
    path.write_text(
        json.dumps({"task_id": "t1", "sample": 0, "actions": ["<answer>first</answer>"]})
        + "\n"
        + json.dumps({"task_id": "t1", "sample": 2, "actions": ["<answer>third</answer>"]})
        + "\n"
    )
    res = rollout("toolenv/ToolEnv-v0", ReplayAgent(path), env_kwargs=ENV_KW, tasks=TASKS[:1], samples=3)
    played = _played(res)
    assert played[("t1", 0)] == "<answer>first</answer>" and played[("t1", 2)] == "<answer>third</answer>"
    assert "has no sample 1 of task 't1' (it holds sample(s) 0, 2)" in (played[("t1", 1)] or "")


def test_replay_with_more_samples_than_recorded_says_so(tmp_path: Path) -> None:
    """Replaying a one-sample recording with samples=2 must not play sample 0 twice: the second
    sample is an error naming what the file holds."""
    path = _answers_run(tmp_path, samples=1)
    res = rollout("toolenv/ToolEnv-v0", ReplayAgent(path), env_kwargs=ENV_KW, samples=2, concurrency=1)
    played = _played(res)
    assert played[("t1", 0)] == "<answer>t1-s0</answer>" and played[("t2", 0)] == "<answer>t2-s0</answer>"
    assert "has no sample 1 of task 't1' (it holds sample(s) 0)" in (played[("t1", 1)] or "")
    assert "has no sample 1 of task 't2'" in (played[("t2", 1)] or "")


def test_replay_with_fewer_samples_than_recorded_plays_each_tasks_own(tmp_path: Path) -> None:
    """Replaying a 2-sample recording with one sample per task plays each task's own sample 0,
    not the recorded sample 1 of the task before it."""
    path = _answers_run(tmp_path, samples=2)
    res = rollout("toolenv/ToolEnv-v0", ReplayAgent(path), env_kwargs=ENV_KW, concurrency=1)
    assert _played(res) == {("t1", 0): "<answer>t1-s0</answer>", ("t2", 0): "<answer>t2-s0</answer>"}


def test_one_replay_agent_serves_rollouts_of_other_task_orders(tmp_path: Path) -> None:
    """The episode groups one rollout saw do not carry over to the next rollout of the same agent."""
    path = _answers_run(tmp_path, samples=2)
    agent = ReplayAgent(path)
    for tasks in (TASKS, TASKS[::-1]):
        res = rollout("toolenv/ToolEnv-v0", agent, env_kwargs=ENV_KW, tasks=tasks, samples=2)
        assert _played(res) == {(t["id"], s): f"<answer>{t['id']}-s{s}</answer>" for t in TASKS for s in range(2)}


def test_replay_lines_without_a_sample_are_sample_0_and_a_bad_sample_is_refused(tmp_path: Path) -> None:
    """A hand-written line names no sample: it is sample 0, the first line of a task is kept (as
    before samples were read); a sample that is not a non-negative int names its line."""
    path = tmp_path / "a.jsonl"
    path.write_text(
        json.dumps({"task_id": "t1", "actions": ["<answer>5</answer>"]})
        + "\n"
        + json.dumps({"task_id": "t1", "actions": ["<answer>6</answer>"]})
        + "\n"
    )
    assert load_replay_samples(path) == {"t1": {0: ["<answer>5</answer>"]}}
    path.write_text(json.dumps({"task_id": "t1", "sample": -1, "actions": ["x"]}) + "\n")
    with pytest.raises(ValueError, match=r"a\.jsonl:1: expected .* with any sample a non-negative int"):
        ReplayAgent(path)
