"""`--retry-errors` keeps every episode's line until its rerun is written, however the run ends.

A retried episode's earlier (errored) line must stay in the run's directory until its
replacement is written: a run killed (SIGKILL), stopped (SIGTERM) or interrupted in between
keeps it, a later resume reads it back once, and `read_trajectories`, `toolenv view` and
`toolenv export` count each (task id, sample) once. Real runs in real subprocesses, killed
for real; no network.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _examples import load_example

import toolenv
from toolenv.agent import Agent, AgentAction, AgentError, EnvInfo
from toolenv.cli import main
from toolenv.report import load_run
from toolenv.report.served import RunIndex
from toolenv.runner import rollout
from toolenv.trajectory import load_trajectory_file, read_trajectories

ROOT = Path(__file__).resolve().parents[1]
example = load_example("rollout_example")
ALL = ["sum-1", "sum-2", "price", "color"]

#: An agent for the subprocess: the scripted one, except that on the tasks named in BLOCK_TASKS
#: it says so (a file named after the task in BLOCK_MARK) and waits for an hour.
BLOCKS = """\
import asyncio, os, pathlib
from rollout_example import ScriptedAgent

class Blocks(ScriptedAgent):
    async def act(self, o, m, i):
        if i.task.id in os.environ["BLOCK_TASKS"].split(","):
            pathlib.Path(os.environ["BLOCK_MARK"], i.task.id).touch()
            await asyncio.sleep(3600)
        return await super().act(o, m, i)
"""


class FailsOnTurn1(Agent):
    """The scripted agent with a server that goes down after its first answer on `fail`'s tasks:
    their episodes end with an error after a tool call (the swatch's image is in the line)."""

    name = "scripted"  # the same run as the scripted agent's, resumed

    def __init__(self, fail: list[str]) -> None:
        self.fail = fail

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        if env_info.task.id in self.fail and env_info.turn == 1:
            raise AgentError("server down (simulated)")
        return await example.ScriptedAgent().act(observation, messages, env_info)


def _errored_run(run: Path, fail: list[str], images: str = "inline") -> None:
    res = rollout(example.ENV_ID, FailsOnTurn1(fail), out=run, images=images)
    assert res.summary.episode_errors == len(fail)


def _start_retry(
    run: Path, tmp_path: Path, block: list[str], images: str = "inline", max_file_size: int | None = None
) -> subprocess.Popen[str]:
    """`toolenv rollout --retry-errors` on `run` in a subprocess, its agent blocking on `block`;
    with `max_file_size`, a write past that many bytes of any file fails as on a full disk."""
    (tmp_path / "blocks_agent.py").write_text(BLOCKS)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT / "examples"), env.get("PYTHONPATH", "")])
    env["BLOCK_TASKS"], env["BLOCK_MARK"] = ",".join(block), str(marks)
    cmd = [sys.executable, "-m", "toolenv.cli", "rollout", f"rollout_example:{example.ENV_ID}"]
    cmd += ["--agent", "blocks_agent:Blocks", "-c", "4", "--out", str(run), "--retry-errors", "--no-progress"]
    cmd += ["--images", images]

    def limit() -> None:
        if max_file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_size, max_file_size))

    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=limit)


def _wait_until_blocked(proc: subprocess.Popen[str], tmp_path: Path, block: list[str], written: list[str]) -> None:
    """Until every task of `block` is blocked and the replacement of each of `written` is in the file."""
    path = tmp_path / "run" / "trajectories.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        blocked = all((tmp_path / "marks" / task).exists() for task in block)
        text = path.read_text() if path.exists() else ""
        lines = [json.loads(x) for x in text.split("\n")[:-1]]  # whole lines: one may be being written
        done = {x["task"]["id"] for x in lines if x["error"] is None}
        if blocked and set(written) <= done:
            return
        time.sleep(0.05)
    raise AssertionError("the retrying run never reached the point to stop it at")


def _killed_retry(
    run: Path, tmp_path: Path, block: list[str], written: list[str], images: str = "inline"
) -> subprocess.Popen[str]:
    """A `--retry-errors` run on `run`, SIGKILLed once `written` are rerun and `block` blocked."""
    proc = _start_retry(run, tmp_path, block, images)
    try:
        _wait_until_blocked(proc, tmp_path, block, written)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    return proc


