"""Helpers shared by the benchmarks: argument parsing, timing, and JSON output."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import venv
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(description: str) -> argparse.Namespace:
    """`--quick` (CI: only show it runs) and `--out` for every benchmark."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a few seconds; numbers are not meaningful")
    p.add_argument("--out", type=Path, default=None, help="JSON output path")
    return p.parse_args()


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def repeat(fn: Callable[[], Any], n: int, rounds: int = 5) -> list[float]:
    """Per-call seconds of `fn`, as the median of `rounds` rounds of `n` calls each."""
    per_round = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per_round.append((time.perf_counter() - t0) / n)
    return per_round


def interleaved(subjects: dict[str, Callable[[int], Any]], n: int, rounds: int = 15) -> dict[str, list[float]]:
    """Seconds per unit of work of each subject, `rounds` times; `subjects[name](n)` does its
    unit `n` times (an async subject loops inside one event-loop run, so the loop is not timed).

    The subjects take turns within a round, each round starting with the next one: a shared
    VM's speed drifts by tens of percent within a minute, so subjects timed one after another
    in blocks compare the host's moments as much as the code. Ratios taken within a round
    cancel that drift.
    """
    names = list(subjects)
    per: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            subjects[name](n)
            per[name].append((time.perf_counter() - t0) / n)
    return per


@contextlib.contextmanager
def bare_python() -> Iterator[Path]:
    """The interpreter of a throwaway venv with nothing installed: what a spawned `python -c` is timed with.

    The bench venvs hold toolenv and its plugins as editable installs, whose `.pth` finders
    import pathlib, re, urllib... at every interpreter start (a ~10 ms start became ~20 ms):
    a peer's or the `python -c` row's subprocess started there would pay for toolenv's
    development install, which no user of the peer has.
    """
    with tempfile.TemporaryDirectory(prefix="bench-bare-python-") as tmp:
        venv.create(tmp, with_pip=False, symlinks=os.name != "nt")
        yield Path(tmp) / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")


def write(name: str, data: dict[str, Any], out: Path | None) -> Path:
    """Write results as JSON (with the machine description) and return the path."""
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **data}, indent=2))
    print(f"wrote {path}")
    return path


def table(rows: list[list[Any]], header: list[str]) -> None:
    """Print a plain aligned table."""
    cells = [header, *[[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


median = statistics.median
