"""A tool with a ResultCache, stepped the way GRPO samples: a group of episodes per prompt.

Each of the 8 samples of a prompt opens with the same search, at the same moment. The cache
runs that search once: the other 7 callers wait for its result (joined). A second group of
the same prompt finds the result stored (hits) and runs nothing.

    python examples/cache_example.py
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field

import toolenv
from toolenv import ResultCache

PASSAGES = {
    "capital of france": "Paris is the capital and largest city of France.",
    "tallest mountain": "Mount Everest is Earth's highest mountain above sea level.",
}


class Search(toolenv.Tool):
    """Search a small encyclopedia (a stand-in for a retriever 50 ms away)."""

    name = "search"
    cache = ResultCache(maxsize=10_000, scope="shared")  # one cache for every env in the process

    class Args(BaseModel):
        query: str = Field(description="What to look up.")

    runs = 0  # searches that reached the "retriever"

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        type(self).runs += 1
        await asyncio.sleep(0.05)
        key = args.query.lower().strip("?")
        return toolenv.ToolResult(text=next((p for k, p in PASSAGES.items() if k in key), "No results."))


TASKS = [{"id": "paris", "question": "What is the capital of France?", "answer": "Paris"}]
SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "capital of France"}}</tool_call>'


async def sample_group(size: int) -> list[float]:
    """`size` episodes of one prompt, stepped concurrently, as a GRPO group is."""

    async def episode(seed: int) -> float:
        env = toolenv.ToolEnv(tools=[Search()], tasks=TASKS, max_turns=3)
        await env.areset(seed=seed)
        await env.astep(SEARCH)
        _, reward, *_ = await env.astep("<answer>Paris</answer>")
        await env.aclose()
        return float(reward)

    return await asyncio.gather(*(episode(i) for i in range(size)))


async def main() -> None:
    for group in (1, 2):
        rewards = await sample_group(8)
        print(f"group {group}: mean reward {sum(rewards) / len(rewards):.1f}")
    assert Search.cache is not None
    stats = Search.cache.stats()
    print(f"16 searches: {Search.runs} ran, {stats.joined} joined a running one, {stats.hits} answered from the cache")
    print(f"saved {stats.saved:.0%} of the calls")


if __name__ == "__main__":
    asyncio.run(main())
