"""The GLM-4.5/4.6 parser: values read by type, reasoning, turn ends, every error, round trips,
the real chat template, an env run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _examples import load_example
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import get_parser, template_mismatch
from toolenv.parsers.glm45 import Glm45Parser
from toolenv.types import ParsedAction, ToolResult

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Range(BaseModel):
    start: int
    end: int | None = None


class Search(toolenv.Tool):
    """Search the catalogue."""

    name = "search"

    class Args(BaseModel):
        query: str = Field(description="what to look for")
        limit: int = 10
        score: float = 0.0
        exact: bool = False
        tags: list[str] = Field(default_factory=list)
        window: Range | None = None
        options: dict[str, Any] = Field(default_factory=dict)
        note: str | None = None
        either: int | str = 0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"{args.query} limit={args.limit!r} tags={args.tags!r}")


PARSER = Glm45Parser()
BOUND = PARSER.bind([Search()])


def call(name: str, *pairs: tuple[str, str], sep: str = "\n") -> str:
    """A call as GLM's template lays it out, with the values written as given."""
    args = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in pairs)
    return f"<tool_call>{name}{sep}{args}</tool_call>"


def summary(action: ParsedAction) -> list[tuple[str, dict[str, Any], str]]:
    return [(c.name, c.arguments, c.id) for c in action.tool_calls]


def as_json(value: Any) -> str:
    """JSON that tells 1, 1.0 and True apart (== does not)."""
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------- reading calls
def test_the_template_layout_is_read_by_type_when_bound() -> None:
    text = "<think>Look it up.</think>\nLet me search.\n" + call(
        "search",
        ("query", "SELECT [a] FROM t\nWHERE x < 3 AND y = 'z'"),  # brackets, quotes, <, new lines: stays text
        ("limit", "5"),
        ("score", "2.5"),
        ("exact", "true"),
        ("tags", '["a", "b"]'),
        ("window", '{"start": 1, "end": null}'),
        ("options", '{"deep": {"k": [1, {"x": true}]}}'),
    )
    action = BOUND.parse(text)
    assert action.errors == [] and action.answer is None
    assert action.text == "<think>Look it up.</think>\nLet me search."
    assert summary(action) == [
        (
            "search",
            {
                "query": "SELECT [a] FROM t\nWHERE x < 3 AND y = 'z'",
                "limit": 5,
                "score": 2.5,
                "exact": True,
                "tags": ["a", "b"],
                "window": {"start": 1, "end": None},
                "options": {"deep": {"k": [1, {"x": True}]}},
            },
            "call_0",
        )
    ]


@pytest.mark.parametrize(
    "value",
    ["42", "[1, 2]", '{"a": 1}', "true", "null", '"quoted"', "  padded \n", "", "a </arg_key> b", "<arg_key>x"],
)
def test_a_string_parameter_keeps_exactly_what_was_written(value: str) -> None:
    (only,) = BOUND.parse(call("search", ("query", value), ("note", value))).tool_calls
    # `note: str | None` is a string parameter too, but for `null`: the template writes None so
    assert only.arguments == {"query": value, "note": None if value == "null" else value}


