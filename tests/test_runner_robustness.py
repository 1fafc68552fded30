"""The runner keeps its promises on bad data: what it writes it reads back, resume never
drops a line it should not, and a resume is the same run (env, agent, model)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _examples import load_example
from pydantic import BaseModel

import toolenv
from toolenv.agent import Agent, AgentAction, EnvInfo
from toolenv.export import export_chat
from toolenv.report import render_report
from toolenv.rewards.base import Reward, WeightedSum
from toolenv.runner import arollout, rollout
from toolenv.trajectory import Trajectory, TurnRecord, read_trajectories
from toolenv.types import Task

example = load_example("rollout_example")


class Odd(example.ScriptedAgent):  # type: ignore[name-defined,misc]
    """The scripted agent, with what real agents hand back now and then: half an emoji in
    the model's text (sum-2), numpy scalars in metadata (price), an object JSON cannot hold (color)."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        action: AgentAction = await super().act(observation, messages, env_info)
        task = env_info.task.id
        if task == "sum-2":
            action.text += " caf\u00e9 \ud83d"  # a lone surrogate: a server cut an emoji in two
        elif task == "price":
            action.metadata = {"score": np.float32(0.5), "ids": np.arange(3), "n": np.int64(7)}
        elif task == "color" and env_info.turn == 1:
            action.metadata = {"handle": object(), "ok": 1}
        return action


def test_a_value_json_cannot_hold_ends_its_episode_not_the_run(tmp_path: Path) -> None:
    res = rollout(example.ENV_ID, Odd(), concurrency=2, out=tmp_path, images="files")
    path = tmp_path / "trajectories.jsonl"
    on_disk = {t.task.id: t for t in read_trajectories(path, strict=True)}  # every line reads back
    assert sorted(on_disk) == ["color", "price", "sum-1", "sum-2"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] == 4 and summary["interrupted"] is False  # the summary matches the file
    # Lone surrogates are written as U+FFFD; the episode is fine otherwise.
    assert on_disk["sum-2"].turns[-1].action.endswith(" caf\u00e9 \ufffd") and on_disk["sum-2"].error is None
    # numpy values become plain numbers and lists.
    assert on_disk["price"].turns[-1].agent_metadata == {"score": 0.5, "ids": [0, 1, 2], "n": 7}
    assert on_disk["price"].error is None and on_disk["price"].success
    # What cannot be converted is written as null and named in the episode's error.
    color = on_disk["color"]
    assert color.turns[1].agent_metadata == {"handle": None, "ok": 1}
    assert color.error == "could not write turns.1.agent_metadata.handle: object is not JSON (written as null)"
    assert not color.success and color.turns[0].results[0].images  # the rest, image included, is kept
    # The result in memory is what the file holds.
    by_id = {t.task.id: t for t in res.trajectories}
    assert by_id["color"].error == color.error and by_id["sum-2"].turns[-1].action == on_disk["sum-2"].turns[-1].action
    assert res.summary.episodes == 4 and res.summary.episode_errors == 1


def test_to_json_line_names_the_field_it_cannot_write() -> None:
    traj = Trajectory(env_id="e", agent="a", task=Task(id="t", question="q", answer="a"))
    traj.turns.append(TurnRecord(index=0, action="x", agent_metadata={"deep": {"obj": object()}}))
    with pytest.raises(ValueError, match=r"cannot write turns\.0\.agent_metadata\.deep\.obj: object is not JSON"):
        traj.to_json_line()


def test_non_finite_floats_read_back() -> None:
    """A -inf logprob (a token the sampler could not pick) is a legal value: it must survive the file."""
    traj = Trajectory(env_id="e", agent="a", task=Task(id="t", question="q", answer="a"))
    traj.turns.append(TurnRecord(index=0, action="x", logprobs=[-math.inf, -0.5]))
    back = Trajectory.model_validate_json(traj.to_json_line())
    assert back.turns[0].logprobs == [-math.inf, -0.5]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def test_resume_stops_at_an_invalid_line_and_keeps_it(tmp_path: Path) -> None:
    rollout(example.ENV_ID, example.ScriptedAgent(), n=3, out=tmp_path)
    path = tmp_path / "trajectories.jsonl"
    lines = _lines(path)
    annotated = json.loads(lines[1])
    annotated["judge_note"] = "checked by hand"
    lines[1] = json.dumps(annotated) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    before = path.read_bytes()
    with pytest.raises(
        ValueError, match=r"cannot resume: .*trajectories\.jsonl:2: not a valid trajectory \(judge_note"
    ):
        rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path)
    assert path.read_bytes() == before  # nothing deleted, nothing appended
    # An invalid last line that ends with a newline is not a torn write either.
    path.write_text("".join(_lines(path)[:1]) + "[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"trajectories\.jsonl:2: not a valid trajectory"):
        rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path)


