"""Run by tests/test_wheels.py in a subprocess whose PYTHONPATH is a `pip install --target` of the
built wheels: plays every env plugin with its oracle and writes a report, printing one JSON object.

Usage: python _wheel_probe.py SITE OUT. Every file these envs, tools and the report read at run
time then comes from the wheels, not from the checkout the editable installs point at.
"""

from __future__ import annotations

import inspect
import json
import sys
from importlib import import_module, metadata
from pathlib import Path
from typing import Any

PACKAGES = [
    "toolenv",
    "toolenv_agents",
    "toolenv_code",
    "toolenv_mcp",
    "toolenv_search",
    "toolenv_sql",
    "toolenv_vision",
]
GROUPS = ["toolenv.envs", "toolenv.oracles", "toolenv.agents", "toolenv.tools", "toolenv.commands", "toolenv.doctor"]
MAX_TURNS = 10


def _where(module: str) -> str:
    path = import_module(module).__file__
    assert path is not None, f"{module} has no __file__"
    return str(Path(path).resolve())


def _entry_points() -> dict[str, list[list[str]]]:
    """Each group's entry points as [name, folder of the distribution that declares it]."""
    found: dict[str, list[list[str]]] = {}
    for group in GROUPS:
        rows = []
        for ep in metadata.entry_points(group=group):
            dist = ep.dist
            rows.append([ep.name, str(Path(str(dist.locate_file(""))).resolve()) if dist is not None else "?"])
        found[group] = rows
    return found


def _play(name: str) -> dict[str, Any]:
    """`gym.make`, reset and step `toolenv/<name>` with its oracle until the episode ends."""
    import gymnasium as gym

    from toolenv import registry

    oracle = registry.load("oracles", name)
    env = gym.make(f"toolenv/{name}")
    try:
        obs, _ = env.reset(seed=0)
        episode = env.unwrapped.episode  # type: ignore[attr-defined]
        total, done, turn = 0.0, False, 0
        while not done and turn < MAX_TURNS:
            action = oracle(episode.task, turn, obs)
            assert not inspect.isawaitable(action), "async oracles are not driven here"
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done, turn = total + float(reward), terminated or truncated, turn + 1
    finally:
        env.close()
    return {"reward": total, "done": done, "turns": turn}


def main(site: Path, out: Path) -> dict[str, Any]:
    import toolenv
    from toolenv import registry
    from toolenv.report import build_report

    result: dict[str, Any] = {
        "site": str(site.resolve()),
        "modules": {m: _where(m) for m in PACKAGES},
        "entry_points": _entry_points(),
        "envs": {},
        "rollouts": {},
    }
    names = sorted({e.name for e in registry.entries("envs")})
    for name in names:
        result["envs"][name] = _play(name)
        # The oracle agent (toolenv-agents) through the runner, whose trajectories feed the report.
        res = toolenv.rollout(f"toolenv/{name}", "oracle", n=1, out=out / name, concurrency=1)
        result["rollouts"][name] = [t.error or t.reward for t in res.trajectories]
    page = build_report([out / name for name in names], out / "report.html")
    result["report"] = str(page)
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
