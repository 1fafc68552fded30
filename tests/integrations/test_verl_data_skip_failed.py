"""`toolenv verl-data --skip-failed` / `build_rows(skip_failed=True)`: a task whose reset fails.

The row builder stopped at the first task whose reset raised (an unreadable photo among
thousands), naming neither the task nor a way on, so one bad task cost the whole file. Now the
error names the task and the flag, and with the flag such tasks are left out and reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="the parquet writer needs pyarrow (pip install 'toolenv[verl]')")

import gymnasium as gym

import toolenv
from toolenv.integrations.verl.data import build_rows, split_tasks
from toolenv.types import Task

FLAKY = "toolenv-test/VerlDataFlakyReset-v0"
CALC = "toolenv.integrations.verl.demo:Calculator"


class FlakyResetEnv(toolenv.ToolEnv):
    """Renders a task's prompt unless its `context["image"]` is "corrupt" (as an unreadable photo fails)."""

    async def arender_prompt(self, task: Task) -> tuple[str, list[toolenv.Message]]:
        if task.context.get("image") == "corrupt":
            raise OSError(f"cannot identify image file 'photos/{task.id}.jpg'")
        return await super().arender_prompt(task)


def _flaky_env(**kwargs: Any) -> FlakyResetEnv:
    return FlakyResetEnv(**kwargs)


if FLAKY not in gym.registry:
    gym.register(FLAKY, entry_point=_flaky_env)


def _tasks(bad: set[int], n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"t{i}",
            "question": f"{i} + 1?",
            "answer": str(i + 1),
            "context": {"image": "corrupt"} if i in bad else {},
        }
        for i in range(n)
    ]


def test_a_failing_reset_names_the_task_and_the_flag():
    with pytest.raises(
        ValueError, match=r"task 't1'.*skip_failed=True.*--skip-failed.*OSError: cannot identify"
    ) as exc:
        build_rows(FLAKY, env_kwargs={"tasks": _tasks({1, 3}, 5)})
    assert isinstance(exc.value.__cause__, OSError)  # the reset's own error, kept as the cause


def test_skip_failed_leaves_the_failing_tasks_out_and_says_which():
    skipped: list[tuple[str, str]] = []
    rows = build_rows(
        FLAKY, env_kwargs={"tasks": _tasks({1, 3}, 5), "tools": [CALC]}, skip_failed=True, skipped=skipped
    )
    assert [r["extra_info"]["task_id"] for r in rows] == ["t0", "t2", "t4"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2]  # the rows kept, with no gaps
    assert [r["prompt"][-1]["content"] for r in rows] == ["0 + 1?", "2 + 1?", "4 + 1?"]
    assert [task_id for task_id, _ in skipped] == ["t1", "t3"]
    assert skipped[0][1] == "OSError: cannot identify image file 'photos/t1.jpg'"


def test_skip_failed_keeps_the_split_and_the_limit_of_the_tasks():
    """`split` and `limit` choose tasks before any reset: a skipped task is not replaced by another."""
    tasks = _tasks(set(range(0, 40, 3)), 40)
    env = FlakyResetEnv(tasks=tasks)
    for split in ("train", "test"):
        chosen = split_tasks(env.tasks, split)[:20]
        expected = [t.id for t in chosen if t.context.get("image") != "corrupt"]
        skipped: list[tuple[str, str]] = []
        rows = build_rows(FLAKY, env_kwargs={"tasks": tasks}, split=split, limit=20, skip_failed=True, skipped=skipped)
        assert [r["extra_info"]["task_id"] for r in rows] == expected
        assert {r["extra_info"]["split"] for r in rows} == {split}
        assert len(rows) + len(skipped) == len(chosen)


def test_skip_failed_still_fails_when_every_task_does():
    with pytest.raises(ValueError, match=r"every one of the 3 tasks.*task 't0': OSError: cannot identify"):
        build_rows(FLAKY, env_kwargs={"tasks": _tasks({0, 1, 2}, 3)}, skip_failed=True)


def _main(*args: str) -> int:
    from toolenv.cli import main

    return main(["verl-data", *args])