def _by_key(trajs: list[toolenv.Trajectory]) -> dict[str, toolenv.Trajectory]:
    counts = Counter(t.key for t in trajs)
    assert max(counts.values()) == 1, f"an episode read twice: {counts}"
    return {t.task.id: t for t in trajs}


def _check_each_reader(run: Path, tmp_path: Path, errored: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Every reader of the run reads each episode once: `errored` with their earlier error line."""
    path = run / "trajectories.jsonl"
    notes: list[str] = []  # a cut last line (a failed write) is told here
    for trajs in (read_trajectories(path), load_trajectory_file(path)[0], load_run(run, warn=notes.append)[0]):
        by_id = _by_key(trajs)
        assert sorted(by_id) == sorted(ALL)
        assert sorted(k for k, t in by_id.items() if t.error) == sorted(errored)
        assert all("server down" in (by_id[k].error or "") for k in errored)
    index = RunIndex([run], warn=notes.append)
    assert len(index) == 4
    served = [json.loads(index.episode(i))["episode"] for i in range(len(index))]
    assert sorted(e["task"]["id"] for e in served) == sorted(ALL)
    out = tmp_path / "sft.jsonl"
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert f"wrote {4 - len(errored)} of 4 trajectories" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fail", "block", "images"),
    [
        (["price", "color"], ["color"], "inline"),  # price rerun and written, color killed mid-rerun
        (ALL, ALL, "files"),  # every line moved aside for a rerun and none written: the file holds none
    ],
)
def test_sigkill_during_a_retry_keeps_every_episode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fail: list[str], block: list[str], images: str
) -> None:
    run = tmp_path / "run"
    _errored_run(run, fail, images)
    proc = _killed_retry(run, tmp_path, block, [t for t in fail if t not in block], images)
    assert proc.returncode == -signal.SIGKILL
    _check_each_reader(run, tmp_path, block, capsys)

    # A resume without --retry-errors keeps the earlier lines and reruns nothing.
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=run, images=images)
    assert (res.new, res.skipped) == (0, 4)
    by_id = _by_key(res.trajectories)
    assert sorted(k for k, t in by_id.items() if t.error) == sorted(block)
    assert res.summary.episodes == 4 and res.summary.episode_errors == len(block)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["episodes"] == 4 and summary["episode_errors"] == len(block)
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == 4  # no line left aside or twice
    _check_each_reader(run, tmp_path, block, capsys)

    # And one with it reruns them, once each.
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=run, retry_errors=True, images=images)
    assert (res.new, res.skipped) == (len(block), 4 - len(block))
    assert res.summary.episodes == 4 and res.summary.success_rate == 1.0
    assert sorted(_by_key(read_trajectories(run / "trajectories.jsonl", strict=True))) == sorted(ALL)
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == 4
    assert sorted(p.name for p in run.iterdir() if "retry" in p.name or p.suffix == ".tmp") == []


def test_sigkill_then_a_retry_again_reruns_what_was_left(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two killed retries in a row, then a third that finishes: nothing lost, nothing twice."""
    run = tmp_path / "run"
    _errored_run(run, ["sum-2", "price", "color"])
    for block, written in ((["price", "color"], ["sum-2"]), (["color"], ["price"])):
        for mark in (tmp_path / "marks").glob("*"):
            mark.unlink()
        _killed_retry(run, tmp_path, block, written)
        _check_each_reader(run, tmp_path, block, capsys)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=run, retry_errors=True)
    assert (res.new, res.skipped) == (1, 3) and res.summary.success_rate == 1.0
    assert sorted(_by_key(res.trajectories)) == sorted(ALL)
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_retry_puts_the_earlier_lines_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], signum: signal.Signals
) -> None:
    """Ctrl-C or SIGTERM: the run ends cleanly with every episode in trajectories.jsonl, once,
    and a summary.json that counts them all."""
    run = tmp_path / "run"
    _errored_run(run, ["price", "color"])
    proc = _start_retry(run, tmp_path, ["color"])
    try:
        _wait_until_blocked(proc, tmp_path, ["color"], ["price"])
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signum, err
    assert "4 trajectories kept" in err
    lines = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(x["task"]["id"] for x in lines) == sorted(ALL)  # the file alone holds each once
    assert [x["task"]["id"] for x in lines if x["error"]] == ["color"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["episodes"] == 4 and summary["episode_errors"] == 1
    _check_each_reader(run, tmp_path, ["color"], capsys)


def test_a_retry_that_finishes_leaves_one_line_per_episode(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _errored_run(run, ["price", "color"])
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=run, retry_errors=True, keep_trajectories=False)
    assert (res.new, res.skipped) == (2, 2) and res.summary.episodes == 4 and res.summary.success_rate == 1.0
    trajs = read_trajectories(run / "trajectories.jsonl", strict=True)
    assert sorted(_by_key(trajs)) == sorted(ALL) and all(t.success for t in trajs)
    assert json.loads((run / "summary.json").read_text())["episodes"] == 4
    assert sorted(p.name for p in run.iterdir()) == [".lock", "run.json", "summary.json", "trajectories.jsonl"]


def test_a_killed_retry_of_every_episode_is_still_a_run_to_resume(tmp_path: Path) -> None:
    """Every line aside and the file empty: resume=False refuses it, and --overwrite starts afresh
    (the lines aside gone too, not read back into the new run)."""
    run = tmp_path / "run"
    _errored_run(run, ALL)
    proc = _start_retry(run, tmp_path, ALL)
    try:
        _wait_until_blocked(proc, tmp_path, ALL, [])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    with pytest.raises(FileExistsError, match=r"trajectories\.retrying\.jsonl already has trajectories"):
        rollout(example.ENV_ID, example.ScriptedAgent(), out=run, resume=False)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), n=2, out=run, overwrite=True)
    assert (res.new, res.skipped) == (2, 0) and res.summary.episodes == 2 and res.summary.success_rate == 1.0
    assert sorted(t.task.id for t in read_trajectories(run / "trajectories.jsonl", strict=True)) == ["sum-1", "sum-2"]
    assert sorted(p.name for p in run.iterdir() if "retry" in p.name) == []


