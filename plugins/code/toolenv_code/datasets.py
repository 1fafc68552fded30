"""HumanEval and MBPP as toolenv Tasks, read from the copies shipped in `data/`."""

from __future__ import annotations

import ast
import json
import warnings
from functools import lru_cache
from importlib import resources
from typing import Any

from toolenv import Task
from toolenv._ast import parse
from toolenv_code.grading import TestSpec

__all__ = ["MBPP_SPLITS", "humaneval_tasks", "mbpp_split", "mbpp_tasks", "split_check"]

HUMANEVAL_INSTRUCTIONS = (
    "Complete the Python function below. You may run code to test your ideas. When you are done, give the "
    "complete function (with its imports and `def` line) as your final answer inside <answer>...</answer>; "
    "a ```python block inside the answer is fine."
)
MBPP_INSTRUCTIONS = (
    "You may run code to test your ideas. When you are done, give the complete solution code as your final "
    "answer inside <answer>...</answer>; a ```python block inside the answer is fine."
)
#: How the instructions ask for the answer (the code envs name another parser's tags instead).
ANSWER_PHRASE = " inside <answer>...</answer>"
#: The instructions' answer format for a model that answers through a tool (TRL's rows).
ANSWER_TOOL_REWRITES = {ANSWER_PHRASE: " by calling the `{answer_tool}` tool"}


#: MBPP tasks whose reference solution needs far more than the default per-test time
#: (task 123 sums amicable numbers below 9999: ~10 s of CPU, per data/mbpp/SOURCE.md).
SLOW_MBPP = {123: 40.0}


def _data(*parts: str) -> str:
    return resources.files("toolenv_code").joinpath("data", *parts).read_text(encoding="utf-8")


