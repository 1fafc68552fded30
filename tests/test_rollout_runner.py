"""The rollout runner on the example env (real tools, real files, real subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _examples import load_example
from pydantic import BaseModel

import toolenv
from toolenv.agent import Agent, AgentAction, AgentError, EnvInfo, load_agent
from toolenv.registry import PluginError
from toolenv.runner import arollout, rollout
from toolenv.trajectory import read_trajectories

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
example = load_example("rollout_example")


class Flaky(Agent):
    """Solves tasks like the scripted agent but fails on the task named in `fail`."""

    name = "scripted"  # the scripted agent with a flaky server: resuming with ScriptedAgent is the same run

    def __init__(self, fail: str = "price") -> None:
        self.fail = fail

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        if env_info.task.id == self.fail:
            raise AgentError("server down (simulated)")
        return await example.ScriptedAgent().act(observation, messages, env_info)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), env.get("PYTHONPATH", "")])
    return env


def test_rollout_records_typed_trajectories(tmp_path: Path) -> None:
    res = rollout(example.ENV_ID, example.ScriptedAgent(), concurrency=3, out=tmp_path / "run")
    assert res.summary.episodes == 4 and res.summary.success_rate == 1.0 and res.summary.mean_reward == 1.0
    assert res.summary.tool_mix == {"add": 2, "lookup": 1, "swatch": 1}
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 4
    trajs = {t.task.id: t for t in read_trajectories(tmp_path / "run" / "trajectories.jsonl", strict=True)}
    color = trajs["color"]
    assert color.env_id == example.ENV_ID and color.agent == "scripted" and color.success
    first = color.turns[0]
    assert first.parsed.tool_calls[0].name == "swatch"
    assert first.results[0].images[0].data.startswith(b"\x89PNG")  # image survives the JSON round trip
    assert first.calls[0].name == "swatch" and first.calls[0].latency_s >= 0
    assert color.turns[1].reward_components == {"exact_match": 1.0}
    assert trajs["price"].turns[0].results[0].metadata["rows"] == [["pear", 5]]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["episodes"] == 4 and summary["tool_latency_s"]["count"] == 4
    config = json.loads((tmp_path / "run" / "run.json").read_text())
    assert config["env_id"] == example.ENV_ID and config["tune_gc"] is True


def test_agent_error_is_recorded_not_raised(tmp_path: Path) -> None:
    res = rollout(example.ENV_ID, Flaky("price"), out=tmp_path)
    by_id = {t.task.id: t for t in res.trajectories}
    assert "server down" in (by_id["price"].error or "") and not by_id["price"].success
    assert by_id["price"].turns == []
    assert all(t.success for k, t in by_id.items() if k != "price")
    assert res.summary.episode_errors == 1 and res.summary.success_rate == 0.75


def test_resume_skips_finished_and_retries_errors(tmp_path: Path) -> None:
    rollout(example.ENV_ID, Flaky("sum-2"), out=tmp_path, n=2)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path)
    assert (res.new, res.skipped) == (2, 2)
    assert res.summary.episodes == 4 and res.summary.episode_errors == 1
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, retry_errors=True)
    assert (res.new, res.skipped) == (1, 3)
    assert res.summary.episode_errors == 0 and res.summary.success_rate == 1.0
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 4


def test_resume_drops_a_partial_last_line(tmp_path: Path) -> None:
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, n=2)
    path = tmp_path / "trajectories.jsonl"
    path.write_text(path.read_text() + '{"schema_version": 1, "env_id": "rollout_ex')  # a killed write
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path)
    assert (res.new, res.skipped) == (2, 2)
    assert len(read_trajectories(path, strict=True)) == 4


def test_a_resume_that_rewrites_the_file_keeps_its_permissions_and_its_link(tmp_path: Path) -> None:
    """Dropping a killed write's partial line rewrites the file: a private run (`chmod 600`) stays
    private, and a file kept elsewhere through a symlink is the one rewritten and appended to."""
    elsewhere = tmp_path / "store" / "calc.jsonl"
    elsewhere.parent.mkdir()
    out = tmp_path / "run"
    out.mkdir()
    (out / "trajectories.jsonl").symlink_to(elsewhere)
    rollout(example.ENV_ID, example.ScriptedAgent(), n=2, out=out)
    elsewhere.chmod(0o600)
    elsewhere.write_text(elsewhere.read_text() + '{"schema_version": 1, "env_id": "rollout_ex')  # a killed write
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=out)
    assert (res.new, res.skipped) == (2, 2)
    assert (out / "trajectories.jsonl").is_symlink() and elsewhere.stat().st_mode & 0o777 == 0o600
    assert len(read_trajectories(elsewhere, strict=True)) == 4


def test_samples_and_seeds(tmp_path: Path) -> None:
    res = rollout(example.ENV_ID, example.ScriptedAgent(), n=2, samples=3, seed=10, out=tmp_path)
    keys = sorted(t.key for t in res.trajectories)
    assert keys == [("sum-1", 0), ("sum-1", 1), ("sum-1", 2), ("sum-2", 0), ("sum-2", 1), ("sum-2", 2)]
    assert sorted(t.seed for t in res.trajectories) == list(range(10, 16))


def test_factory_env_and_bad_arguments(tmp_path: Path) -> None:
    res = rollout(lambda: example.make_env(max_turns=1), example.ScriptedAgent(), n=1)
    assert res.trajectories[0].truncated and res.trajectories[0].reward == 0.0 and res.out is None
    with pytest.raises(ValueError, match="only 4 tasks"):
        rollout(example.ENV_ID, example.ScriptedAgent(), n=9)
    rollout(example.ENV_ID, example.ScriptedAgent(), n=1, out=tmp_path)
    with pytest.raises(FileExistsError):
        rollout(example.ENV_ID, example.ScriptedAgent(), n=1, out=tmp_path, resume=False)
    with pytest.raises(PluginError, match="no agent named"):
        load_agent("no-such-agent")


def test_rollout_and_tool_stay_functions_after_every_submodule_import() -> None:
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(toolenv.__path__):
        if not mod.name.startswith("integrations"):
            importlib.import_module(f"toolenv.{mod.name}")
    res = toolenv.rollout(example.ENV_ID, example.ScriptedAgent(), n=1)
    assert res.summary.episodes == 1
    assert toolenv.tool(lambda: "x").name == "<lambda>"


class Meeting(Agent):
    """The scripted agent, whose first action in each episode waits until `n` episodes are at
    theirs: episodes run one after another never all meet (each gives up after 10 s)."""

    name = "scripted"

    def __init__(self, n: int) -> None:
        import asyncio

        self.n = n
        self.counts = {"arrived": 0, "met": 0}  # shared by the per-episode copies (`spawn`)
        self.all_in = asyncio.Event()

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        import asyncio

        if env_info.turn == 0:  # the episode's first action
            self.counts["arrived"] += 1
            if self.counts["arrived"] == self.n:
                self.all_in.set()
            try:
                await asyncio.wait_for(self.all_in.wait(), 10)
                self.counts["met"] += 1
            except asyncio.TimeoutError:  # not TimeoutError on Python 3.10
                self.all_in.set()  # one at a time: let the rest go on without waiting
        return await example.ScriptedAgent().act(observation, messages, env_info)


async def test_arollout_runs_concurrently() -> None:
    agent = Meeting(4)
    res = await arollout(example.ENV_ID, agent, concurrency=4)
    assert res.summary.episodes == 4 and res.summary.success_rate == 1.0
    assert agent.counts == {"arrived": 4, "met": 4}  # all four episodes were at their first action at once


def test_cli_rollout_then_resume(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "toolenv.cli",
        "rollout",
        f"rollout_example:{example.ENV_ID}",
        "--agent",
        "rollout_example:ScriptedAgent",
        "-n",
        "3",
        "-c",
        "2",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "success rate" in out.stdout and "100.0%" in out.stdout
    assert "3 new, 0 already done" in out.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert "0 new, 3 already done" in again.stdout


def test_cli_error_is_one_line(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "toolenv.cli",
        "rollout",
        "toolenv/ToolEnv-v0",
        "--agent",
        "no-such-agent",
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "no agent named 'no-such-agent'" in out.stderr


def test_ctrl_c_keeps_written_trajectories(tmp_path: Path) -> None:
    slow = tmp_path / "slow_agent.py"
    slow.write_text(
        "import asyncio\nfrom rollout_example import ScriptedAgent\n"
        "class Slow(ScriptedAgent):\n"
        "    async def act(self, o, m, i):\n"
        "        await asyncio.sleep(0.0 if i.task.id == 'sum-1' else 30)\n"
        "        return await super().act(o, m, i)\n"
    )
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    cmd = [
        sys.executable,
        "-m",
        "toolenv.cli",
        "rollout",
        f"rollout_example:{example.ENV_ID}",
        "--agent",
        "slow_agent:Slow",
        "-c",
        "4",
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    path = tmp_path / "run" / "trajectories.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (path.exists() and path.read_text().count("\n") >= 1):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "1 trajectories kept" in err
    kept = read_trajectories(path, strict=True)
    assert [t.task.id for t in kept] == ["sum-1"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["interrupted"] is True


def test_progress_into_a_log_file_is_plain_lines(tmp_path: Path) -> None:
    """Without a terminal (nohup, Slurm, `2> log`) Rich draws nothing until the run ends, then
    one frame cut at 80 columns: an hours-long run showed no progress at all. There the
    progress is plain lines instead, one at the start, then as the run goes, and one at the end."""
    cmd = [sys.executable, "-m", "toolenv.cli", "rollout", f"rollout_example:{example.ENV_ID}"]
    cmd += ["--agent", "rollout_example:ScriptedAgent", "--samples", "2", "--out", str(tmp_path)]
    env = {k: v for k, v in _env().items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    log = tmp_path / "stderr.log"
    with log.open("w") as err:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, timeout=120)
    assert out.returncode == 0, log.read_text()
    lines = log.read_text().splitlines()
    assert lines[0].startswith(f"{example.ENV_ID}: 0/8 episodes")
    assert lines[-1].startswith(f"{example.ENV_ID}: 8/8 episodes | reward 1.000 | tool errors 0")
    assert all(line.startswith(f"{example.ENV_ID}: ") for line in lines)
    assert "\u2026" not in log.read_text() and "\x1b" not in log.read_text()  # no cut frame, no escapes


def test_plain_progress_reports_as_the_run_goes() -> None:
    import io

    from toolenv.report.console import Progress

    stream = io.StringIO()
    bar = Progress(3, stream=stream, label="calc", plain_interval=0.0)
    done = rollout(example.ENV_ID, example.ScriptedAgent(), n=3).trajectories
    with bar:
        for t in done:
            bar.update(t)
    lines = stream.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [f"calc: {i}/3 episodes" for i in range(4)]


def test_example_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "rollout_example.py"), str(tmp_path / "calc")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "mean reward 1.00 over 4 episodes" in out.stdout
    assert (tmp_path / "calc" / "report.html").stat().st_size > 1000
    assert [p.suffix for p in (tmp_path / "calc" / "images").iterdir()] == [".png"]  # the swatch, as a file
    config = json.loads((tmp_path / "calc" / "run.json").read_text())
    assert config["images"] == "files" and config["episode_timeout"] == 60.0


class Stalls(Agent):
    """The scripted agent, except that on `task_id` it stalls at turn `turn` (a hung server)."""

    name = "scripted"

    def __init__(self, task_id: str, turn: int) -> None:
        self.task_id, self.turn = task_id, turn
        self.cancelled: list[str] = []  # shared by the spawned copies

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        import asyncio

        if env_info.task.id == self.task_id and env_info.turn == self.turn:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.append(env_info.task.id)
                raise
        return await example.ScriptedAgent().act(observation, messages, env_info)


def test_episode_timeout_stops_a_stalled_agent_and_keeps_its_turns(tmp_path: Path) -> None:
    agent = Stalls("color", turn=1)
    res = rollout(example.ENV_ID, agent, concurrency=2, out=tmp_path, episode_timeout=0.5)
    by_id = {t.task.id: t for t in res.trajectories}
    stalled = by_id["color"]
    assert stalled.error == "episode timed out after 0.5 s, during the agent's turn 1"
    assert len(stalled.turns) == 1 and stalled.turns[0].parsed.tool_calls[0].name == "swatch"  # turn 0 kept
    assert 0.5 <= stalled.duration_s < 5.0 and not stalled.success
    assert agent.cancelled == ["color"]  # the hung call was cancelled, not left running
    assert all(t.success for k, t in by_id.items() if k != "color")
    assert res.summary.episode_errors == 1
    assert json.loads((tmp_path / "run.json").read_text())["episode_timeout"] == 0.5
    again = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, retry_errors=True)
    assert again.new == 1 and again.summary.success_rate == 1.0  # --retry-errors reruns it


class Hang(toolenv.Tool):
    """Wait far longer than the episode may take (within its own 60 s timeout)."""

    name = "hang"

    class Args(BaseModel):
        seconds: float

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        import asyncio

        await asyncio.sleep(args.seconds)
        return toolenv.ToolResult(text="done")


def test_episode_timeout_stops_a_hanging_env_step() -> None:
    def make() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Hang(timeout=60)], tasks=[{"id": "s", "question": "q", "answer": "a"}])

    class Sleeper(Agent):
        async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
            return AgentAction(text='<tool_call>{"name": "hang", "arguments": {"seconds": 30}}</tool_call>')

    res = rollout(make, Sleeper(), episode_timeout=0.3)
    (traj,) = res.trajectories
    assert traj.error == "episode timed out after 0.3 s, during env step 0" and traj.turns == []
    assert traj.duration_s < 5.0


@pytest.mark.parametrize("where", ["env step", "agent turn"])
async def test_a_stopped_run_with_an_episode_timeout_leaves_no_call_running(where: str) -> None:
    """Ctrl-C or SIGTERM cancels the run: the agent call or env step in flight under an episode
    timeout is cancelled and over before the envs are closed and `arollout` ends, as it is
    without a timeout (it went on running after the run, its cleanup after its env's close)."""
    import asyncio

    log: list[str] = []
    started = asyncio.Event()

    async def hang() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            log.append("call cancelled")
            await asyncio.sleep(0.05)  # a cleanup that takes a while, as closing a connection does
            log.append("call cleaned up")

    class Hanging(toolenv.Tool):
        name = "hang"

        class Args(BaseModel):
            x: int

        async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
            await hang()
            return toolenv.ToolResult(text="done")

    class Closing(toolenv.ToolEnv):
        async def aclose(self) -> None:
            log.append("env closed")
            await super().aclose()

    class Calling(Agent):
        async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
            if where == "agent turn":
                await hang()
            return AgentAction(text='<tool_call>{"name": "hang", "arguments": {"x": 1}}</tool_call>')

    def make() -> toolenv.ToolEnv:
        return Closing(tools=[Hanging(timeout=3600)], tasks=[{"id": "s", "question": "q", "answer": "a"}])

    run = asyncio.ensure_future(arollout(make, Calling(), episode_timeout=3600))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert log == ["call cancelled", "call cleaned up", "env closed"]
    assert asyncio.all_tasks() == {asyncio.current_task()}


def test_episode_timeout_must_be_positive(tmp_path: Path) -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="episode_timeout must be a positive number of seconds"):
            rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, episode_timeout=bad)


