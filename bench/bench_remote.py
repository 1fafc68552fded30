"""Per-step latency of an env stepped over HTTP (`toolenv serve` + `RemoteToolEnv`) against the same env in-process.

The server is a `toolenv serve` subprocess on 127.0.0.1 (one uvicorn worker) with the
calculator tool; the client steps it with `astep` over one keep-alive connection per env.
Loopback only: add the network's round trip on a real cluster.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from _common import median, parse_args, table, write

import toolenv
from toolenv.integrations.verl.demo import DEMO_TASKS, Calculator

ACTION = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
TURNS = 8  # steps per episode; the env is reset between them
CONCURRENT = 32


def local_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Calculator()], tasks=DEMO_TASKS, max_turns=TURNS + 1)


def start_server() -> tuple[subprocess.Popen[str], str]:
    args = [
        sys.executable,
        "-m",
        "toolenv.cli",
        "serve",
        "toolenv/ToolEnv-v0",
        "--port",
        "0",
        "--max-sessions",
        str(CONCURRENT + 8),
        "--env-arg",
        'tools=["toolenv.integrations.verl.demo:Calculator"]',
        "--env-arg",
        f"tasks={json.dumps(DEMO_TASKS)}",
        "--env-arg",
        f"max_turns={TURNS + 1}",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise SystemExit(f"toolenv serve did not start: {line!r}")
    return proc, line.split(" on ", 1)[1].split()[0]


async def per_step(env: toolenv.ToolEnv, episodes: int) -> tuple[float, float]:
    """(seconds per reset, seconds per astep), each the median over episodes."""
    resets, steps = [], []
    for i in range(episodes):
        t0 = time.perf_counter()
        await env.areset(seed=i)
        t1 = time.perf_counter()
        for _ in range(TURNS):
            await env.astep(ACTION)
        t2 = time.perf_counter()
        resets.append(t1 - t0)
        steps.append((t2 - t1) / TURNS)
    return median(resets), median(steps)


async def throughput(envs: list[toolenv.ToolEnv], episodes: int) -> float:
    """Steps per second with every env stepping its own episodes concurrently."""

    async def run(env: toolenv.ToolEnv) -> None:
        for i in range(episodes):
            await env.areset(seed=i)
            for _ in range(TURNS):
                await env.astep(ACTION)

    t0 = time.perf_counter()
    await asyncio.gather(*(run(e) for e in envs))
    return len(envs) * episodes * TURNS / (time.perf_counter() - t0)


async def measure(url: str, episodes: int) -> dict[str, Any]:
    from toolenv.remote import RemoteToolEnv

    local = local_env()
    remote = await asyncio.to_thread(RemoteToolEnv, url)
    await per_step(local, 3)  # warm up both paths (imports, the connection, the server's first session)
    await per_step(remote, 3)
    local_reset, local_step = await per_step(local, episodes)
    remote_reset, remote_step = await per_step(remote, episodes)
    await remote.aclose()
    locals_ = [local_env() for _ in range(CONCURRENT)]
    remotes = [await asyncio.to_thread(RemoteToolEnv, url) for _ in range(CONCURRENT)]
    rounds = max(1, episodes // 8)
    local_rate = await throughput(locals_, rounds)
    remote_rate = await throughput(remotes, rounds)
    for e in remotes:
        await e.aclose()
    return {
        "local_reset_us": local_reset * 1e6,
        "local_step_us": local_step * 1e6,
        "remote_reset_us": remote_reset * 1e6,
        "remote_step_us": remote_step * 1e6,
        "local_steps_per_s": local_rate,
        "remote_steps_per_s": remote_rate,
    }


def main() -> None:
    args = parse_args(__doc__ or "")
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("skipped: the server needs the serve extra (pip install 'toolenv[serve]')")
        return
    episodes = 20 if args.quick else 200
    proc, url = start_server()
    try:
        res = asyncio.run(measure(url, episodes))
    finally:
        proc.terminate()
        proc.wait(30)
    table(
        [
            ["reset, in-process", res["local_reset_us"], 1.0],
            ["reset, over HTTP", res["remote_reset_us"], res["remote_reset_us"] / res["local_reset_us"]],
            ["astep, in-process", res["local_step_us"], 1.0],
            ["astep, over HTTP", res["remote_step_us"], res["remote_step_us"] / res["local_step_us"]],
        ],
        ["path (one env, loopback)", "µs", "× in-process"],
    )
    print()
    table(
        [
            ["in-process", res["local_steps_per_s"]],
            ["over HTTP (one server process)", res["remote_steps_per_s"]],
        ],
        [f"{CONCURRENT} envs stepping concurrently", "steps/s"],
    )
    config = {"quick": args.quick, "episodes": episodes, "turns": TURNS, "concurrent": CONCURRENT}
    write("remote", {**config, **res}, args.out)


if __name__ == "__main__":
    main()
