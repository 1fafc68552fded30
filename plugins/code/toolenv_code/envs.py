"""`toolenv/HumanEval-v0` and `toolenv/MBPP-v0`, and their oracles."""

from __future__ import annotations

from typing import Any

from toolenv import Task, ToolEnv
from toolenv.parsers import answer_markup_of
from toolenv.types import load_tasks
from toolenv_code.datasets import ANSWER_PHRASE, ANSWER_TOOL_REWRITES, humaneval_tasks, mbpp_tasks
from toolenv_code.reward import time_limits  # (importing it registers "tests_passed")
from toolenv_code.sandbox import SandboxLimits
from toolenv_code.tool import PythonTool

__all__ = ["humaneval_oracle", "make_code_env", "make_humaneval_env", "make_mbpp_env", "mbpp_oracle"]


def make_code_env(default_tasks: list[Task], **overrides: Any) -> ToolEnv:
    """A code env over `default_tasks`.

    Overrides: `tasks`, `limit` (first N tasks), `stateful` (variables persist within
    an episode), `sandbox` (`SandboxLimits`), `preload` (modules the sandbox imports once
    ahead of every call, e.g. `"numpy"`), `tools` (`[]`: none), `test_timeout` and
    `total_timeout` (the grading's time limits, in seconds: set in every task's context over the
    task's own), and any `ToolEnv` argument (`max_turns`, `parser`, `reward`, ...). The default
    parser reads ```python blocks; pass `parser="hermes"` to call the `python` tool with JSON
    tool calls instead. The bundled tasks' instructions name the parser's own answer tags
    (`ActionParser.answer_markup()`): an answer in tags the parser does not read is no answer.
    """
    tasks = overrides.pop("tasks", None)
    parser = overrides.pop("parser", "codeblock")
    if tasks is None:
        tasks = default_tasks
        markup = answer_markup_of(parser, overrides.get("parser_kwargs"))
        if markup != ANSWER_PHRASE.removeprefix(" inside "):
            tasks = _answer_in(tasks, markup)
            said = f" inside {markup}" if markup else ""
            overrides.setdefault("answer_tool_rewrites", {said: ANSWER_TOOL_REWRITES[ANSWER_PHRASE]} if said else {})
    limit = overrides.pop("limit", None)
    if limit is not None:
        tasks = list(tasks)[: int(limit)]
    tasks = _with_time_limits(tasks, overrides.pop("test_timeout", None), overrides.pop("total_timeout", None))
    stateful = bool(overrides.pop("stateful", False))
    sandbox = overrides.pop("sandbox", None)
    if isinstance(sandbox, dict):
        sandbox = SandboxLimits.model_validate(sandbox)
    preload = overrides.pop("preload", ())
    tools = overrides.pop("tools", None)
    if tools is not None and preload:
        raise ValueError("preload= applies to the env's own python tool; with tools=, give it to your PythonTool")
    if tools is None:  # (an empty list is no tools: a baseline that answers without running code)
        tools = [PythonTool(stateful=stateful, sandbox=sandbox, preload=preload)]
    overrides.setdefault("reward", "tests_passed")
    overrides.setdefault("max_turns", 4)
    overrides.setdefault("answer_tool_rewrites", ANSWER_TOOL_REWRITES)
    return ToolEnv(tools=tools, tasks=tasks, parser=parser, **overrides)


def _answer_in(tasks: list[Task], markup: str | None) -> list[Task]:
    """Copies of the bundled `tasks` whose instructions ask for the answer inside `markup` (or,
    None, in no tags: the parser's own instructions then say how to answer)."""
    said = f" inside {markup}" if markup else ""
    return [task.model_copy(update={"question": task.question.replace(ANSWER_PHRASE, said)}) for task in tasks]


def _with_time_limits(tasks: Any, test_timeout: Any, total_timeout: Any) -> Any:
    """`tasks` (any form `ToolEnv` takes) with the grading's time limits that are given set in
    their context (copies: the datasets' tasks are shared).

    Raises:
        ValueError: a limit is not a number of seconds above 0.
    """
    limits = time_limits(test_timeout, total_timeout)
    if not limits:
        return tasks
    return [task.model_copy(update={"context": {**task.context, **limits}}) for task in load_tasks(tasks)]


def make_humaneval_env(**overrides: Any) -> ToolEnv:
    """HumanEval (164 problems): complete the function; reward = share of its asserts passed."""
    return make_code_env(humaneval_tasks(), **overrides)


def make_mbpp_env(**overrides: Any) -> ToolEnv:
    """MBPP (974 problems; `subset="sanitized"` for the 427 checked ones); reward = share of tests passed.

    `split` (`all`, `train`, `test`, `validation`, `prompt`) picks one of MBPP's splits;
    `shown_tests` shows only a task's first N tests in its prompt (all are graded).
    """
    subset = overrides.pop("subset", "full")
    split = overrides.pop("split", "all")
    shown = overrides.pop("shown_tests", None)
    return make_code_env(mbpp_tasks(subset, split=split, shown_tests=shown), **overrides)


def _answer(task: Task) -> str:
    return f"<answer>\n```python\n{task.answers[0]}\n```\n</answer>"


def humaneval_oracle(task: Task, turn: int, observation: str) -> str:
    """Answer at once with the canonical solution (in a fenced block inside `<answer>`)."""
    return _answer(task)


def mbpp_oracle(task: Task, turn: int, observation: str) -> str:
    """Answer at once with the reference solution (in a fenced block inside `<answer>`)."""
    return _answer(task)
