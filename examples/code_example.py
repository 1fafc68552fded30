"""The sandboxed `python` tool and the HumanEval env, end to end.

Run: python examples/code_example.py  (needs `pip install -e plugins/code`)
"""

from __future__ import annotations

import gymnasium as gym

import toolenv  # noqa: F401 - registers toolenv/* env ids
from toolenv.registry import load
from toolenv_code import isolation_report, run_code

# 1. The sandbox on its own: a fresh process per call, limits, no network.
print("isolation:", isolation_report().summary())
result = run_code("import math\nprint(math.factorial(20))")
print("run_code ->", result.stdout.strip(), f"({result.duration * 1000:.1f} ms)")

# 2. An episode of HumanEval: run code in a ```python block, then answer.
env = gym.make("toolenv/HumanEval-v0", max_turns=3)
obs, info = env.reset(seed=0, options={"task_id": "HumanEval/0"})
print("task:", info["task_id"])
obs, reward, terminated, truncated, info = env.step("Let me check abs():\n```python\nprint(abs(1.0 - 2.5))\n```")
print("observation:", obs.replace("\n", " | "))

oracle = load("oracles", "HumanEval-v0")  # answers with the canonical solution
task = env.unwrapped.episode.task
obs, reward, terminated, truncated, info = env.step(oracle(task, 1, obs))
print(f"reward {float(reward)} terminated={terminated}")
env.close()
