"""examples/rewards_example.py runs as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rewards_example.py"


def test_rewards_example_runs() -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "step 1: reward=+0.100 [tool_success=+1.00]"
    assert lines[1] == "step 2: reward=-0.300 [tool_call_penalty=-1.00, invalid_call_penalty=-1.00]"
    assert lines[2] == "step 3: reward=+2.200 [exact_match=+1.00, format=+1.00, verified=+1.00, judge=+1.00]"
    assert lines[3] == "episode return=2.000"
    assert "'error': None" in lines[4] and "'reply': 'yes'" in lines[4]


def test_the_examples_verification_checks_the_answer() -> None:
    """Its `ToolVerified` re-ran the task's own expression, so any answer at all scored 1."""
    import importlib.util

    import toolenv

    spec = importlib.util.spec_from_file_location("rewards_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for answer, expected in [("42", 1.0), ("6 * 7", 1.0), ("41", 0.0), ("forty-two", 0.0)]:
        env = toolenv.ToolEnv(
            tools=[example.calc],
            tasks=[{"question": "What is 6 * 7?", "answer": "42"}],
            reward=[(example.VERIFIED, 1.0)],
        )
        env.reset(seed=0)
        _, _, term, _, info = env.step(f"<answer>{answer}</answer>")
        env.close()
        assert term and info["reward_components"] == {"verified": expected}, answer
