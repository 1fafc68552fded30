"""`toolenv serve` as a user runs it: a subprocess, its errors, and a server killed mid-rollout."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="toolenv serve needs the serve extra: pip install 'toolenv[serve]'")
pytest.importorskip("uvicorn", reason="toolenv serve needs the serve extra: pip install 'toolenv[serve]'")

from _remote import TASKS, Scripted

import toolenv
from toolenv.commands.serve_cmd import bind_socket
from toolenv.remote import RemoteToolEnv
from toolenv.trajectory import read_trajectories

TOOLENV = str(Path(sys.executable).parent / "toolenv")
HERE = Path(__file__).resolve().parent
ENV_ARGS = [
    "--env-arg",
    'tools=["_remote:add", "_remote:swatch"]',
    "--env-arg",
    f"tasks={json.dumps(TASKS)}",
    "--env-arg",
    "task_order=sequential",
]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


def start(*extra: str) -> tuple[subprocess.Popen[str], str]:
    """`toolenv serve` on a free port; returns the process and the URL it printed."""
    proc = subprocess.Popen(
        [TOOLENV, "serve", "toolenv/ToolEnv-v0", "--port", "0", *ENV_ARGS, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"toolenv serve did not start: {err}")
    assert line.startswith("serving toolenv/ToolEnv-v0 on http://127.0.0.1:"), line
    return proc, line.split(" on ", 1)[1].split()[0]


@pytest.fixture
def server() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, url = start()
    yield proc, url
    stop(proc)


def stop(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C the server (if it still runs) and return its stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=30)[1]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLENV, *args], capture_output=True, text=True, timeout=120, env=_env())


def test_serve_runs_an_episode_and_stops_on_ctrl_c(server: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = server
    env = RemoteToolEnv(url)
    assert env.remote.env_id == "toolenv/ToolEnv-v0" and env.remote.num_tasks == len(TASKS)
    env.reset(options={"task_id": "t2"})
    obs, reward, terminated, *_ = env.step("<answer>14</answer>")
    assert (reward, terminated) == (1.0, True)
    env.close()
    assert "Traceback" not in stop(proc)
    assert proc.returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["toolenv/Nope-v0"], "toolenv serve: error: cannot make env 'toolenv/Nope-v0'"),
        (["toolenv/ToolEnv-v0", "--env-arg", "max_turns=0"], "toolenv serve: error: max_turns must be at least 1"),
        (["toolenv/ToolEnv-v0", "--env-arg", "nope=1"], "toolenv serve: error: env 'toolenv/ToolEnv-v0' rejected"),
        (["toolenv/ToolEnv-v0", "--max-sessions", "0"], "toolenv serve: error: --max-sessions must be at least 1"),
        (["toolenv/ToolEnv-v0", "--env-arg", "oops"], "toolenv serve: error: argument --env-arg: expected KEY=VALUE"),
        (["toolenv/ToolEnv-v0", "--log-level", "nope"], "toolenv serve: error: argument --log-level: invalid choice"),
    ],
)
def test_bad_arguments_are_one_line_and_nonzero(args: list[str], message: str) -> None:
    out = run_cli("serve", *args)
    assert out.returncode == 2
    assert out.stderr.startswith(message), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_a_busy_port_is_one_line() -> None:
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    try:
        out = run_cli("serve", "toolenv/ToolEnv-v0", "--port", str(port), *ENV_ARGS)
    finally:
        sock.close()
    assert out.returncode == 2
    assert out.stderr.startswith(f"toolenv serve: error: cannot listen on 127.0.0.1:{port}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_missing_extra_is_one_line() -> None:
    code = (
        "import sys; sys.modules['starlette'] = None\n"  # as if Starlette were not installed
        "from toolenv.cli import main; sys.exit(main(['serve', 'toolenv/ToolEnv-v0']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("toolenv serve: error: serving needs Starlette and uvicorn"), out.stderr
    assert "pip install 'toolenv[serve]'" in out.stderr and len(out.stderr.strip().splitlines()) == 1


class KillsTheServer(Scripted):
    """Scripted, but kills the server (SIGKILL) before its first action on task `t2`."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    async def act(
        self, observation: str, messages: list[toolenv.Message], env_info: toolenv.agent.EnvInfo
    ) -> toolenv.AgentAction:
        if env_info.task.id == "t2" and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        return await super().act(observation, messages, env_info)


