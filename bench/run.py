"""Run every benchmark: `python bench/run.py [--quick]`. Each writes bench/results/<name>.json."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_docs(path: Path, sections: list[str], quick: bool) -> None:
    """The benchmark page: how it was run, on what, and every benchmark's printed table."""
    import platform

    cmd = "python bench/run.py" + (" --quick" if quick else "") + f" --write-docs {path.as_posix()}"
    head = (
        "# Benchmarks\n\n"
        f"Measured on {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"on {time.strftime('%Y-%m-%d')}. Reproduce with `{cmd}` (from the repository root, in `.venv`). "
        "Every benchmark compares its subjects side by side in one run and writes JSON to "
        "`bench/results/`. The machines are shared 2-core VMs: figures vary by tens of percent "
        "between runs; the ratios are steadier than the absolute numbers.\n\n"
    )
    path.write_text(head + "\n".join(sections))
    print(f"wrote {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="CI mode: check each benchmark runs")
    p.add_argument("names", nargs="*", help="only these (e.g. step sql)")
    p.add_argument("--write-docs", type=Path, default=None, help="write the printed tables to this Markdown file")
    args = p.parse_args()
    scripts = sorted(HERE.glob("bench_*.py"))
    if args.names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in args.names]
    failed = []
    sections: list[str] = []
    for script in scripts:
        print(f"\n=== {script.stem} ===", flush=True)
        t0 = time.perf_counter()
        cmd = [sys.executable, str(script), *(["--quick"] if args.quick else [])]
        proc = subprocess.run(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(proc.stdout, end="", flush=True)
        elapsed = time.perf_counter() - t0
        print(f"--- {script.stem}: exit {proc.returncode} in {elapsed:.1f} s", flush=True)
        if proc.returncode != 0:
            failed.append(script.stem)
        doc = (script.read_text().split('"""')[1].strip().splitlines() or [""])[0]
        out = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("wrote "))
        sections.append(f"## {script.stem.removeprefix('bench_')}\n\n{doc}\n\n```text\n{out.strip(chr(10))}\n```\n")
    if args.write_docs:
        write_docs(args.write_docs, sections, quick=args.quick)
    if failed:
        print(f"benchmarks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
