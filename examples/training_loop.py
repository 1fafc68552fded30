"""A training-loop skeleton: a vector of envs stepped concurrently, a policy in the middle.

The policy here is scripted (it calls the tool, then answers with what the tool said);
swap `policy` for your model's generate call.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np

import toolenv


@toolenv.tool
async def multiply(a: int, b: int) -> str:
    """Multiply two integers."""
    return str(a * b)


TASKS = [{"id": str(i), "question": f"What is {i} times {i + 1}?", "answer": str(i * (i + 1))} for i in range(32)]


def policy(observation: str) -> str:
    """Call the tool for the question's numbers; answer with the tool's output."""
    if not observation:  # the episode just ended; next-step autoreset ignores this action
        return ""
    if m := re.search(r"<tool_response>\n(\d+)\n</tool_response>", observation):
        return f"<answer>{m.group(1)}</answer>"
    a, b = map(int, re.findall(r"What is (\d+) times (\d+)", observation)[0])
    return f'<tool_call>{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def main() -> None:
    envs = gym.make_vec(
        "toolenv/ToolEnv-v0", num_envs=8, vectorization_mode="vector_entry_point", tools=[multiply], tasks=TASKS
    )
    obs, _ = envs.reset(seed=0)
    returns: list[float] = []
    while len(returns) < 16:
        obs, rewards, terminated, truncated, infos = envs.step([policy(o) for o in obs])
        done = np.logical_or(terminated, truncated)
        returns += [float(r) for r in rewards[done]]
    print(f"episodes={len(returns)} mean return={np.mean(returns):.2f}")
    assert np.mean(returns) == 1.0
    envs.close()


if __name__ == "__main__":
    main()
