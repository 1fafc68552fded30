"""A circuit breaker on a tool whose server stops answering mid-run.

A "judge" server on 127.0.0.1 accepts connections and never answers (a hung process). The
tool asks it over httpx with a 0.2 s timeout. Without a breaker every call waits out the
timeout; with `breaker_threshold=3` the first three do, and the rest are refused at once
with an error observation, so the episodes go on at full speed and the server is left alone.

    python examples/breaker_example.py
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
from pydantic import BaseModel

import toolenv
from toolenv.breaker import reset_breakers


class Judge(toolenv.Tool):
    """Ask the judge whether a claim holds."""

    name = "judge"

    class Args(BaseModel):
        claim: str

    def __init__(self, url: str, **limits: Any) -> None:
        super().__init__(**limits)
        self.url = url
        self.requests = 0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        self.requests += 1
        async with httpx.AsyncClient() as client:
            reply = await client.post(self.url, json={"claim": args.claim})
        return toolenv.ToolResult(text=reply.text)


CALL = '<tool_call>{"name": "judge", "arguments": {"claim": "2 + 2 = 4"}}</tool_call>'


async def episodes(tool: Judge, count: int) -> tuple[int, int]:
    """Run `count` two-call episodes; (calls that timed out, calls refused by the breaker)."""
    timed_out = refused = 0
    env = toolenv.ToolEnv(tools=[tool], tasks=[{"question": "Is 2 + 2 = 4?", "answer": "yes"}], max_turns=3)
    for seed in range(count):
        await env.areset(seed=seed)
        for _ in range(2):
            obs, *_ = await env.astep(CALL)
            if "is unavailable" in obs:
                refused += 1
            elif "timed out" in obs:
                timed_out += 1
        await env.astep("<answer>yes</answer>")
    await env.aclose()
    return timed_out, refused


async def main() -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # cancelled: the example is over
            await reader.read()  # answer nothing, until the client gives up and hangs up
        writer.close()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/judge"
    for label, limits in (("no breaker", {}), ("breaker_threshold=3", {"breaker_threshold": 3})):
        reset_breakers()
        tool = Judge(url, timeout=0.2, **limits)
        start = time.perf_counter()
        timed_out, refused = await episodes(tool, 6)
        took = time.perf_counter() - start
        print(
            f"{label}: 12 calls, {timed_out} timed out, {refused} refused at once, {tool.requests} reached the server"
        )
        print(f"  ({took:.1f} s)")
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(main())