# ---------------------------------------------------------------------- at scale
def _live_trajectories() -> int:
    import gc

    from toolenv.trajectory import Trajectory

    gc.collect()
    return sum(type(o) is Trajectory for o in gc.get_objects())


async def test_keep_trajectories_false_holds_no_finished_episode(tmp_path: Path) -> None:
    """A long run's memory must not grow with its length: without `keep_trajectories`, neither
    the episodes written so far nor those of the run being resumed stay alive."""
    await arollout(example.ENV_ID, example.ScriptedAgent(), samples=10, concurrency=4, out=tmp_path, tune_gc=False)
    before = _live_trajectories()  # in a whole test session, earlier tests may hold some
    live: list[int] = []
    res = await arollout(
        example.ENV_ID,
        example.ScriptedAgent(),
        samples=25,
        concurrency=4,
        out=tmp_path,
        tune_gc=False,
        keep_trajectories=False,
        on_trajectory=lambda t: live.append(_live_trajectories()),
    )
    assert (res.new, res.skipped, res.summary.episodes) == (60, 40, 100)
    assert res.trajectories == []
    assert len(live) == 60 and max(live) - before <= 8  # the 40 resumed and the 59 written before are gone
    keys = [t.key for t in read_trajectories(tmp_path / "trajectories.jsonl", strict=True)]
    assert len(keys) == len(set(keys)) == 100


