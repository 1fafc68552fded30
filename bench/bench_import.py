"""Import and start-up: `import toolenv`, `import toolenv` + Gymnasium registration, `gym.make`, first step.

Each figure is the median over fresh interpreters (`python -X importtime` for imports).
Goal: `import toolenv` under 150 ms.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys

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
    write("import", {"quick": args.quick, "repetitions": reps, "ms": results}, args.out)


if __name__ == "__main__":
    main()
