"""`toolenv check` and the checker's Python API: schema validation, running event loops."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

import toolenv
from toolenv import ToolContext
from toolenv.checker import SCHEMA_NOT_VALIDATED, check_env, check_tool
from toolenv.cli import main
from toolenv.env import ToolEnv
from toolenv.types import ToolResult

from .conftest import TASKS, Add

pytest.importorskip("jsonschema", reason="schema validation uses jsonschema when it is installed")


GOOD: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


class HandWritten(toolenv.Tool):
    """A tool whose parameters schema is written by hand (as an MCP server or a plugin may)."""

    name = "hand_written"

    class Args(BaseModel):
        x: int

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.parameters = GOOD if parameters is None else parameters

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        return ToolResult(text="ok")


def hand_written(parameters: dict[str, Any]) -> HandWritten:
    return HandWritten(parameters)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {**GOOD, "properties": {"x": {"type": "strng"}}},
            "parameters are not a valid JSON Schema: 'strng' is not valid under any of the given schemas "
            "(at properties/x/type)",
        ),
        ({**GOOD, "required": "x"}, "parameters are not a valid JSON Schema: 'x' is not of type 'array' (at required)"),
        ({**GOOD, "properties": [{"x": {}}]}, "parameters are not a valid JSON Schema: [{'x': {}}] is not of type"),
        (
            {**GOOD, "properties": {"x": {"$ref": "#/$defs/Missing"}}, "$defs": {"Other": {"type": "integer"}}},
            "parameters have a $ref that resolves nowhere: '#/$defs/Missing'",
        ),
        ({**GOOD, "properties": {"x": {"$ref": "https://example.com/x.json"}}}, "resolves nowhere"),
        ({"type": "array", "items": {"type": "integer"}}, 'parameters must be a JSON object schema ("type": "object"'),
        ({"properties": {"x": {"type": "integer"}}}, 'parameters must be a JSON object schema ("type": "object"'),
        ({**GOOD, "properties": {"x": {"type": "number", "default": float("nan")}}}, "its schema is not JSON"),
    ],
)
def test_an_invalid_parameters_schema_fails_the_schema_check(parameters: dict[str, Any], message: str) -> None:
    """A schema the server would refuse at request time (vLLM and OpenAI validate it) fails
    `toolenv check`, with where the problem is."""
    (schema, _) = check_tool(hand_written(parameters))
    assert not schema.ok
    assert message in schema.message, schema.message
    assert schema.message.startswith("tool 'hand_written': ")


@pytest.mark.parametrize(
    "parameters",
    [
        GOOD,
        {  # references into the schema: $defs, a JSON pointer, the root, an anchor
            "type": "object",
            "properties": {
                "a": {"$ref": "#/$defs/Node"},
                "b": {"$ref": "#/properties/a"},
                "c": {"$ref": "#named"},
                "d": {"type": "string", "default": {"$ref": "not a reference: data"}},
            },
            "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#"}}}, "N": {"$anchor": "named"}},
        },
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "definitions": {}, "properties": {}},
    ],
)
def test_a_valid_parameters_schema_passes(parameters: dict[str, Any]) -> None:
    (schema, _) = check_tool(hand_written(parameters))
    assert schema.ok and schema.message == "", schema.message


class Point(BaseModel):
    x: float
    label: str | None = None


class Tree(BaseModel):
    children: list[Tree] = []


def test_pydantic_schemas_with_nested_recursive_and_optional_models_pass() -> None:
    class Shapes(toolenv.Tool):
        """Draw shapes."""

        name = "shapes"

        class Args(BaseModel):
            points: list[Point]
            origin: Point | None = None
            tree: Tree | None = None

        async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
            return ToolResult(text="ok")

    assert all(r.ok and not r.message for r in check_tool(Shapes())), check_tool(Shapes())


def test_without_jsonschema_the_check_says_it_did_not_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    """jsonschema is not a core dependency: without it the schema check passes with a note
    saying how to enable validation; the checks that need no library still run."""
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # `import jsonschema` raises ImportError
    (schema, _) = check_tool(hand_written({**GOOD, "properties": {"x": {"type": "strng"}}}))
    assert schema.ok and schema.message == SCHEMA_NOT_VALIDATED
    assert "pip install jsonschema" in SCHEMA_NOT_VALIDATED
    (schema, _) = check_tool(hand_written({**GOOD, "properties": {"x": {"$ref": "#/$defs/Missing"}}}))
    assert not schema.ok and "resolves nowhere" in schema.message


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A tool plugin distribution `hand-plug` whose tool `hand_bad` has an invalid schema."""
    (tmp_path / "hand_plug.py").write_text(
        "from pydantic import BaseModel\n"
        "import toolenv\n\n"
        "class Bad(toolenv.Tool):\n"
        '    """A tool whose hand-written schema misspells a type."""\n\n'
        "    name = 'hand_bad'\n\n"
        "    class Args(BaseModel):\n"
        "        x: int\n\n"
        "    def schema(self):\n"
        "        schema = super().schema()\n"
        "        schema['function']['parameters']['properties']['x']['type'] = 'strng'\n"
        "        return schema\n"
    )
    info = tmp_path / "hand_plug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hand-plug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[toolenv.tools]\nhand_bad = hand_plug:Bad\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hand_bad"