def test_keep_trajectories_default_returns_every_episode(tmp_path: Path) -> None:
    rollout(example.ENV_ID, example.ScriptedAgent(), n=2, out=tmp_path)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), samples=2, out=tmp_path)
    ids = ["color", "price", "sum-1", "sum-2"]
    assert sorted(t.key for t in res.trajectories) == [(i, s) for i in ids for s in (0, 1)]


def test_cli_keeps_no_trajectory_in_memory_and_still_names_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`toolenv rollout` reads its one error example from the file, not from a list of every episode."""
    import toolenv.runner
    from toolenv.cli import main

    rollout(f"rollout_example:{example.ENV_ID}", Flaky("sum-2"), n=2, out=tmp_path)  # an earlier run, an error
    asked: list[bool] = []
    real = toolenv.runner.arollout

    async def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["keep_trajectories"])
        return await real(*args, **kwargs)

    monkeypatch.setattr(toolenv.runner, "arollout", spy)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    argv = ["rollout", f"rollout_example:{example.ENV_ID}", "--agent", "rollout_example:ScriptedAgent"]
    assert main([*argv, "--out", str(tmp_path), "--no-progress"]) == 0
    assert asked == [False]
    out, err = capsys.readouterr()
    assert "2 new, 2 already done" in out
    assert "1 episode(s) ended with an error, e.g.: agent failed on turn 0: AgentError: server down" in err


def test_workers_do_not_each_read_every_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering the plugin envs reads every installed distribution's entry points (~4 ms,
    more in a big environment): once per worker, `-c 1024` spent seconds on it."""
    import toolenv._gym

    calls: list[int] = []
    real = toolenv._gym.register_envs

    def counting() -> list[str]:
        calls.append(1)
        return real()

    monkeypatch.setattr(toolenv._gym, "register_envs", counting)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), samples=4, concurrency=16, out=tmp_path)
    assert res.summary.episodes == 16 and res.summary.success_rate == 1.0
    assert len(calls) <= 1


