"""Per-step overhead of parse + validate + invoke + format with an in-process no-op tool.

Compares `step` (sync, private loop) and `astep` (async) side by side, with the
bare parse alone as a floor. Goal: < 30 µs per astep, < 60 µs per step.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _common import median, parse_args, repeat, table, write
from pydantic import BaseModel

import toolenv
from toolenv import _aio
from toolenv.env import _turn_messages
from toolenv.episode import Turn

ACTION = '<tool_call>{"name": "noop", "arguments": {"x": 1}}</tool_call>'


class Noop(toolenv.Tool):
    """Do nothing."""

    name = "noop"

    class Args(BaseModel):
        x: int

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text="ok")


TURNS = 8  # steps per episode, as in real tool-use episodes; the env is reset between them


def make(parser: str = "hermes") -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Noop()], tasks=[{"question": "q", "answer": "a"}], max_turns=TURNS + 1, parser=parser)


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


async def time_async(env: toolenv.ToolEnv, steps: int, action: str = ACTION) -> float:
    """Seconds per `astep` of `action`, resets excluded."""
    total = 0.0
    for _ in range(steps // TURNS):
        await env.areset(seed=0)
        t0 = time.perf_counter()
        for _ in range(TURNS):
            await env.astep(action)
        total += time.perf_counter() - t0
    return total / (steps // TURNS * TURNS)


def drive(coro: Any) -> Any:
    """Run a coroutine that never suspends to its end without an event loop (for timing parts)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the coroutine suspended")


def breakdown(env: toolenv.ToolEnv, n: int) -> dict[str, float]:
    """Median seconds of each part of one astep, each timed on its own."""
    drive(env.areset(seed=0))
    ep = env.episode
    assert ep is not None
    parsed = env.parser.parse(ACTION)
    ctx = ep.context()
    results, records = drive(env.caller.invoke(parsed.tool_calls, ctx))
    turn = Turn(action=ACTION, parsed=parsed, results=results, records=records)
    loop = asyncio.new_event_loop()

    async def nothing() -> None:
        return None

    parts = {
        "parse (find tags, JSON, ToolCall)": lambda: env.parser.parse(ACTION),
        "invoke (Pydantic args, run, result, record)": lambda: drive(env.caller.invoke(parsed.tool_calls, ctx)),
        "reward (components, weighted sum)": lambda: env.reward_fn.weighted(
            drive(env.reward_fn.turn_components(ep, turn))
        ),
        "chat messages": lambda: _turn_messages(ACTION, parsed, results),
        "observation text": lambda: env.parser.format_results(results),
        "event-loop entry (sync step only: _aio.complete)": lambda: _aio.complete(loop, nothing()),
        "run_until_complete instead (sync step only, before)": lambda: loop.run_until_complete(nothing()),
    }
    try:
        return {name: median(repeat(fn, n)) for name, fn in parts.items()}
    finally:
        loop.close()


def per_parser(n: int) -> dict[str, dict[str, float]]:
    """µs to parse one turn with one call, and to run the whole astep, in each built-in format.

    The call is written by each parser's own `format_call`, so every format reads the same call.
    """
    out: dict[str, dict[str, float]] = {}
    for spec in toolenv.parsers.parser_names():
        parser = toolenv.get_parser(spec)
        action = parser.format_call("noop", {"x": 1})
        if action is None:  # the format cannot write this call (tags, codeblock): not comparable
            continue
        env = make(spec)
        bound = env.parser
        assert bound.parse(action).tool_calls[0].arguments == {"x": 1}, spec
        parse_s = median(repeat(lambda bound=bound, action=action: bound.parse(action), n))
        astep_s = asyncio.run(time_async(env, n, action))
        out[spec] = {"chars": len(action), "parse_us": parse_s * 1e6, "astep_us": astep_s * 1e6}
    return out


def main() -> None:
    args = parse_args(__doc__ or "")
    n = 800 if args.quick else 20_000
    env = make()
    step_s = median([time_sync(env, n) for _ in range(5)])
    aenv = make()
    astep_s = median([asyncio.run(time_async(aenv, n)) for _ in range(5)])
    parts = breakdown(make(), n)
    parse_s = parts["parse (find tags, JSON, ToolCall)"]
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
    print("\nwhere one astep goes (each part timed alone; the rest is episode bookkeeping and the info dict):")
    in_astep = {k: v for k, v in parts.items() if "sync step" not in k}
    rest = astep_s - sum(in_astep.values())
    table(
        [[k, v * 1e6, v / astep_s] for k, v in parts.items()] + [["rest of astep", rest * 1e6, rest / astep_s]],
        ["part", "µs", "share of astep"],
    )
    formats = per_parser(n)
    print("\none call in each format (written by the parser's own format_call), side by side:")
    table(
        [
            [k, v["chars"], v["parse_us"], v["astep_us"], v["parse_us"] / formats["hermes"]["parse_us"]]
            for k, v in formats.items()
        ],
        ["parser", "action chars", "parse µs", "astep µs", "parse × hermes"],
    )
    write(
        "step",
        {
            "formats": formats,
            "quick": args.quick,
            "n": n,
            "parse_us": parse_s * 1e6,
            "astep_us": astep_s * 1e6,
            "step_us": step_s * 1e6,
            "parts_us": {k: v * 1e6 for k, v in parts.items()},
            "goals": goals,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
