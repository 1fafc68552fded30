"""A reward that fails (an LLM judge that is down) is visible in the run: each trajectory keeps
the episode's reward info, and `toolenv rollout` warns (one stderr line, exit code unchanged)
when a large share of this run's episodes had a reward part that reported an error. A judge
URL pointing at a dead port made every reward 0 while the run looked like a model scoring 0."""

from __future__ import annotations

import itertools
import json
import socket
from pathlib import Path

import numpy as np
import pytest
from _examples import load_example

import toolenv
from toolenv.cli import main
from toolenv.episode import Episode
from toolenv.report.summary import summarize
from toolenv.rewards import record_reward_info
from toolenv.trajectory import Trajectory, read_trajectories

example = load_example("rollout_example")
_SERIAL = itertools.count()

# A reward whose scorer is down for the tasks named in FAILING: it scores 0 and records why,
# as LLMJudge does after its retries (it never raises, so the episode itself ends well).
REWARD = """
import toolenv
from toolenv.rewards import record_reward_info

FAILING = {failing!r}
DOWN = "HTTP 503 from http://127.0.0.1:9/judge\\nretry later"


class Flaky(toolenv.Reward):
    name = "flaky"

    async def final(self, episode):
        if episode.task.id in FAILING:
            record_reward_info(episode, self.name, score=0.0, error=DOWN)
            return 0.0
        record_reward_info(episode, self.name, score=1.0, error=None, reply="yes")
        return 1.0
"""

ALL = ["sum-1", "sum-2", "price", "color"]


def _reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: list[str]) -> str:
    """The name of a fresh module whose `Flaky` reward fails for the tasks in `failing`."""
    name = f"flaky_reward_{next(_SERIAL)}"
    (tmp_path / f"{name}.py").write_text(REWARD.format(failing=set(failing)))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _rollout(out: Path, n: int, reward: object) -> int:
    return main(
        [
            "rollout", example.ENV_ID, "--agent", "rollout_example:ScriptedAgent", "-n", str(n), "--no-progress",
            "--env-arg", f"reward={json.dumps(reward)}", "--out", str(out),
        ]
    )  # fmt: skip


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "reward reported an error" in line]


def test_a_run_whose_every_reward_failed_warns_once_and_still_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _reward_module(tmp_path, monkeypatch, ALL)
    assert _rollout(tmp_path / "run", 4, f"{module}:Flaky") == 0
    err = capsys.readouterr().err
    assert _warnings(err) == [
        "toolenv rollout: in 4 of 4 episodes of this run a reward reported an error (it scored 0: "
        "see reward_info in the trajectories), e.g.: flaky: HTTP 503 from http://127.0.0.1:9/judge retry later"
    ]
    assert err.strip().splitlines() == _warnings(err)  # the one line, nothing else


def test_the_trajectory_file_keeps_the_reward_info_and_reads_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _reward_module(tmp_path, monkeypatch, ["sum-1"])
    assert _rollout(tmp_path / "run", 2, f"{module}:Flaky") == 0
    path = tmp_path / "run" / "trajectories.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_task = {line["task"]["id"]: line["reward_info"] for line in lines}
    assert by_task == {
        "sum-1": {"flaky": {"score": 0.0, "error": "HTTP 503 from http://127.0.0.1:9/judge\nretry later"}},
        "sum-2": {"flaky": {"score": 1.0, "error": None, "reply": "yes"}},
    }
    read = {t.task.id: t.reward_info for t in read_trajectories(path, strict=True)}
    assert read == by_task
    assert [t.error for t in read_trajectories(path)] == [None, None]  # the episodes themselves went well


def test_a_line_without_reward_info_still_reads(tmp_path: Path) -> None:
    # A file written before trajectories kept reward info
    old = {"schema_version": 1, "env_id": "e", "agent": "a", "task": {"id": "t", "question": "q"}, "reward": 1.0}
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (traj,) = read_trajectories(path, strict=True)
    assert traj.reward_info == {} and traj.reward == 1.0
    assert Trajectory.model_validate_json(traj.to_json_line()) == traj


