"""SQL step latency on the Spider gold queries, side by side with plain sqlite3.

For each gold query (on its own database) it times, per call:
  plain sqlite3     conn.execute(sql).fetchall() on an open connection (the floor)
  guard, uncached   sqlglot parse + read-only check, first time (`prepare` caches repeats)
  executor          read-only connection, awaited (`execute`: inline within a 2 ms budget)
  executor via pool the same, always on the worker pool (the thread hop it saves)
  tool call         `SQLTool.run`: guard + executor + table formatting
  env.astep         a `<sql>…</sql>` turn through parser, caller, tool and observation
and prints median / p90 in µs with each path's median ratio to plain sqlite3.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from _common import parse_args, table, write

from toolenv import Task, ToolContext
from toolenv_sql import DATA_DIR, SQLTool, execute
from toolenv_sql.datasets import spider_tasks
from toolenv_sql.envs import make_spider_env
from toolenv_sql.executor import sqlite_uri
from toolenv_sql.guard import _prepare


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1] if len(xs) > 1 else xs[0]


async def time_async(fn: Callable[[], Awaitable[Any]], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        await fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_sync(fn: Callable[[], Any], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


async def run(tasks: list[Task], reps: int) -> dict[str, list[float]]:
    tool = SQLTool(max_rows=50)
    env = make_spider_env(max_turns=10**6)
    conns: dict[str, sqlite3.Connection] = {}
    out: dict[str, list[float]] = {
        k: [] for k in ("plain sqlite3", "guard, uncached", "executor", "executor via pool", "tool call", "env.astep")
    }
    for task in tasks:
        sql = task.context["gold_sql"]
        path = (DATA_DIR / task.context["db_path"]).resolve()
        conn = conns.setdefault(str(path), sqlite3.connect(sqlite_uri(path), uri=True))
        ctx = ToolContext(task)
        args = tool.Args(query=sql)
        await tool.run(args, ctx)  # warm the worker connections and caches
        out["plain sqlite3"].append(time_sync(partial(lambda c, q: c.execute(q).fetchall(), conn, sql), reps))
        uncached = _prepare.__wrapped__  # the check without its cache
        out["guard, uncached"].append(time_sync(partial(uncached, sql, None, "sqlite"), reps))
        out["executor"].append(await time_async(partial(execute, path, "sqlite", sql, max_rows=50), reps))
        pooled = partial(execute, path, "sqlite", sql, max_rows=50, inline_budget=0)
        out["executor via pool"].append(await time_async(pooled, reps))
        out["tool call"].append(await time_async(partial(tool.run, args, ctx), reps))
        await env.areset(options={"task": task})
        out["env.astep"].append(await time_async(partial(env.astep, f"<sql>{sql}</sql>"), reps))
    return out


def main() -> None:
    args = parse_args(__doc__ or "")
    tasks = list(spider_tasks())
    if args.quick:
        tasks = tasks[::25]
    reps = 3 if args.quick else 7
    times = asyncio.run(run(tasks, reps))
    base = statistics.median(times["plain sqlite3"])
    rows, data = [], {}
    for name, xs in times.items():
        med, hi = statistics.median(xs), p90(xs)
        rows.append([name, med * 1e6, hi * 1e6, med / base])
        data[name] = {"median_us": med * 1e6, "p90_us": hi * 1e6, "ratio_to_sqlite3": med / base}
    print(f"{len(tasks)} Spider gold queries, best of {reps} per query; median and p90 over queries")
    table(rows, ["path", "median µs", "p90 µs", "× sqlite3"])
    write("sql", {"quick": args.quick, "queries": len(tasks), "reps": reps, "paths": data}, args.out)


if __name__ == "__main__":
    main()