def test_resume_after_a_complete_last_line_without_its_newline(tmp_path: Path) -> None:
    rollout(example.ENV_ID, example.ScriptedAgent(), n=2, out=tmp_path)
    path = tmp_path / "trajectories.jsonl"
    path.write_text("\n" + path.read_text().rstrip("\n"))  # a blank line, and the newline gone
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path, keep_trajectories=False)
    assert (res.new, res.skipped, res.summary.episodes) == (2, 2, 4)
    keys = [t.key for t in read_trajectories(path, strict=True)]
    assert len(keys) == len(set(keys)) == 4


class NativeCaller(Agent):
    """An agent that hands the model the tools itself (as the API's `tools`): it reads the prompt it
    is given, then answers."""

    native_tools = True

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        self.seen.append(messages[0].content)
        assert env_info.tool_schemas  # the tools still reach the agent, to send natively
        return AgentAction(text="<answer>none</answer>")


def test_an_agent_with_native_tools_gets_a_prompt_without_the_tools_text() -> None:
    agent = NativeCaller()
    res = rollout(example.ENV_ID, agent, n=2)
    env = example.make_env()
    full = env.render_prompt(env.tasks[0])[1][0].content
    answer_only = env.parser.answer_instructions()
    assert full != answer_only and answer_only
    assert agent.seen and all(s.endswith(answer_only) and s != full for s in agent.seen)
    assert all(t.prompt_messages[0].content in agent.seen for t in res.trajectories)  # recorded as sent
    plain = rollout(example.ENV_ID, example.ScriptedAgent(), n=1)
    assert plain.trajectories[0].prompt_messages[0].content == full


