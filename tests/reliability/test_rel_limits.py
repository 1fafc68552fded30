"""Per-tool limits hold across concurrent episodes of a `ToolVectorEnv`.

A tool limited to R calls/s is called by many episodes at once; counting its
calls in every sliding one-second window, none may hold more than R. The
concurrency cap is checked the same way, by counting calls in flight.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from typing import Any

from pydantic import BaseModel

import toolenv

RATE = 25.0
EPISODES = 16
TURNS = 6  # 16 episodes x 6 turns = 96 calls: about 3.8 s at 25 calls/s


class Stamped(toolenv.Tool):
    """Record when each call starts and how many are in flight."""

    name = "stamped"

    class Args(BaseModel):
        n: int = 0

    def __init__(self, **limits: Any) -> None:
        super().__init__(**limits)
        self.starts: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        self.starts.append(time.monotonic())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.02)
        finally:
            self.in_flight -= 1
        return toolenv.ToolResult(text=str(args.n))


def max_in_window(times: list[float], window: float = 1.0) -> int:
    """Most events in any half-open window [t, t + window) that starts at an event."""
    times = sorted(times)
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


def run_vector(tool: Stamped, episodes: int, turns: int, calls_per_turn: int = 1) -> float:
    """Step `episodes` envs sharing `tool` for `turns` turns; returns the wall time."""
    tasks = [{"id": "t", "question": "q", "answer": "a"}]
    venv = toolenv.ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[tool], tasks=tasks, max_turns=turns + 1)] * episodes)
    venv.reset(seed=0)
    action = "".join(
        "<tool_call>" + json.dumps({"name": "stamped", "arguments": {"n": i}}) + "</tool_call>"
        for i in range(calls_per_turn)
    )
    t0 = time.perf_counter()
    for _ in range(turns):
        _, _, _, _, infos = venv.step([action] * episodes)
        assert all(not r.is_error for rs in infos["tool_results"] for r in rs)
    wall = time.perf_counter() - t0
    venv.close()
    return wall


def test_rel_rate_limit_never_exceeded() -> None:
    tool = Stamped(rate_limit=RATE, timeout=60.0)
    wall = run_vector(tool, EPISODES, TURNS)
    calls = EPISODES * TURNS
    assert len(tool.starts) == calls
    peak = max_in_window(tool.starts)
    print(f"\n[rate] {calls} calls at limit {RATE:g}/s: peak {peak} in any 1 s window, wall {wall:.2f} s")
    assert peak <= RATE, f"{peak} calls in one second, limit {RATE}"
    assert peak >= RATE - 2, "the limiter, not the test, set the pace"  # the window was saturated
    assert wall >= (calls - RATE) / RATE * 0.95


def test_rel_rate_limit_with_many_calls_per_turn() -> None:
    """Several calls per turn and per episode share the same budget."""
    tool = Stamped(rate_limit=40.0, timeout=60.0)
    run_vector(tool, episodes=8, turns=3, calls_per_turn=5)
    assert len(tool.starts) == 120
    assert max_in_window(tool.starts) <= 40


def test_rel_concurrency_cap_never_exceeded() -> None:
    tool = Stamped(max_concurrency=3, timeout=60.0)
    run_vector(tool, episodes=32, turns=3, calls_per_turn=2)
    assert len(tool.starts) == 192
    assert tool.max_in_flight == 3


def test_rel_max_in_window_counts_half_open_windows() -> None:
    """The checker itself: events exactly one second apart fall in different windows."""
    assert max_in_window([0.0, 1.0, 2.0]) == 1
    assert max_in_window([0.0, 0.5, 0.99, 1.0]) == 3
    assert max_in_window([]) == 0
