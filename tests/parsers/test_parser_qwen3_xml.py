"""Qwen3-Coder's XML parser: raw-text arguments read by type, errors, round trips, an env run."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import Qwen3XMLParser, get_parser


class Query(toolenv.Tool):
    """Run a query."""

    name = "run_sql"

    class Args(BaseModel):
        query: str = Field(description="the SQL")
        limit: int = 10
        columns: list[str] | None = None
        strict: bool = False
        options: dict[str, int] = Field(default_factory=dict)

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"{args.query} limit={args.limit!r} columns={args.columns!r}")


def block(name: str, **params: str) -> str:
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


BOUND = Qwen3XMLParser().bind([Query()])


def test_arguments_are_read_by_their_type_when_bound() -> None:
    text = "Let me look.\n" + block(
        "run_sql",
        query="SELECT [name] FROM t\nWHERE a < 3 AND b = 'x'",  # multi-line, brackets, quotes: stays text
        limit="5",
        columns='["a", "b"]',
        strict="True",
        options='{"x": 1}',
    )
    action = BOUND.parse(text)
    assert action.errors == [] and action.text == "Let me look."
    (call,) = action.tool_calls
    assert call.name == "run_sql" and call.id == "call_0"
    assert call.arguments == {
        "query": "SELECT [name] FROM t\nWHERE a < 3 AND b = 'x'",
        "limit": 5,
        "columns": ["a", "b"],
        "strict": True,
        "options": {"x": 1},
    }


def test_unbound_arguments_stay_text() -> None:
    (call,) = Qwen3XMLParser().parse(block("run_sql", query="1", limit="5")).tool_calls
    assert call.arguments == {"query": "1", "limit": "5"}


def test_a_value_that_does_not_decode_stays_text_for_validation_to_report() -> None:
    (call,) = BOUND.parse(block("run_sql", query="x", limit="five")).tool_calls
    assert call.arguments["limit"] == "five"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "has no <function=NAME>"),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "names no function"),
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</tool_call>", "is not closed with </function>"),
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", "is not closed with </parameter>"),
        ("<tool_call>\n<function=f\n</function>\n</tool_call>", "is not closed with </function>"),
        ("<tool_call>\n<function=f>\n<parameter=>\n1\n</parameter>\n</function>\n</tool_call>", "has no name"),
        (block("f", a="1") + "\n<tool_call>\n<function=g>", "is not closed with </tool_call>"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = BOUND.parse(text)
    assert error in " ".join(action.errors), action


def test_a_parameter_given_twice_is_an_error() -> None:
    twice = "<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n"
    text = f"<tool_call>\n<function=f>\n{twice}</function>\n</tool_call>"
    assert "given twice" in BOUND.parse(text).errors[0]


def test_several_calls_and_an_answer() -> None:
    action = BOUND.parse(block("run_sql", query="a") + block("now") + "<answer>42</answer>")
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("run_sql", {"query": "a"}, "call_0"),
        ("now", {}, "call_1"),
    ]
    assert action.answer == "42"


def functions(*calls: tuple[str, dict[str, str]]) -> str:
    """Several `<function=…>` blocks in ONE `<tool_call>`, as vLLM's qwen3_coder parser reads them."""
    parts = []
    for name, params in calls:
        inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
        parts.append(f"<function={name}>\n{inner}</function>\n")
    return "<tool_call>\n" + "".join(parts) + "</tool_call>"


def test_every_function_in_one_tool_call_block_is_a_call() -> None:
    text = functions(("run_sql", {"query": "a"}), ("run_sql", {"query": "b", "limit": "2"})) + block("now")
    action = BOUND.parse(text)
    assert action.errors == [] and action.text == ""
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("run_sql", {"query": "a"}, "call_0"),
        ("run_sql", {"query": "b", "limit": 2}, "call_1"),
        ("now", {}, "call_2"),
    ]


def test_a_bad_function_next_to_a_good_one_in_one_block_is_an_error_not_dropped() -> None:
    text = functions(("f", {"a": "1"}), ("", {}), ("g", {"b": "2"}))
    action = Qwen3XMLParser().parse(text)
    assert [(c.name, c.id) for c in action.tool_calls] == [("f", "call_0"), ("g", "call_2")]
    assert action.errors == ["Tool call 2: <function=> names no function."]
    unclosed = Qwen3XMLParser().parse(
        "<tool_call>\n<function=f>\n</function>\n<function=g>\n<parameter=a>\n1\n</tool_call>"
    )
    assert [c.name for c in unclosed.tool_calls] == ["f"]
    assert unclosed.errors == ["Tool call 2: <function=g> is not closed with </function>."]