class Other(example.ScriptedAgent):  # type: ignore[name-defined,misc]
    name = "other"


class WithModel(example.ScriptedAgent):  # type: ignore[name-defined,misc]
    def __init__(self, model: str | None = None) -> None:
        self.model = model


def test_resume_refuses_another_agent_or_model(tmp_path: Path) -> None:
    rollout(example.ENV_ID, WithModel("qwen-7b"), n=2, out=tmp_path)
    config = (tmp_path / "run.json").read_text()
    before = (tmp_path / "trajectories.jsonl").read_bytes()
    with pytest.raises(
        ValueError, match=r"holds trajectories of agent 'scripted' \(model 'qwen-7b'\), not agent 'other'"
    ):
        rollout(example.ENV_ID, Other(), out=tmp_path)
    with pytest.raises(ValueError, match=r"\(model 'qwen-7b'\), not agent 'scripted' \(model 'llama-8b'\)"):
        rollout(example.ENV_ID, WithModel("llama-8b"), out=tmp_path, retry_errors=True)
    assert (tmp_path / "trajectories.jsonl").read_bytes() == before and (tmp_path / "run.json").read_text() == config
    res = rollout(example.ENV_ID, WithModel("qwen-7b"), out=tmp_path)  # the same run resumes
    assert (res.new, res.skipped) == (2, 2)
    fresh = rollout(example.ENV_ID, Other(), n=1, out=tmp_path, overwrite=True)
    assert fresh.summary.episodes == 1


def test_resume_recomputes_success_at_the_threshold_in_force(tmp_path: Path) -> None:
    res = rollout(example.ENV_ID, example.ScriptedAgent(), n=3, out=tmp_path, success_threshold=2.0)
    assert res.summary.success_rate == 0.0  # every reward is 1.0
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, success_threshold=0.5)
    assert (res.new, res.skipped) == (1, 3)
    assert res.summary.success_rate == 1.0 and all(t.success for t in res.trajectories)
    path = tmp_path / "trajectories.jsonl"
    assert all(t.success for t in read_trajectories(path, strict=True))  # the file says so too
    assert json.loads((tmp_path / "summary.json").read_text())["success_rate"] == 1.0
    assert json.loads((tmp_path / "run.json").read_text())["success_threshold"] == 0.5
    assert export_chat(read_trajectories(path), tmp_path / "sft.jsonl", success_only=True) == 4


def test_negative_seed_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -2"):
        rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path / "run", seed=-2)
    assert not (tmp_path / "run").exists()


class NanEnv(toolenv.ToolEnv):
    """An env whose step reward is NaN without going through WeightedSum (a subclass's own scoring)."""

    async def astep(self, action: str, *, parsed: Any = None) -> Any:
        obs, _, term, trunc, info = await super().astep(action, parsed=parsed)
        self.episode.turns[-1].reward_components = {"mine": math.nan}  # type: ignore[union-attr]
        return obs, math.nan, term, trunc, info


def test_a_non_finite_reward_from_the_env_is_an_episode_error(tmp_path: Path) -> None:
    tasks = [{"id": f"t{i}", "question": "2+3?", "answer": "5"} for i in range(2)]

    def make() -> toolenv.ToolEnv:
        return NanEnv(tools=[], tasks=tasks, max_turns=2)

    class Answers(Agent):
        name = "answers"

        async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
            return AgentAction(text="<answer>5</answer>")

    res = rollout(make, Answers(), out=tmp_path)
    assert res.summary.episodes == 2 and math.isfinite(res.summary.mean_reward)
    for traj in read_trajectories(tmp_path / "trajectories.jsonl", strict=True):
        assert traj.error == "env step 0 gave a non-finite reward (mine=nan); recorded as 0"
        assert traj.reward == 0.0 and traj.turns[0].reward_components == {"mine": 0.0} and not traj.success
    again = rollout(make, Answers(), out=tmp_path)
    assert (again.new, again.skipped) == (0, 2)  # what was written reads back: resume skips it