@pytest.mark.parametrize(
    ("key", "written", "read"),
    [
        ("limit", "five", "five"),  # stays text: the tool's validation tells the model
        ("limit", " 7 ", 7),
        ("exact", "True", True),  # Python's spelling, accepted for booleans
        ("exact", "FALSE", False),
        ("exact", "yes", "yes"),
        ("tags", "a, b", "a, b"),
        ("tags", "['a', 'b']", ["a", "b"]),  # Python's list: ast.literal_eval, as vLLM reads it
        ("tags", "[os.sep]", "[os.sep]"),  # not a literal: stays text (never eval'd)
        ("tags", "[" * 10_000, "[" * 10_000),  # too deep for either reader
        ("window", "{start: 1}", "{start: 1}"),
        ("limit", "[" * 10_000, "[" * 10_000),  # too deep for the decoder
        ("limit", "1" * 5000, "1" * 5000),  # past Python's 4300-digit limit
        ("either", "5", 5),  # a union: JSON when it is JSON
        ("either", "five", "five"),
    ],
)
def test_values_that_do_not_decode_stay_text(key: str, written: str, read: Any) -> None:
    (only,) = BOUND.parse(call("search", ("query", "q"), (key, written))).tool_calls
    assert as_json(only.arguments[key]) == as_json(read)


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("paris", "paris"),
        ("42", 42),
        ("2.5", 2.5),
        ("[1, 2]", [1, 2]),
        ('{"a": {"b": null}}', {"a": {"b": None}}),
        ("true", True),
        ("null", None),
        ('"42"', "42"),
        ("not json [", "not json ["),
        ("NaN", "NaN"),
        ("  spaced  ", "  spaced  "),
        ("", ""),
    ],
)
def test_unbound_values_are_json_when_they_decode_and_text_otherwise(written: str, read: Any) -> None:
    for parser in (PARSER, BOUND):  # bound: a tool the env does not have is read the same way
        (only,) = parser.parse(call("other_tool", ("v", written))).tool_calls
        assert as_json(only.arguments["v"]) == as_json(read)
    (only,) = BOUND.parse(call("search", ("query", "q"), ("unknown_key", written))).tool_calls
    assert as_json(only.arguments["unknown_key"]) == as_json(read)


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>now\n</tool_call>",  # what the template writes for a call without arguments
        "<tool_call>now</tool_call>",
        "<tool_call>\n  now  \n</tool_call>",
        "<tool_call>add<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",  # GLM-4.7's layout
        "<tool_call>add\n<arg_key> a </arg_key>\n\n<arg_value>1</arg_value>\n\n</tool_call>",
    ],
)
def test_the_forms_a_call_takes(text: str) -> None:
    action = PARSER.parse(text)
    assert action.errors == [] and action.text == ""
    (only,) = action.tool_calls
    assert only.name in ("now", "add") and only.arguments == ({"a": 1} if only.name == "add" else {})


def test_several_calls_text_and_an_answer() -> None:
    text = "First.\n" + call("a", ("x", "1")) + "\n" + call("b") + "\nthen <answer>42</answer>"
    action = PARSER.parse(text)
    assert summary(action) == [("a", {"x": 1}, "call_0"), ("b", {}, "call_1")]
    assert action.answer == "42" and action.text == "First.\n\n\nthen"
    many = PARSER.parse(call("f") * 20)
    assert [c.id for c in many.tool_calls][-2:] == ["call_18", "call_19"]
    assert Glm45Parser(answer_tag=False).parse("<answer>x</answer>").answer is None
    plain = PARSER.parse("just text")
    assert plain == ParsedAction(text="just text")


def test_an_answer_inside_arguments_is_not_the_answer() -> None:
    action = PARSER.parse(call("echo", ("text", "<answer>no</answer>")))
    assert action.answer is None and action.tool_calls[0].arguments == {"text": "<answer>no</answer>"}


# ---------------------------------------------------------------- reasoning
def test_calls_and_answers_inside_reasoning_are_not_read() -> None:
    text = f"<think>maybe {call('wrong')} or <answer>1</answer></think>\n{call('right')}<answer>2</answer>"
    action = PARSER.parse(text)
    assert summary(action) == [("right", {}, "call_0")] and action.answer == "2"
    assert action.text == f"<think>maybe {call('wrong')} or <answer>1</answer></think>"
    only_thought = PARSER.parse("<think>the answer is <answer>1</answer></think> I am not sure.")
    assert only_thought.answer is None and only_thought.text.endswith("I am not sure.")


def test_an_unclosed_think_is_reasoning_to_the_end() -> None:
    action = PARSER.parse(f"{call('a')}<think>then {call('b')} <answer>x</answer>")
    assert summary(action) == [("a", {}, "call_0")] and action.answer is None and action.errors == []
    assert action.text == f"<think>then {call('b')} <answer>x</answer>"


def test_a_reply_that_starts_inside_reasoning() -> None:
    # a generation prompt that ends with `<think>`: the reply's reasoning has no opening tag
    action = PARSER.parse(f"drafting {call('wrong')}</think>\n{call('right')}")
    assert summary(action) == [("right", {}, "call_0")]
    assert action.text == f"drafting {call('wrong')}</think>"


