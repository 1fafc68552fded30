"""A `tools=` reference to a factory that builds several tools (`mcp_tools` is one) splices them
in: it failed with "tool reference 'mod:facts' built list, not a toolenv.Tool", exit 2."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

import toolenv
from toolenv.cli import main
from toolenv.registry import resolve_tool, resolve_tools, resolved_tools

_SERIAL = itertools.count()

FACTORIES = '''
import toolenv


@toolenv.tool
def capital(country: str) -> str:
    """The capital of a country."""
    return {"france": "Paris"}.get(country.lower(), "unknown")


@toolenv.tool
def population(city: str) -> str:
    """The population of a city."""
    return {"paris": "2102650"}.get(city.lower(), "unknown")


def facts():
    """Several tools, as mcp_tools(...) returns them."""
    return [capital, population]


def as_tuple():
    return (capital, population)


def mixed():
    return [capital, "population"]


def nothing():
    return None
'''


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a fresh module holding the factories."""
    name = f"fact_tools_{next(_SERIAL)}"
    (tmp_path / f"{name}.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_reference_that_builds_a_list_or_tuple_of_tools_gives_each(mod: str) -> None:
    assert [t.name for t in resolve_tools(f"{mod}:facts")] == ["capital", "population"]
    assert [t.name for t in resolve_tools(f"{mod}:as_tuple")] == ["capital", "population"]
    assert [t.name for t in resolve_tools(f"{mod}:capital")] == ["capital"]  # one tool: a list of one


def test_resolve_tool_still_gives_one_tool_and_says_where_a_list_goes(mod: str) -> None:
    assert resolve_tool(f"{mod}:capital").name == "capital"
    with pytest.raises(ValueError, match=r"built list, not a toolenv\.Tool") as err:
        resolve_tool(f"{mod}:facts")
    assert "resolve_tools" in str(err.value)


@pytest.mark.parametrize(
    ("factory", "why"),
    [
        ("mixed", "tool reference '{mod}:mixed' built a list whose item 1 is str, not a toolenv.Tool"),
        ("nothing", "tool reference '{mod}:nothing' built NoneType, not a toolenv.Tool"),
    ],
)
def test_a_list_with_anything_but_tools_is_refused_clearly(mod: str, factory: str, why: str) -> None:
    with pytest.raises(ValueError) as err:
        resolve_tools(f"{mod}:{factory}")
    assert str(err.value).startswith(why.format(mod=mod)), err.value


def test_tools_lists_splice_the_built_tools_in(mod: str) -> None:
    kwargs = resolved_tools({"tools": ["sql", f"{mod}:facts"], "max_turns": 2})
    assert [t.name for t in kwargs["tools"]] == ["sql", "capital", "population"] and kwargs["max_turns"] == 2


def test_a_tool_env_takes_a_reference_to_a_list_factory(mod: str) -> None:
    env = toolenv.ToolEnv(tools=[f"{mod}:facts", "sql"], tasks=[{"question": "q", "answer": "a"}])
    try:
        assert [t.name for t in env.tools] == ["capital", "population", "sql"]
    finally:
        env.close()


def test_check_takes_a_reference_to_a_list_factory(mod: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The reviewer's `toolenv check toolenv/ToolEnv-v0 --kwargs '{"tools": [..., "mcpref:facts"]}'`."""
    kwargs = {"tools": ["sql", f"{mod}:facts"], "parser": "hermes", "tasks": [{"question": "q", "answer": "a"}]}
    assert main(["check", "toolenv/ToolEnv-v0", "--kwargs", json.dumps(kwargs)]) == 0
    out = capsys.readouterr().out
    assert "tool_schema[capital]" in out and "tool_schema[population]" in out and "tool_schema[sql]" in out
