"""Running Python code: toolenv-code's sandbox against GEM's and SkyRL-gym's python tools and `python -c`.

Every row runs the same three snippets (a trivial `print(1)`, a ~50 ms compute
loop, a failing snippet) through its framework's own entry point:

- toolenv: `toolenv_code.run_code` on the warm fork-server pool, isolation on
  (namespaces, read-only root, unprivileged uid, rlimits: see the printed summary).
- GEM (`gem-llm`): `PythonCodeTool().execute_action("<python>…</python>")`
  (a `python -c` subprocess in a fresh temp dir, import blacklist, no bwrap here).
- SkyRL-gym (`skyrl-gym`): `PythonCodeExecutorToolGroup().execute_tool("python", code)`
  (an unsandboxed `python -c` subprocess).
- `python -c`: `subprocess.run([python, "-c", code])`, the bare floor of the peers.

Every spawned `python` (the peers' and the `python -c` row's) is the interpreter of a
throwaway venv with nothing installed (`bare_python`): started in `.venv-bench`, it
would also import the finders of toolenv's editable installs, about 10 ms per start
that no user of the peers pays.

Beside the rows, a floor: what `fork()`, `_exit(0)` and `waitpid` of the bare interpreter
cost, no isolation and no code run (the least any fresh-process-per-run design pays), printed
next to the goal's threshold (the fastest peer's median over 10).

It reports, for every row, median and p90 latency of sequential calls taken in two ways:
- *in turns*: every row the same number of calls, the rows taking turns (each round starting
  with the next row), so each call follows the other rows' calls. A shared host's speed drifts,
  and rows timed in blocks would compare its moments as much as the runners. An agent's calls
  come like this: its model generates between them.
- *back to back*: each row's calls one right after another, with the machine's CPU time per
  call over them (all processes: a sandbox's work off the caller's path counts too).
Then executions per second with as many parallel callers as toolenv's pool has servers (the
same for every row), and each row's median latency over the fastest non-toolenv row's.
Goal: toolenv at least 10x faster than the fastest of those on the trivial snippet; judged
both ways, and printed for each. Back to back, a pre-forked sandbox cannot hide the work of
preparing the next run: on N CPUs its calls come at most N runs per CPU time of one.
All rows run in one process in `.venv-bench`; `--quick` without it measures
toolenv and `python -c` only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _peers
import peers_env
from _common import bare_python, machine, median, table, write

SNIPPETS = {
    "trivial": "print(1)",
    "compute_50ms": (
        "import time\nt = time.perf_counter()\nn = 0\nwhile time.perf_counter() - t < 0.05:\n    n += 1\nprint(n > 0)"
    ),
    "failing": "def f():\n    return 1 / 0\nf()\n",
}
TOOLENV = "toolenv run_code"
#: How the latencies were taken (see the module's docstring) -> their key in a row's results.
WAYS = {"in turns": "median_ms", "back to back": "back_to_back_median_ms"}
# The floor, run inside the bare interpreter: median ms of fork + _exit(0) + waitpid, no code.
FORK_FLOOR = """
import os, sys, time
n = int(sys.argv[1])
times = []
for _ in range(n):
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    times.append(time.perf_counter() - t0)
times.sort()
print(times[n // 2] * 1e3)
"""
Runner = Callable[[str], tuple[bool, str]]  # code -> (ok, output): ok is False for an error


def runners(python: Path) -> tuple[dict[str, Runner], dict[str, str]]:
    """Every row importable here, and why the others were skipped; `python` is the spawned interpreter
    (the peers find it first on PATH)."""
    from toolenv_code import run_code

    def toolenv(code: str) -> tuple[bool, str]:
        r = run_code(code)
        return r.ok, r.stdout + r.stderr

    def plain(code: str) -> tuple[bool, str]:
        p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, check=False)
        return p.returncode == 0, p.stdout + p.stderr

    rows: dict[str, Runner] = {TOOLENV: toolenv, "python -c": plain}
    skipped: dict[str, str] = {}
    try:
        from gem.tools.python_code_tool import PythonCodeTool  # type: ignore[import-not-found,unused-ignore]

        gem_tool = PythonCodeTool(timeout=10)

        def gem(code: str) -> tuple[bool, str]:
            _valid, has_error, obs, _ = gem_tool.execute_action(f"<python>{code}</python>")
            return not has_error, obs

        rows["GEM PythonCodeTool"] = gem
    except ImportError as exc:
        skipped["GEM PythonCodeTool"] = f"gem-llm is not importable in {sys.prefix} ({exc})"
    try:
        from skyrl_gym.tools.python import PythonCodeExecutorToolGroup  # type: ignore[import-not-found,unused-ignore]

        group = PythonCodeExecutorToolGroup(timeout=10)

        def skyrl(code: str) -> tuple[bool, str]:
            out = group.execute_tool("python", code)
            return not out.startswith("Error executing"), out

        rows["SkyRL python tool"] = skyrl
    except ImportError as exc:
        skipped["SkyRL python tool"] = f"skyrl-gym is not importable in {sys.prefix} ({exc})"
    return rows, skipped


def check(name: str, fn: Runner, python: Path) -> None:
    """Every row must really run the snippets: right output, and the failure seen as one; a row
    that spawns an interpreter must spawn `python` (not one whose start costs more)."""
    ok, out = fn(SNIPPETS["trivial"])
    assert ok and "1" in out, (name, out)
    ok, out = fn(SNIPPETS["failing"])
    assert not ok and "ZeroDivisionError" in out, (name, out)
    ok, out = fn(SNIPPETS["compute_50ms"])
    assert ok and "True" in out, (name, out)
    if name != TOOLENV:
        ok, out = fn("import sys\nprint(sys.prefix)")
        assert ok and str(python.parent.parent) in out, (name, out)


def in_turns(rows: dict[str, Runner], code: str, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each row over `rounds` rounds, the rows taking turns (each round starting
    with the next row): every row's calls follow the other rows' calls alike."""
    names = list(rows)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t0 = time.perf_counter()
            rows[name](code)
            out[name].append(time.perf_counter() - t0)
    return out


def busy_seconds(line: str, ticks_per_s: int) -> float:
    """CPU seconds busy in `/proc/stat`'s `cpu` line: user, nice, system, irq and softirq. Not idle
    or iowait; not steal (another system ran), nor guest and guest_nice (already in user and nice)."""
    ticks = [int(x) for x in line.split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = ticks[:7]
    return (user + nice + system + irq + softirq) / ticks_per_s


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent busy since boot (Linux: /proc/stat)."""
    with open("/proc/stat") as f:
        return busy_seconds(f.readline(), os.sysconf("SC_CLK_TCK"))


def back_to_back(fn: Runner, code: str, n: int) -> tuple[list[float], float]:
    """Seconds per call of `n` calls one right after another, and the machine's CPU seconds per call."""
    out = []
    cpu0 = machine_cpu()
    for _ in range(n):
        t0 = time.perf_counter()
        fn(code)
        out.append(time.perf_counter() - t0)
    return out, (machine_cpu() - cpu0) / n


def throughput(fn: Runner, code: str, n: int, workers: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(fn, [code] * n))
    return n / (time.perf_counter() - t0)


def measure_all(rows: dict[str, Runner], quick: bool, workers: int) -> dict[str, dict[str, dict[str, float]]]:
    """snippet -> row -> median/p90 latency in turns and back to back, CPU per call, executions per second."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    for snippet, code in SNIPPETS.items():
        slow = snippet == "compute_50ms"
        rounds = (5 if quick else 20) if slow else (10 if quick else 200)
        for fn in rows.values():
            fn(code)  # warm-up
        turns = in_turns(rows, code, rounds)
        results[snippet] = {}
        for name, fn in rows.items():
            fast = name == TOOLENV and not slow
            n = (20 if fast else 5) if quick else (300 if fast else 20 if slow else 40)
            own, cpu = back_to_back(fn, code, n)
            results[snippet][name] = {
                "median_ms": median(turns[name]) * 1e3,
                "p90_ms": _peers.percentile(turns[name], 0.9) * 1e3,
                "n": rounds,
                "back_to_back_median_ms": median(own) * 1e3,
                "back_to_back_p90_ms": _peers.percentile(own, 0.9) * 1e3,
                "back_to_back_n": n,
                "cpu_ms_per_call": cpu * 1e3,
                "exec_per_s": throughput(fn, code, max(n, 2 * workers), workers),
            }
    return results


def measure(quick: bool) -> dict[str, Any]:
    """Latency and throughput of every row on every snippet, in this process."""
    from toolenv_code import get_pool, isolation_report

    report = isolation_report()  # also starts and warms every server
    workers = get_pool().size
    here, path = os.getcwd(), os.environ.get("PATH", "")
    with bare_python() as python, tempfile.TemporaryDirectory(prefix="bench-peers-code-") as tmp:
        os.environ["PATH"] = f"{python.parent}{os.pathsep}{path}"  # GEM and SkyRL spawn `python` from PATH
        os.chdir(tmp)  # GEM makes its temp dirs in the cwd
        try:
            rows, skipped = runners(python)
            for name, fn in rows.items():
                check(name, fn, python)
            results = measure_all(rows, quick, workers)
            floor = subprocess.run(
                [str(python), "-c", FORK_FLOOR, "50" if quick else "1000"], capture_output=True, text=True, check=True
            )
        finally:
            os.chdir(here)
            os.environ["PATH"] = path
    return {
        "results": results,
        "skipped": skipped,
        "isolation": report.model_dump(),
        "isolation_summary": report.summary(),
        "workers": workers,
        "fork_floor_ms": float(floor.stdout),
        "spawned_python": f"a venv with nothing installed, Python {sys.version.split()[0]}",
        "versions": _peers.versions("toolenv", "toolenv-code", "gem-llm", "skyrl-gym"),
        "python": peers_env.shown(sys.executable),
    }


def main() -> int:
    args = _peers.parse_args(__doc__.splitlines()[0])
    extras = {"toolenv-code": _peers.editable("code")}
    got = _peers.run(__file__, args, measure, extras)
    if got is None:
        return 1
    result, note = got
    venv = Path(result["python"]).parent.parent.name
    print(f"machine: {machine()['processor']}, {machine()['cpus']} CPUs; measured with {venv}/bin/python")
    print(f"isolation: {result['isolation_summary']}; parallel callers: {result['workers']}")
    table_rows, ratios = [], {}
    for snippet, by_row in result["results"].items():
        peers = {k: v for k, v in by_row.items() if k != TOOLENV}
        ratios[snippet] = {}
        for way, key in WAYS.items():
            fastest = min(peers, key=lambda k: peers[k][key])
            base = peers[fastest][key]
            ratios[snippet][way] = {
                "fastest_peer": fastest,
                "fastest_peer_ms": base,
                "speedup": base / by_row[TOOLENV][key],
            }
        turns, b2b = (ratios[snippet][way]["fastest_peer_ms"] for way in WAYS)
        for name, r in sorted(by_row.items(), key=lambda kv: kv[1]["median_ms"]):
            own = r["back_to_back_median_ms"]
            table_rows.append([snippet, name, r["median_ms"], r["p90_ms"], r["median_ms"] / turns, own, own / b2b])
            table_rows[-1] += [r["cpu_ms_per_call"], r["exec_per_s"]]
    header = ["snippet", "runner", "in turns ms", "p90 ms", "× fastest", "back to back ms", "× fastest", "CPU ms"]
    table(table_rows, [*header, "exec/s"])
    print("(CPU ms: the whole machine's CPU time per call back to back, every process of it)")
    for label, why in result["skipped"].items():
        print(f"not measured: {label}: {why}")
    met = {}
    for way in WAYS:
        trivial = ratios["trivial"][way]
        met[way] = trivial["speedup"] >= 10
        print(
            f"goal (toolenv ≥10× faster than the fastest peer on the trivial snippet, isolation on), {way}: "
            f"{'met' if met[way] else 'NOT met'}: {trivial['speedup']:.1f}× vs {trivial['fastest_peer']}"
        )
    toolenv = result["results"]["trivial"][TOOLENV]
    cpus = machine()["cpus"]
    print(
        f"back to back, a run's {toolenv['cpu_ms_per_call']:.2f} ms of CPU on {cpus} CPUs puts calls at least "
        f"{toolenv['cpu_ms_per_call'] / cpus:.2f} ms apart; "
        f"the goal needs {ratios['trivial']['back to back']['fastest_peer_ms'] / 10:.2f} ms"
    )
    floor = result.get("fork_floor_ms")
    if floor is not None:  # absent from an older worker's JSON
        print(f"floor: fork() + _exit(0) + waitpid of the bare interpreter, no isolation, no code: {floor:.2f} ms")
    if note:
        print(note)
    write(
        "peers_code",
        {
            "quick": args.quick,
            "snippets": SNIPPETS,
            "results": result["results"],
            "speedup_vs_fastest_peer": ratios,
            "goal_10x_trivial_met": all(met.values()),
            "goal_10x_trivial_met_by_way": met,
            "fork_floor_ms": result.get("fork_floor_ms"),
            "isolation": result["isolation"],
            "workers": result["workers"],
            "spawned_python": result.get("spawned_python"),
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
