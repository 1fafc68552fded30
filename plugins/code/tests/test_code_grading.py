"""Grading: splitting HumanEval's check(), extracting code from answers, counting passes."""

from __future__ import annotations

import pytest

from toolenv_code.datasets import humaneval_tasks, mbpp_tasks, split_check
from toolenv_code.grading import TestSpec, extract_code, run_tests, solution_source

CHECK = """
METADATA = {'author': 'x'}

def check(candidate):
    import math
    assert candidate(1) == 2
    assert True, "always"
    data = [3, 4]
    for d in data:
        assert candidate(d) == d + 1
    assert candidate(0) == 1
"""

SPEC = TestSpec(tests=["assert inc(1) == 2", "assert inc(5) == 6", "assert inc(-1) == 0"])


def test_split_check_counts_assert_statements() -> None:
    setup, tests = split_check(CHECK, "inc")
    assert "METADATA" in setup and setup.endswith("candidate = inc")
    assert len(tests) == 3  # `assert True` is not a test; the for loop is one
    assert tests[0].startswith("import math") and "assert True" in tests[1] and "for d in data" in tests[1]


def test_extract_code_and_solution_source() -> None:
    assert extract_code("Here:\n```python\nx = 1\n```\nthanks") == "x = 1"
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("```python\na = 1\n```\n```python\nb = 2\n```") == "a = 1\n\nb = 2"
    prefix = "def f(x):\n    '''doc'''\n"
    assert solution_source("    return x + 1\n", prefix) == prefix + "    return x + 1"
    assert solution_source("def f(x):\n    return x", prefix).startswith(prefix.rstrip("\n") + "\n\n")


def test_extract_code_joins_python_blocks_of_any_case() -> None:
    solution, usage = "def f(x):\n    return x + 1", "print(f(1))"
    answer = f"Solution:\n```python\n{solution}\n```\nUsage:\n```Python\n{usage}\n```\nOutput:\n```\n2\n```"
    assert extract_code(answer) == f"{solution}\n\n{usage}"  # untagged blocks only count without python ones
    assert extract_code(f"```PY\n{solution}\n```\n```python3\n{usage}\n```") == f"{solution}\n\n{usage}"
    assert extract_code(f"```\n{solution}\n```\n```text\nnotes\n```") == solution
    assert extract_code(f"```python\n{solution}\n```\n```python\n>>> f(1)\n2\n```") == solution  # a transcript
    assert extract_code(f"```python\ns = '```'\n{solution}\n```") == f"s = '```'\n{solution}"
    assert extract_code(f"```python\n{solution}") == solution  # an unclosed block runs to the end
    indented = "1. The code:\n   ```python\n   def f(x):\n       return x + 1\n   ```\n"
    assert extract_code(indented) == solution  # a fence in a list item: its indentation comes off
    assert extract_code("Only prose.\n```text\nnotes\n```") == "Only prose.\n```text\nnotes\n```"


def test_solution_then_usage_block_and_capitalised_tag_score_full() -> None:
    solution = "def inc(x):\n    return x + 1\n"
    assert run_tests(f"```python\n{solution}```\nUsage:\n```python\nprint(inc(1))\n```", SPEC).fraction == 1.0
    assert run_tests(f"```Python\n{solution}```", SPEC).fraction == 1.0
    pickled = TestSpec(tests=["import pickle\nassert pickle.loads(pickle.dumps(P(2))).v == 2"])
    assert run_tests("class P:\n    def __init__(self, v):\n        self.v = v", pickled).fraction == 1.0


def test_partial_credit_and_failures() -> None:
    assert run_tests("def inc(x):\n    return x + 1", SPEC).fraction == 1.0
    report = run_tests("def inc(x):\n    return 2 if x == 1 else 0", SPEC)
    assert report.passed == [True, False, True] and report.fraction == pytest.approx(2 / 3)
    broken = run_tests("def inc(x) return", SPEC)
    assert broken.fraction == 0.0 and "SyntaxError" in broken.solution_error


def test_cheating_by_printing_or_exiting_does_not_pass() -> None:
    forged = 'print(\'["test", 0, true, ""]\')\nimport os\nos._exit(0)'
    assert run_tests(forged, SPEC).fraction == 0.0
    assert run_tests("import sys\nsys.exit(0)", SPEC).fraction == 0.0


def test_hanging_test_costs_only_itself() -> None:
    spec = SPEC.model_copy(update={"test_timeout": 0.5})
    report = run_tests("def inc(x):\n    while x == 5:\n        pass\n    return x + 1", spec)
    assert report.passed == [True, False, True]
    assert "time limit" in report.messages[1]


def test_datasets_load() -> None:
    he, mb = humaneval_tasks(), mbpp_tasks()
    assert len(he) == 164 and len(mb) == 974 and len(mbpp_tasks("sanitized")) == 427
    assert all(t.context["tests"] for t in he + mb)
    assert sum(len(t.context["tests"]) for t in he) > 164 * 5  # asserts were split, not one per task
    assert mb[0].id == "MBPP/1" and "\r" not in str(mb[0].answer)
    with pytest.raises(ValueError, match="unknown MBPP subset"):
        mbpp_tasks("nope")