def test_most_episodes_failing_warns_a_few_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    most = _reward_module(tmp_path, monkeypatch, ["sum-1", "price"])  # 2 of 4: half
    assert _rollout(tmp_path / "most", 4, f"{most}:Flaky") == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert line.startswith("toolenv rollout: in 2 of 4 episodes of this run a reward reported an error")
    few = _reward_module(tmp_path, monkeypatch, ["price"])  # 1 of 4: an observation
    assert _rollout(tmp_path / "few", 4, f"{few}:Flaky") == 0
    assert _warnings(capsys.readouterr().err) == []


def test_a_healthy_run_and_a_run_with_nothing_new_do_not_warn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    healthy = _reward_module(tmp_path, monkeypatch, [])
    assert _rollout(tmp_path / "ok", 4, f"{healthy}:Flaky") == 0
    assert capsys.readouterr().err == ""
    failing = _reward_module(tmp_path, monkeypatch, ALL)
    assert _rollout(tmp_path / "bad", 2, f"{failing}:Flaky") == 0
    assert len(_warnings(capsys.readouterr().err)) == 1
    # resumed with nothing left to play: this run scored no episode, whatever the earlier one did
    assert _rollout(tmp_path / "bad", 2, f"{failing}:Flaky") == 0
    assert _warnings(capsys.readouterr().err) == []


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_llm_judge_that_is_down_is_visible_in_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    judge = {"base_url": f"http://127.0.0.1:{_dead_port()}/v1", "model": "j", "api_key_env": None, "retries": 0}
    assert _rollout(tmp_path / "run", 4, {"judge": judge}) == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert line.startswith("toolenv rollout: in 4 of 4 episodes of this run a reward reported an error")
    assert "e.g.: judge: judge request failed after 1 attempt(s): ConnectError" in line
    for traj in read_trajectories(tmp_path / "run" / "trajectories.jsonl", strict=True):
        assert traj.reward == 0.0 and traj.error is None
        assert "ConnectError" in traj.reward_info["judge"]["error"]


def test_the_summary_counts_the_episodes_whose_reward_reported_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _reward_module(tmp_path, monkeypatch, ["sum-1", "price"])
    assert _rollout(tmp_path / "run", 4, f"{module}:Flaky") == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reward_errors"] == 2 and summary["episode_errors"] == 0
    first = {t.task.id: t for t in read_trajectories(tmp_path / "run" / "trajectories.jsonl")}["sum-1"]
    assert first.reward_error == "flaky: HTTP 503 from http://127.0.0.1:9/judge\nretry later"
    assert summarize([first.model_copy(update={"reward_info": {"flaky": {"error": None}, "f1": 3}})]).reward_errors == 0


class _Odd:
    def __str__(self) -> str:
        return "<odd>"


class _Recording(toolenv.Reward):
    """Records values JSON cannot hold as they are: a numpy score, an object, bytes, a tuple key."""

    name = "recording"

    async def final(self, episode: Episode) -> float:
        record_reward_info(
            episode, self.name, score=np.float32(0.5), scores=np.arange(2), raw=b"ok", obj=_Odd(), by={(1, 2): 3}
        )
        return 0.5


def test_reward_info_json_cannot_hold_is_kept_readable_not_made_an_episode_error(tmp_path: Path) -> None:
    res = toolenv.rollout(
        lambda: example.make_env(reward=_Recording()), example.ScriptedAgent(), n=2, out=tmp_path / "run"
    )
    assert [t.error for t in res.trajectories] == [None, None]
    for traj in read_trajectories(tmp_path / "run" / "trajectories.jsonl", strict=True):
        assert traj.error is None
        assert traj.reward_info == {
            "recording": {"score": 0.5, "scores": [0, 1], "raw": "ok", "obj": "<odd>", "by": {"(1, 2)": 3}}
        }
