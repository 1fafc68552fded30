"""A call its caller gave up on (a tool's timeout cancels it) stops its run at once.

The pool is process-wide, with one server per CPU: a run left going until the sandbox's own
timeout would keep a server busy for every env in the process, so each later call (any
env's) would wait behind it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import toolenv  # noqa: F401 - registers the env ids
from toolenv_code.sandbox import SandboxLimits, SandboxPool, get_pool

_LOOP = "while True: pass"
#: Far longer than any bound below: a run left going would still hold its server then.
_LONG = SandboxLimits(timeout=60)
#: What "at once" means on a loaded host (a free server answers in milliseconds).
_PROMPT_S = 15.0


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first, then the parent)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def _descendants(root: int) -> set[int]:
    """Every live process under `root`."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {pid for pid in found if _alive(pid)}


def _under_server(stats: dict[str, Any], *, spare: bool) -> set[int]:
    """The processes under the server of `stats` but its zygote, and its spare unless `spare`
    (a one-shot run takes the spare `stats` named: its code runs there)."""
    keep = {stats["zygote_pid"], None if spare else stats["spare_pid"]} - {None}
    return {pid for pid in _descendants(stats["pid"]) if pid not in keep}


def _gone(pids: set[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not any(_alive(p) for p in pids)


async def _cancel_after(coro: Any, seconds: float) -> None:
    """Await `coro`, cancelling it after `seconds` (it must still be running then)."""
    try:
        await asyncio.wait_for(coro, seconds)
    except asyncio.TimeoutError:
        return
    raise AssertionError("the call should still have been running")


async def _timed(coro: Any) -> tuple[Any, float]:
    """`coro`'s result and the seconds it took; fails past `_PROMPT_S` rather than hang."""
    start = time.monotonic()
    try:
        result = await asyncio.wait_for(coro, _PROMPT_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"the call was still waiting after {_PROMPT_S:g} s") from None
    return result, time.monotonic() - start


async def test_a_cancelled_run_is_killed_and_its_server_freed() -> None:
    pool = SandboxPool(size=1)
    try:
        stats = pool.stats()[0]
        looping = asyncio.create_task(pool.arun(_LOOP, _LONG))
        await asyncio.sleep(1.0)  # it runs by now
        code = _under_server(stats, spare=True)
        assert stats["spare_pid"] in code, (stats, code)
        looping.cancel()
        try:
            await looping
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the cancellation must reach the caller")
        assert _gone(code), f"the cancelled run's processes still run: {sorted(p for p in code if _alive(p))}"
        r, took = await _timed(pool.arun("print('next')", _LONG))
        assert r.stdout == "next\n" and r.ok, r
        assert took < _PROMPT_S
    finally:
        pool.close()


async def test_a_call_cancelled_by_wait_for_frees_its_server_for_the_next() -> None:
    """Many cancelled calls in a row: each one's run stops, none piles up behind another."""
    pool = SandboxPool(size=1)
    try:
        start = time.monotonic()
        for _ in range(3):
            await _cancel_after(pool.arun(_LOOP, _LONG), 0.5)
        r, _ = await _timed(pool.arun("print(6 * 7)", _LONG))
        assert r.stdout == "42\n", r
        assert time.monotonic() - start < 2 * _PROMPT_S
    finally:
        pool.close()


def test_sync_run_still_runs_to_its_own_timeout() -> None:
    """Only a cancelled `arun` stops early: a blocking `run` keeps the sandbox's timeout."""
    pool = SandboxPool(size=1)
    try:
        r = pool.run("import time; time.sleep(3); print('done')", SandboxLimits(timeout=1))
        assert r.timed_out and r.stdout == "", r
        assert pool.run("print('after')").stdout == "after\n"
    finally:
        pool.close()


async def test_a_cancelled_session_call_ends_its_session_as_a_timeout_does() -> None:
    pool = SandboxPool(size=1)
    try:
        assert (await pool.arun("x = 1", _LONG, session="s")).new_session
        stats = pool.stats()[0]
        looping = asyncio.create_task(_cancel_after(pool.arun(_LOOP, _LONG, session="s"), 1.0))
        await asyncio.sleep(0.7)
        session = _under_server(stats, spare=False)  # the session's init and the process running its code
        assert session, stats
        await looping
        assert _gone(session), f"the cancelled session still runs: {sorted(p for p in session if _alive(p))}"
        r, _ = await _timed(pool.arun("print('x' in globals())", _LONG, session="s"))
        assert r.new_session and r.stdout == "False\n", r
    finally:
        pool.close()


def _fence(code: str) -> str:
    return f"```python\n{code}\n```"


def _tool_call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _env(env_id: str, **kwargs: Any) -> Any:
    """The `ToolEnv` itself (its async API), not gym's wrappers."""
    return gym.make(env_id, **kwargs).unwrapped


async def test_a_tool_timeout_stops_the_run_so_no_env_waits_behind_it() -> None:
    """The repro: `tool_limits` timeout 2 s, sandbox timeout 30 s, a looping call in as many envs
    as the process-wide pool has servers; then a plain print in another env answers at once."""
    n = get_pool().size
    short = [
        _env("toolenv/HumanEval-v0", tool_limits={"python": {"timeout": 2}}, sandbox={"timeout": 30}) for _ in range(n)
    ]
    other = _env("toolenv/HumanEval-v0", sandbox={"timeout": 30})
    try:
        for env in [*short, other]:
            await env.areset(options={"task_id": "HumanEval/0"})
        results = await asyncio.gather(*(env.astep(_fence(_LOOP)) for env in short))
        assert all("timed out after 2 s" in str(obs) for obs, *_ in results), results[0][0]
        (obs, *_), took = await _timed(other.astep(_fence("print('hello')")))
        assert "hello" in str(obs), obs
        assert took < _PROMPT_S
    finally:
        for env in [*short, other]:
            await env.aclose()


async def test_a_stateful_tool_call_cut_by_its_timeout_restarts_the_session_and_says_so() -> None:
    env = _env(
        "toolenv/MBPP-v0",
        parser="hermes",
        stateful=True,
        max_turns=8,
        tool_limits={"python": {"timeout": 2}},
        sandbox={"timeout": 30},
    )
    try:
        await env.areset(seed=0)
        await env.astep(_tool_call("x = 41"))
        await env.astep(_tool_call("x = 1\n" + _LOOP))
        (obs, *_), _ = await _timed(env.astep(_tool_call("print(x)")))
        assert "session was restarted" in str(obs) and "NameError" in str(obs), obs
    finally:
        await env.aclose()