def test_a_server_killed_mid_run_ends_episodes_with_errors_and_resume_finishes_them(
    server: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    proc, url = server
    out = tmp_path / "run"
    res = toolenv.rollout(lambda: RemoteToolEnv(url, timeout=30), KillsTheServer(proc), concurrency=1, out=out)
    by_id = {t.task.id: t for t in res.trajectories}
    assert sorted(by_id) == ["t1", "t2", "t3", "t4"]  # every episode recorded, none lost
    assert by_id["t1"].success and by_id["t1"].error is None
    assert by_id["t2"].error is not None and by_id["t2"].error.startswith("env step failed on turn 0: RemoteEnvError")
    assert by_id["t3"].error is not None and by_id["t3"].error.startswith("env reset failed: RemoteEnvError")
    assert len(read_trajectories(out / "trajectories.jsonl", strict=True)) == 4

    again, new_url = start()  # a new server; the failed episodes run again
    try:
        res = toolenv.rollout(lambda: RemoteToolEnv(new_url), Scripted(), concurrency=2, out=out, retry_errors=True)
    finally:
        stop(again)
    assert res.skipped == 1 and res.new == 3
    assert all(t.success for t in res.trajectories) and len(res.trajectories) == 4


def _has_ipv6_loopback() -> bool:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_serve_binds_an_ipv6_address() -> None:
    proc = subprocess.Popen(
        [TOOLENV, "serve", "toolenv/ToolEnv-v0", "--host", "::1", "--port", "0", *ENV_ARGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving toolenv/ToolEnv-v0 on http://[::1]:"), line
        env = RemoteToolEnv(line.split(" on ", 1)[1].split()[0])
        env.reset(options={"task_id": "t2"})
        assert env.step("<answer>14</answer>")[1] == 1.0
        env.close()
    finally:
        stop(proc)
    assert proc.returncode == 0


def test_a_stop_does_not_wait_for_ever_for_a_stuck_step() -> None:
    """SIGTERM (Slurm, Kubernetes) while a step waits in a tool with no timeout: the server waits
    --graceful-timeout for it, then cancels it, closes its sessions and exits."""
    import threading

    proc, url = start("--graceful-timeout", "1", "--env-arg", 'tools=["_remote:add", "_remote:hang"]')
    env = RemoteToolEnv(url)
    env.reset(seed=0)
    outcome: list[object] = []

    def stuck_step() -> None:
        try:
            outcome.append(env.step('<tool_call>{"name": "hang", "arguments": {"seconds": 3600}}</tool_call>'))
        except Exception as exc:
            outcome.append(exc)

    caller = threading.Thread(target=stuck_step, daemon=True)
    caller.start()
    caller.join(1.0)  # the step is in flight (it waits an hour)
    assert caller.is_alive()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)  # without the limit uvicorn waits for the step: this times out
    caller.join(30)
    assert not caller.is_alive() and outcome  # the client heard of the stop, not an hour later


def test_a_negative_graceful_timeout_is_one_line() -> None:
    out = run_cli("serve", "toolenv/ToolEnv-v0", "--graceful-timeout", "-1", *ENV_ARGS)
    assert out.returncode != 0 and "--graceful-timeout" in out.stderr and len(out.stderr.strip().splitlines()) == 1


async def test_a_stop_with_a_deleted_session_still_in_a_stuck_step_closes_and_exits() -> None:
    """A client gave up on a step (its episode timed out) and moved on; the server, still in
    that step, is stopped: it cancels the step after --graceful-timeout, closes the envs, exits."""
    import asyncio

    proc, url = start("--graceful-timeout", "1", "--env-arg", 'tools=["_remote:add", "_remote:hang"]')
    try:
        env = RemoteToolEnv(url)
        await env.areset(seed=0)
        stepping = asyncio.create_task(
            env.astep('<tool_call>{"name": "hang", "arguments": {"seconds": 3600}}</tool_call>')
        )
        await asyncio.sleep(0.5)  # the step is in flight (it waits an hour)
        stepping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stepping
        obs, _ = await env.areset(seed=1)  # a new session; the old one's step is cancelled, its env closed
        assert "10+4?" in obs
        await env.aclose()
    finally:
        err = await asyncio.to_thread(stop, proc)  # SIGINT; communicate(timeout=30) raises if it hangs
    assert proc.returncode == 0, err
    assert "closing the env of session" not in err, err


def test_a_stop_ends_even_when_an_env_close_hangs() -> None:
    """SIGTERM with a session whose env has a tool whose `close` never returns: the server closes
    what it can within --close-timeout, names the session it left behind, and exits."""
    proc, url = start("--close-timeout", "0.5", "--env-arg", 'tools=["_remote:add", "_remote:StuckClose"]')
    try:
        env = RemoteToolEnv(url)
        env.reset(seed=0)  # a session: the env the server described itself with
        session = env._session  # the id the server's log names
        RemoteToolEnv(url).reset(seed=0)  # and one more, whose env was built for it
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)  # a failure guard: without the bound it never exits
    assert f"the env of session {session} did not close within 0.5 s" in err, err
    assert err.count("did not close within 0.5 s") == 2, err


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 0), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_stop_ends_even_when_an_env_close_blocks_in_a_thread(sig: signal.Signals, code: int) -> None:
    """Ctrl-C or SIGTERM with a session whose tool's `close` is stuck in a thread (a sync teardown run with
    `asyncio.to_thread`), which no cancel stops: after --close-timeout the server logs what it left
    running and exits, instead of waiting for the thread in asyncio's executor shutdown for ever."""
    proc, url = start("--close-timeout", "0.5", "--env-arg", 'tools=["_remote:add", "_remote:StuckThreadClose"]')
    try:
        env = RemoteToolEnv(url)
        env.reset(seed=0)
        session = env._session
    finally:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)  # a hang guard: before the fix it never exits
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"toolenv serve did not exit after {sig.name}: {err}") from None
    assert f"the env of session {session} did not close within 0.5 s" in err, err
    assert "_wait_for_ever" in err, err  # the call left running in its thread is named
    assert proc.returncode == code, err  # Ctrl-C exits 0; SIGTERM ends the process by the signal, as uvicorn does


