"""`toolenv check ENV` calls each tool once, with arguments its schema takes, and fails a tool
whose result is a bug of the tool's own (a str, not a ToolResult: the model got "returned str,
not a ToolResult (a bug in the tool)" on every call while the check said all passed). An
ordinary error result (a backend down, a refusal) is an observation, not a failure."""

from __future__ import annotations

import copy
import itertools
import json
import textwrap
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from pydantic import BaseModel, Field

import toolenv
from toolenv import ToolContext
from toolenv.checker import check_env
from toolenv.cli import main
from toolenv.env import ToolEnv
from toolenv.types import ToolResult

from .conftest import TASKS, Add


class ReturnsStr(toolenv.Tool):
    """Echo a text (returns a str: the author's mistake)."""

    name = "echo"

    class Args(BaseModel):
        text: str

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        return args.text


class NotAsync(toolenv.Tool):
    """A run that is no `async def`."""

    name = "not_async"

    class Args(BaseModel):
        n: int

    def run(self, args: Any, ctx: ToolContext) -> Any:  # type: ignore[override]
        return ToolResult(text=str(args.n))


class TextNotStr(toolenv.Tool):
    """A ToolResult whose text is a list."""

    name = "text_not_str"

    class Args(BaseModel):
        pass

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        return ToolResult(text=["a", "b"])  # type: ignore[arg-type]


class Down(toolenv.Tool):
    """A search whose server is down: an error result, as designed."""

    name = "search"

    class Args(BaseModel):
        query: str

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        raise ConnectionError("HTTP 500 from http://127.0.0.1:9/retrieve")


class Refuses(toolenv.Tool):
    """Refuses every call with an error result of its own (a tool may)."""

    name = "refuses"

    class Args(BaseModel):
        q: str

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        return ToolResult.error("nothing found")


class Picky(toolenv.Tool):
    """A tool whose arguments have constraints: the sample call must satisfy them to reach `run`."""

    name = "picky"
    calls: ClassVar[list[dict[str, Any]]] = []

    class Args(BaseModel):
        word: str = Field(min_length=3)
        mode: Literal["fast", "slow"]
        count: int = Field(ge=2, le=9)
        ratio: float = Field(gt=0.5)
        tags: list[str] = Field(min_length=1)
        flag: bool
        optional: int = 7

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        Picky.calls.append(args.model_dump())
        return ToolResult(text="ok")


def _by_name(*tools: toolenv.Tool) -> dict[str, Any]:
    env = ToolEnv(tools=list(tools), tasks=copy.deepcopy(TASKS), parser="hermes")
    return {r.name: r for r in check_env(env)}


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        (ReturnsStr(), "returned str, not a ToolResult"),
        (NotAsync(), "is broken: its run returned ToolResult, not a coroutine"),
        (TextNotStr(), "whose text is list, not str"),
    ],
)
def test_a_tool_whose_result_is_its_own_bug_fails_the_check(tool: toolenv.Tool, said: str) -> None:
    by_name = _by_name(Add(), tool)
    bad = by_name[f"tool_runs[{tool.name}]"]
    assert not bad.ok
    assert bad.message.startswith(f"tool {tool.name!r} ") and said in bad.message
    assert by_name["tool_runs[add]"].ok  # the good tool beside it passes
    assert [n for n, r in by_name.items() if not r.ok] == [f"tool_runs[{tool.name}]"]


def test_ordinary_error_results_are_observations_not_failures() -> None:
    by_name = _by_name(Down(), Refuses())
    assert all(r.ok for r in by_name.values()), [r for r in by_name.values() if not r.ok]
    assert "tool_runs[search]" in by_name and "tool_runs[refuses]" in by_name


def test_the_sample_call_meets_the_schema_constraints() -> None:
    Picky.calls.clear()
    by_name = _by_name(Picky())
    assert by_name["tool_runs[picky]"].ok, by_name["tool_runs[picky]"]
    (args,) = Picky.calls  # called once, with valid arguments (else the caller had refused them)
    assert len(args["word"]) >= 3 and args["mode"] == "fast" and 2 <= args["count"] <= 9
    assert args["ratio"] > 0.5 and len(args["tags"]) >= 1 and args["optional"] == 7


def test_toolenv_check_fails_an_env_with_a_buggy_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's case: `toolenv check toolenv/ToolEnv-v0` with a "module:Name" tool whose run returns a str."""
    name = f"badtool_{next(_SERIAL)}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import toolenv
            from pydantic import BaseModel


            class Echo(toolenv.Tool):
                \"\"\"Echo a text.\"\"\"
                name = "echo"

                class Args(BaseModel):
                    text: str

                async def run(self, args, ctx):
                    return args.text
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    kwargs = {"tools": [f"{name}:Echo"], "tasks": [{"question": "q", "answer": "a"}], "parser": "hermes"}
    assert main(["check", "toolenv/ToolEnv-v0", "--kwargs", json.dumps(kwargs)]) == 1
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert "tool_runs[echo]" in line and "tool 'echo'" in line and "returned str, not a ToolResult" in line
    assert out.splitlines()[-1].endswith("1 failed")


_SERIAL = itertools.count()
