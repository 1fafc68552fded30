"""A stateful episode's sandbox session closes when the episode ends, not when Python collects it."""

from __future__ import annotations

import gc
import json

import gymnasium as gym

import toolenv  # noqa: F401 - registers the env ids
from toolenv_code.sandbox import get_pool


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _live_sessions() -> set[str]:
    return {sid for s in get_pool().stats() for sid in s["sessions"]}


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
