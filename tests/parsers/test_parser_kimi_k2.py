"""The Kimi K2 parser: the call forms, ids, reasoning, turn ends, errors, round trips, a chat
template written like Kimi's, adversarial input, an env run and the example."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from _examples import load_example
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import detect_parser, get_parser, template_mismatch
from toolenv.parsers.kimi_k2 import KimiK2Parser
from toolenv.types import ParsedAction, ToolResult

PARSER = KimiK2Parser()
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARG, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
IM_END = "<|im_end|>"


def kimi(call_id: str, args: Any) -> str:
    """One call as Kimi's template writes it (without the section markers)."""
    return f"{CALL}{call_id}{ARG}{json.dumps(args, ensure_ascii=False)}{CALL_END}"


def section(*calls: str) -> str:
    return SECTION + "".join(calls) + SECTION_END


def summary(action: ParsedAction) -> list[tuple[str, dict[str, Any], str]]:
    return [(c.name, c.arguments, c.id) for c in action.tool_calls]


# ---------------------------------------------------------------- what the model writes
def test_a_call_after_text_as_the_template_writes_it() -> None:
    action = PARSER.parse(f"Let me look.{section(kimi('functions.get_weather:0', {'city': 'Paris'}))}{IM_END}")
    assert action.errors == [] and action.answer is None and action.text == "Let me look."
    assert summary(action) == [("get_weather", {"city": "Paris"}, "functions.get_weather:0")]


def test_several_calls_keep_their_ids() -> None:
    text = section(
        kimi("functions.get_weather:0", {"city": "Beijing"}),
        kimi("functions.get_weather:1", {"city": "Shanghai"}),
        kimi("functions.add:2", {"a": [1, {"b": None}], "c": {"d": {"e": [True, 1.5]}}}),
    )
    assert summary(PARSER.parse(text)) == [
        ("get_weather", {"city": "Beijing"}, "functions.get_weather:0"),
        ("get_weather", {"city": "Shanghai"}, "functions.get_weather:1"),
        ("add", {"a": [1, {"b": None}], "c": {"d": {"e": [True, 1.5]}}}, "functions.add:2"),
    ]


@pytest.mark.parametrize(
    ("call_id", "name"),
    [
        ("functions.get_weather:0", "get_weather"),
        ("get_weather:0", "get_weather"),  # vLLM's other form
        ("functions.get_weather", "get_weather"),  # no index
        ("get_weather", "get_weather"),
        ("functions.get_weather:12", "get_weather"),
        ("functions.web.search:0", "web.search"),  # only the `functions.` prefix goes (vLLM keeps `search`)
        ("functions.functions.x:0", "functions.x"),
        ("functions.a:b:3", "a:b"),
        ("functions.f:x", "f:x"),  # not an index: part of the name
        ("functions.f:٣", "f:٣"),  # an index is ASCII digits
        ("  functions.get_weather : 0 \n", "get_weather"),  # white space around the parts
    ],
)
def test_names_come_from_the_call_id(call_id: str, name: str) -> None:
    action = PARSER.parse(section(kimi(call_id, {})))
    assert action.errors == [] and summary(action) == [(name, {}, call_id.strip())]


@pytest.mark.parametrize(
    "text",
    [
        kimi("functions.add:0", {"a": 1, "b": 2}),  # no section markers
        SECTION + kimi("functions.add:0", {"a": 1, "b": 2}),  # stopped on the section end (not in the output)
        f'{SECTION}{CALL}functions.add:0{ARG}{{"a": 1, "b": 2}}{SECTION_END}',  # no call end
        f'{SECTION}{CALL}functions.add:0{ARG}{{"a": 1, "b": 2}}',  # stopped before the call end
        f'{SECTION} {CALL} functions.add:0 {ARG} {{"a": 1, "b": 2}} {CALL_END} {SECTION_END}',  # spaces
        f'{SECTION}\n{CALL}functions.add:0{ARG}\n{{\n  "a": 1,\n  "b": 2\n}}\n{CALL_END}\n{SECTION_END}\n',
        f'{CALL}functions.add:0{ARG}"{{\\"a\\": 1, \\"b\\": 2}}"{CALL_END}',  # double-encoded arguments
        f"<|tool_call_section_begin|>{kimi('functions.add:0', {'a': 1, 'b': 2})}<|tool_call_section_end|>",
        section(kimi("functions.add:0", {"a": 1, "b": 2})) + IM_END,
    ],
)
def test_the_forms_a_call_takes(text: str) -> None:
    action = PARSER.parse(text)
    assert action.errors == [] and action.text == ""
    assert summary(action) == [("add", {"a": 1, "b": 2}, "functions.add:0")]