def test_think_tags_inside_a_call_are_text() -> None:
    (only,) = PARSER.parse(call("write", ("s", "<think>x</think> y"))).tool_calls
    assert only.arguments == {"s": "<think>x</think> y"}


def test_a_tool_call_tag_inside_a_value_is_text_as_vllm_reads_it() -> None:
    # vLLM's glm45 parser reads a call to its first `</tool_call>`: a value that holds the tag
    # itself (a file about tool calls) is text, and the call runs.
    code = 'PROMPT = "Call tools as <tool_call>NAME ..."'
    action = PARSER.parse("Writing." + call("write", ("path", "a.py"), ("content", code)) + call("run"))
    assert action.errors == [] and action.text == "Writing."
    assert summary(action) == [("write", {"path": "a.py", "content": code}, "call_0"), ("run", {}, "call_1")]


# ---------------------------------------------------------------- where the turn ends
@pytest.mark.parametrize("end", ["<|observation|>", "<|user|>", "<|endoftext|>"])
def test_nothing_after_an_end_of_turn_token_is_read(end: str) -> None:
    text = call("a", ("q", "x")) + end + "\n<tool_response>\nmade up\n</tool_response>" + call("b") + "<answer>z"
    action = PARSER.parse(text + "</answer>")
    assert summary(action) == [("a", {"q": "x"}, "call_0")] and action.answer is None and action.text == ""
    assert PARSER.parse("It is <answer>4</answer>" + end).answer == "4"


# ---------------------------------------------------------------- errors
HOW = "Write <tool_call>NAME on its own line, then each argument as <arg_key>KEY</arg_key> and <arg_value>VALUE"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call></tool_call>", "Tool call 1 has no function name: write it right after <tool_call>."),
        ("<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "has no function name"),
        ("<tool_call><arg_value>1</arg_value></tool_call>", "has an <arg_value> but no function name"),
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', 'Tool call 1 holds JSON (\'{"name"'),
        ("<tool_call>f\nplease\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "Tool call 1 (f): the"),
        ("<tool_call>f<arg_value>1</arg_value></tool_call>", "the function name must stand alone"),
        ("<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>", "<arg_key>a</arg_key> is not followed by <arg_value>"),
        ("<tool_call>f\n<arg_key>a\n<arg_value>1</arg_value></tool_call>", "an <arg_key> is not closed"),
        ("<tool_call>f\n<arg_key>a</tool_call>", "an <arg_key> is not closed with </arg_key>"),
        ("<tool_call>f\n<arg_key>a</arg_key><arg_value>1</tool_call>", "the <arg_value> of 'a' is not closed"),
        ("<tool_call>f\n<arg_key> </arg_key><arg_value>1</arg_value></tool_call>", "an <arg_key></arg_key> is empty"),
        (call("f", ("a", "1"), ("a", "2")), "Tool call 1 (f): argument 'a' is given twice."),
        (call("f", ("a", "1")).replace("</tool_call>", "<arg_value>2</arg_value></tool_call>"), "has no <arg_key>"),
        (call("f", ("a", "1")).replace("</tool_call>", "b=2\n</tool_call>"), "unexpected text 'b=2'"),
        (
            "<tool_call>f\n<arg_key>a</arg_key><arg_value>1</arg_value>",
            "Tool call 1 (f) is not closed with </tool_call>",
        ),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = BOUND.parse(text)
    assert action.tool_calls == [] and len(action.errors) == 1, action
    assert error in action.errors[0], action.errors
    assert HOW in action.errors[0] or "given twice" in error


def test_an_unclosed_call_names_what_it_can() -> None:
    errors = PARSER.parse("<tool_call>" * 2 + "<tool_call>get_weather\n<arg_key>city").errors
    assert [e.split(" is not closed")[0] for e in errors] == ["Tool call 1", "Tool call 2", "Tool call 3 (get_weather)"]


def test_a_good_call_beside_bad_ones_still_runs() -> None:
    text = "<tool_call>broken\n<arg_key>a" + call("ok", ("a", "1")) + call("") + call("ok", ("b", "2"))
    action = PARSER.parse(text)
    assert summary(action) == [("ok", {"a": 1}, "call_1"), ("ok", {"b": 2}, "call_3")]
    assert [e.split(" ", 3)[2] for e in action.errors] == ["1", "3"]  # numbered by position in the turn
    assert "not closed with </tool_call>" in action.errors[0]


@pytest.mark.parametrize(
    "text",
    [
        "<think>" * 100_000 + "<tool_call>" * 10,
        "<think>" * 100_000 + "</think>" * 100_000,
        "</think>" * 100_000 + "<think>" + "<tool_call>" * 10,
        "<|observation|>" + "<tool_call>" * 100_000,
        "<answer>" * 100_000,
        "<" * 1_000_000,
    ],
)
def test_huge_inputs_without_calls_parse(text: str) -> None:
    action = BOUND.parse(text)
    assert action.tool_calls == [] and action.errors == [] and action.answer is None


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" * 100_000,
        "<tool_call>f\n<arg_key>" * 50_000,
        "<tool_call>f\n<arg_key>a</arg_key><arg_value>" * 30_000 + "</tool_call>",
        "<tool_call>f\n" + "<arg_key>a</arg_key><arg_value>1</arg_value>" * 30_000 + "</tool_call>",
        "<tool_call>f\n" + "<arg_key>" * 100_000 + "</tool_call>",
        "<tool_call>f\n" + "<arg_value>" * 100_000 + "</tool_call>",
        "</think>" * 100_000 + "<tool_call>",
        "<answer>" * 100_000 + "<tool_call>",
        "<tool_call>f\n" + "x" * 1_000_000,
        "<tool_call>" + "{" * 1_000_000 + "</tool_call>",
    ],
)
def test_huge_inputs_return_errors(text: str) -> None:
    action = BOUND.parse(text)
    assert action.tool_calls == [] and action.errors and all(isinstance(e, str) and e for e in action.errors)
    assert all(len(e) < 1000 for e in action.errors[:10])  # errors quote the input briefly, never whole


