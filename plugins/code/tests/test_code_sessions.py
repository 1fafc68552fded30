"""Stateful sessions: variables persist within an episode and are released with it."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import gymnasium as gym

import toolenv  # noqa: F401 - registers the env ids
from toolenv import Task, ToolCall, ToolCaller, ToolContext
from toolenv_code.sandbox import SandboxLimits, SandboxPool, get_pool, run_code
from toolenv_code.tool import PythonTool, format_result


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _live_sessions() -> set[str]:
    return {sid for s in get_pool().stats() for sid in s["sessions"]}


def test_state_persists_within_episode_and_not_across() -> None:
    env = gym.make("toolenv/MBPP-v0", parser="hermes", stateful=True, limit=3, max_turns=8)
    try:
        env.reset(seed=0)
        obs, *_ = env.step(_call("x = 41; open('note.txt', 'w').write('kept')"))
        assert "no output" in obs
        obs, *_ = env.step(_call("print(x + 1, open('note.txt').read())"))
        assert "42 kept" in obs
        first = env.unwrapped.episode.episode_id
        before = _live_sessions()
        assert len(before) >= 1
        env.reset(seed=1)
        gc.collect()
        obs, *_ = env.step(_call("print(x)"))
        assert "NameError" in obs
        assert env.unwrapped.episode.episode_id != first
        after = _live_sessions()  # the old episode's session was closed once its state was dropped
        assert not (before & after) and len(after) == 1
    finally:
        env.close()
    assert _live_sessions() == set()  # env.close released the last one


def test_session_survives_errors_but_not_timeouts() -> None:
    pool = SandboxPool(size=1)
    limits = SandboxLimits(timeout=0.5)
    try:
        assert pool.run("y = 5", limits, session="s").new_session
        r = pool.run("1 / 0", limits, session="s")
        assert "ZeroDivisionError" in r.stderr and not r.new_session
        assert pool.run("print(y)", limits, session="s").stdout == "5\n"
        assert pool.run("import time; time.sleep(5)", limits, session="s").timed_out
        r = pool.run("print('y' in globals())", limits, session="s")
        assert r.new_session and r.stdout == "False\n"
    finally:
        pool.close()


def test_session_cap_evicts_least_recently_used() -> None:
    pool = SandboxPool(size=1, max_sessions=2)
    try:
        for sid in ("a", "b", "c"):
            pool.run(f"v = {sid!r}", session=sid)
        assert sorted(pool.stats()[0]["sessions"]) == ["b", "c"]
        assert pool.run("print(v)", session="c").stdout == "c\n"
        assert "NameError" in pool.run("print(v)", session="a").stderr
    finally:
        pool.close()


def test_session_idle_timeout() -> None:
    pool = SandboxPool(size=1, session_idle=0.0)
    try:
        pool.run("z = 1", session="old")
        pool.run("pass")  # any request lets the server drop idle sessions
        assert "NameError" in pool.run("print(z)", session="other").stderr
        assert "old" not in pool.stats()[0]["sessions"]
    finally:
        pool.close()


def test_session_closes_at_episode_end_and_on_abandoning_reset() -> None:
    env = gym.make("toolenv/MBPP-v0", parser="hermes", stateful=True, limit=3, max_turns=8)
    gc.disable()  # the episode's state stays referenced: only the release hook can close it
    try:
        env.reset(seed=0)
        env.step(_call("x = 1"))
        first = env.unwrapped.episode.episode_id
        assert first in _live_sessions()
        *_, terminated, _, _ = env.step("<answer>def f(): pass</answer>")
        assert terminated and first not in _live_sessions()
        env.reset(seed=1)
        env.step(_call("y = 2"))
        second = env.unwrapped.episode.episode_id
        assert second in _live_sessions()
        env.reset(seed=2)  # abandons the unfinished second episode
        assert second not in _live_sessions()
        env.step(_call("z = 3"))
        third = env.unwrapped.episode.episode_id
        env.close()
        assert third not in _live_sessions()
    finally:
        gc.enable()
        env.close()


def test_session_cells_run_in_one_real_main() -> None:
    pool = SandboxPool(size=1)
    try:
        pool.run("import pickle\nclass A:\n    v = 7\n", session="m")
        r = pool.run("print(pickle.loads(pickle.dumps(A())).v)", session="m")
        assert r.ok and r.stdout == "7\n", r.stderr
        r = pool.run("import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        self.fail()\n"
                     "unittest.main(exit=False)", session="m")  # fmt: skip
        assert "Ran 1 test" in r.stderr and "FAILED" in r.stderr
    finally:
        pool.close()


def test_session_traceback_shows_each_cells_own_lines() -> None:
    pool = SandboxPool(size=1)
    try:
        pool.run("def f(a):\n    b = a + 1\n    return 1 / (a - a)\n", session="t")
        r = pool.run("# cell 2\nprint('x')\nprint('y')\nf(1)", session="t")
        assert 'File "<cell 2>", line 4, in <module>\n    f(1)' in r.stderr
        assert 'File "<cell 1>", line 3, in f\n    return 1 / (a - a)' in r.stderr
        assert "print('y')" not in r.stderr and "_child.py" not in r.stderr
        assert 'File "<cell 3>", line 1' in pool.run("def (:", session="t").stderr
    finally:
        pool.close()


def test_session_process_ending_is_reported() -> None:
    pool = SandboxPool(size=1)
    try:
        pool.run("x = 1", session="e")
        r = pool.run("import os; os._exit(3)", session="e")
        assert r.exit_code == 3 and r.signal is None and r.session_ended and not r.ok
        text = format_result(r, SandboxLimits())
        assert "exit status 3" in text and "session has ended" in text
        r = pool.run("print('x' in globals()); import os; os.abort()", session="e")
        assert r.new_session and r.stdout == "False\n" and r.signal is not None and r.session_ended
        assert "killed by SIG" in format_result(r, SandboxLimits())
        assert pool.run("print(1)", session="e").new_session
    finally:
        pool.close()


async def test_tool_says_why_the_session_ended() -> None:
    caller, ctx = ToolCaller([PythonTool(stateful=True)]), ToolContext(Task())
    texts = []
    for code in ["x = 1", "import os; os._exit(3)", "print(x)"]:
        results, _ = await caller.invoke([ToolCall(name="python", arguments={"code": code}, id="c")], ctx)
        texts.append(results[0])
    assert texts[1].is_error and texts[1].metadata["exit_code"] == 3
    assert "exit status 3" in texts[1].text and "session has ended" in texts[1].text
    assert "session was restarted" in texts[2].text and "NameError" in texts[2].text


def test_session_waits_for_threads_and_labels_later_output() -> None:
    pool = SandboxPool(size=1)
    try:
        r = pool.run("import threading, time\n"
                     "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n"
                     "print('main')", session="th")  # fmt: skip
        assert r.stdout == "main\nthread done\n"
        r = pool.run("from concurrent.futures import ThreadPoolExecutor\nex = ThreadPoolExecutor(2)\n"
                     "print(ex.submit(lambda: 6 * 7).result())", session="th")  # fmt: skip
        assert r.ok and r.stdout == "42\n"  # the executor's idle workers are not waited for
        assert pool.run("print(ex.submit(lambda: 1).result())", session="th").stdout == "1\n"
        pool.run("threading.Thread(target=lambda: (time.sleep(0.2), print('late')), daemon=True).start()",
                 session="th")  # fmt: skip
        time.sleep(0.5)
        r = pool.run("print('now')", session="th")
        assert r.stdout == "(printed after the previous call had returned:)\nlate\n(this call's output:)\nnow\n"
    finally:
        pool.close()


def test_the_model_is_told_whether_variables_persist() -> None:
    """The description the model reads says which kind of tool this is; 'unless the tool is
    stateful' told it nothing it could know."""
    fresh = PythonTool().schema()["function"]["description"]
    stateful = PythonTool(stateful=True).schema()["function"]["description"]
    assert "clean interpreter" in fresh and "persist" not in fresh
    assert "persist" in stateful and "clean interpreter" not in stateful
    assert "unless" not in fresh + stateful
    env = gym.make("toolenv/MBPP-v0", parser="hermes", stateful=True, limit=1)
    assert "persist from one call to the next" in env.reset(seed=0)[0]
    env.close()