def test_instructions_list_parameters_with_their_types() -> None:
    text = BOUND.instructions([Query()])
    assert "<name>run_sql</name>" in text and "<description>Run a query.</description>" in text
    assert (
        "<name>query</name>\n<type>string</type>\n<description>the SQL</description>\n<required>true</required>" in text
    )
    assert "<name>columns</name>\n<type>array | null</type>\n<required>false</required>" in text
    assert "<function=example_function_name>" in text and "<answer>" in text


text_values = st.lists(
    st.text(max_size=8) | st.sampled_from(["<", ">", "\n", "</", "<parameter", "</function", "[1]", "{}"]), max_size=5
).map("".join)
keys = st.text(st.characters(categories=("L", "N"), include_characters="_"), min_size=1, max_size=10)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(keys, st.dictionaries(keys, text_values, max_size=4)), max_size=3))
def test_text_arguments_round_trip(calls: list[tuple[str, dict[str, str]]]) -> None:
    """Unbound, what format_call writes reads back exactly (or format_call declines)."""
    parser = Qwen3XMLParser()
    written = [(n, a, parser.format_call(n, a)) for n, a in calls]
    kept = [(n, a) for n, a, text in written if text is not None]
    action = parser.parse("\n".join(text for _, _, text in written if text is not None))
    assert action.errors == []
    assert [(c.name, c.arguments) for c in action.tool_calls] == kept
    for _, a, text in written:
        if text is None:  # declined only for a value holding the format's own closing tags
            assert any(
                t in v for v in a.values() for t in ("</parameter>", "</function>", "</tool_call>", "<tool_call>")
            )


def test_typed_arguments_round_trip_when_bound() -> None:
    args = {"query": "[1, 2]", "limit": 3, "columns": ["x", "y"], "strict": False, "options": {"k": 2}}
    text = BOUND.format_call("run_sql", args)
    assert text is not None and BOUND.parse(text).tool_calls[0].arguments == args
    assert BOUND.format_call("run_sql", {"query": 5}) is None  # a number for a string parameter


def test_an_env_with_the_qwen3_xml_parser() -> None:
    env = toolenv.ToolEnv(tools=[Query()], tasks=[{"question": "q", "answer": "ok"}], parser="qwen3_xml")
    obs, _ = env.reset(seed=0)
    assert "<name>run_sql</name>" in obs
    obs, *_ = env.step(block("run_sql", query="SELECT 1", limit="3", columns='["a"]'))
    assert obs == "<tool_response>\nSELECT 1 limit=3 columns=['a']\n</tool_response>"
    obs, *_ = env.step(block("run_sql", query="SELECT 1", limit="three"))
    assert "Invalid arguments for tool 'run_sql'" in obs and "limit" in obs
    assert get_parser("qwen3_xml").bind([]) is not get_parser("qwen3_xml")  # bound copies, never shared state


def test_union_and_any_parameters_read_back_as_written() -> None:
    from pydantic import BaseModel

    class Lookup(toolenv.Tool):
        """Look a key up."""

        name = "lookup"

        class Args(BaseModel):
            key: int | str
            extra: Any = None
            note: str = ""

        async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
            return toolenv.ToolResult(text="ok")

    parser = get_parser("qwen3_xml").bind([Lookup()])
    for args in (
        {"key": 7, "extra": {"a": 1}, "note": "7"},
        {"key": "seven", "extra": [1, "x"], "note": "[1]"},
        {"key": "7", "extra": "true", "note": "plain"},  # strings that read as JSON are written as JSON strings
    ):
        text = parser.format_call("lookup", args)
        assert text is not None
        assert parser.parse(text).tool_calls[0].arguments == args, text


