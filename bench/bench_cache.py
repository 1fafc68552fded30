"""What a `ResultCache` saves when GRPO groups share a retriever of limited capacity, and what it costs.

GRPO groups: P prompts x G samples, every episode stepped concurrently in one event loop
(as verl's agent loop and `toolenv.arollout` run them). An episode makes two searches and
answers: the first search is the prompt's own query, the same in every sample of the group;
the second is one of three rewordings, drawn per sample. The retriever answers in 20 ms and
serves 16 requests at once (`max_concurrency=16`, a server's capacity), so calls queue.
The same episodes run without a cache and with one (`scope="shared"`, fresh for the run),
side by side: wall time, searches that reached the retriever, and their ratio.

The second table is the cost side: `astep` of an in-process tool that answers at once,
without a cache, and with a cache answering every call (a hit: the key is serialised and
looked up), per step.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from _common import median, parse_args, table, write
from pydantic import BaseModel

import toolenv
from toolenv import ResultCache

LATENCY = 0.02
CAPACITY = 16
GROUP = 8
VARIANTS = 3


class Retriever(toolenv.Tool):
    """A retriever 20 ms away that serves CAPACITY requests at once."""

    name = "search"
    limits = toolenv.ToolLimits(max_concurrency=CAPACITY, timeout=60)

    class Args(BaseModel):
        query: str

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.runs = 0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        self.runs += 1
        await asyncio.sleep(LATENCY)
        return toolenv.ToolResult(text=f"passages for {args.query}")


def search(query: str) -> str:
    return '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % query  # noqa: UP031


async def groups(prompts: int, cache: ResultCache | None, seed: int) -> tuple[float, int, int]:
    """(wall seconds, searches made, searches that reached the retriever) for one run."""
    tool = Retriever(cache=cache)
    tasks = [{"id": f"p{i}", "question": f"question {i}", "answer": "x"} for i in range(prompts)]
    rng = random.Random(seed)
    plans = [(p, rng.randrange(VARIANTS)) for p in range(prompts) for _ in range(GROUP)]

    async def episode(prompt: int, variant: int) -> None:
        env = toolenv.ToolEnv(tools=[tool], tasks=tasks, max_turns=3)
        await env.areset(options={"task_index": prompt})
        await env.astep(search(f"query of prompt {prompt}"))
        await env.astep(search(f"rewording {variant} of prompt {prompt}"))
        await env.astep("<answer>x</answer>")

    start = time.perf_counter()
    await asyncio.gather(*(episode(p, v) for p, v in plans))
    return time.perf_counter() - start, 2 * len(plans), tool.runs


class Instant(toolenv.Tool):
    """Answers at once."""

    name = "search"

    class Args(BaseModel):
        query: str

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text="ok")


async def per_step(cache: ResultCache | None, steps: int) -> float:
    env = toolenv.ToolEnv(tools=[Instant(cache=cache)], tasks=[{"question": "q", "answer": "a"}], max_turns=10**9)
    action = search("the same query")
    await env.areset()
    await env.astep(action)  # warm (and, with a cache, stored)
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps):
            await env.astep(action)
        rounds.append((time.perf_counter() - t0) / steps)
    return median(rounds)


def main() -> None:
    args = parse_args(__doc__ or "")
    prompts = 4 if args.quick else 64
    steps = 2_000 if args.quick else 50_000
    rows, results = [], {}
    asyncio.run(groups(1, None, 0))  # warm: imports and first-use costs stay out of both rows
    for label, make in (("no cache", lambda: None), ("ResultCache (shared)", lambda: ResultCache(scope="shared"))):
        walls, reached = [], 0
        for seed in range(1 if args.quick else 3):
            wall, searches, runs = asyncio.run(groups(prompts, make(), seed))
            walls.append(wall)
            reached = runs
        results[label] = {"wall_s": median(walls), "searches": searches, "retriever_calls": reached}
        rows.append([label, prompts * GROUP, searches, reached, median(walls) * 1000])
    base, cached = results["no cache"], results["ResultCache (shared)"]
    print(f"GRPO groups: {prompts} prompts x {GROUP} samples, retriever {LATENCY * 1000:.0f} ms, capacity {CAPACITY}")
    table(rows, ["run", "episodes", "searches", "retriever calls", "wall ms"])
    speedup = base["wall_s"] / cached["wall_s"]
    calls_ratio = cached["retriever_calls"] / base["retriever_calls"]
    print(f"with the cache: {speedup:.2f}x faster, {calls_ratio:.2f}x the retriever calls")

    plain = asyncio.run(per_step(None, steps))
    hit = asyncio.run(per_step(ResultCache(scope="shared"), steps))
    print()
    table([["no cache (tool runs)", plain * 1e6], ["cache hit", hit * 1e6]], ["astep, in-process tool", "us/step"])
    print(f"a hit costs {hit / plain:.2f}x a step whose tool runs at once")
    write(
        "cache",
        {
            "quick": args.quick,
            "groups": {"prompts": prompts, "group": GROUP, "latency_s": LATENCY, "capacity": CAPACITY, **results},
            "speedup": speedup,
            "retriever_calls_ratio": calls_ratio,
            "astep_us": {"no_cache": plain * 1e6, "cache_hit": hit * 1e6},
        },
        args.out,
    )


if __name__ == "__main__":
    main()
