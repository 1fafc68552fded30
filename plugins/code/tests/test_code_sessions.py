"""Stateful sessions: variables persist within an episode and are released with it."""

from __future__ import annotations

import gc
import json

import gymnasium as gym

import toolenv  # noqa: F401 - registers the env ids
from toolenv_code.sandbox import SandboxLimits, SandboxPool, get_pool


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
