"""Resuming a rollout is running the same run again: a task changed under its id, another
seed or other env arguments are refused before anything changes; the same tasks, however
given (the env's own, dicts, a JSONL file), resume."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _examples import load_example

import toolenv
from toolenv.runner import arollout, rollout
from toolenv.trajectory import read_trajectories
from toolenv.types import Task, ToolImage

example = load_example("rollout_example")
ROOT = Path(__file__).resolve().parents[1]


def _tasks() -> list[dict[str, Any]]:
    return json.loads(json.dumps(example.TASKS))  # a deep copy, as a JSONL file would give them


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _unchanged(out: Path) -> tuple[bytes, str]:
    return (out / "trajectories.jsonl").read_bytes(), (out / "run.json").read_text()


def test_a_task_changed_under_its_id_is_refused_not_skipped(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rollout(example.ENV_ID, example.ScriptedAgent(), tasks=_tasks(), n=3, out=out)
    before = _unchanged(out)
    tasks = _tasks()
    tasks[0]["answer"] = "6"  # the same id, another question/answer
    tasks[0]["question"] = "What is 2 + 4?"
    tasks[2]["context"] = {"call": ["lookup", {"fruit": "plum"}]}
    with pytest.raises(ValueError) as err:
        rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks, out=out)
    message = str(err.value)
    assert "2 tasks changed" in message and "'sum-1', 'price'" in message and "--overwrite" in message
    assert "\n" not in message
    assert _unchanged(out) == before  # nothing on disk changed
    res = rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks, out=out, overwrite=True)
    assert res.new == 4 and {t.task.id: t.task.answer for t in res.trajectories}["sum-1"] == "6"


def test_the_same_tasks_resume_however_they_are_given(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rollout(example.ENV_ID, example.ScriptedAgent(), n=1, out=out)  # the env's own tasks
    res = rollout(example.ENV_ID, example.ScriptedAgent(), tasks=_tasks(), n=2, out=out)  # as dicts
    assert (res.new, res.skipped) == (1, 1)
    reordered = [{k: t[k] for k in reversed(list(t))} for t in _tasks()]  # keys in another order
    res = rollout(example.ENV_ID, example.ScriptedAgent(), tasks=_write_jsonl(tmp_path / "t.jsonl", reordered), out=out)
    assert (res.new, res.skipped) == (2, 2)
    tasks = [Task.model_validate(t) for t in _tasks()]  # Task objects, defaults spelled out or not
    tasks[0] = tasks[0].model_copy(update={"prompt": None, "metadata": {}})
    res = rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks, out=out)
    assert (res.new, res.skipped) == (0, 4)


def test_tasks_with_values_json_changes_resume(tmp_path: Path) -> None:
    """Tuples, floats, bytes, NaN and images in a task's context are
    written as JSON; the task read back from the file is the same task as the one given."""
    image = ToolImage(data=example.png(4, 4, (1, 2, 3)), width=4, height=4)

    def tasks() -> list[Task]:
        made = [Task.model_validate(t) for t in _tasks()]
        made[0].context.update({"box": (1, 2, 3.0), "raw": b"abc", "nan": math.nan, "photo": image})
        made[1].metadata.update({"weight": 2.0, "n": 3})
        return made

    for images in ("inline", "files"):
        out = tmp_path / images
        rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks(), n=2, out=out, images=images)
        res = rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks(), out=out, images=images)
        assert (res.new, res.skipped) == (2, 2)
    other = tasks()
    other[0].context["photo"] = ToolImage(data=example.png(4, 4, (9, 9, 9)), width=4, height=4)
    with pytest.raises(ValueError, match=r"1 task changed.*'sum-1'"):
        rollout(example.ENV_ID, example.ScriptedAgent(), tasks=other, out=tmp_path / "files", images="files")


def test_a_task_with_a_real_image_resumes_with_its_image_in_a_file_or_inline(tmp_path: Path) -> None:
    """A task's image as pydantic writes it inline is URL-safe base64 (`-` and `_`, as about every
    real image's has), as a file it is its SHA-256: the same task all the same, whichever
    `images` the run wrote and the resume uses."""
    data = b"\x89PNG\r\n\x1a\n" + bytes(range(256))  # its base64 has "-" and "_" in the URL-safe alphabet

    def tasks() -> list[Task]:
        made = [Task.model_validate(t) for t in _tasks()]
        made[0].context["photo"] = ToolImage(data=data, width=4, height=4)
        return made

    for first, then in [("files", "files"), ("inline", "files"), ("files", "inline")]:
        out = tmp_path / f"{first}-{then}"
        rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks(), n=2, out=out, images=first)
        res = rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks(), out=out, images=then)
        assert (res.new, res.skipped) == (2, 2)
    other = tasks()
    other[0].context["photo"] = ToolImage(data=data[::-1], width=4, height=4)
    with pytest.raises(ValueError, match=r"1 task changed.*'sum-1'"):
        rollout(example.ENV_ID, example.ScriptedAgent(), tasks=other, out=tmp_path / "files-files")


def test_a_task_no_longer_given_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rollout(example.ENV_ID, example.ScriptedAgent(), out=out)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), tasks=_tasks()[2:], out=out)
    assert (res.new, res.skipped) == (0, 2)
    assert res.summary.episodes == 4  # the file, and its summary, still hold sum-1 and sum-2
    assert len(read_trajectories(out / "trajectories.jsonl", strict=True)) == 4


class _FailOn(example.ScriptedAgent):  # type: ignore[name-defined,misc]
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    async def act(self, observation: str, messages: list[Any], env_info: Any) -> Any:
        if env_info.task.id == self.task_id:
            raise RuntimeError("server down (simulated)")
        return await super().act(observation, messages, env_info)


def test_retry_errors_reruns_an_errored_episode_of_a_changed_task(tmp_path: Path) -> None:
    """A line `--retry-errors` drops is no earlier result to keep: its task may change."""
    out = tmp_path / "run"
    rollout(example.ENV_ID, _FailOn("sum-1"), n=2, out=out)
    tasks = _tasks()
    tasks[0]["answer"] = "6"
    res = rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks, n=2, out=out, retry_errors=True)
    assert (res.new, res.skipped) == (1, 1) and res.summary.success_rate == 1.0


def test_cli_refuses_a_changed_task_with_one_line(tmp_path: Path) -> None:
    tasks = _tasks()
    path = _write_jsonl(tmp_path / "tasks.jsonl", tasks)
    cmd = [
        sys.executable,
        "-m",
        "toolenv.cli",
        "rollout",
        f"rollout_example:{example.ENV_ID}",
        "--agent",
        "rollout_example:ScriptedAgent",
        "--tasks",
        str(path),
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
    ]
    env = {"PYTHONPATH": str(ROOT / "examples"), "PATH": "/usr/bin:/bin"}
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    tasks[3]["answer"] = "red"
    _write_jsonl(path, tasks)
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "1 task changed" in again.stderr and "'color'" in again.stderr


def test_another_seed_or_other_env_arguments_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rollout(example.ENV_ID, example.ScriptedAgent(), n=2, seed=7, env_kwargs={"max_turns": 3}, out=out)
    before = _unchanged(out)
    with pytest.raises(ValueError, match=r"ran with seed 7, not 8; use another output directory, or --overwrite"):
        rollout(example.ENV_ID, example.ScriptedAgent(), seed=8, env_kwargs={"max_turns": 3}, out=out)
    with pytest.raises(ValueError, match=r"ran with env_kwargs \{'max_turns': 3\}, not \{'max_turns': 2\}"):
        rollout(example.ENV_ID, example.ScriptedAgent(), seed=7, env_kwargs={"max_turns": 2}, out=out)
    assert _unchanged(out) == before
    # The same run resumes; more samples are more episodes of it (the earlier ones keep their seeds).
    res = rollout(example.ENV_ID, example.ScriptedAgent(), seed=7, samples=2, env_kwargs={"max_turns": 3}, out=out)
    assert (res.new, res.skipped) == (6, 2)
    seeds = {(t.task.id, t.sample): t.seed for t in res.trajectories}
    assert seeds[("sum-1", 0)] == 7 and seeds[("sum-2", 0)] == 8  # as the first run gave them
    for task in ("sum-1", "sum-2", "price", "color"):  # a task's samples never share a seed
        assert seeds[(task, 0)] != seeds[(task, 1)]


class _Gate(example.ScriptedAgent):  # type: ignore[name-defined,misc]
    """Waits at its first action until `open` is set; counts its closes."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.open = asyncio.Event()
        self.closed = 0

    async def act(self, observation: str, messages: list[Any], env_info: Any) -> Any:
        self.waiting.set()
        await self.open.wait()
        return await super().act(observation, messages, env_info)

    async def aclose(self) -> None:
        self.closed += 1