def test_a_call_with_many_arguments_parses() -> None:
    pairs = "".join(f"<arg_key>k{i}</arg_key><arg_value>{i}</arg_value>" for i in range(30_000))
    (only,) = PARSER.parse(f"<tool_call>f\n{pairs}</tool_call>").tool_calls
    assert len(only.arguments) == 30_000 and only.arguments["k29999"] == 29_999


markers = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "<|observation|>",
        "<|user|>",
        "<|endoftext|>",
        "f",
        "\n",
        " ",
        "{",
        "[",
        '"',
        "1",
        "true",
        "\x00",
        "😀",
        "\ud800",
    ]
)
near_valid = st.lists(markers | st.text(max_size=5), max_size=40).map("".join)


@SETTINGS
@given(near_valid | st.text())
def test_no_input_makes_it_raise(text: str) -> None:
    for parser in (PARSER, BOUND, Glm45Parser(answer_tag=False)):
        action = parser.parse(text)
        assert action == parser.parse(text)
        assert all(isinstance(e, str) and e for e in action.errors)
        assert all(isinstance(c.name, str) and c.name and isinstance(c.arguments, dict) for c in action.tool_calls)


@SETTINGS
@given(near_valid.filter(lambda s: not any(m in s for m in ("think>", "<|observation|>", "<|user|>", "<|endoft"))))
def test_every_opened_call_is_a_call_or_an_error(text: str) -> None:
    action = BOUND.parse(text)
    got, opens = len(action.tool_calls) + len(action.errors), text.count("<tool_call>")
    # But a `<tool_call>` inside an `<arg_value>` of a block that reads whole is text, as vLLM reads it.
    assert got == opens or (0 < got < opens and "<arg_value>" in text)


# ---------------------------------------------------------------- writing calls
def test_format_call_writes_the_template_layout() -> None:
    assert PARSER.format_call("lookup", {"query": "paris"}) == (
        "<tool_call>lookup\n<arg_key>query</arg_key>\n<arg_value>paris</arg_value>\n</tool_call>"
    )
    assert PARSER.format_call("now", {}) == "<tool_call>now\n</tool_call>"
    args = {"query": "42", "limit": 3, "tags": ["x"], "window": {"start": 1}, "exact": False, "note": None}
    assert BOUND.format_call("search", args) == (
        "<tool_call>search\n"
        "<arg_key>query</arg_key>\n<arg_value>42</arg_value>\n"  # a string parameter: raw, as the template
        "<arg_key>limit</arg_key>\n<arg_value>3</arg_value>\n"
        '<arg_key>tags</arg_key>\n<arg_value>["x"]</arg_value>\n'
        '<arg_key>window</arg_key>\n<arg_value>{"start": 1}</arg_value>\n'
        "<arg_key>exact</arg_key>\n<arg_value>false</arg_value>\n"
        "<arg_key>note</arg_key>\n<arg_value>null</arg_value>\n"
        "</tool_call>"
    )


