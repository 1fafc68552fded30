"""`toolenv doctor`: the environment toolenv runs in, and each plugin's own report.

Plugins contribute reports through the `toolenv.doctor` entry-point group: a
callable returning a JSON-able dict (the code sandbox reports its isolation level).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from typing import Any

HELP = "Show versions, installed plugins and each plugin's health report (e.g. sandbox isolation)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


#: The training stack around toolenv, whose versions a bug report needs (None: not installed).
TRAINING_STACK = ("verl", "trl", "skyrl-gym", "transformers", "torch", "vllm", "sglang")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect() -> dict[str, Any]:
    """Versions, plugin distributions, the training stack and plugin reports."""
    from toolenv import __version__
    from toolenv.cli import error_line
    from toolenv.registry import GROUPS, entries

    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "toolenv": __version__,
        "plugins": sorted({e.dist for kind in GROUPS for e in entries(kind)}),  # type: ignore[arg-type]
        "training": {dist: _version(dist) for dist in TRAINING_STACK},
        "reports": {},
    }
    for ep in metadata.entry_points(group="toolenv.doctor"):
        try:
            rep = ep.load()()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, not fatal
            rep = {"error": f"{type(exc).__name__}: {error_line(exc)}"}  # one line, as toolenv's errors are
        if not isinstance(rep, dict):  # so is one that returns no report
            rep = {"error": f"the report is {type(rep).__name__}, not a dict"}
        report["reports"][ep.name] = rep
    return report


def run(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"toolenv {report['toolenv']} on Python {report['python']} ({report['platform']})")
    print("plugins: " + (", ".join(report["plugins"]) or "none"))
    found = [f"{d} {v}" for d, v in report["training"].items() if v]
    print("training stack: " + (", ".join(found) or "none of " + ", ".join(report["training"])))
    for name, rep in report["reports"].items():
        print(f"{name}:")
        for k, v in rep.items():
            print(f"  {k}: {v}")
    return 0
