#!/usr/bin/env python3
"""Set up and run toolenv: `python3 dev.py demo` (the main job) or `python3 dev.py test` (the suite).

Both create `.venv` beside this file and install the core, the plugins and the
agents into it, so the two README commands work on a machine with only Python
3.10+ and the package registries. Standard library only: it runs before anything
is installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("TOOLENV_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"

# Every distribution of the workspace, installed editable by both commands.
WORKSPACE = [
    ".",
    "plugins/search",
    "plugins/sql",
    "plugins/code",
    "plugins/vision",
    "plugins/mcp",
    "agents",
]
# The same distributions with the extras the test suite exercises (verl, DuckDB, ddgs, ...).
TEST_WORKSPACE = [
    ".[dev,verl,serve,trl,skyrl,math]",
    "plugins/search[web,stem]",
    "plugins/sql[duckdb]",
    "plugins/code",
    "plugins/vision",
    "plugins/mcp[images]",
    "agents[transformers]",
]
# `test --core`: the same without the extras that bring torch (verl, TRL, SkyRL, transformers)
# or a browser, for a Python that the pinned CPU torch build is not made for (CI runs the
# suite once more on the oldest supported Python, whose code paths differ: asyncio there has
# no `timeout` nor `Task.uncancel`). Tests that need those extras skip with their reason.
CORE_TEST_WORKSPACE = [
    ".[dev,serve,math]",
    "plugins/search[web,stem]",
    "plugins/sql[duckdb]",
    "plugins/code",
    "plugins/vision",
    "plugins/mcp[images]",
    "agents",
]
# verl must not pull a multi-GB CUDA torch: this CPU build is pinned and installed first.
TORCH_PIN = "torch==2.13.0"
TEST_EXTRAS = ["playwright"]


def sh(*cmd: str | Path, check: bool = True, **kw: object) -> int:
    """Run a command, echoing it; exit with one readable line on failure."""
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    rc = subprocess.call([str(c) for c in cmd], cwd=ROOT, **kw)  # type: ignore[call-overload]
    if check and rc != 0:
        sys.exit(f"dev.py: command failed with exit code {rc}: {' '.join(str(c) for c in cmd)}")
    return int(rc)


def pip(*args: str, constraint: str | None = None) -> None:
    extra: list[str] = []
    if constraint:
        cfile = Path(tempfile.mkdtemp()) / "constraints.txt"
        cfile.write_text(constraint + "\n")
        extra = ["-c", str(cfile)]
    sh(PY, "-m", "pip", "install", "--disable-pip-version-check", "-q", *args, *extra)


def ensure_venv() -> None:
    if sys.version_info < (3, 10):  # noqa: UP036 - dev.py itself runs before anything checks the version
        sys.exit(f"dev.py: toolenv needs Python 3.10 or newer, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating virtual environment {VENV.relative_to(ROOT) if VENV.is_relative_to(ROOT) else VENV}")
        venv.create(VENV, with_pip=True)
        sh(PY, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-U", "pip", "setuptools>=77")


def editable(specs: list[str]) -> list[str]:
    out: list[str] = []
    for spec in specs:
        out += ["-e", spec]
    return out


def install_base() -> None:
    ensure_venv()
    pip(*editable(WORKSPACE))


def demo(args: argparse.Namespace) -> int:
    """The main job: rollouts on the bundled data (oracle agent by default), then one HTML report."""
    install_base()
    toolenv = BIN / "toolenv"
    runs = ROOT / "runs"
    envs = args.envs or ["toolenv/Spider-v0", "toolenv/HotpotQA-v0", "toolenv/VisualSearch-v0"]
    outs = [runs / env_id.split("/")[-1].lower() for env_id in envs]
    for env_id, out in zip(envs, outs, strict=True):
        sh(
            toolenv,
            "rollout",
            env_id,
            "--agent",
            args.agent,
            "-n",
            str(args.n),
            "--concurrency",
            "16",
            "--out",
            out,
            # Fresh runs every time: a resumed run refuses tasks changed since it ran (runs of an
            # older toolenv), and a demo shows this version's results.
            "--overwrite",
            *(args.rollout_args or []),
        )
    report = runs / "report.html"
    sh(toolenv, "view", *outs, "--out", report)
    print(f"\nreport: {report}\n(open it in a browser, or: {toolenv} view {' '.join(map(str, outs))} --serve)")
    return 0


def ensure_chromium() -> None:
    """Debian's chromium for the report's browser test; installed when we can (root + apt)."""
    if shutil.which("chromium"):
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        sh("apt-get", "update", "-qq", check=False)
        quiet = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        sh("apt-get", "install", "-y", "-qq", "chromium", check=False, env=quiet)
    if not shutil.which("chromium"):
        print("note: chromium is not installed; the browser test of the report will skip")


def test(args: argparse.Namespace) -> int:
    """The whole suite: lint, types, tests (verl tests included), benchmarks in quick mode."""
    ensure_venv()
    if args.core:
        pip(*editable(CORE_TEST_WORKSPACE))
        return run_pytest(args)
    pip(TORCH_PIN)
    pip(*editable(TEST_WORKSPACE), *TEST_EXTRAS, constraint=TORCH_PIN)
    ensure_chromium()
    sh(BIN / "ruff", "check", ".")
    sh(BIN / "ruff", "format", "--check", ".")
    sh(BIN / "mypy")
    run_pytest(args)
    if not args.no_bench:
        sh(PY, ROOT / "bench" / "run.py", "--quick")
    return 0


def run_pytest(args: argparse.Namespace) -> int:
    rc = sh(BIN / "pytest", *(args.pytest_args or []), check=False)
    if rc == 5:
        sys.exit("dev.py: pytest collected no tests")
    if rc != 0:
        sys.exit(f"dev.py: tests failed (pytest exit code {rc})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="set up and run the main job (oracle rollouts + report)")
    d.add_argument("--agent", default="oracle")
    d.add_argument("-n", type=int, default=50)
    d.add_argument("--envs", nargs="*")
    d.add_argument("rollout_args", nargs="*", help="more `toolenv rollout` options, after --")
    t = sub.add_parser("test", help="set up and run lint, type checks and the whole test suite")
    t.add_argument("--no-bench", action="store_true", help="skip the quick benchmark run")
    t.add_argument(
        "--core",
        action="store_true",
        help="only the tests, without the torch and browser extras (for another Python; set TOOLENV_VENV)",
    )
    t.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    return demo(args) if args.cmd == "demo" else test(args)


if __name__ == "__main__":
    sys.exit(main())