def test_format_call_writes_json_where_raw_text_would_read_back_differently() -> None:
    # unbound, "42" written raw would read back as 42: it is written as a JSON string
    assert (
        PARSER.format_call("f", {"a": "42"})
        == '<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>"42"</arg_value>\n</tool_call>'
    )
    args = {"a": "x </arg_value> <tool_call> </think> <|observation|>", "b": ["</tool_call>"], "limit": "7"}
    text = PARSER.format_call("f", args)
    assert text is not None and text.count("</arg_value>") == 3 and "<|observation|>" not in text
    assert "\\u003c/tool_call>" in text and "\\u003c|observation|>" in text
    assert PARSER.parse(text).tool_calls[0].arguments == args
    (only,) = BOUND.parse(BOUND.format_call("search", {"query": "q", "limit": "7"}) or "").tool_calls
    assert only.arguments == {"query": "q", "limit": "7"}  # a string for an int parameter stays a string


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("", {}),
        (" f", {}),
        ("two\nlines", {}),
        ('{"name"', {}),
        ("[f]", {}),
        ("f</tool_call>", {}),
        ("f<arg_key>", {}),
        ("f", {"": 1}),
        ("f", {" a": 1}),
        ("f", {"a</arg_key>": 1}),
        ("f", {"a<|user|>": 1}),
        ("f", {"a": float("nan")}),
        ("f", {"a": 10**5000}),
        ("f", {"a": {1, 2}}),
        ("search", {"query": 5}),  # a number for a string parameter would read back as text
        ("search", {"query": "a</arg_value>"}),  # a string parameter cannot carry its closing tag
        ("search", {"query": "q", "note": "null"}),  # `str | None`: written null, it would read back as None
    ],
)
def test_format_call_declines_what_cannot_be_read_back(name: str, args: dict[str, Any]) -> None:
    assert BOUND.format_call(name, args) is None


names = st.text(st.characters(categories=("L", "N"), include_characters="_-.:"), min_size=1, max_size=20)
keys = names | st.text(min_size=1, max_size=8).filter(lambda s: s == s.strip() and s)
strings = st.lists(st.text(max_size=6) | markers, max_size=4).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(strings, kids, max_size=3),
    max_leaves=8,
)
BREAKS = ("</tool_call>", "<tool_call>", "</think>", "<|observation|>", "<|user|>", "<|endoftext|>")