def test_the_servers_thread_executor_runs_calls_and_does_not_wait_for_a_stuck_one() -> None:
    """`toolenv serve`'s default executor: results and errors as a ThreadPoolExecutor's, an idle
    thread reused, and a shutdown that leaves a stuck call behind, named, instead of joining it."""
    import threading

    from toolenv._threads import DaemonThreadExecutor, DaemonThreads

    threads = DaemonThreads("test-serve")  # a pool of its own: no other test's calls in `running()`
    pool = DaemonThreadExecutor(threads)
    assert pool.submit(sum, [1, 2, 3]).result(timeout=30) == 6
    with pytest.raises(ZeroDivisionError):
        pool.submit(divmod, 1, 0).result(timeout=30)
    assert len(threads.workers) == 1  # the same thread took both calls
    release = threading.Event()
    started = threading.Event()

    def stuck() -> None:
        started.set()
        release.wait()

    future = pool.submit(stuck)
    assert started.wait(30)
    pool.shutdown(wait=True)  # returns with the call still running
    assert [name for name, _ in pool.running()] == [f"{__name__}.{stuck.__qualname__}"]
    assert all(w.daemon for w in threads.workers)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(sum, [])
    release.set()
    assert future.result(timeout=30) is None


def test_a_stop_names_a_sync_tool_call_left_behind_in_its_thread() -> None:
    """A sync function tool stuck past its timeout keeps its thread (a thread cannot be stopped):
    the server exits without it, and its log names it with the other calls left behind."""
    proc, url = start("--env-arg", 'tools=["_remote:add", "_remote:stuck_sync"]')
    try:
        env = RemoteToolEnv(url)
        env.reset(seed=0)
        obs, *_ = env.step('<tool_call>{"name": "stuck_sync", "arguments": {"word": "hi"}}</tool_call>')
        assert "timed out after 0.2 s" in json.dumps(obs), obs
    finally:
        err = stop(proc)
    assert "exiting with 1 call(s) still running in a thread, left behind: _remote.stuck_sync (running " in err, err
    assert proc.returncode == 0, err