def test_the_report_survives_non_finite_numbers_in_memory() -> None:
    import re

    traj = Trajectory(env_id="e", agent="a", task=Task(id="t", question="q", answer="a"), reward=math.nan)
    page = render_report([traj])
    data = re.search(r'class="report-data">(.*?)</script>', page, re.S)
    assert data is not None

    def refuse(name: str) -> Any:
        raise ValueError(f"JSON.parse rejects {name}")

    episode = json.loads(data.group(1), parse_constant=refuse)["episodes"][0]
    assert episode["reward"] == "NaN"


class _Logged(toolenv.Tool):
    """A tool that logs its calls and waits a little, as a network call would."""

    name = "ping"
    log: list[str] = []  # noqa: RUF012 - set per test

    class Args(BaseModel):
        x: int

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        self.log.append("call")
        await asyncio.sleep(0.05)
        return toolenv.ToolResult(text="pong")


class _Pinging(Agent):
    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        return AgentAction(text='<tool_call>{"name": "ping", "arguments": {"x": 1}}</tool_call>')


def test_each_worker_builds_its_env_when_it_takes_its_first_task(tmp_path: Path) -> None:
    """Episodes start at once, not after every env is built: the first episode acts before the
    second env's build, and each later worker builds its env just before its episode."""
    log: list[str] = []
    tool = _Logged()
    tool.log = log
    tasks = [{"id": f"t{i}", "question": "q", "answer": "a"} for i in range(6)]

    class Acting(_Pinging):
        async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
            log.append("act")
            return await super().act(observation, messages, env_info)

    def make() -> toolenv.ToolEnv:
        log.append("build")
        return toolenv.ToolEnv(tools=[tool], tasks=tasks, max_turns=1)

    res = rollout(make, Acting(), concurrency=3, out=tmp_path)
    assert res.summary.episodes == 6 and res.summary.tool_error_rate == 0
    # The first env is built up front (it names the tasks); workers 2 and 3 build theirs on demand.
    steps = [e for e in log if e != "call"]  # when a tool's first line runs differs on Python 3.10
    assert steps[:6] == ["build", "act", "build", "act", "build", "act"]
    assert log.count("build") == 3 and log.count("call") == 6


def test_a_worker_that_fails_stops_the_others_and_keeps_what_was_written(tmp_path: Path) -> None:
    """An env that cannot be built ends the run with its error; the other workers are stopped,
    not left to run and write after the run has failed, and what was written is kept."""
    log: list[str] = []
    tool = _Logged()
    tool.log = log
    tasks = [{"id": f"t{i}", "question": "q", "answer": "a"} for i in range(8)]

    def make() -> toolenv.ToolEnv:
        if log.count("build") == 2:
            raise RuntimeError("no more envs today")
        log.append("build")
        return toolenv.ToolEnv(tools=[tool], tasks=tasks, max_turns=2)

    async def run() -> int:
        with pytest.raises(RuntimeError, match="no more envs today"):
            await arollout(make, _Pinging(), concurrency=3, out=tmp_path)
        calls = log.count("call")
        assert asyncio.all_tasks() == {asyncio.current_task()}  # no worker was left running
        for _ in range(50):  # nor anything it started: let the loop step, no more calls come
            await asyncio.sleep(0)
        assert log.count("call") == calls
        return calls

    assert asyncio.run(run()) >= 1
    written = read_trajectories(tmp_path / "trajectories.jsonl", strict=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] == len(written)  # the summary counts what the file holds
    assert summary["interrupted"] is True  # a run that failed did not finish: not a whole run's summary


def test_overwrite_clears_the_earlier_runs_images_and_nothing_else(tmp_path: Path) -> None:
    """A run started afresh in the same directory left every earlier image file in `images/`,
    referred to by no line; a resumed run keeps them (its lines refer to them)."""
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, images="files")
    images = tmp_path / "images"
    earlier = sorted(p.name for p in images.iterdir())
    assert earlier
    stale = images / f"{'0' * 64}.png"  # as an image of another task would be
    stale.write_bytes(b"old")
    mine = images / "notes.txt"  # not the store's: left alone
    mine.write_text("keep")
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, images="files", resume=True)
    assert stale.exists()
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, images="files", overwrite=True)
    assert not stale.exists() and mine.read_text() == "keep"
    assert sorted(p.name for p in images.iterdir() if p != mine) == earlier  # this run's own, rewritten
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, overwrite=True)  # inline images now
    assert [p.name for p in images.iterdir()] == ["notes.txt"]