@SETTINGS
@given(st.lists(st.tuples(names, st.dictionaries(keys, json_values, max_size=4)), min_size=1, max_size=3))
def test_format_call_round_trips(calls: list[tuple[str, dict[str, Any]]]) -> None:
    """What format_call writes (an agent rendering a server's native calls) reads back as exactly
    those calls, 1, 1.0 and True told apart; it declines only keys the format cannot carry."""
    written = [(n, a, PARSER.format_call(n, a)) for n, a in calls]
    for _, a, text in written:
        if text is None:
            assert any(t in k for k in a for t in (*BREAKS, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"))
    kept = [(n, a) for n, a, text in written if text is not None]
    action = PARSER.parse("\n".join(text for _, _, text in written if text is not None))
    assert action.errors == []
    assert [(c.name, as_json(c.arguments)) for c in action.tool_calls] == [(n, as_json(a)) for n, a in kept]


typed_args = st.fixed_dictionaries(
    {"query": strings},
    optional={
        "limit": st.integers(),
        "score": st.floats(allow_nan=False, allow_infinity=False),
        "exact": st.booleans(),
        "tags": st.lists(strings, max_size=3),
        "window": st.fixed_dictionaries({"start": st.integers()}, optional={"end": st.none() | st.integers()}),
        "options": st.dictionaries(strings, json_values, max_size=3),
        "note": st.none() | strings,
        "either": st.integers() | strings,
    },
)


@SETTINGS
@given(typed_args)
def test_typed_arguments_round_trip_when_bound(args: dict[str, Any]) -> None:
    text = BOUND.format_call("search", args)
    if text is None:  # only a string parameter's value holding a tag the format cannot carry, or "null"
        strs = [args[k] for k in ("query", "note") if isinstance(args.get(k), str)]
        assert args.get("note") == "null" or any(t in v for v in strs for t in (*BREAKS, "</arg_value>"))
        return
    (only,) = BOUND.parse(text).tool_calls
    assert as_json(only.arguments) == as_json(args)


# ---------------------------------------------------------------- prompt, results, registration
def test_results_come_back_in_tool_response_blocks() -> None:
    obs = PARSER.format_results(
        [
            ToolResult(text="20 degrees", name="get_weather", call_id="call_0"),
            ToolResult(text="bad", name="parser", is_error=True),
        ]
    )
    assert obs == "<tool_response>\n20 degrees\n</tool_response>\n<tool_response>\nbad\n</tool_response>"
    assert PARSER.format_errors(["x"]) == "<tool_response>\nx\n</tool_response>"


def test_instructions_list_the_tools_as_the_template_does() -> None:
    text = PARSER.instructions([Search()])
    assert text.startswith("# Tools\n\nYou may call one or more functions to assist with the user query.")
    assert f"<tools>\n{json.dumps(Search().schema(), ensure_ascii=False)}\n</tools>" in text
    assert "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>" in text
    assert text.endswith("When you know the final answer, write it as <answer>...</answer>.")
    assert "<answer>" not in Glm45Parser(answer_tag=False).instructions([Search()])
    assert Glm45Parser(answer_tag=False).instructions([]) == ""


def test_the_parser_is_registered_with_its_traits() -> None:
    parser = get_parser("glm45")
    assert isinstance(parser, Glm45Parser) and parser.name == "glm45"
    assert parser.special_tokens and parser.tool_messages and parser.stop == ("<|observation|>",)
    quiet = get_parser("glm45", answer_tag=False)
    assert isinstance(quiet, Glm45Parser) and quiet.answer_tag is False
    assert parser.bind([]) is not parser and BOUND is not PARSER  # bound copies, never shared state


def test_an_env_with_the_glm45_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Search()], tasks=[{"question": "Find cats", "answer": "3"}], parser="glm45", max_turns=6
    )
    obs, _ = env.reset(seed=0)
    assert '"name": "search"' in obs and "<arg_key>{arg-key-1}</arg_key>" in obs
    reply = "<think>search</think>\n" + call("search", ("query", "cats"), ("limit", "2"), ("tags", '["pets"]'))
    obs, reward, term, trunc, info = env.step(reply + "<|observation|>")
    assert obs == "<tool_response>\ncats limit=2 tags=['pets']\n</tool_response>"
    assert not term and info["messages"][1].role == "tool" and info["messages"][1].tool_call_id == "call_0"
    obs, *_ = env.step(call("search", ("query", "cats"), ("limit", "two")))
    assert obs.startswith("<tool_response>\nInvalid arguments for tool 'search'") and "limit" in obs
    obs, *_ = env.step(call("search", ("query", "a"), ("query", "b")))
    assert "given twice" in obs
    obs, reward, term, trunc, info = env.step("<think>done</think>\nThree. <answer>3</answer><|user|>")
    assert term and reward == 1.0 and info["answer"] == "3"


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    load_example("glm45_example").main()
    out = capsys.readouterr().out
    assert out.startswith("# Tools\n") and '"name": "run_sql"' in out
    assert (
        "--- call_0 run_sql({'query': \"SELECT name FROM singer\\nWHERE age > 30 AND name <> 'Bo'\\nORDER BY name\""
        in out
    )
    assert "'limit': 5})" in out
    assert "--- observation: '<tool_response>\\nAnn\\nCy\\n</tool_response>'" in out
    assert "reward=1.0 terminated=True answer='2'" in out


