"""Every `ast.parse` the core runs takes turns with other threads (CPython 3.11, gh-106905)."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from toolenv import _ast
from toolenv.integrations.verl.demo import evaluate
from toolenv.parsers._scan import python_literal
from toolenv.parsers.pythonic import PythonicParser


@pytest.fixture
def unlocked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources `ast.parse` was given while no thread held the core's AST lock."""
    parse, seen = ast.parse, []

    def checked(source: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ast._LOCK.locked():
            seen.append(str(source)[:40])
        return parse(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", checked)
    return seen


def test_the_pythonic_parser_parses_under_the_lock(unlocked: list[str]) -> None:
    action = PythonicParser().parse("[get_weather(city='Paris', days=[1, 2])]")
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("get_weather", {"city": "Paris", "days": [1, 2]})]
    assert unlocked == []


def test_python_literal_arguments_parse_under_the_lock(unlocked: list[str]) -> None:
    assert python_literal("['a', ('b', None)]", "raw") == ["a", ["b", None]]
    assert python_literal("{'k': {1, 2}}", "raw") == "raw"  # a set: not JSON
    assert unlocked == []


def test_the_demo_calculator_parses_under_the_lock(unlocked: list[str]) -> None:
    assert evaluate("(1 + 2) * 4 / 3") == 4.0
    assert unlocked == []


def test_the_lock_is_released_when_the_source_is_not_python() -> None:
    with pytest.raises(SyntaxError):
        _ast.parse("def (", mode="exec")
    assert not _ast._LOCK.locked()
    assert _ast.literal_eval("  [1, 'a']") == [1, "a"]
