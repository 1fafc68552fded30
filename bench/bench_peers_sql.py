"""SQL tool latency on Spider gold queries: toolenv-sql's `SQLTool` against SkyRL-gym's SQL tool.

Both tools get the same gold queries (the bundled `spider_dev_sample`, one
query per question, each on its own database) and do their whole job per call:

- toolenv: `SQLTool.Args` validation, then `SQLTool.run` (sqlglot read-only
  guard, execution on a pooled read-only connection with a timeout, table
  formatting). The guard caches parsed queries and the pooled connection its
  prepared statements, so two rows: "cold guard" clears the guard's cache and
  sends a text never sent before (the query behind a fresh `/* call N */`
  comment), as a model's new query is; "warm" repeats the same text.
- SkyRL-gym: `SQLCodeExecutorToolGroup(db_root).execute_tool("sql", db_id, sql, 5)` on
  the cold row's texts
  (a fresh sqlite3 connection in a new thread per call, a rolled-back
  transaction, pandas formatting).

Per query, the median of `reps` calls; then median and p90 over queries, and
the ratio toolenv/SkyRL of those medians (goal: ≤ 1.0). Everything runs in one
process in `.venv-bench`; `--quick` without it measures toolenv only.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import _peers
import peers_env
from _common import machine, median, table, write

ROWS = ("toolenv SQLTool (cold guard)", "toolenv SQLTool (warm)", "SkyRL SQL tool")


async def measure_async(quick: bool) -> dict[str, Any]:
    from toolenv import ToolContext
    from toolenv_sql import DATA_DIR, SQLTool
    from toolenv_sql.datasets import spider_tasks
    from toolenv_sql.guard import _prepare

    tasks = list(spider_tasks())
    if quick:
        tasks = tasks[::35]
    reps = 3 if quick else 7
    tool = SQLTool()
    db_root = DATA_DIR / "spider_dev_sample" / "database"
    skyrl: Any = None
    skipped: dict[str, str] = {}
    try:
        from skyrl_gym.tools.sql import SQLCodeExecutorToolGroup  # type: ignore[import-not-found,unused-ignore]

        skyrl = SQLCodeExecutorToolGroup(str(db_root))
    except ImportError as exc:
        skipped["SkyRL SQL tool"] = f"skyrl-gym is not importable in {sys.prefix} ({exc})"

    async def toolenv_call(sql: str, ctx: ToolContext, cold: bool) -> Any:
        if cold:
            _prepare.cache_clear()
        return await tool.run(tool.Args.model_validate({"query": sql}), ctx)

    calls = itertools.count()

    def fresh(sql: str) -> str:
        """`sql` as a text never sent before: neither the guard's cache nor SQLite's statement
        cache on a pooled connection has it (a repeated text would skip SQLite's prepare)."""
        return f"/* call {next(calls)} */ {sql}"

    per_query: dict[str, list[float]] = {name: [] for name in ROWS if name not in skipped}
    errors = dict.fromkeys(per_query, 0)
    for task in tasks:
        sql, db_id = task.context["gold_sql"], task.context["db_id"]
        ctx = ToolContext(task)
        # Warm the connections, and check that each row's texts are answered.
        errors[ROWS[1]] += (await toolenv_call(sql, ctx, cold=False)).is_error
        errors[ROWS[0]] += (await toolenv_call(fresh(sql), ctx, cold=True)).is_error
        if skyrl is not None:
            out = skyrl.execute_tool("sql", db_id, fresh(sql), 5)
            errors[ROWS[2]] += "Error executing SQL" in out or "SQL Timeout" in out
        times: dict[str, list[float]] = {name: [] for name in per_query}
        for _ in range(reps):  # interleaved, so drift hits every row alike
            for name in per_query:
                text = sql if name == ROWS[1] else fresh(sql)
                t0 = time.perf_counter()
                if name == "SkyRL SQL tool":
                    skyrl.execute_tool("sql", db_id, text, 5)
                else:
                    await toolenv_call(text, ctx, cold=name == ROWS[0])
                times[name].append(time.perf_counter() - t0)
        for name, xs in times.items():
            per_query[name].append(median(xs))
    return {
        "per_query_s": per_query,
        "errors": errors,
        "queries": len(tasks),
        "reps": reps,
        "skipped": skipped,
        "versions": _peers.versions("toolenv", "toolenv-sql", "sqlglot", "skyrl-gym", "pandas"),
        "python": peers_env.shown(sys.executable),
    }


def measure(quick: bool) -> dict[str, Any]:
    return asyncio.run(measure_async(quick))


def main() -> int:
    args = _peers.parse_args(__doc__.splitlines()[0])
    extras = {"toolenv-sql": _peers.editable("sql")}
    got = _peers.run(__file__, args, measure, extras)
    if got is None:
        return 1
    result, note = got
    per_query: dict[str, list[float]] = result["per_query_s"]
    stats = {
        name: {"median_us": median(xs) * 1e6, "p90_us": _peers.percentile(xs, 0.9) * 1e6}
        for name, xs in per_query.items()
    }
    skyrl = stats.get("SkyRL SQL tool")
    venv = Path(result["python"]).parent.parent.name
    print(f"machine: {machine()['processor']}, {machine()['cpus']} CPUs; measured with {venv}/bin/python")
    print(f"{result['queries']} Spider gold queries, median of {result['reps']} calls each; median/p90 over queries")
    rows = []
    for name, s in stats.items():
        ratio = s["median_us"] / skyrl["median_us"] if skyrl else float("nan")
        s["ratio_to_skyrl"] = ratio
        if skyrl and name != "SkyRL SQL tool":  # per query, then the median of those ratios
            pq = [a / b for a, b in zip(per_query[name], per_query["SkyRL SQL tool"], strict=True)]
            s["median_per_query_ratio"] = median(pq)
        rows.append([name, s["median_us"], s["p90_us"], ratio, result["errors"][name]])
    table(rows, ["tool", "median µs", "p90 µs", "÷ SkyRL", "error results"])
    for label, why in result["skipped"].items():
        print(f"not measured: {label}: {why}")
    met = None
    if skyrl:
        cold = stats[ROWS[0]]["ratio_to_skyrl"]
        met = cold <= 1.0
        print(f"goal (toolenv/SkyRL ≤ 1.0, cold guard): {'met' if met else 'NOT met'}: {cold:.2f}")
    if note:
        print(note)
    write(
        "peers_sql",
        {
            "quick": args.quick,
            "queries": result["queries"],
            "reps": result["reps"],
            "stats": stats,
            "errors": result["errors"],
            "goal_ratio_le_1_met": met,
            "skipped": result["skipped"],
            "versions": result["versions"],
            "measured_with": result["python"],
            "note": note,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
