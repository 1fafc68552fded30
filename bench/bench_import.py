"""Import and start-up: `import toolenv`, `import toolenv` + Gymnasium registration, `gym.make`, first step.

Each figure is the median over fresh interpreters (`python -X importtime` for imports).
Then every installed env, each in fresh interpreters: `gym.make`, `reset`, the first
step (the env's oracle's first action: a tool call, or for the code envs the answer, which
the reward tests in the sandbox; pools, indexes and database handles start here) and a
second, warm step where the episode goes on. Goal: `import toolenv` under 150 ms.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from typing import Any

from _common import parse_args, table, write

SNIPPETS = {
    "python -c pass": "pass",
    "import toolenv": "import toolenv",
    "import gymnasium": "import gymnasium",
    "import toolenv, gymnasium (registered)": "import toolenv, gymnasium",
    "gym.make ToolEnv-v0 + reset + step": (
        "import toolenv, gymnasium as gym\n"
        "env = gym.make('toolenv/ToolEnv-v0', tasks=[{'question': 'q'}])\n"
        "env.reset(seed=0); env.step('<answer>a</answer>')"
    ),
}


def wall(code: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", f"import time; _t=time.perf_counter()\n{code}\nprint(time.perf_counter()-_t)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


# One env's start-up, timed inside a fresh interpreter; prints a JSON object of milliseconds.
ENV_STARTUP = """
import json, sys, time
t0 = time.perf_counter()
import gymnasium as gym
import toolenv
from toolenv import registry
name = sys.argv[1]
t1 = time.perf_counter()
env = gym.make("toolenv/" + name)
t2 = time.perf_counter()
obs, _ = env.reset(seed=0)
t3 = time.perf_counter()
oracle = registry.load("oracles", name) if any(e.name == name for e in registry.entries("oracles")) else None
action = oracle(env.unwrapped.episode.task, 0, obs) if oracle else "<answer>a</answer>"
t4 = time.perf_counter()
obs, _, terminated, truncated, _ = env.step(action)
t5 = time.perf_counter()
again = oracle is not None and not (terminated or truncated)
if again:
    env.step(oracle(env.unwrapped.episode.task, 1, obs))
t6 = time.perf_counter()
env.close()
ms = lambda a, b: (b - a) * 1000
print(json.dumps({"import": ms(t0, t1), "make": ms(t1, t2), "reset": ms(t2, t3), "first step": ms(t4, t5),
                  "second step": ms(t5, t6) if again else None}))
"""


def env_names() -> list[str]:
    """Every env id the installed plugins register (besides the core's)."""
    out = subprocess.run(
        [sys.executable, "-c", "from toolenv import registry; print(*[e.name for e in registry.entries('envs')])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(out.stdout.split())


def env_startup(name: str, reps: int) -> dict[str, Any]:
    """Median milliseconds of each start-up stage of env `name` over `reps` fresh interpreters."""
    runs = []
    for _ in range(reps):
        out = subprocess.run(
            [sys.executable, "-c", ENV_STARTUP, name], capture_output=True, text=True, check=True, timeout=300
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {k: (statistics.median(r[k] for r in runs) if runs[0][k] is not None else None) for k in runs[0]}  # type: ignore[type-var]


def importtime_ms(module: str) -> float:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True, check=True
    )
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$", line)
        if m and m.group(2) == module:
            return int(m.group(1)) / 1000
    raise RuntimeError(f"no importtime line for {module}")


def main() -> None:
    args = parse_args(__doc__ or "")
    reps = 3 if args.quick else 15
    results = {name: statistics.median(wall(code) for _ in range(reps)) * 1000 for name, code in SNIPPETS.items()}
    results["importtime toolenv (cumulative)"] = statistics.median(importtime_ms("toolenv") for _ in range(reps))
    rows = [[k, v] for k, v in results.items()]
    table(rows, ["what", "ms (median)"])
    goal = results["importtime toolenv (cumulative)"] < 150
    print(f"goal: import toolenv < 150 ms: {'met' if goal else 'NOT met'}")
    env_reps = 1 if args.quick else 5
    envs = {name: env_startup(name, env_reps) for name in env_names()}
    stages = ["import", "make", "reset", "first step", "second step"]
    print(f"\nstart-up of every installed env, ms (median of {env_reps} fresh interpreters):")
    table(
        [[name, *(v[s] if v[s] is not None else "-" for s in stages)] for name, v in envs.items()],
        ["env", "import toolenv+gym", "gym.make", "reset", "first step", "second step"],
    )
    write("import", {"quick": args.quick, "repetitions": reps, "ms": results, "envs_ms": envs}, args.out)


if __name__ == "__main__":
    main()