def test_cli_skip_failed_reports_the_count_and_the_first_reasons(tmp_path, capsys):
    import pyarrow.parquet as pq

    out = tmp_path / "d.parquet"
    env_kwargs = json.dumps({"tasks": _tasks({0, 2, 3, 4, 5, 6, 7}, 9)})
    assert _main(FLAKY, "--out", str(out), "--env-kwargs", env_kwargs, "--skip-failed") == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "skipped 7 of 9 tasks whose reset failed:"
    assert err[1] == "  task 't0': OSError: cannot identify image file 'photos/t0.jpg'"
    assert [line.split("'")[1] for line in err[1:6]] == ["t0", "t2", "t3", "t4", "t5"]  # the first five
    assert err[6] == "  ... and 2 more"
    rows = pq.read_table(out).to_pylist()
    assert [(r["extra_info"]["index"], r["extra_info"]["task_id"]) for r in rows] == [(0, "t1"), (1, "t8")]


def test_cli_without_the_flag_stops_in_one_line_naming_it(tmp_path, capsys):
    out = tmp_path / "d.parquet"
    env_kwargs = json.dumps({"tasks": _tasks({1}, 3)})
    assert _main(FLAKY, "--out", str(out), "--env-kwargs", env_kwargs) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "task 't1'" in line and "--skip-failed" in line and "cannot identify image file" in line
    assert not out.exists()


def test_cli_fails_in_one_line_when_every_task_fails(tmp_path, capsys):
    out = tmp_path / "d.parquet"
    env_kwargs = json.dumps({"tasks": _tasks({0, 1}, 2)})
    assert _main(FLAKY, "--out", str(out), "--env-kwargs", env_kwargs, "--skip-failed") == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("toolenv verl-data: error: ") and "every one of the 2 tasks" in line
    assert not out.exists()


def test_cli_skips_an_unreadable_photo_of_visual_search(tmp_path):
    """The reviewer's case: VisualSearch tasks, one photo not an image; the real command, in a subprocess."""
    pytest.importorskip("toolenv_vision", reason="VisualSearch-v0 comes from toolenv-vision")
    import pyarrow.parquet as pq
    from PIL import Image

    Image.new("RGB", (64, 48), "white").save(tmp_path / "good.png")
    (tmp_path / "corrupt.jpg").write_bytes(b"this is not a jpeg")
    tasks = tmp_path / "tasks.jsonl"
    lines = [
        {"id": "corrupt", "question": "What is shown?", "answer": "a", "context": {"image": "corrupt.jpg"}},
        {"id": "good", "question": "What is shown?", "answer": "a", "context": {"image": "good.png"}},
    ]
    tasks.write_text("".join(json.dumps(t) + "\n" for t in lines))
    out = tmp_path / "vs.parquet"
    env_kwargs = json.dumps({"tasks": str(tasks), "image_root": str(tmp_path)})

    def cli(*flags: str) -> subprocess.CompletedProcess[str]:
        args = ["toolenv/VisualSearch-v0", "--out", str(out), "--env-kwargs", env_kwargs, *flags]
        return subprocess.run(
            [sys.executable, "-m", "toolenv.cli", "verl-data", *args], capture_output=True, text=True, timeout=120
        )

    stopped = cli()
    assert stopped.returncode == 2 and not out.exists()
    [line] = stopped.stderr.strip().splitlines()
    assert "task 'corrupt'" in line and "--skip-failed" in line

    skipped = cli("--skip-failed")
    assert skipped.returncode == 0, skipped.stderr
    err = skipped.stderr.splitlines()
    assert err[0] == "skipped 1 of 2 tasks whose reset failed:" and err[1].startswith("  task 'corrupt': ")

    rows = pq.read_table(out).to_pylist()
    assert [(r["extra_info"]["index"], r["extra_info"]["task_id"]) for r in rows] == [(0, "good")]
    assert len(rows[0]["images"]) == 1


def test_rows_are_unchanged_without_failures():
    """No failing task: the rows are what they were (the flag changes nothing then)."""
    tasks = _tasks(set(), 4)
    assert build_rows(FLAKY, env_kwargs={"tasks": tasks}, skip_failed=True) == build_rows(
        FLAKY, env_kwargs={"tasks": tasks}
    )
