"""`toolenv list`: tools, envs, agents, parsers and rewards, with the distribution of each."""

from __future__ import annotations

import argparse
import json

from toolenv.parsers import parser_names
from toolenv.registry import entries, plugin_rewards
from toolenv.rewards import reward_names

HELP = "List installed tools, envs, agents, parsers and rewards."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def collect() -> dict[str, list[dict[str, str]]]:
    """Everything `toolenv list` shows, from metadata and source only (no plugin is imported)."""
    core = "toolenv (core)"
    out: dict[str, list[dict[str, str]]] = {
        "tools": [{"name": e.name, "dist": e.dist, "target": e.value} for e in entries("tools")],
        "envs": [
            {"name": "toolenv/ToolEnv-v0", "dist": core, "target": "toolenv.env:ToolEnv"},
            {"name": "toolenv/Remote-v0", "dist": core, "target": "toolenv.remote.client:RemoteToolEnv"},
        ]
        + [{"name": f"toolenv/{e.name}", "dist": e.dist, "target": e.value} for e in entries("envs")],
        "agents": [{"name": e.name, "dist": e.dist, "target": e.value} for e in entries("agents")],
        "parsers": [{"name": n, "dist": core, "target": "toolenv.parsers"} for n in parser_names()],
        "rewards": [{"name": n, "dist": core, "target": "toolenv.rewards"} for n in reward_names()]
        + plugin_rewards(set(reward_names())),
    }
    return out


def run(args: argparse.Namespace) -> int:
    data = collect()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for kind, rows in data.items():
        print(f"{kind}:")
        if not rows:
            print("  (none installed)")
        width = max((len(r["name"]) for r in rows), default=0)
        for r in rows:
            print(f"  {r['name']:<{width}}  {r['dist']}")
    return 0
