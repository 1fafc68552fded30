"""Many episodes at once: one coroutine each, in one event loop, inside `toolenv.tuned_gc()`.

Each episode asks a tool that waits 50 ms (as a network call would) four times, so the
ideal wall time is 4 x 50 ms however many episodes run. Run it with a number of episodes:

    python examples/many_episodes.py 1024
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time

from pydantic import BaseModel

import toolenv

LATENCY, TURNS = 0.05, 4
ACTION = '<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>'


class Lookup(toolenv.Tool):
    """Look a key up in a remote store (simulated: 50 ms)."""

    name = "lookup"

    class Args(BaseModel):
        key: str

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        await asyncio.sleep(LATENCY)
        return toolenv.ToolResult(text=f"value of {args.key}")


async def episode(env: toolenv.ToolEnv) -> float:
    await env.areset()
    total = 0.0
    for _ in range(TURNS):
        _, reward, _, _, info = await env.astep(ACTION)
        assert not info["tool_results"][0].is_error
        total += float(reward)
    return total


async def main(n: int) -> None:
    tool = Lookup()  # one tool object serves every env
    envs = [toolenv.ToolEnv(tools=[tool], tasks=[{"question": "q", "answer": "a"}], max_turns=TURNS) for _ in range(n)]
    before = gc.get_threshold()
    with toolenv.tuned_gc(toolenv.gen0_threshold_for(n)) as tuned:  # a young generation sized for n episodes
        t0 = time.perf_counter()
        await asyncio.gather(*(episode(e) for e in envs))
        wall = time.perf_counter() - t0
    assert gc.get_threshold() == before  # the collector is as it was
    ideal = TURNS * LATENCY
    print(f"{n} episodes x {TURNS} turns: {wall * 1e3:.0f} ms, {wall / ideal:.2f}x the ideal {ideal * 1e3:.0f} ms")
    print(f"garbage collector tuned for the run: {tuned}; settings restored: {gc.get_threshold() == before}")
    for env in envs:
        await env.aclose()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 256))