def test_resume_reads_an_env_id_with_its_module_prefix_as_the_same_env(tmp_path: Path) -> None:
    """`module:ns/Name-v0` is Gymnasium's way to say "import module, then make ns/Name-v0": the
    same env as `ns/Name-v0`, so a run started one way resumes the other, and records the id."""
    prefixed = f"rollout_example:{example.ENV_ID}"
    first = rollout(prefixed, example.ScriptedAgent(), n=2, out=tmp_path)
    assert {t.env_id for t in first.trajectories} == {example.ENV_ID}
    assert json.loads((tmp_path / "run.json").read_text())["env_id"] == prefixed  # the command as given
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path)
    assert (res.new, res.skipped) == (2, 2)
    # A file written by an older version with the prefix in it resumes too.
    path = tmp_path / "trajectories.jsonl"
    path.write_text(path.read_text().replace(f'"env_id":"{example.ENV_ID}"', f'"env_id":"{prefixed}"'))
    assert prefixed in path.read_text()
    again = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path)
    assert again.new == 0
    with pytest.raises(ValueError, match=r"holds trajectories of 'rollout_example:rollout_example/Calc-v0'"):
        rollout("toolenv/Spider-v0", example.ScriptedAgent(), out=tmp_path)


class _Full(Reward):
    """A part every episode earns in full."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def final(self, episode: Any) -> float:
        return 1.0


def test_a_perfect_score_whose_weights_sum_to_one_in_floats_is_a_success(tmp_path: Path) -> None:
    """Weights 0.6, 0.3 and 0.1 make a perfect episode's reward 0.9999999999999999 in floats:
    at the default threshold of 1.0 it counted as a failure, and so did pass@k."""

    parts = {"answer": (_Full("answer"), 0.6), "format": (_Full("format"), 0.3), "tools": (_Full("tools"), 0.1)}

    def make() -> toolenv.ToolEnv:
        return example.make_env(reward=WeightedSum(parts))

    res = rollout(make, example.ScriptedAgent(), samples=2, out=tmp_path)
    assert {t.reward for t in res.trajectories} == {0.6 + 0.3 + 0.1} != {1.0}
    assert all(t.success for t in res.trajectories)
    assert res.summary.success_rate == 1.0 and res.summary.pass_at_k == {"1": 1.0, "2": 1.0}
    again = rollout(make, example.ScriptedAgent(), samples=2, out=tmp_path, success_threshold=1.0)
    assert again.new == 0 and again.summary.success_rate == 1.0  # recomputed on resume alike
    strict = rollout(make, example.ScriptedAgent(), samples=2, out=tmp_path, success_threshold=1.001)
    assert strict.summary.success_rate == 0.0  # a threshold above the reward still fails it


class RawBytes(example.ScriptedAgent):  # type: ignore[name-defined,misc]
    """Puts bytes that are not UTF-8 (a PNG's, as a dataset's image column holds them) in its metadata."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        action: AgentAction = await super().act(observation, messages, env_info)
        if env_info.task.id == "price" and env_info.turn == 1:
            action.metadata = {"raw": b"\x89PNG\r\n", "text": b"plain", "nan": math.nan}
        return action


@pytest.mark.parametrize("images", ["inline", "files"])
def test_bytes_that_are_not_utf8_end_their_episode_not_the_run(tmp_path: Path, images: str) -> None:
    res = rollout(example.ENV_ID, RawBytes(), out=tmp_path, images=images)
    on_disk = {t.task.id: t for t in read_trajectories(tmp_path / "trajectories.jsonl", strict=True)}
    assert sorted(on_disk) == ["color", "price", "sum-1", "sum-2"] and res.summary.episodes == 4
    price = on_disk["price"]
    assert price.error == "could not write turns.1.agent_metadata.raw: bytes that are not UTF-8 (written as null)"
    assert price.turns[1].agent_metadata["raw"] is None and price.turns[1].agent_metadata["text"] == "plain"
    assert on_disk["color"].turns[0].results[0].images[0].data.startswith(b"\x89PNG")  # real images untouched
    traj = Trajectory(env_id="e", agent="a", task=Task(id="t", context={"image": {"bytes": b"\xff\xd8"}}))
    traj.turns.append(TurnRecord(index=0, action="x", results=[on_disk["color"].turns[0].results[0]]))
    with pytest.raises(ValueError, match=r"cannot write task\.context\.image\.bytes: bytes that are not UTF-8"):
        traj.to_json_line()