def test_text_around_and_between_calls_is_kept() -> None:
    action = PARSER.parse(f"one {SECTION}{kimi('a:0', {})} two {kimi('b:1', {})}{SECTION_END} three")
    assert [c.name for c in action.tool_calls] == ["a", "b"] and action.text == "one  two  three"


def test_text_after_an_unclosed_last_call_is_text() -> None:
    action = PARSER.parse(f'{SECTION}{CALL}functions.add:0{ARG}{{"a": 1}} and then I wait.')
    assert summary(action) == [("add", {"a": 1}, "functions.add:0")] and action.text == "and then I wait."


def test_nothing_after_the_turn_end_is_read() -> None:
    # A reply that runs past its end: the hallucinated tool result and next turn are not the model's.
    text = (
        section(kimi("functions.a:0", {}))
        + f"{IM_END}<|im_system|>a<|im_middle|>## Return of functions.a:0\n42{IM_END}"
        + f"<|im_assistant|>assistant<|im_middle|>{section(kimi('functions.b:0', {}))} <answer>42</answer>"
    )
    action = PARSER.parse(text)
    assert summary(action) == [("a", {}, "functions.a:0")] and action.answer is None and action.text == ""
    for marker in ("<|im_user|>", "<|im_system|>", "<|im_assistant|>"):
        assert PARSER.parse(f"ok{marker}{kimi('b:0', {})}") == ParsedAction(text="ok")


def test_the_same_text_parses_the_same() -> None:
    text = section(*(kimi(f"functions.f:{i}", {"i": i}) for i in range(20)))
    first, second = PARSER.parse(text), PARSER.parse(text)
    assert first == second and [c.id for c in first.tool_calls] == [f"functions.f:{i}" for i in range(20)]


def test_a_repeated_id_is_kept_as_written() -> None:
    action = PARSER.parse(section(kimi("functions.f:0", {"a": 1}), kimi("functions.f:0", {"a": 2})))
    assert summary(action) == [("f", {"a": 1}, "functions.f:0"), ("f", {"a": 2}, "functions.f:0")]


def test_markers_inside_json_strings_are_read_as_text_when_escaped() -> None:
    args = {"q": f"{CALL_END}{SECTION_END}{CALL}x{ARG}{{}} </think> <think> {IM_END}", "n": "日本語 ✓ \u00e9"}
    text = PARSER.format_call("search", args, "functions.search:0")
    assert text is not None and text.count("<|") == 5
    assert summary(PARSER.parse(text)) == [("search", args, "functions.search:0")]


# ---------------------------------------------------------------- reasoning
def test_think_blocks_are_not_read_and_stay_text() -> None:
    text = f"<think>try {kimi('a:0', {})}</think>{section(kimi('b:0', {}))}<think>and {CALL}c:0{ARG}</think>"
    action = PARSER.parse(text)
    assert action.errors == [] and [c.name for c in action.tool_calls] == ["b"]
    assert action.text == f"<think>try {kimi('a:0', {})}</think><think>and {CALL}c:0{ARG}</think>"


