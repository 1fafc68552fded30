"""docs/rewards.md's ToolVerified example, run as a reader would paste it, on the bundled code
envs: the reference solution scores 1 and a partly right answer 0 (`tests_passed` pays its fraction)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from toolenv.registry import load
from toolenv.rewards import ToolVerified

PAGE = Path(__file__).resolve().parents[3] / "docs" / "rewards.md"


def _example() -> Any:
    """The section's example, built with the imports its text gives (and `ToolVerified`)."""
    text = PAGE.read_text()
    section = text.split("\n## Tool verification\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"^```python\n(.*?)^```", section, re.M | re.S)[:1]
    imports = re.findall(r"`(from toolenv_code[\w.]* import [\w, ]+)`", section)
    scope: dict[str, Any] = {"ToolVerified": ToolVerified}
    for line in imports:
        exec(line, scope)
    return eval(compile(code, str(PAGE), "eval"), scope)


WRONG = {
    "toolenv/MBPP-v0": "def remove_Occ(s, ch):\n    return s.strip(ch)",  # passes 2 of 3
    "toolenv/HumanEval-v0": "def has_close_elements(numbers, threshold):\n    return False",  # 3 of 7
}


@pytest.mark.parametrize(
    ("env_id", "task_id"), [("toolenv/MBPP-v0", "MBPP/11"), ("toolenv/HumanEval-v0", "HumanEval/0")]
)
def test_the_toolverified_example_scores_the_bundled_code_envs(env_id: str, task_id: str) -> None:
    verified = _example()
    env = gym.make(env_id, reward=[("tests_passed", 1.0), (verified, 1.0)])
    try:
        env.reset(options={"task_id": task_id})
        oracle = load("oracles", env_id.split("/")[1])
        _, _, terminated, _, info = env.step(oracle(env.unwrapped.episode.task, 0, ""))  # a fenced answer
        assert terminated and info["reward_components"] == {"tests_passed": 1.0, verified.name: 1.0}, info
        env.reset(options={"task_id": task_id})
        _, _, _, _, info = env.step(f"<answer>\n```python\n{WRONG[env_id]}\n```\n</answer>")
        components = info["reward_components"]
        assert 0.0 < components["tests_passed"] < 1.0 and components[verified.name] == 0.0, info
    finally:
        env.close()
