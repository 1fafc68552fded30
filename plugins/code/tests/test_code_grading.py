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
    assert extract_code("```python\na = 1\n```\n```python\nb = 2\n```") == "b = 2"
    prefix = "def f(x):\n    '''doc'''\n"
    assert solution_source("    return x + 1\n", prefix) == prefix + "    return x + 1"
    assert solution_source("def f(x):\n    return x", prefix).startswith(prefix.rstrip("\n") + "\n\n")


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
