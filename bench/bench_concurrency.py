"""Concurrent episodes through `ToolVectorEnv` with a tool of 50 ms simulated I/O.

Every episode makes 4 turns, each one call of a tool that awaits
`asyncio.sleep(0.05)`. All episodes share one event loop, so the ideal wall
time is 4 x 50 ms whatever the number of episodes; the table shows how close
toolenv stays as episodes go from 1 to 1,024, beside the floor of the same
waits as bare coroutines (`asyncio.gather`, no env), and inside `toolenv.tuned_gc()`,
which shows what the garbage collector costs. Goal: within 1.2x of ideal at 1,024.

A second table runs the same episodes the way `toolenv.arollout` and verl's agent loop
do: each episode is its own coroutine (reset, then 4 steps, at its own pace), with the
collector at CPython's defaults and inside `toolenv.tuned_gc()` (as `toolenv rollout`
runs), beside bare coroutines doing the same 4 waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

from _common import median, parse_args, table, write
from pydantic import BaseModel

import toolenv
from toolenv.agent import Agent, AgentAction, EnvInfo
from toolenv.gc_tuning import gen0_threshold_for
from toolenv.runner import arollout

LATENCY = 0.05
TURNS = 4
IDEAL = TURNS * LATENCY
ACTION = '<tool_call>{"name": "io", "arguments": {"key": "k"}}</tool_call>'
GOAL = 1.2


class SimulatedIO(toolenv.Tool):
    """Wait 50 ms as a network call would, then answer."""

    name = "io"

    class Args(BaseModel):
        key: str

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        await asyncio.sleep(LATENCY)
        return toolenv.ToolResult(text=f"value of {args.key}")


TOOL = SimulatedIO()  # one tool object shared by every env, as a plugin's process-wide tool is
TASKS = [{"id": "t", "question": "q", "answer": "a"}]


def make() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[TOOL], tasks=TASKS, max_turns=TURNS)


async def episode_wall(venv: toolenv.ToolVectorEnv) -> tuple[float, float]:
    """(reset seconds, seconds for the 4 tool turns) of one batch of episodes."""
    t0 = time.perf_counter()
    await venv.areset(seed=0)
    t1 = time.perf_counter()
    actions = [ACTION] * venv.num_envs
    for turn in range(TURNS):
        _, _, _, truncs, infos = await venv.astep(actions)
        assert not any(r.is_error for rs in infos["tool_results"] for r in rs)
        assert bool(truncs.all()) == (turn == TURNS - 1)
    return t1 - t0, time.perf_counter() - t1


async def bare_asyncio(n: int) -> float:
    """The floor: the same waits as plain coroutines in one `asyncio.gather` per turn, no env."""
    t0 = time.perf_counter()
    for _ in range(TURNS):
        await asyncio.gather(*(asyncio.sleep(LATENCY) for _ in range(n)))
    return time.perf_counter() - t0


async def independent_episode(env: toolenv.ToolEnv) -> None:
    """One episode at its own pace: reset, then one tool turn after another."""
    await env.areset(seed=0)
    for _ in range(TURNS):
        _, _, _, _, info = await env.astep(ACTION)
        assert not any(r.is_error for r in info["tool_results"])


async def bare_independent_episode() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(LATENCY)


async def independent_walls(n: int, rounds: int) -> tuple[float, float, float]:
    """Median seconds of `n` independent episodes (reset included), of the same inside
    `toolenv.tuned_gc()` sized for `n` (as `toolenv rollout` runs them), and of `n` bare ones."""
    envs = [make() for _ in range(n)]
    await asyncio.gather(*(independent_episode(e) for e in envs))  # warm-up round
    walls, tuned, floors = [], [], []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            await asyncio.gather(*(independent_episode(e) for e in envs))
            walls.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await asyncio.gather(*(bare_independent_episode() for _ in range(n)))
            floors.append(time.perf_counter() - t0)
        with toolenv.tuned_gc(gen0_threshold_for(n)):
            for _ in range(rounds):
                t0 = time.perf_counter()
                await asyncio.gather(*(independent_episode(e) for e in envs))
                tuned.append(time.perf_counter() - t0)
    finally:
        for e in envs:
            await e.aclose()
    return median(walls), median(tuned), median(floors)


class CallingAgent(Agent):
    """Calls the tool every turn, at once: the runner's own cost with no model behind it."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        return AgentAction(text=ACTION)


async def runner_walls(n: int, rounds: int) -> float:
    """Median seconds of `toolenv.arollout` running `n` episodes with `concurrency=n` (no output
    files): building the envs, recording every turn as a typed trajectory, the summary."""
    tasks = toolenv.load_tasks([{"id": f"t{i}", "question": "q", "answer": "a"} for i in range(n)])
    walls = []
    for _ in range(rounds + 1):  # the first is a warm-up
        gc.collect()  # the previous round's trajectories are garbage: not this round's cost
        t0 = time.perf_counter()
        result = await arollout(make, CallingAgent(), tasks=tasks, concurrency=n, seed=None)
        walls.append(time.perf_counter() - t0)
        assert (
            result.summary.episodes == n and result.summary.episode_errors == 0 and result.summary.tool_error_rate == 0
        ), result.summary
        del result
    return median(walls[1:])


