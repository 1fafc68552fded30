"""Per-step overhead of parse + validate + invoke + format with an in-process no-op tool.

Compares `step` (sync, private loop) and `astep` (async) side by side, with the
bare parse alone as a floor. Goal: < 30 µs per astep, < 60 µs per step.
"""

from __future__ import annotations

import asyncio
import time

from _common import median, parse_args, repeat, table, write
from pydantic import BaseModel

import toolenv

ACTION = '<tool_call>{"name": "noop", "arguments": {"x": 1}}</tool_call>'


class Noop(toolenv.Tool):
    """Do nothing."""

    name = "noop"

    class Args(BaseModel):
        x: int

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text="ok")


TURNS = 8  # steps per episode, as in real tool-use episodes; the env is reset between them


def make() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Noop()], tasks=[{"question": "q", "answer": "a"}], max_turns=TURNS + 1)


def time_sync(env: toolenv.ToolEnv, steps: int) -> float:
    """Seconds per `step`, resets excluded."""
    total = 0.0
    for _ in range(steps // TURNS):
        env.reset(seed=0)
        t0 = time.perf_counter()
        for _ in range(TURNS):
            env.step(ACTION)
        total += time.perf_counter() - t0
    return total / (steps // TURNS * TURNS)


async def time_async(env: toolenv.ToolEnv, steps: int) -> float:
    """Seconds per `astep`, resets excluded."""
    total = 0.0
    for _ in range(steps // TURNS):
        await env.areset(seed=0)
        t0 = time.perf_counter()
        for _ in range(TURNS):
            await env.astep(ACTION)
        total += time.perf_counter() - t0
    return total / (steps // TURNS * TURNS)


def main() -> None:
    args = parse_args(__doc__ or "")
    n = 800 if args.quick else 20_000
    env = make()
    step_s = median([time_sync(env, n) for _ in range(5)])
    aenv = make()
    astep_s = median([asyncio.run(time_async(aenv, n)) for _ in range(5)])
    parse_s = median(repeat(lambda: env.parser.parse(ACTION), n))
    rows = [
        ["parse only", parse_s * 1e6, 1.0],
        ["astep", astep_s * 1e6, astep_s / parse_s],
        ["step", step_s * 1e6, step_s / parse_s],
    ]
    table(rows, ["path", "µs/step", "× parse"])
    goals = {"astep_us": 30.0, "step_us": 60.0}
    print(
        f"goal: astep < {goals['astep_us']} µs ({'met' if astep_s * 1e6 < 30 else 'NOT met'}), "
        f"step < {goals['step_us']} µs ({'met' if step_s * 1e6 < 60 else 'NOT met'})"
    )
    write(
        "step",
        {
            "quick": args.quick,
            "n": n,
            "parse_us": parse_s * 1e6,
            "astep_us": astep_s * 1e6,
            "step_us": step_s * 1e6,
            "goals": goals,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
