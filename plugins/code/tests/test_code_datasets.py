"""The shipped HumanEval and MBPP tests check the answer: none accepts any answer.

Upstream tests that did not (HumanEval/33 compared the solution with itself; MBPP/698
compared dicts, whose equality ignores the order the task asks for) are corrected in
`data/*/corrections.json`, as each dataset's SOURCE.md records.
"""

from __future__ import annotations

import ast
import json
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import toolenv_code
from toolenv import Task
from toolenv_code.datasets import humaneval_tasks, mbpp_tasks
from toolenv_code.grading import TestSpec, run_tests

#: Trivially wrong answers: each entry point returns this, whatever it is given.
WRONG = {
    "none": "None",
    "first argument": "a[0] if a else None",
    "garbage": "('garbage', repr(a))",
    "true": "True",
}
#: Tasks whose upstream tests a trivially wrong answer passes although none of them is wrong:
#: the tests are weak, not broken, and have no expected value to correct (see SOURCE.md).
WEAK = {
    ("MBPP/404", "first argument"),  # minimum(a, b): each test's smaller number comes first
    ("MBPP/847", "first argument"),  # "copy a list": the list itself equals its copy
    ("MBPP/899", "true"),  # every expected value is True (the reference solution returns True always)
}


def _spec(task: Task) -> TestSpec:
    return TestSpec.model_validate({k: task.context[k] for k in TestSpec.model_fields if k in task.context})


def _all_tasks() -> list[Task]:
    return humaneval_tasks() + mbpp_tasks() + mbpp_tasks("sanitized")


def _wrong(task: Task, body: str) -> str:
    return "".join(f"def {name}(*a, **k):\n    return {body}\n" for name in task.context["entry_points"])


def _task(task_id: str, subset: str = "full") -> Task:
    return next(t for t in humaneval_tasks() + mbpp_tasks(subset) if t.id == task_id)


def test_humaneval_33_checks_the_answer_against_literals() -> None:
    """Upstream, three of its asserts were `candidate(x) == sort_third(x)`, and `sort_third`
    is the answer itself: any function passed them."""
    task = _task("HumanEval/33")
    identity = "def sort_third(l):\n    return list(l)\n"
    report = run_tests(identity, _spec(task))
    assert report.passed == [True, False, False, False, False, False, False], report.messages  # [1, 2, 3] is sorted
    assert all(
        "sort_third(" not in ast.unparse(ast.parse(t).body[-1].test.comparators[0]) for t in task.context["tests"]
    )
    assert run_tests(str(task.answer), _spec(task)).fraction == 1.0


def test_mbpp_698_checks_the_order_it_asks_for() -> None:
    task = _task("MBPP/698")
    unsorted = "def sort_dict_item(test_dict):\n    return dict(test_dict)\n"
    assert run_tests(unsorted, _spec(task)).fraction == 0.0
    assert run_tests(str(task.answer), _spec(task)).fraction == 1.0
    assert "sort_dict_item({(5, 6): 3" in task.question  # the prompt shows the tests that are graded


def test_corrections_replace_what_upstream_holds_and_are_documented() -> None:
    data = Path(toolenv_code.__file__).parent / "data"
    he_rows = {
        r["task_id"]: r
        for r in map(json.loads, (data / "humaneval" / "HumanEval.jsonl").read_text(encoding="utf-8").splitlines())
    }
    he_fixes = json.loads((data / "humaneval" / "corrections.json").read_text(encoding="utf-8"))["tasks"]
    he_source = (data / "humaneval" / "SOURCE.md").read_text(encoding="utf-8")
    for task_id, fix in he_fixes.items():
        assert he_rows[task_id][fix["field"]] == fix["upstream"] != fix["corrected"]
        assert task_id in he_source
    mb_fixes = json.loads((data / "mbpp" / "corrections.json").read_text(encoding="utf-8"))
    mb_rows = {
        "full": [
            json.loads(line) for line in (data / "mbpp" / "mbpp.jsonl").read_text(encoding="utf-8").splitlines() if line
        ],
        "sanitized": json.loads((data / "mbpp" / "sanitized-mbpp.json").read_text(encoding="utf-8")),
    }
    mb_source = (data / "mbpp" / "SOURCE.md").read_text(encoding="utf-8")
    for subset, rows in mb_rows.items():
        by_id = {str(r["task_id"]): r for r in rows}
        for task_id, fix in mb_fixes[subset].items():
            assert by_id[task_id][fix["field"]] == fix["upstream"] != fix["corrected"]
            assert _task(f"MBPP/{task_id}", subset).context["tests"] == fix["corrected"]
            assert f"MBPP/{task_id}" in mb_source


def test_no_test_compares_the_answer_with_itself() -> None:
    for task in _all_tasks():
        names = set(task.context["entry_points"]) | {"candidate"}
        for test in task.context["tests"]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(test)
            for node in ast.walk(tree):
                if isinstance(node, ast.Compare):
                    sides = [node.left, *node.comparators]
                    uses = [any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(s)) for s in sides]
                    assert sum(uses) < 2, (task.id, ast.unparse(node))


def _truthiness(test: str) -> bool:
    """`assert f(x)`: any truthy value passes it (the task's `assert not f(y)` tests catch a constant)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        last = ast.parse(test).body[-1]
    return isinstance(last, ast.Assert) and isinstance(last.test, ast.Call)


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_a_trivially_wrong_answer_fails_every_task(wrong: str) -> None:
    """Every HumanEval and MBPP (full and sanitized) task (~10 s on 2 cores per answer)."""
    tasks = _all_tasks()
    with ThreadPoolExecutor(3) as pool:
        reports = list(pool.map(lambda t: run_tests(_wrong(t, WRONG[wrong]), _spec(t)), tasks))
    full_marks = {(t.id, wrong) for t, r in zip(tasks, reports, strict=True) if r.fraction == 1.0}
    assert full_marks <= WEAK
    if wrong == "garbage":  # a value no test expects passes only the truthiness asserts
        passed = [
            (t.id, test)
            for t, r in zip(tasks, reports, strict=True)
            for test, ok in zip(t.context["tests"], r.passed, strict=True)
            if ok and not _truthiness(test)
        ]
        assert passed == []