async def batch_walls(n: int, rounds: int, tuned: bool) -> tuple[float, float]:
    """Median (reset, 4-turn) seconds of `rounds` batches of `n` episodes after one warm-up batch,
    with `tuned` inside `toolenv.tuned_gc()` (the envs, built before, are frozen out of collections)."""
    venv = toolenv.ToolVectorEnv([make] * n)
    await episode_wall(venv)  # warm-up round
    resets, walls = [], []
    try:
        with toolenv.tuned_gc(gen0_threshold_for(n)) if tuned else contextlib.nullcontext():
            for _ in range(rounds):
                r, w = await episode_wall(venv)
                resets.append(r)
                walls.append(w)
    finally:
        await venv.aclose()
    return median(resets), median(walls)


async def measure(n: int, rounds: int) -> dict[str, float]:
    reset, wall = await batch_walls(n, rounds, tuned=False)
    _, frozen = await batch_walls(n, rounds, tuned=True)
    floor = median([await bare_asyncio(n) for _ in range(rounds)])
    independent, independent_tuned, independent_floor = await independent_walls(n, rounds)
    runner = await runner_walls(n, rounds)
    return {
        "runner_ms": runner * 1e3,
        "runner_x_ideal": runner / IDEAL,
        "independent_ms": independent * 1e3,
        "independent_x_ideal": independent / IDEAL,
        "independent_gc_tuned_ms": independent_tuned * 1e3,
        "independent_gc_tuned_x_ideal": independent_tuned / IDEAL,
        "independent_floor_ms": independent_floor * 1e3,
        "independent_floor_x_ideal": independent_floor / IDEAL,
        "episodes": n,
        "reset_ms": reset * 1e3,
        "wall_ms": wall * 1e3,
        "wall_tuned_gc_ms": frozen * 1e3,
        "ideal_ms": IDEAL * 1e3,
        "x_ideal": wall / IDEAL,
        "asyncio_floor_ms": floor * 1e3,
        "x_floor": wall / floor,
        "overhead_us_per_step": (wall - IDEAL) / (n * TURNS) * 1e6,
        "episode_turns_per_s": n * TURNS / wall,
    }


def main() -> None:
    args = parse_args(__doc__ or "")
    counts = [1, 16, 128] if args.quick else [1, 4, 16, 64, 256, 1024]
    rounds = 1 if args.quick else 5
    rows = [asyncio.run(measure(n, rounds)) for n in counts]
    table(
        [
            [
                r["episodes"],
                r["wall_ms"],
                r["wall_tuned_gc_ms"],
                r["asyncio_floor_ms"],
                r["ideal_ms"],
                r["x_ideal"],
                r["x_floor"],
                r["overhead_us_per_step"],
                r["reset_ms"],
            ]
            for r in rows
        ],
        [
            "episodes",
            "toolenv ms",
            "tuned_gc ms",
            "bare asyncio ms",
            "ideal ms",
            "× ideal",
            "× asyncio",
            "µs/step over",
            "reset ms",
        ],
    )
    print(
        "\nindependent episodes (one coroutine each, reset included), as arollout and verl run them;"
        "\narollout: the whole runner (envs built, every turn recorded as a typed trajectory, summary):"
    )
    table(
        [
            [
                r["episodes"],
                r["independent_ms"],
                r["independent_gc_tuned_ms"],
                r["independent_floor_ms"],
                r["ideal_ms"],
                r["independent_x_ideal"],
                r["independent_gc_tuned_x_ideal"],
                r["independent_floor_x_ideal"],
                r["runner_ms"],
                r["runner_x_ideal"],
            ]
            for r in rows
        ],
        [
            "episodes",
            "toolenv ms",
            "tuned_gc ms",
            "bare asyncio ms",
            "ideal ms",
            "× ideal",
            "tuned × ideal",
            "bare × ideal",
            "arollout ms",
            "arollout × ideal",
        ],
    )
    top = rows[-1]
    for label, key, floor_key in (
        ("vector env", "x_ideal", None),
        ("independent episodes", "independent_x_ideal", "independent_floor_x_ideal"),
        (
            "independent episodes in tuned_gc (the runner's arrangement)",
            "independent_gc_tuned_x_ideal",
            "independent_floor_x_ideal",
        ),
        ("the whole runner (arollout, tuned_gc)", "runner_x_ideal", "independent_floor_x_ideal"),
    ):
        verdict = "met" if top[key] <= GOAL else "NOT met"
        floor = (
            f"; bare asyncio alone: {top[floor_key]:.2f}×"
            if floor_key
            else f"; bare asyncio alone: {top['asyncio_floor_ms'] / top['ideal_ms']:.2f}×"
        )
        print(f"goal: {top['episodes']} episodes within {GOAL}× of ideal, {label}: {top[key]:.2f}× ({verdict}{floor})")
    write(
        "concurrency",
        {
            "quick": args.quick,
            "latency_s": LATENCY,
            "turns": TURNS,
            "rounds": rounds,
            "goal_x_ideal": GOAL,
            "goal_met": top["x_ideal"] <= GOAL,
            "goal_met_independent": top["independent_x_ideal"] <= GOAL,
            "goal_met_independent_tuned_gc": top["independent_gc_tuned_x_ideal"] <= GOAL,
            "goal_met_runner": top["runner_x_ideal"] <= GOAL,
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