def test_an_error_after_the_code_closed_stderr_is_an_error_not_a_crash() -> None:
    """As `python -c`: exit status 1; a session survives it, its variables intact."""
    code = "import os\nos.close(2)\nraise ValueError('x')"
    assert run_code(code).exit_code == 1
    assert run_code("import os, sys\nos.close(2)\nsys.exit('bye')").exit_code == 1
    pool = SandboxPool(size=1)
    try:
        assert pool.run("y = 5", session="s").new_session
        r = pool.run(code, session="s")
        assert r.exit_code == 1 and not r.session_ended, r
        r = pool.run("print(y)", session="s")
        assert r.stdout == "5\n" and not r.new_session
    finally:
        pool.close()


def test_a_session_restarted_with_its_server_stays_on_it() -> None:
    """After its server died, a session starts afresh once, then keeps its state (it is not
    moved to another server at the next call, which would restart it again)."""
    pool = SandboxPool(size=2)
    try:
        pool.run("pass", session="a")  # the first server
        assert pool.run("x = 1", session="s").new_session  # the second
        pool.close_session("a")  # the first is now the least loaded
        (pid,) = [srv["pid"] for srv in pool.stats() if "s" in srv["sessions"]]
        os.kill(pid, signal.SIGKILL)
        _wait_until_dead(pid)  # so that the next call finds it dead, rather than dying during it
        assert pool.run("y = 2", session="s").new_session
        r = pool.run("print(y)", session="s")
        assert r.stdout == "2\n" and not r.new_session, r
    finally:
        pool.close()