async def test_a_second_run_on_the_same_out_is_refused_while_the_first_writes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = _Gate()
    running = asyncio.ensure_future(arollout(example.ENV_ID, first, n=2, out=out))
    await first.waiting.wait()
    second = _Gate()
    with pytest.raises(RuntimeError, match=r"another run is writing to .*; wait for it to end, or use another"):
        await asyncio.wait_for(arollout(example.ENV_ID, second, out=out), 60)  # not a hang, were it let in
    assert second.closed == 1  # refused, and its agent closed all the same
    first.open.set()
    res = await running
    assert res.new == 2 and first.closed == 1
    second.open.set()
    again = await arollout(example.ENV_ID, second, out=out)  # the first run ended: the lock is free
    assert (again.new, again.skipped) == (2, 2)


class _ClosingEnv(toolenv.ToolEnv):
    closed = 0

    async def aclose(self) -> None:
        type(self).closed += 1
        await super().aclose()


def test_a_refused_run_closes_its_env_and_agent(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rollout(example.ENV_ID, example.ScriptedAgent(), n=2, out=out)

    def make() -> toolenv.ToolEnv:
        return _ClosingEnv(tools=[example.add, example.Lookup(), example.Swatch()], tasks=_tasks(), max_turns=3)

    tasks = _tasks()
    tasks[0]["answer"] = "6"
    for kwargs in ({"tasks": tasks}, {"n": 9}, {"resume": False}):
        agent = _Gate()
        _ClosingEnv.closed = 0
        with pytest.raises((ValueError, FileExistsError)):
            rollout(make, agent, out=out, **kwargs)
        assert (agent.closed, _ClosingEnv.closed) == (1, 1), kwargs


def test_env_arguments_json_cannot_hold_do_not_refuse_a_resume(tmp_path: Path) -> None:
    """An object (a parser) in env_kwargs is recorded in run.json as its text, which names its
    address: an equal object made by the next process is no other run."""
    from toolenv.parsers import get_parser

    out = tmp_path / "run"

    def kwargs() -> dict[str, Any]:
        return {"parser": get_parser("hermes"), "max_turns": 3}

    rollout(example.ENV_ID, example.ScriptedAgent(), n=2, env_kwargs=kwargs(), out=out)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), env_kwargs=kwargs(), out=out)
    assert (res.new, res.skipped) == (2, 2)
    with pytest.raises(ValueError, match="ran with env_kwargs"):
        rollout(example.ENV_ID, example.ScriptedAgent(), env_kwargs={"max_turns": 3}, out=out)  # parser left out


def test_many_changed_tasks_are_counted_and_the_first_few_named(tmp_path: Path) -> None:
    tasks = [{"id": f"t{i}", "question": f"{i}?", "answer": str(i)} for i in range(8)]
    rollout(example.ENV_ID, example.ScriptedAgent(), tasks=tasks, out=tmp_path, concurrency=4)
    changed = [{**t, "answer": "x"} if i != 1 else t for i, t in enumerate(tasks)]
    with pytest.raises(ValueError, match=r"of 7 tasks changed .*: 't0', 't2', 't3', 't4', 't5', \.\.\.; use another"):
        rollout(example.ENV_ID, example.ScriptedAgent(), tasks=changed, out=tmp_path)