def test_check_command_fails_a_tool_plugin_with_an_invalid_schema(
    plugin: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", plugin]) == 1
    out = capsys.readouterr().out
    assert "FAIL tool_schema" in out and "'strng' is not valid" in out and "1 failed" in out


def test_check_command_says_when_schemas_were_not_validated(
    plugin: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    assert main(["check", plugin]) == 0
    out = capsys.readouterr().out
    assert f"ok  tool_schema                 {SCHEMA_NOT_VALIDATED}\n" in out


# ---------------------------------------------------------------- inside a running event loop


async def test_check_env_works_inside_a_running_event_loop() -> None:
    """A notebook or an async test has a running loop: the checks still run, and pass."""
    results = check_env(ToolEnv(tools=[Add()], tasks=copy.deepcopy(TASKS)))
    assert results and all(r.ok for r in results), [r for r in results if not r.ok]


async def test_check_tool_works_inside_a_running_event_loop() -> None:
    results = check_tool(Add())
    assert [(r.name, r.ok) for r in results] == [("tool_schema", True), ("tool_rejects_bad_arguments", True)]


async def test_check_env_inside_a_running_loop_still_reports_real_failures() -> None:
    class Lax(toolenv.Tool):
        """Accepts anything."""

        name = "lax"

        class Args(BaseModel, extra="allow"):
            pass

        async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
            return ToolResult(text=json.dumps(args.model_dump()))

    by_name = {r.name: r for r in check_env(ToolEnv(tools=[Lax()], tasks=copy.deepcopy(TASKS)))}
    assert by_name["async_twins"].ok and by_name["reset_gives_prompt"].ok
    bad = by_name["tool_rejects_bad_arguments[lax]"]
    assert not bad.ok and "accepted an unknown argument" in bad.message


class Open(HandWritten):
    """A tool whose schema admits any argument, as an MCP server's may; it records its calls."""

    name = "open_tool"
    calls: ClassVar[list[dict[str, Any]]] = []

    class Args(BaseModel, extra="allow"):
        pass

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        Open.calls.append(args.model_dump())
        return ToolResult(text="done")


def test_a_tool_whose_schema_admits_any_argument_is_not_failed_nor_called_with_junk() -> None:
    """`additionalProperties: true` makes junk arguments valid ones: the checks neither call the
    tool with them (a real call, with side effects) nor fail it for accepting them."""
    Open.calls.clear()
    tool = Open({"type": "object", "properties": {}, "additionalProperties": True})
    by_name = {r.name: r for r in check_env(ToolEnv(tools=[tool], tasks=copy.deepcopy(TASKS)))}
    assert all(r.ok for r in by_name.values()), [r for r in by_name.values() if not r.ok]
    assert "not tried" in by_name["tool_rejects_bad_arguments[open_tool]"].message
    assert Open.calls == []


def test_doctor_shows_a_plugins_multi_line_error_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `toolenv.doctor` plugin that raises with a multi-line message (a subprocess's stderr)
    is shown as one `error:` line under its name, as `toolenv`'s other errors are."""
    (tmp_path / "doctor_lines.py").write_text(
        "def broken():\n    raise RuntimeError('probe failed:\\n  sandbox: missing\\n  hint: install it')\n"
    )
    info = tmp_path / "doctor_lines-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: doctor-lines\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[toolenv.doctor]\nlines = doctor_lines:broken\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "lines:\n  error: RuntimeError: probe failed: sandbox: missing hint: install it\n" in out


def test_check_command_closes_the_tool_it_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`toolenv check TOOL` builds the tool, so it closes it (a tool's processes and
    connections end in `close`), as `toolenv check ENV` closes the env."""
    marker = tmp_path / "closed"
    (tmp_path / "closing_plug.py").write_text(
        "from pathlib import Path\n"
        "from pydantic import BaseModel, ConfigDict\n"
        "import toolenv\n\n"
        "class Closing(toolenv.Tool):\n"
        '    """Writes a file when closed."""\n\n'
        "    name = 'closing'\n\n"
        "    class Args(BaseModel):\n"
        "        model_config = ConfigDict(extra='forbid')\n\n"
        "    async def close(self):\n"
        f"        Path({str(marker)!r}).write_text('closed')\n"
    )
    info = tmp_path / "closing_plug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: closing-plug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[toolenv.tools]\nclosing = closing_plug:Closing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["check", "closing"]) == 0
    assert marker.read_text() == "closed"