class Deciding(Agent):
    """Decides native tool calling per env from its parser, against its class-level `native_tools`."""

    def __init__(self, native: bool) -> None:
        self.native_tools = not native  # the method, not the attribute, is what counts
        self.native = native
        self.asked: list[object] = []
        self.seen: list[str] = []

    def uses_native_tools(self, parser: Any) -> bool:
        self.asked.append(parser)
        return self.native

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        self.seen.append(messages[0].content)
        return AgentAction(text="<answer>none</answer>")


@pytest.mark.parametrize("native", [True, False])
def test_the_runner_asks_the_agent_with_the_envs_parser(native: bool) -> None:
    agent = Deciding(native)
    envs: list[Any] = []

    def make() -> Any:
        envs.append(example.make_env())
        return envs[-1]

    rollout(make, agent, n=2)
    env = example.make_env()
    full = env.render_prompt(env.tasks[0])[1][0].content
    answer_only = env.parser.answer_instructions()
    assert agent.seen and all(s.endswith(answer_only) and s != full for s in agent.seen) is native
    assert all(s == full for s in agent.seen) is not native
    parsers = {id(e.unwrapped.parser) for e in envs}
    assert agent.asked and all(id(p) in parsers for p in agent.asked)


def test_an_agent_failing_to_decide_native_tools_ends_only_its_episode() -> None:
    class Broken(Deciding):
        def uses_native_tools(self, parser: Any) -> bool:
            raise RuntimeError("no tokenizer")

    res = rollout(example.ENV_ID, Broken(True), n=2)
    assert [t.error for t in res.trajectories] == [
        "agent failed to say how it sends the tools: RuntimeError: no tokenizer"
    ] * 2
    assert all(not t.turns for t in res.trajectories)


def test_a_password_in_a_url_is_kept_out_of_run_json_and_errors(tmp_path: Path) -> None:
    """A base URL with `user:password@` (a proxy's basic auth) is recorded without its password,
    as keys and tokens are: run.json and trajectories are shared with others."""
    url = "http://alice:hunter2@127.0.0.1:9/v1"  # port 9 (discard): nothing listens, the call fails at once
    rollout(
        example.ENV_ID,
        "openai",
        agent_kwargs={"model": "m", "base_url": url, "max_retries": 0},
        env_kwargs={"system_prompt": "Reach http://bob:pw2@127.0.0.1:9/ for nothing."},
        n=1,
        out=tmp_path,
    )
    written = (tmp_path / "run.json").read_text() + (tmp_path / "trajectories.jsonl").read_text()
    assert "hunter2" not in written and "alice:***@" in written  # the error line names the URL too
    config = json.loads((tmp_path / "run.json").read_text())
    assert config["agent_kwargs"]["base_url"] == "http://alice:***@127.0.0.1:9/v1"
    assert "pw2" not in config["env_kwargs"]["system_prompt"]