def test_a_section_ends_reasoning_as_vllms_kimi_reasoning_parser_does() -> None:
    # K2-Thinking may go from reasoning straight to its calls without `</think>`.
    action = PARSER.parse(f"<think>I need the weather{section(kimi('functions.get_weather:0', {'city': 'Rome'}))}")
    assert summary(action) == [("get_weather", {"city": "Rome"}, "functions.get_weather:0")]
    assert action.text == "<think>I need the weather" and action.errors == []


def test_reasoning_the_prompt_opened_is_not_read() -> None:
    # A generation prompt that ends with `<think>` (K2.5's): the reply starts inside the reasoning.
    text = f"I could {kimi('wrong:0', {})} but no.</think>Sure.{section(kimi('right:0', {'q': 1}))}"
    action = PARSER.parse(text)
    assert action.errors == [] and summary(action) == [("right", {"q": 1}, "right:0")]
    assert action.text == f"I could {kimi('wrong:0', {})} but no.</think>Sure."
    # ... and a section in it ends it: a raw `</think>` in the arguments does not hide the call.
    action = PARSER.parse(f"thinking {section(kimi('w:0', {'s': '</think>'}))}")
    assert summary(action) == [("w", {"s": "</think>"}, "w:0")] and action.text == "thinking"


def test_an_unclosed_think_is_reasoning_to_the_end() -> None:
    action = PARSER.parse(f"{kimi('a:0', {})}<think>then {kimi('b:0', {})} <answer>no</answer>")
    assert [c.name for c in action.tool_calls] == ["a"] and action.errors == [] and action.answer is None


def test_an_answer_counts_only_outside_reasoning() -> None:
    assert PARSER.parse("<think>maybe <answer>3</answer></think>It is <answer>4</answer>").answer == "4"
    assert PARSER.parse("draft <answer>3</answer></think>no answer yet").answer is None


def test_a_think_tag_inside_a_calls_arguments_is_not_reasoning() -> None:
    text = section(kimi("write:0", {"s": "<think>x</think>"}), kimi("b:1", {}))
    assert summary(PARSER.parse(text)) == [("write", {"s": "<think>x</think>"}, "write:0"), ("b", {}, "b:1")]


# ---------------------------------------------------------------- answers
def test_the_answer_tag() -> None:
    assert PARSER.parse(f"It is <answer>Paris</answer>{IM_END}").answer == "Paris"
    action = PARSER.parse(section(kimi("now:0", {})) + " <answer>noon</answer>")
    assert action.answer == "noon" and len(action.tool_calls) == 1
    assert KimiK2Parser(answer_tag=False).parse("<answer>x</answer>").answer is None
    assert PARSER.parse("just thinking") == ParsedAction(text="just thinking")


def test_an_answer_inside_arguments_is_not_the_answer() -> None:
    action = PARSER.parse(section(kimi("echo:0", {"text": "<answer>no</answer>"})))
    assert action.answer is None and action.tool_calls[0].arguments == {"text": "<answer>no</answer>"}