def test_a_line_both_aside_and_in_the_file_is_read_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run killed after setting its errored lines aside and before rewriting the file leaves
    them in both files: each is read once, and the next retry reruns it once."""
    run = tmp_path / "run"
    _errored_run(run, ["price", "color"])
    path = run / "trajectories.jsonl"
    errored = [x for x in path.read_text().splitlines(keepends=True) if json.loads(x)["error"]]
    (run / "trajectories.retrying.jsonl").write_text("".join(errored))
    _check_each_reader(run, tmp_path, ["price", "color"], capsys)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=run, retry_errors=True)
    assert (res.new, res.skipped) == (2, 2) and res.summary.episodes == 4 and res.summary.success_rate == 1.0
    assert sorted(_by_key(read_trajectories(path, strict=True))) == sorted(ALL)
    assert len(path.read_text().splitlines()) == 4 and not (run / "trajectories.retrying.jsonl").exists()


def test_a_retry_stopped_by_a_full_disk_keeps_the_earlier_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rerun's write fails part way (a full disk: here a file size limit), leaving a cut last
    line: the earlier lines stay aside rather than follow it, and are read back once."""
    run = tmp_path / "run"
    _errored_run(run, ["price", "color"])
    lines = (run / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    kept = [x for x in lines if json.loads(x)["error"] is None]
    room = sum(map(len, kept)) + 64  # the file without its errored lines, and less than a rerun's line
    proc = _start_retry(run, tmp_path, [], max_file_size=room)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "File too large" in err and err.strip().count("\n") == 0
    _check_each_reader(run, tmp_path, ["price", "color"], capsys)
    assert json.loads((run / "summary.json").read_text())["episodes"] == 4
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=run, retry_errors=True)
    assert (res.new, res.skipped) == (2, 2) and res.summary.success_rate == 1.0
    assert sorted(_by_key(read_trajectories(run / "trajectories.jsonl", strict=True))) == sorted(ALL)
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == 4
