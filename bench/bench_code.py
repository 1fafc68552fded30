"""Sandboxed execution speed: toolenv's warm fork-server pool vs a plain `python -c` subprocess.

For three snippets (trivial print, a 50 ms compute loop, a failing snippet) it
measures sequential latency (median, p90) and throughput (executions per second
with as many parallel callers as the pool has servers), prints a side-by-side
table with ratios and writes bench/results/code.json. The `python -c` row starts the
interpreter of a throwaway venv with nothing installed (`bare_python`): the project's
venv holds editable installs whose finders add ~10 ms to every interpreter start.
Each side's answer to each snippet is checked before it is timed. A second table times the
hidden-test grader on reference solutions, split (the default: the solution's
process never holds the expected values) against every test run in the solution's
process (`split_tests=False`), the two taking turns. A third times `preload` (sympy, numpy:
whichever are installed): a call that imports the module, and `print(1)`, on a plain pool and
on one whose servers pre-import it, in turns.

Usage: python bench/bench_code.py [--quick]
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import bare_python, parse_args, table, write

from toolenv_code import SandboxPool, get_pool, isolation_report
from toolenv_code.datasets import humaneval_tasks, mbpp_tasks
from toolenv_code.grading import TestSpec, run_tests

#: Reference solutions graded in the grading table: typical tasks, and one whose tests need the
#: second (trusted) run because the host cannot decide them from plain comparisons.
GRADED = ("HumanEval/0", "HumanEval/151", "MBPP/11", "MBPP/324")

SNIPPETS = {
    "trivial": "print(1)",
    "compute_50ms": (
        "import time\nt = time.perf_counter()\nn = 0\nwhile time.perf_counter() - t < 0.05:\n    n += 1\nprint(n > 0)"
    ),
    "failing": "def f():\n    return 1 / 0\nf()\n",
}


#: What each snippet must print (stdout), and whether it must fail.
EXPECTED = {"trivial": ("1\n", False), "compute_50ms": ("True\n", False), "failing": ("", True)}


def run_toolenv(code: str) -> tuple[bool, str, str]:
    r = get_pool().run(code)
    return r.ok, r.stdout, r.stderr


def subprocess_runner(python: Path) -> Callable[[str], tuple[bool, str, str]]:
    def run_subprocess(code: str) -> tuple[bool, str, str]:
        p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, check=False)
        return p.returncode == 0, p.stdout, p.stderr

    return run_subprocess


def check(label: str, snippet: str, fn: Callable[[str], tuple[bool, str, str]]) -> None:
    """A side that fails, or does less, must not be timed as faster: its answer is checked first."""
    ok, out, err = fn(SNIPPETS[snippet])
    stdout, fails = EXPECTED[snippet]
    assert ok is not fails and out == stdout, (label, snippet, ok, out, err)
    assert not fails or "ZeroDivisionError" in err, (label, snippet, err)


def latency(fn: Callable[[str], object], code: str, n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn(code)
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times) * 1000, times[int(0.9 * (len(times) - 1))] * 1000


def throughput(fn: Callable[[str], object], code: str, n: int, workers: int) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(fn, [code] * n))
    return n / (time.perf_counter() - start)


def grading_rows(rounds: int) -> list[dict[str, float | str]]:
    """Median ms per grading of each GRADED reference solution, split and in-process, in turns."""
    tasks = {t.id: t for t in [*humaneval_tasks(), *mbpp_tasks()] if t.id in GRADED}
    rows: list[dict[str, float | str]] = []
    for task_id in GRADED:
        task = tasks[task_id]
        fields = {k: v for k, v in task.context.items() if k in TestSpec.model_fields}
        split, whole = TestSpec.model_validate(fields), TestSpec.model_validate({**fields, "split_tests": False})
        answer = task.answers[0]
        assert run_tests(answer, split).fraction == 1.0 and run_tests(answer, whole).fraction == 1.0, task_id
        times: dict[str, list[float]] = {"split": [], "whole": []}
        for _ in range(rounds):
            for label, spec in (("split", split), ("whole", whole)):
                start = time.perf_counter()
                run_tests(answer, spec)
                times[label].append((time.perf_counter() - start) * 1000)
        report = run_tests(answer, split)
        rows.append(
            {
                "task": task_id,
                "tests": len(split.tests),
                "split_tests": sum(report.split),
                "split_ms": statistics.median(times["split"]),
                "in_process_ms": statistics.median(times["whole"]),
                "ratio": statistics.median(times["split"]) / statistics.median(times["whole"]),
            }
        )
    return rows


#: Per preloadable module: a call that imports and uses it, and what it must print.
PRELOADED = {
    "sympy": ("import sympy\nprint(sympy.factorint(360))", "{2: 3, 3: 2, 5: 1}\n"),
    "numpy": ("import numpy\nprint(int(numpy.arange(10).sum()))", "45\n"),
}


def preload_rows(rounds: int) -> list[dict[str, float | str]]:
    """Median ms of each module's call and of `print(1)`, plain pool against preloaded, in turns.

    Calls are 10 ms apart (as an agent's model generates between them), and `print(1)` also back
    to back: a preloaded server's next spare, a clone of a larger process, takes longer to make.
    """
    rows: list[dict[str, float | str]] = []
    for module, (code, printed) in PRELOADED.items():
        if importlib.util.find_spec(module) is None:
            print(f"preload: {module} is not installed here; its row is left out")
            continue
        pools = {"plain": SandboxPool(size=1), "preloaded": SandboxPool(size=1, preload=[module])}
        try:
            for snippet, expected, pause in ((code, printed, 0.01), ("print(1)", "1\n", 0.01), ("print(1)", "1\n", 0)):
                times: dict[str, list[float]] = {"plain": [], "preloaded": []}
                for pool in pools.values():
                    result = pool.run(snippet)  # the answer checked, and the warm-up
                    assert result.ok and result.stdout == expected, (module, result)
                for _ in range(rounds):
                    for label, pool in pools.items():
                        start = time.perf_counter()
                        pool.run(snippet)
                        times[label].append((time.perf_counter() - start) * 1000)
                        time.sleep(pause)
                plain, pre = statistics.median(times["plain"]), statistics.median(times["preloaded"])
                spacing = " (10 ms apart)" if pause else " (back to back)"
                name = (f"import {module}" if snippet == code else snippet) + spacing
                rows.append({"module": module, "snippet": name, "plain_ms": plain, "preloaded_ms": pre,
                             "ratio": plain / pre})  # fmt: skip
        finally:
            for pool in pools.values():
                pool.close()
    return rows


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    n_lat, n_tp = (10, 10) if args.quick else (200, 200)
    pool = get_pool()
    workers = pool.size
    report = isolation_report()  # also starts and warms every server
    pool.stats()
    rows: list[dict[str, float | str]] = []
    with bare_python() as python:
        run_subprocess = subprocess_runner(python)
        for name, code in SNIPPETS.items():
            row: dict[str, float | str] = {"snippet": name}
            slow = name == "compute_50ms"
            for label, fn in (("toolenv", run_toolenv), ("subprocess", run_subprocess)):
                check(label, name, fn)  # also the warm-up
                med, p90 = latency(fn, code, max(5, n_lat // 4) if slow else n_lat)
                tp = throughput(fn, code, max(8, n_tp // 4) if slow else n_tp, workers)
                row.update({f"{label}_median_ms": med, f"{label}_p90_ms": p90, f"{label}_per_s": tp})
            row["latency_ratio"] = float(row["subprocess_median_ms"]) / float(row["toolenv_median_ms"])
            row["throughput_ratio"] = float(row["toolenv_per_s"]) / float(row["subprocess_per_s"])
            rows.append(row)

    print(f"isolation: {report.summary()}  parallel callers: {workers}  quick: {args.quick}")
    keys = ["toolenv_median_ms", "toolenv_p90_ms", "toolenv_per_s", "subprocess_median_ms", "subprocess_p90_ms",
            "subprocess_per_s", "latency_ratio", "throughput_ratio"]  # fmt: skip
    header = ["snippet", "toolenv ms", "p90", "exec/s", "python -c ms", "p90", "exec/s", "latency x", "exec/s x"]
    table([[r["snippet"], *(float(r[k]) for k in keys)] for r in rows], header)
    grading = grading_rows(5 if args.quick else 60)
    print("\ngrading a reference solution: split (the default) against every test in the solution's process")
    table(
        [[g["task"], g["tests"], g["split_tests"], g["split_ms"], g["in_process_ms"], g["ratio"]] for g in grading],
        ["task", "tests", "split", "split ms", "in-process ms", "× in-process"],
    )
    preloads = preload_rows(3 if args.quick else 20)
    print("\npreload: a pool whose servers import the module once, against a plain pool (in turns)")
    table(
        [[p["module"], p["snippet"], p["plain_ms"], p["preloaded_ms"], p["ratio"]] for p in preloads],
        ["preload", "snippet", "plain ms", "preloaded ms", "plain / preloaded"],
    )
    results = {"quick": args.quick, "workers": workers, "isolation": report.model_dump(), "rows": rows}
    write("code", {**results, "grading": grading, "preload": preloads}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