def test_an_answer_silences_markers_without_a_call() -> None:
    action = PARSER.parse(f"{SECTION}<answer>4</answer>")
    assert action.answer == "4" and action.errors == [] and action.text == ""


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("text", "error"),
    [
        (CALL, f"Tool call 1: nothing follows {CALL}"),
        (f"{CALL}  {CALL_END}", f"Tool call 1: nothing follows {CALL}"),
        (f"{CALL}functions.get_weather:0{CALL_END}", f"Tool call 1 (functions.get_weather:0) has no {ARG}"),
        (f'{CALL}{ARG}{{"a": 1}}{CALL_END}', "Tool call 1 has no call id: write functions.NAME:INDEX"),
        (f"{CALL} functions.:0 {ARG}{{}}{CALL_END}", "Tool call 1 (functions.:0) has no function name in its id"),
        (f"{CALL}:3{ARG}{{}}{CALL_END}", "Tool call 1 (:3) has no function name"),
        (f"{CALL}f:0{ARG}{CALL_END}", f"Tool call 1 (f): no JSON arguments follow {ARG} (write {{}} for none)"),
        (f'{CALL}f:0{ARG}{{"a": {CALL_END}', "Tool call 1 (f): the arguments are not valid JSON (Expecting value)"),
        (f'{CALL}f:0{ARG}{{"a": 1}} extra{CALL_END}', "the arguments are not valid JSON (Extra data)"),
        (f"{CALL}f:0{ARG}[1, 2]{CALL_END}", "Tool call 1 (f): the arguments must be a JSON object"),
        (f"{CALL}f:0{ARG}null{CALL_END}", "the arguments must be a JSON object"),
        (f'{CALL}f:0{ARG}"[1]"{CALL_END}', "the arguments must be a JSON object"),
        (f'{CALL}f:0{ARG}"{{bad"{CALL_END}', "the arguments are a string that is not JSON"),
        (f"{CALL}f:0{ARG}" + "[" * 100_000 + CALL_END, "too deeply nested"),
        (f'{CALL}f:0{ARG}{{"n": 1' + "0" * 5000 + f"}}{CALL_END}", "Exceeds the limit"),
        (f'{CALL}f:0{ARG}{{"a": ', f"not valid JSON (Expecting value), and the call is not closed with {CALL_END}"),
        (f'{CALL}f:0{ARG}{{"a": "cut', "the arguments are not valid JSON (Unterminated string"),
        (f"{CALL}f:0{ARG}" + "[" * 100_000, "too deeply nested"),
        (f'{CALL}functions.f:0{ARG}{{"a": 1}}{CALL}', f"Tool call 1 (functions.f:0) is not closed with {CALL_END}"),
        (SECTION, f"{SECTION} is not followed by a tool call"),
        (f"{SECTION}{SECTION_END}{IM_END}", f"{SECTION} is not followed by a tool call"),
        (f'functions.get_weather:0{ARG}{{"a": 1}}{CALL_END}', f"{ARG} appears outside a tool call"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = PARSER.parse(text)
    assert action.tool_calls == [] and action.errors and error in action.errors[0], action.errors
    assert all(len(e.splitlines()) == 1 for e in action.errors)  # one line each


def test_a_good_call_beside_bad_ones_still_runs() -> None:
    text = section(
        f"{CALL}broken{CALL_END}", kimi("functions.add:1", {"a": 1}), f"{CALL}x:2{ARG}3{CALL_END}", kimi("y:3", {})
    )
    action = PARSER.parse(text)
    assert summary(action) == [("add", {"a": 1}, "functions.add:1"), ("y", {}, "y:3")]
    assert [e.split(" ", 3)[2] for e in action.errors] == ["1", "3"]  # numbered by position in the turn


def test_an_unclosed_call_does_not_swallow_the_next() -> None:
    action = PARSER.parse(section(f'{CALL}functions.a:0{ARG}{{"x": 1}}', kimi("functions.b:1", {"y": 2})))
    assert summary(action) == [("b", {"y": 2}, "functions.b:1")]
    assert len(action.errors) == 1 and action.errors[0].startswith(
        f"Tool call 1 (functions.a:0) is not closed with {CALL_END}. Write {CALL}functions.NAME:INDEX{ARG}"
    )


def test_a_call_missing_its_begin_marker_is_reported_beside_a_good_one() -> None:
    action = PARSER.parse(f"{SECTION}{kimi('a:0', {})}functions.b:1{ARG}{{}}{CALL_END}{SECTION_END}")
    assert [c.name for c in action.tool_calls] == ["a"]
    assert len(action.errors) == 1 and f"{ARG} appears outside a tool call" in action.errors[0]


def test_plain_text_and_other_formats_are_not_calls() -> None:
    for text in ['<tool_call>{"name": "f", "arguments": {}}</tool_call>', '[TOOL_CALLS]f[ARGS]{"a": 1}', "a <| b |>"]:
        assert PARSER.parse(text) == ParsedAction(text=text)


# ---------------------------------------------------------------- adversarial input
MB = 1_000_000


@pytest.mark.parametrize(
    "text",
    [
        CALL * (MB // len(CALL)),
        SECTION * (MB // len(SECTION)),
        ARG * (MB // len(ARG)),
        (CALL + "f:0" + ARG + "{") * (MB // 40),
        (CALL + "functions.f:0" + ARG + '{"a": "') * (MB // 50),
        (CALL + "x" + CALL_END) * (MB // 40),
        CALL + "f:0" + ARG + "[" * MB,
        CALL + "f:0" + ARG + "{" * MB + CALL_END,
        "</think>" * (MB // 8) + CALL,
        "<think>" * (MB // 7) + SECTION + CALL,
        ("<think>" + SECTION) * (MB // 35) + CALL,
        "<answer>" * (MB // 8) + CALL,
        CALL + ":" * MB + ARG,
    ],
)
def test_a_megabyte_of_repeated_fragments_parses(text: str) -> None:
    action = PARSER.parse(text)
    assert action.tool_calls == [] and action.errors
    assert len(action.errors) <= text.count(CALL) + 1


def test_a_megabyte_of_reasoning_is_text() -> None:
    text = "<think>" * (MB // 14) + CALL + "</think" * (MB // 14)
    assert PARSER.parse(text) == ParsedAction(text=text)


def test_a_hundred_thousand_calls_parse() -> None:
    action = PARSER.parse(SECTION + kimi("functions.f:0", {}) * 100_000 + SECTION_END)
    assert action.errors == [] and len(action.tool_calls) == 100_000


markers = st.sampled_from(
    [
        *(SECTION, SECTION_END, CALL, ARG, CALL_END, IM_END, "<|im_system|>", "functions.", ":0", ":", "."),
        *("<think>", "</think>", "<answer>", "</answer>", "<|", "|>", "{", "}", "[", "]", '"', ",", " ", "\n", "\\"),
    ]
)
near_valid = st.lists(markers | st.text(max_size=5), max_size=40).map("".join)


@settings(SETTINGS, max_examples=400)
@given(near_valid | st.text())
def test_no_input_makes_it_raise(text: str) -> None:
    for parser in (PARSER, KimiK2Parser(answer_tag=False)):
        action = parser.parse(text)
        assert action == parser.parse(text)
        assert all(isinstance(e, str) and len(e.splitlines()) == 1 for e in action.errors)
        assert all(isinstance(c.arguments, dict) and c.name and c.id for c in action.tool_calls)
        if "think>" not in text and "<|im_" not in text:  # every call marker is a call or an error
            assert len(action.tool_calls) + len(action.errors) >= text.count(CALL)


# ---------------------------------------------------------------- writing calls
def test_format_call_writes_what_the_template_writes() -> None:
    assert PARSER.format_call("lookup", {"query": "paris"}, "functions.lookup:0") == (
        f'{SECTION}{CALL}functions.lookup:0{ARG}{{"query": "paris"}}{CALL_END}{SECTION_END}'
    )


@pytest.mark.parametrize(
    ("call_id", "written"),
    [
        ("functions.lookup:3", "functions.lookup:3"),  # an id that names the call is kept
        ("lookup:3", "lookup:3"),
        ("call_2", "functions.lookup:2"),  # toolenv's positional ids give the index
        ("", "functions.lookup:0"),
        ("abcdefghi", "functions.lookup:0"),  # a server's id that does not name the call
        ("functions.other:0", "functions.lookup:0"),
        ("call_x", "functions.lookup:0"),
        ("call_" + "9" * 5000, "functions.lookup:" + "9" * 5000),
        (" functions.lookup:0", "functions.lookup:0"),
        ("functions.lookup:0<|im_end|>", "functions.lookup:0"),
    ],
)
def test_the_call_id_format_call_writes(call_id: str, written: str) -> None:
    text = PARSER.format_call("lookup", {}, call_id)
    assert text == f"{SECTION}{CALL}{written}{ARG}{{}}{CALL_END}{SECTION_END}"
    assert summary(PARSER.parse(text)) == [("lookup", {}, written)]


@pytest.mark.parametrize("name", ["", " pad", "pad ", "\n", f"a{CALL}b", "x<|im_end|>", "x<think>", "x</think>"])
def test_names_a_call_id_cannot_carry_are_refused(name: str) -> None:
    assert PARSER.format_call(name, {}) is None


def test_arguments_that_are_not_json_are_refused() -> None:
    assert PARSER.format_call("f", {"x": float("nan")}) is None
    assert PARSER.format_call("f", {"x": {1, 2}}) is None
    assert PARSER.format_call("f", {"x": 10**5000}) is None
    assert PARSER.format_call("f", [1]) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["web.search", "functions", "functions.x", "a:1", "1", "x\ny", "名前", "f:"])
def test_unusual_names_round_trip(name: str) -> None:
    text = PARSER.format_call(name, {"a": [1]}, "call_1")
    assert text is not None and summary(PARSER.parse(text)) == [(name, {"a": [1]}, f"functions.{name}:1")]


names = st.text(st.characters(categories=("L", "N"), include_characters="_-.:"), min_size=1, max_size=20) | st.text(
    min_size=1, max_size=12
)
strings = st.lists(st.text(max_size=6) | markers, max_size=4).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(strings, kids, max_size=3),
    max_leaves=8,
)


@SETTINGS
@given(
    st.lists(st.tuples(names, st.dictionaries(strings, json_values, max_size=4)), min_size=1, max_size=3),
    st.sampled_from(["", "\n", " then "]),
)
def test_format_call_round_trips(calls: list[tuple[str, dict[str, Any]]], between: str) -> None:
    """What format_call writes (an agent rendering a server's native calls) reads back as those calls,
    one section each, as the env writes a turn given as parsed calls."""
    written = [(n, a, PARSER.format_call(n, a, f"call_{i}")) for i, (n, a) in enumerate(calls)]
    for name, _, text in written:
        if name.replace("_", "").replace("-", "").replace(".", "").replace(":", "").isalnum():
            assert text is not None  # every ordinary tool name can be written
    kept = [(i, n, a, t) for i, (n, a, t) in enumerate(written) if t is not None]
    action = PARSER.parse(between.join(t for *_, t in kept))
    assert action.errors == []
    assert summary(action) == [(n, a, f"functions.{n}:{i}") for i, n, a, _ in kept]
    assert action.text == between.join("" for _ in kept).strip()


# ---------------------------------------------------------------- results, instructions, traits
def test_results_as_the_template_writes_tool_messages() -> None:
    results = [
        ToolResult(text="20 degrees", name="get_weather", call_id="functions.get_weather:0"),
        ToolResult(text='{"t": "noon"}', name="now", call_id="functions.now:1"),
        ToolResult(text="bad", name="parser", is_error=True),
        ToolResult(text="worse", is_error=True),
    ]
    assert PARSER.format_results(results) == (
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n20 degrees<|im_end|>"
        '<|im_system|>now<|im_middle|>## Return of functions.now:1\n{"t": "noon"}<|im_end|>'
        "<|im_user|>user<|im_middle|>bad\nworse<|im_end|>"
    )
    assert PARSER.format_results([ToolResult(text="x", call_id="f:0")]) == (
        "<|im_system|>tool<|im_middle|>## Return of f:0\nx<|im_end|>"
    )
    assert PARSER.format_errors(["x"]) == "<|im_user|>user<|im_middle|>x<|im_end|>"
    assert PARSER.format_results([]) == ""


class Weather(toolenv.Tool):
    """Weather in a city <|tool_calls_section_begin|>."""

    name = "get_weather"

    class Args(BaseModel):
        city: str = Field(description="the city <|tool_call_end|>")
        unit: str = "c"

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"20 degrees in {args.city}")


def test_instructions_declare_the_tools_as_the_template_does() -> None:
    text = PARSER.instructions([Weather()])
    head, declared, *rest = text.split("\n")
    assert head == "# Tools" and json.loads(declared) == [Weather().schema()]
    assert "<|" not in declared  # markers in descriptions are escaped, the JSON intact
    assert f"{CALL}functions.NAME:INDEX{ARG}" in text and SECTION in text and SECTION_END in text
    assert text.endswith("write it as <answer>...</answer>.")
    assert "<answer>" not in KimiK2Parser(answer_tag=False).instructions([Weather()])
    assert KimiK2Parser(answer_tag=False).instructions([]) == ""


def test_the_parsers_traits() -> None:
    assert PARSER.name == "kimi_k2" and PARSER.special_tokens and PARSER.tool_messages
    assert PARSER.stop == (SECTION_END,) and PARSER.bind([Weather()]) is PARSER


def test_the_parser_is_registered() -> None:
    parser = get_parser("kimi_k2")
    assert isinstance(parser, KimiK2Parser) and parser.name == "kimi_k2" and parser.answer_tag
    quiet = get_parser("kimi_k2", answer_tag=False)
    assert isinstance(quiet, KimiK2Parser) and quiet.answer_tag is False
    env = toolenv.ToolEnv(tools=[Weather()], tasks=[{"question": "q", "answer": "a"}], parser="kimi_k2")
    assert isinstance(env.parser, KimiK2Parser)
    env.close()


# ---------------------------------------------------------------- a template written like Kimi's
# A few lines that write assistant tool calls and tool results as Kimi's chat templates do
# (Kimi-K2-Instruct-0905's and K2-Thinking's): the role header is `<|im_system|>` + the message's
# name (else its role) for tool messages, each call's id is written as given, its arguments as the
# string given (else `tojson`), all calls in one section, and a tool message is `## Return of ID`,
# a line break, then the content. (0905's file also indents that content by four spaces; left out.)
KIMI_LIKE = (
    "{%- for m in messages -%}"
    "{%- set role_name = m.get('name') or m['role'] -%}"
    "{%- if m['role'] == 'user' -%}<|im_user|>{{ role_name }}<|im_middle|>"
    "{%- elif m['role'] == 'assistant' -%}<|im_assistant|>{{ role_name }}<|im_middle|>"
    "{%- else -%}<|im_system|>{{ role_name }}<|im_middle|>{%- endif -%}"
    "{%- if m['role'] == 'assistant' and m.get('tool_calls') -%}"
    "{{ m['content'] or '' }}<|tool_calls_section_begin|>"
    "{%- for tc in m['tool_calls'] -%}"
    "<|tool_call_begin|>{{ tc['id'] }}<|tool_call_argument_begin|>"
    "{%- if tc['function']['arguments'] is string -%}{{ tc['function']['arguments'] }}"
    "{%- else -%}{{ tc['function']['arguments'] | tojson }}{%- endif -%}<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>"
    "{%- elif m['role'] == 'tool' -%}## Return of {{ m['tool_call_id'] }}\n{{ m['content'] }}"
    "{%- else -%}{{ m['content'] }}{%- endif -%}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def render(messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)  # transformers' tojson
    return env.from_string(KIMI_LIKE).render(messages=messages, add_generation_prompt=add_generation_prompt)


CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("functions.search:0", "search", {"query": 'Paris "x" é 日本', "k": 3, "where": {"lat": 48.8, "on": True}}),
    ("functions.now:1", "now", {}),
    ("functions.add:2", "add", {"numbers": [1, -2, 3.5], "note": None}),
]


def assistant_turn(calls: list[tuple[str, str, dict[str, Any]]], as_string: bool) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a) if as_string else a}}
            for i, n, a in calls
        ],
    }


@pytest.mark.parametrize("as_string", [False, True])
def test_the_parser_reads_the_templates_calls(as_string: bool) -> None:
    user = [{"role": "user", "content": "Go."}]
    head = render(user, add_generation_prompt=True)
    whole = render([*user, assistant_turn(CALLS, as_string)])
    assert whole.startswith(head)
    action = PARSER.parse(whole[len(head) :])
    assert action.errors == [] and action.text == "Checking."
    assert summary(action) == [(n, a, i) for i, n, a in CALLS]


def test_format_call_and_format_results_write_what_the_template_writes() -> None:
    user = [{"role": "user", "content": "Go."}]
    one = render([*user, assistant_turn(CALLS[:1], as_string=False)])
    written = PARSER.format_call(CALLS[0][1], CALLS[0][2], CALLS[0][0])
    assert written is not None and one.endswith("Checking." + written + IM_END)
    tools = [
        {"role": "tool", "name": n, "tool_call_id": i, "content": f"result {k}"} for k, (i, n, _) in enumerate(CALLS)
    ]
    head = render([*user, assistant_turn(CALLS, as_string=False)])
    outputs = render([*user, assistant_turn(CALLS, as_string=False), *tools])[len(head) :]
    results = [ToolResult(text=t["content"], name=t["name"], call_id=t["tool_call_id"]) for t in tools]
    assert outputs == PARSER.format_results(results)


# ---------------------------------------------------------------- an episode
def test_an_env_with_the_kimi_k2_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Weather()], tasks=[{"question": "Weather in Paris?", "answer": "20"}], parser=KimiK2Parser(), max_turns=6
    )
    obs, _ = env.reset(seed=0)
    assert obs.startswith("# Tools\n") and '"name": "get_weather"' in obs and "Weather in Paris?" in obs
    reply = f"<think>Need the weather.</think>{section(kimi('functions.get_weather:0', {'city': 'Paris'}))}{IM_END}"
    obs, reward, term, trunc, info = env.step(reply)
    assert (
        obs == f"<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n20 degrees in Paris{IM_END}"
    )
    assert not term and info["messages"][1].role == "tool"
    assert info["messages"][1].tool_call_id == "functions.get_weather:0"
    obs, *_ = env.step(section(kimi("functions.get_weather:0", {"town": "Paris"})))
    assert obs.startswith(
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\nInvalid arguments for tool"
    )
    obs, *_ = env.step(f"{SECTION}{CALL}functions.get_weather:0{CALL_END}{SECTION_END}")
    assert obs.startswith(f"<|im_user|>user<|im_middle|>Tool call 1 (functions.get_weather:0) has no {ARG}")
    obs, reward, term, trunc, info = env.step(f"It is 20 degrees. <answer>20</answer>{IM_END}")
    assert term and reward == 1.0 and info["answer"] == "20"


@pytest.fixture(scope="module")
def kimi_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("transformers", reason="a tokenizer needs transformers (CI installs it with verl)")
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen2(Path(tmp_path_factory.mktemp("tok")), with_model=False))
    tok.chat_template = KIMI_LIKE
    return tok


def test_the_template_check_finds_kimi_k2(kimi_tok: Any) -> None:
    # Kimi's templates write a call's id and no name: the check renders the call with the id
    # Kimi writes (`functions.lookup:0`), so the template gets a verdict and a parser.
    assert template_mismatch(get_parser("kimi_k2"), kimi_tok) is None
    problem = template_mismatch(get_parser("hermes"), kimi_tok)
    assert problem is not None and "functions.lookup:0" in problem and "parser='kimi_k2' reads it" in problem
    assert detect_parser(kimi_tok) == "kimi_k2"


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    load_example("kimi_k2_example").main()
    out = capsys.readouterr().out
    assert out.startswith('# Tools\n[{"type": "function", "function": {"name": "convert"')
    assert "[('convert', {'value': 100, 'to': 'F'}, 'functions.convert:0')]" in out
    assert "'<|im_system|>convert<|im_middle|>## Return of functions.convert:0\\n212 F<|im_end|>'" in out
    assert "## Return of functions.convert:1\\n32 F<|im_end|>'" in out
    assert "reward=1.0 terminated=True answer='212'" in out
