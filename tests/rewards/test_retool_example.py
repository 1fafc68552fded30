"""examples/retool_example.py runs as a user would run it: code, then a boxed answer, scored by `math`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "retool_example.py"

pytest.importorskip("math_verify", reason="the `math` reward needs the math extra: pip install 'toolenv[math]'")
pytest.importorskip("toolenv_code", reason="the example runs the code plugin's `python` tool")


def test_retool_example_runs_code_then_scores_the_boxed_answer() -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "turn 0: python printed ['1/2']"  # the sandbox really ran the policy's block
    assert lines[1] == r"turn 1: answered 'The answer is $\\boxed{\\frac{1}{2}}$.'"
    assert lines[2] == r"reward=1.0 terminated=True boxed=\frac{1}{2}"  # gold "0.5": exact_match would say 0


def test_the_example_scores_a_wrong_box_zero() -> None:
    """The same episode with a wrong final box: the reward reads the answer, not the run."""
    import importlib.util

    import toolenv
    from toolenv_code import PythonTool

    spec = importlib.util.spec_from_file_location("retool_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    env = toolenv.ToolEnv(
        tools=[PythonTool()], tasks=example.TASKS, parser="codeblock", no_call_is_answer=True, reward="math"
    )
    try:
        obs, _ = env.reset(seed=0)
        obs, reward, term, *_ = env.step(example.policy(obs, 0))
        assert (reward, term) == (0.0, False)
        _, reward, term, _, info = env.step(r"I think it is \boxed{\frac{5}{12}}")
        assert term and reward == 0.0 and info["reward_info"]["math"]["extracted"] == r"\frac{5}{12}"
    finally:
        env.close()