def _wait_until_dead(pid: int) -> None:
    """Until `pid` (a child of this process) has exited: a zombie, or gone."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not die")


async def test_a_call_abandoned_while_it_waits_for_a_server_never_runs() -> None:
    """A tool call whose caller gave up (its tool timeout) while every server was busy must not
    run later: the model was told it failed, so a session's variables must not change behind
    its back (nor a later call run before it), and a backlog of abandoned calls must not keep
    the servers busy."""
    pool = SandboxPool(size=1)  # one server: the second call waits for the first
    try:
        busy = asyncio.create_task(pool.arun("import time; time.sleep(1.5)"))
        await asyncio.sleep(0.3)
        try:
            await asyncio.wait_for(pool.arun("x = 1", session="late"), 0.2)
        except asyncio.TimeoutError:
            pass
        else:
            raise AssertionError("the call should still have been waiting for the server")
        assert (await busy).ok
        await asyncio.sleep(1.0)  # time enough for an abandoned call to run, were it still to
        assert pool.stats()[0]["sessions"] == []
        r = await pool.arun("print(x)", session="late")
        assert "NameError" in r.stderr and r.new_session, r.stdout + r.stderr
    finally:
        pool.close()


def test_closes_pending_for_a_server_that_died_are_dropped_with_it() -> None:
    """A session closed while its server was idle is closed at that server's next request; if the
    server dies first, the session is gone with it, and the close must not stay queued for good
    (the queue is scanned on every request: a long run would keep growing it)."""
    pool = SandboxPool(size=1)
    try:
        pool.run("x = 1", session="a")
        (pid,) = [srv["pid"] for srv in pool.stats()]
        pool.close_session("a")
        os.kill(pid, signal.SIGKILL)
        _wait_until_dead(pid)
        assert pool.run("print('next')").stdout == "next\n"  # on a fresh server
        assert pool._pending_close == []
    finally:
        pool.close()


async def test_a_session_s_calls_run_in_the_order_they_were_made() -> None:
    """A turn's tool calls run concurrently: with a stateful session, `x = 1` then `print(x)` must
    still run in that order, whichever worker thread reaches the server first (under load the
    second often did, and the model got a NameError for code it wrote in the right order)."""

    class FirstJobLate(ThreadPoolExecutor):
        """The first job's thread starts late, as a loaded host's scheduler may have it."""

        late = True

        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            if FirstJobLate.late:
                FirstJobLate.late = False

                def slow() -> Any:
                    time.sleep(0.5)
                    return fn(*args, **kwargs)

                return super().submit(slow)
            return super().submit(fn, *args, **kwargs)

    asyncio.get_running_loop().set_default_executor(FirstJobLate(max_workers=4))
    pool = SandboxPool(size=1)
    try:
        first, second = await asyncio.gather(pool.arun("x = 1", session="s"), pool.arun("print(x)", session="s"))
        assert first.ok and first.new_session
        assert second.stdout == "1\n", second.stdout + second.stderr
    finally:
        pool.close()