def test_a_call_without_its_opening_tool_call_tag_is_read_as_vllm_reads_it() -> None:
    """Qwen3-Coder often drops the opening `<tool_call>` and writes the function block (and
    often the closing tag) alone; vLLM's `qwen3_coder` parser reads the `<function=…>` blocks
    of a reply that has no `<tool_call>`, so the env must too."""
    text = (
        "I'll fetch the page.\n\n<function=run_sql>\n<parameter=query>\nSELECT 1\n</parameter>\n"
        "<parameter=limit>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    action = BOUND.parse(text)
    assert action.errors == []
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("run_sql", {"query": "SELECT 1", "limit": 3}, "call_0")
    ]
    assert action.text == "I'll fetch the page."
    two = BOUND.parse(
        "<function=now>\n</function>\n<function=run_sql>\n<parameter=query>\nx\n</parameter>\n</function>"
    )
    assert [(c.name, c.id) for c in two.tool_calls] == [("now", "call_0"), ("run_sql", "call_1")]
    assert two.text == "" and two.errors == []
    unclosed = BOUND.parse("Let me run it: <function=run_sql>\n<parameter=query>\nx")
    assert unclosed.tool_calls == [] and "is not closed with </function>" in unclosed.errors[0]


def test_null_is_none_for_a_parameter_that_may_be_null() -> None:
    """vLLM reads `null` as None; for an optional string that is the only way to write None
    (the text `null` of a plain string parameter stays text)."""

    class Note(toolenv.Tool):
        """Take a note."""

        name = "note"

        class Args(BaseModel):
            title: str
            body: str | None = "-"

        async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
            return toolenv.ToolResult(text="ok")

    parser = Qwen3XMLParser().bind([Note()])
    (call,) = parser.parse(block("note", title="null", body="null")).tool_calls
    assert call.arguments == {"title": "null", "body": None}
    text = parser.format_call("note", {"title": "t", "body": None})
    assert text is not None and parser.parse(text).tool_calls[0].arguments == {"title": "t", "body": None}


def test_python_literal_arrays_and_objects_are_read_as_vllm_reads_them() -> None:
    """vLLM's `qwen3_coder` parser falls back to `ast.literal_eval` for an array or object
    that is not JSON (Qwen3-Coder's template writes other values with Python's `str`)."""
    (call,) = BOUND.parse(block("run_sql", query="['a']", columns="['a', 'b']", options="{'x': 1}")).tool_calls
    assert call.arguments == {"query": "['a']", "columns": ["a", "b"], "options": {"x": 1}}
    (kept,) = BOUND.parse(block("run_sql", query="q", columns="[open('f')]")).tool_calls
    assert kept.arguments["columns"] == "[open('f')]"


def test_a_last_call_whose_close_was_the_stop_string_is_read() -> None:
    # vLLM's qwen3_coder parser reads `<tool_call>(.*?)</tool_call>|<tool_call>(.*?)$`: a block
    # left open at the end of the reply (the server stopped on `</tool_call>` and dropped it, as
    # the OpenAI API drops stop strings) is read like a closed one.
    text = "Checking.\n<tool_call>\n<function=run_sql>\n<parameter=limit>\n3\n</parameter>\n</function>\n"
    action = BOUND.parse(text)
    assert action.errors == []
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("run_sql", {"limit": 3})]
    assert action.text == "Checking."


def test_a_tool_call_tag_inside_a_parameter_is_text_as_vllm_reads_it() -> None:
    # vLLM's qwen3_coder parser reads a block to its first `</tool_call>`: a file the model writes
    # that holds `<tool_call>` (code or docs about tool calls) is the parameter's text.
    code = 'PROMPT = "Call tools as <tool_call>{...}"'
    text = "Writing." + block("write", path="a.py", content=code) + "\n" + block("run", cmd="python a.py")
    action = get_parser("qwen3_xml").parse(text)
    assert action.errors == [] and action.text == "Writing."
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("write", {"path": "a.py", "content": code}, "call_0"),
        ("run", {"cmd": "python a.py"}, "call_1"),
    ]
    # A block whose `</tool_call>` was forgotten holds the next block's function too, as vLLM reads it.
    forgot = block("write", path="a.py").removesuffix("</tool_call>") + block("run", cmd="ls")
    action = get_parser("qwen3_xml").parse(forgot)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("write", {"path": "a.py"}), ("run", {"cmd": "ls"})]
    assert action.errors == []
    # Without its `</function>` either, the function runs to the next one's, as vLLM reads it.
    unclosed = "<tool_call>\n<function=write>\n<parameter=path>\na.py\n</parameter>\n" + block("run", cmd="ls")
    action = get_parser("qwen3_xml").parse(unclosed)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("write", {"path": "a.py", "cmd": "ls"})]
