"""Reading a run's `trajectories.jsonl` as a killed run leaves it: view, export and resume."""

from __future__ import annotations

from pathlib import Path

import pytest

import toolenv
from toolenv.agent import Agent, EnvInfo
from toolenv.cli import main
from toolenv.trajectory import load_trajectory_file, read_trajectories

TASKS = [{"id": "a", "question": "2+3?", "answer": "5"}, {"id": "b", "question": "2+3?", "answer": "5"}]
EMOJI = "\N{GRINNING FACE}"


@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


class Unicode(Agent):
    """Answers in Chinese with an emoji: characters of two to four bytes in UTF-8."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        return f"答案是 <answer>5</answer> {EMOJI}"


def _env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[add], tasks=TASKS, max_turns=2)


@pytest.fixture
def cut_run(tmp_path: Path) -> Path:
    """A run killed while writing its second line, in the middle of a four-byte character."""
    run = tmp_path / "run"
    toolenv.rollout(_env, Unicode(), out=run, concurrency=1)
    path = run / "trajectories.jsonl"
    first, second, _ = path.read_bytes().split(b"\n")
    cut = second.index(EMOJI.encode()) + 2  # two of the emoji's four bytes written
    path.write_bytes(first + b"\n" + second[:cut])
    return run


def test_a_line_cut_inside_a_character_is_a_partial_last_line(cut_run: Path) -> None:
    trajs, partial = load_trajectory_file(cut_run / "trajectories.jsonl")
    assert partial == 2 and [t.task.id for t in trajs] == ["a"]
    assert trajs[0].turns[0].action.endswith(EMOJI)
    assert [t.task.id for t in read_trajectories(cut_run / "trajectories.jsonl")] == ["a"]


def test_view_and_export_leave_out_a_line_cut_inside_a_character(
    cut_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", str(cut_run)]) == 0
    assert "trajectories.jsonl:2: left out a partial last line" in capsys.readouterr().err
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(cut_run), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "wrote 1 of 1 trajectories" in captured.out and "left out a partial last line" in captured.err


def test_resume_reruns_a_line_cut_inside_a_character(cut_run: Path) -> None:
    res = toolenv.rollout(_env, Unicode(), out=cut_run)
    assert (res.new, res.skipped) == (1, 1)
    trajs = read_trajectories(cut_run / "trajectories.jsonl", strict=True)
    assert sorted(t.task.id for t in trajs) == ["a", "b"]