def _corrected(rows: list[dict[str, Any]], fixes: dict[str, dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """`rows` with the corrections of upstream data applied (`data/*/corrections.json`, by
    task id; each dataset's SOURCE.md says what changed and why). A correction replaces one
    field, and only the upstream value it was made for: anything else is a packaging error."""
    by_id = {str(row[key]): row for row in rows}
    for task_id, fix in fixes.items():
        row = by_id.get(task_id)
        if row is None or row.get(fix["field"]) != fix["upstream"]:
            raise RuntimeError(f"the correction of task {task_id} does not match the shipped data")
        row[fix["field"]] = fix["corrected"]
    return rows


def _is_test(stmt: ast.stmt) -> bool:
    asserts = [n for n in ast.walk(stmt) if isinstance(n, ast.Assert)]
    trivial = isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and bool(stmt.test.value)
    return bool(asserts) and not trivial


def split_check(test_source: str, entry_point: str) -> tuple[str, list[str]]:
    """Split HumanEval's `check(candidate)` into setup code and one snippet per assert.

    Module-level code other than `check` becomes setup (plus `candidate = <entry_point>`);
    each assert-bearing statement of `check`'s body is one test, carrying the plain
    statements just before it (imports, helper variables) so that order is kept.
    """
    module = parse(test_source)
    setup: list[str] = []
    tests: list[str] = []
    pending: list[str] = []
    for node in module.body:
        if not (isinstance(node, ast.FunctionDef) and node.name == "check"):
            setup.append(ast.unparse(node))
            continue
        for stmt in node.body:
            pending.append(ast.unparse(stmt))
            if _is_test(stmt):
                tests.append("\n".join(pending))
                pending = []
    if pending and tests:
        tests[-1] += "\n" + "\n".join(pending)
    setup.append(f"candidate = {entry_point}")
    return "\n".join(setup), tests


@lru_cache(maxsize=1)
def _humaneval() -> tuple[Task, ...]:
    rows = [json.loads(line) for line in _data("humaneval", "HumanEval.jsonl").splitlines()]
    rows = _corrected(rows, json.loads(_data("humaneval", "corrections.json"))["tasks"], "task_id")
    tasks = []
    for row in rows:
        setup, tests = split_check(row["test"], row["entry_point"])
        spec = TestSpec(tests=tests, setup=setup, solution_prefix=row["prompt"], entry_points=[row["entry_point"]])
        tasks.append(
            Task(
                id=row["task_id"],
                question=f"{HUMANEVAL_INSTRUCTIONS}\n\n```python\n{row['prompt']}```",
                answer=row["prompt"] + row["canonical_solution"],
                context={"dataset": "humaneval", "entry_point": row["entry_point"], **spec.model_dump()},
            )
        )
    return tuple(tasks)


def humaneval_tasks() -> list[Task]:
    """The 164 HumanEval problems; `context` holds the split hidden tests."""
    return list(_humaneval())


def _tested_functions(code: str, tests: list[str]) -> list[str]:
    """The reference solution's top-level functions that the tests call (MBPP names no entry point)."""
    with warnings.catch_warnings():  # some tests hold invalid escapes ("\\d") that warn
        warnings.simplefilter("ignore")
        body = parse(code).body
        names = [n for t in tests for n in ast.walk(parse(t))]
    defined = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    called = {n.id for n in names if isinstance(n, ast.Name)}
    return sorted(defined & called)


def _mbpp_question(text: str, tests: list[str]) -> str:
    shown = "\n".join(tests)
    return f"{text}\nYour code should pass these tests:\n\n{shown}\n\n{MBPP_INSTRUCTIONS}"


#: MBPP's splits by task id, as its README gives them (Hugging Face's `mbpp` splits are the same).
MBPP_SPLITS: dict[str, range] = {
    "prompt": range(1, 11),
    "test": range(11, 511),
    "validation": range(511, 601),
    "train": range(601, 975),
}


def mbpp_split(task_id: int) -> str:
    """The MBPP split a task id belongs to (`prompt`, `test`, `validation` or `train`)."""
    for name, ids in MBPP_SPLITS.items():
        if task_id in ids:
            return name
    raise ValueError(f"MBPP has no task {task_id}")


@lru_cache(maxsize=2)
def _mbpp(subset: str) -> tuple[Task, ...]:
    rows: list[dict[str, Any]]
    if subset == "full":
        rows = [json.loads(line) for line in _data("mbpp", "mbpp.jsonl").splitlines() if line.strip()]
    elif subset == "sanitized":
        rows = json.loads(_data("mbpp", "sanitized-mbpp.json"))
    else:
        raise ValueError(f"unknown MBPP subset {subset!r}; expected 'full' or 'sanitized'")
    rows = _corrected(rows, json.loads(_data("mbpp", "corrections.json"))[subset], "task_id")
    tasks = []
    for row in rows:
        text = row.get("text", row.get("prompt", ""))
        setup = row.get("test_setup_code") or "\n".join(row.get("test_imports", []))
        entry_points = _tested_functions(row["code"], row["test_list"])
        spec = TestSpec(tests=list(row["test_list"]), setup=setup, entry_points=entry_points)
        if row["task_id"] in SLOW_MBPP:
            spec.test_timeout = SLOW_MBPP[row["task_id"]]
        tasks.append(
            Task(
                id=f"MBPP/{row['task_id']}",
                question=_mbpp_question(text, row["test_list"]),
                answer=row["code"].replace("\r\n", "\n"),
                context={"dataset": f"mbpp-{subset}", **spec.model_dump()},
                metadata={"split": mbpp_split(int(row["task_id"]))},
            )
        )
    return tuple(tasks)


def mbpp_tasks(subset: str = "full", split: str = "all", shown_tests: int | None = None) -> list[Task]:
    """MBPP problems: `full` (974, mbpp.jsonl) or `sanitized` (427 hand-checked).

    `split`: `all`, or one of MBPP's own splits (`train`: 374 full / 120 sanitized, `test`:
    500 / 257, `validation`: 90 / 43, `prompt`: 10 / 7): train on `train`, report on `test`.
    `shown_tests`: how many of a task's tests its prompt shows (all, as in the paper, by
    default); every test is graded, so a policy cannot pass by special-casing the inputs it saw.
    """
    if split != "all" and split not in MBPP_SPLITS:
        raise ValueError(f"unknown MBPP split {split!r}; expected 'all' or one of {', '.join(MBPP_SPLITS)}")
    if shown_tests is not None and shown_tests < 1:
        raise ValueError(f"shown_tests must be at least 1 (the tests name the function), got {shown_tests}")
    tasks = [t for t in _mbpp(subset) if split in ("all", t.metadata["split"])]
    if shown_tests is None:
        return tasks
    return [_showing(t, shown_tests) for t in tasks]


def _showing(task: Task, k: int) -> Task:
    """`task` with a prompt that shows only its first `k` tests."""
    tests: list[str] = task.context["tests"]
    text = task.question.split("\nYour code should pass these tests:", 1)[0]
    return task.model_copy(update={"question": _mbpp_question(text, tests[:k])})
