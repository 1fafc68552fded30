"""MCP tool calls: toolenv-mcp (a toolenv env step, and a bare tool call) against the MCP SDK's own `ClientSession`.

Same server (the plugin's demo shop, `python -m toolenv_mcp.demo_server`, over stdio),
same call (`multiply(a=2.25, b=3)`). The SDK row is the floor: one `ClientSession` used
from the loop that opened it. toolenv's calls go through the shared session on the
plugin's background loop (so any env in any loop can use it), with the arguments checked
against the server's schema first. Also: calls per second with many in flight over the
one session, and what an episode-scoped server costs (a process started and stopped per
episode).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from _common import median, parse_args, table, write

import toolenv

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 2.25, "b": 3}}</tool_call>'
ARGS = {"a": 2.25, "b": 3}
CONCURRENT = 64


async def sdk_floor(n: int, concurrent: int) -> tuple[float, float]:
    """(median seconds per call, calls/s with `concurrent` in flight) through a bare ClientSession."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "toolenv_mcp.demo_server"])
    async with stdio_client(params) as (read, write_), ClientSession(read, write_) as session:
        await session.initialize()
        for _ in range(5):
            await session.call_tool("multiply", ARGS)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await session.call_tool("multiply", ARGS)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await asyncio.gather(*(session.call_tool("multiply", ARGS) for _ in range(concurrent * 4)))
        rate = concurrent * 4 / (time.perf_counter() - t0)
    return median(times), rate


async def toolenv_paths(n: int, concurrent: int) -> dict[str, float]:
    """Per-call seconds through a ToolEnv step and through the tool alone, and calls/s in flight."""
    from toolenv_mcp import mcp_tools
    from toolenv_mcp.demo import DEMO_SERVERS

    tools = await asyncio.to_thread(mcp_tools, DEMO_SERVERS)
    env = toolenv.ToolEnv(tools=tools, tasks=[{"question": "q", "answer": "a"}], max_turns=n + 10)
    await env.areset(seed=0)
    for _ in range(5):
        await env.astep(CALL)
    steps = []
    for _ in range(n):
        t0 = time.perf_counter()
        await env.astep(CALL)
        steps.append(time.perf_counter() - t0)
    caller = toolenv.ToolCaller(tools)
    ctx = toolenv.ToolContext(task=toolenv.Task(question="q"))
    call = toolenv.ToolCall(name="multiply", arguments=dict(ARGS), id="c")
    bare = []
    for _ in range(n):
        t0 = time.perf_counter()
        results, _ = await caller.invoke([call], ctx)
        bare.append(time.perf_counter() - t0)
        assert not results[0].is_error, results[0].text
    t0 = time.perf_counter()
    await asyncio.gather(*(caller.invoke([call], ctx) for _ in range(concurrent * 4)))
    rate = concurrent * 4 / (time.perf_counter() - t0)
    await env.aclose()
    return {"step_s": median(steps), "call_s": median(bare), "calls_per_s": rate}


async def episode_scope(episodes: int) -> dict[str, float]:
    """Seconds of an episode's first call (the server's start included), a later call, and the episode's end."""
    from toolenv_mcp import MCPServer, mcp_tools

    server = MCPServer(name="shop", command=sys.executable, args=["-m", "toolenv_mcp.demo_server"], scope="episode")
    tools = await asyncio.to_thread(mcp_tools, server)
    env = toolenv.ToolEnv(tools=tools, tasks=[{"question": "q", "answer": "6.75"}], max_turns=3)
    first, later, end = [], [], []
    for i in range(episodes):
        await env.areset(seed=i)
        t0 = time.perf_counter()
        await env.astep(CALL)
        t1 = time.perf_counter()
        await env.astep(CALL)
        t2 = time.perf_counter()
        await env.astep("<answer>6.75</answer>")  # ends the episode: its server is stopped
        t3 = time.perf_counter()
        first.append(t1 - t0)
        later.append(t2 - t1)
        end.append(t3 - t2)
    await env.aclose()
    return {"first_call_s": median(first), "later_call_s": median(later), "episode_end_s": median(end)}


async def measure(n: int, episodes: int) -> dict[str, Any]:
    sdk_call, sdk_rate = await sdk_floor(n, CONCURRENT)
    ours = await toolenv_paths(n, CONCURRENT)
    scoped = await episode_scope(episodes)
    return {"sdk_call_s": sdk_call, "sdk_calls_per_s": sdk_rate, **ours, **scoped}


def main() -> None:
    args = parse_args(__doc__ or "")
    try:
        import mcp  # noqa: F401

        import toolenv_mcp  # noqa: F401
    except ImportError:
        print("skipped: needs the MCP plugin (pip install -e plugins/mcp)")
        return
    n, episodes = (30, 2) if args.quick else (400, 10)
    res = asyncio.run(measure(n, episodes))
    floor = res["sdk_call_s"]
    table(
        [
            ["MCP SDK ClientSession (floor)", floor * 1e3, 1.0, res["sdk_calls_per_s"]],
            ["toolenv MCPTool via ToolCaller", res["call_s"] * 1e3, res["call_s"] / floor, res["calls_per_s"]],
            ["toolenv env.astep (parse+call+observe)", res["step_s"] * 1e3, res["step_s"] / floor, ""],
        ],
        ["path (stdio, demo server)", "ms/call", "× SDK", f"calls/s, {CONCURRENT * 4} in flight"],
    )
    print()
    table(
        [
            ["first call (server start + handshake)", res["first_call_s"] * 1e3],
            ["later call", res["later_call_s"] * 1e3],
            ["episode end (server stopped)", res["episode_end_s"] * 1e3],
        ],
        ['scope="episode", per episode', "ms"],
    )
    write("mcp", {"quick": args.quick, "calls": n, "episodes": episodes, "concurrent": CONCURRENT, **res}, args.out)


if __name__ == "__main__":
    main()