# ---------------------------------------------------------------- the real chat template
@pytest.fixture(scope="module")
def glm_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    trl = pytest.importorskip("trl", reason="GLM's chat template comes with trl (pip install toolenv[trl])")
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("tok"), with_model=False))
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "glm4moe.jinja").read_text(encoding="utf-8")
    return tok


def test_the_real_template_is_read_by_glm45_and_not_by_hermes(glm_tok: Any) -> None:
    assert template_mismatch(get_parser("glm45"), glm_tok) is None
    problem = template_mismatch(get_parser("hermes"), glm_tok)
    assert problem is not None and "<arg_key>query</arg_key>" in problem


REAL_ARGS: dict[str, Any] = {
    "query": "cats & dogs <3\nsecond line",
    "limit": 7,
    "tags": ["pets", "a b"],
    "window": {"start": 1, "end": None},
    "options": {"deep": {"k": [1, 2.5, {"x": True}]}, "s": "é"},
}


def test_a_call_rendered_by_the_real_template_reads_back_exactly(glm_tok: Any) -> None:
    tools = [Search().schema()]
    user = [{"role": "user", "content": "Find cats"}]
    calls: list[dict[str, Any]] = [
        {"id": "a", "type": "function", "function": {"name": "search", "arguments": REAL_ARGS}},
        {"id": "b", "type": "function", "function": {"name": "search", "arguments": {"query": "42"}}},
    ]
    head = glm_tok.apply_chat_template(user, tools=tools, tokenize=False, add_generation_prompt=True)
    turn = [*user, {"role": "assistant", "content": "", "tool_calls": calls}]
    whole = glm_tok.apply_chat_template(turn, tools=tools, tokenize=False)
    assert whole.startswith(head)
    reply = whole[len(head) :]
    action = BOUND.parse(reply)
    assert action.errors == [] and action.text == "<think></think>"
    assert [(c.name, as_json(c.arguments)) for c in action.tool_calls] == [
        ("search", as_json(REAL_ARGS)),
        ("search", as_json({"query": "42"})),  # a string parameter: "42" stays a string
    ]
    # ... and format_call writes what the template writes, call for call
    written = "\n".join(BOUND.format_call(c["function"]["name"], c["function"]["arguments"]) or "" for c in calls)
    assert reply == "\n<think></think>\n" + written


def test_results_are_what_the_real_template_writes_after_observation(glm_tok: Any) -> None:
    calls = [{"id": "a", "type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}] * 2
    turn = [
        {"role": "user", "content": "Find cats"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two\nlines"},
    ]
    whole = glm_tok.apply_chat_template(turn, tools=[Search().schema()], tokenize=False)
    results = [ToolResult(text="one", name="search", call_id="a"), ToolResult(text="two\nlines", name="search")]
    assert whole.endswith("</tool_call><|observation|>\n" + PARSER.format_results(results))


def test_instructions_are_the_real_templates_system_prompt(glm_tok: Any) -> None:
    class Now(toolenv.Tool):
        """What time it is."""

        name = "now"

        class Args(BaseModel):
            pass

    tools = [Search(), Now()]
    rendered = glm_tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[t.schema() for t in tools], tokenize=False
    )
    system = rendered.split("<|system|>\n", 1)[1].split("<|user|>", 1)[0]
    assert Glm45Parser(answer_tag=False).instructions(tools) == system + (
        "\nWrite a string value as it is, without quotes; numbers, booleans, arrays and objects as JSON."
    )


def test_python_literal_arrays_and_objects_are_read_as_vllm_reads_them() -> None:
    """vLLM's glm45 parser reads a value that is not JSON with `ast.literal_eval`: a model that
    writes `['a', 'b']` for a list gets a list there, so it must here too (never `eval`)."""
    text = call("search", ("query", "x"), ("tags", "['a', \"b\"]"), ("options", "{'k': [1, 2.5, None, True]}"))
    (got,) = summary(BOUND.parse(text))
    assert got[1] == {"query": "x", "tags": ["a", "b"], "options": {"k": [1, 2.5, None, True]}}
    for not_literal in ("[__import__('os')]", "{'a': {1, 2}}", "[b'x']", "(1, 2"):
        (kept,) = summary(BOUND.parse(call("search", ("query", "x"), ("tags", not_literal))))
        assert kept[1]["tags"] == not_literal
