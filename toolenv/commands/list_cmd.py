"""`toolenv list`: tools, envs, agents, parsers and rewards, with the distribution of each."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
from pathlib import Path

from toolenv.parsers import parser_names
from toolenv.registry import entries
from toolenv.rewards import reward_names

HELP = "List installed tools, envs, agents, parsers and rewards."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _registered_rewards(package: str) -> list[tuple[str, str]]:
    """(name, module) of each `register_reward("name", ...)` call in a package's source, read
    without importing it (a plugin registers its rewards when its env module is imported)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[tuple[str, str]] = []
    for folder in spec.submodule_search_locations:
        for file in sorted(Path(folder).rglob("*.py")):
            try:
                source = file.read_text(encoding="utf-8")
                if "register_reward(" not in source:  # most files: no need to parse them
                    continue
                tree = ast.parse(source)
            except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
                continue
            module = ".".join((package, *file.relative_to(folder).with_suffix("").parts))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "register_reward"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    found.append((node.args[0].value, module.removesuffix(".__init__")))
    return found


def _plugin_rewards(known: set[str]) -> list[dict[str, str]]:
    """Rewards that plugin distributions register, with the distribution of each."""
    rows: list[dict[str, str]] = []
    seen = set(known)
    packages: dict[str, str] = {}
    for kind in ("envs", "tools"):
        for e in entries(kind):
            packages.setdefault(e.value.split(":")[0].split(".")[0], e.dist)
    for package, dist in sorted(packages.items()):
        for name, module in _registered_rewards(package):
            if name not in seen:
                seen.add(name)
                rows.append({"name": name, "dist": dist, "target": module})
    return sorted(rows, key=lambda r: r["name"])


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
        + _plugin_rewards(set(reward_names())),
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
