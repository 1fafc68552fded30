"""The DeepSeek parser: both layouts, the forms servers leave, reasoning, errors, round trips,
an env run and the real DeepSeek-V3 chat template."""

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
from toolenv.parsers.deepseek import DeepSeekParser
from toolenv.types import ParsedAction, ToolResult

PARSER = DeepSeekParser()
V31 = DeepSeekParser(version="v3.1")

CALLS, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
OUTPUTS, OUTPUTS_END = "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>"
OUTPUT, OUTPUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
EOS = "<｜end▁of▁sentence｜>"


def v3(name: str, args: Any) -> str:
    """One call as DeepSeek-V3's template writes it (without the outer markers)."""
    return f"{CALL}function{SEP}{name}\n```json\n{json.dumps(args)}\n```{CALL_END}"


def v31(name: str, args: Any) -> str:
    """One call as DeepSeek-V3.1's template writes it (without the outer markers)."""
    return f"{CALL}{name}{SEP}{json.dumps(args)}{CALL_END}"


def summary(action: ParsedAction) -> list[tuple[str, dict[str, Any], str]]:
    return [(c.name, c.arguments, c.id) for c in action.tool_calls]


# ---------------------------------------------------------------- the two layouts
def test_a_v3_call_after_prose_as_the_template_writes_it() -> None:
    action = PARSER.parse(f"Let me look.{CALLS}{v3('get_weather', {'city': 'Paris'})}{CALLS_END}{EOS}")
    assert action.errors == [] and action.answer is None and action.text == "Let me look."
    assert summary(action) == [("get_weather", {"city": "Paris"}, "call_0")]


def test_several_v3_calls_one_per_line() -> None:
    text = CALLS + "\n".join([v3("a", {"x": 1}), v3("b", {}), v3("c", {"y": [1, {"z": None}]})]) + CALLS_END + EOS
    action = PARSER.parse(text)
    assert action.errors == [] and action.text == ""
    assert summary(action) == [("a", {"x": 1}, "call_0"), ("b", {}, "call_1"), ("c", {"y": [1, {"z": None}]}, "call_2")]


def test_several_v31_calls_chained() -> None:
    text = f"Checking both.{CALLS}{v31('a', {'x': 1})}{v31('b', {})}{CALLS_END}{EOS}"
    action = V31.parse(text)
    assert action.errors == [] and action.text == "Checking both."
    assert summary(action) == [("a", {"x": 1}, "call_0"), ("b", {}, "call_1")]


def test_both_layouts_in_one_turn_and_either_parser_reads_both() -> None:
    text = CALLS + v3("a", {"x": 1}) + v31("b", {"y": 2}) + CALLS_END
    for parser in (PARSER, V31):
        assert summary(parser.parse(text)) == [("a", {"x": 1}, "call_0"), ("b", {"y": 2}, "call_1")]


def test_a_v31_tool_named_function_is_not_taken_for_the_v3_type() -> None:
    assert summary(PARSER.parse(v31("function", {"x": 1}))) == [("function", {"x": 1}, "call_0")]
    assert summary(PARSER.parse(v3("function", {"x": 1}))) == [("function", {"x": 1}, "call_0")]


@pytest.mark.parametrize(
    "text",
    [
        f'{CALL}function{SEP}add\n```json\n{{"a": 1, "b": 2}}\n```{CALL_END}',  # no outer markers
        f'{CALLS}{CALL}function{SEP}add\n```json\n{{"a": 1, "b": 2}}\n```',  # stopped before the call's end
        f'{CALLS}{CALL}function{SEP}add\n```json\n{{"a": 1, "b": 2}}\n```{CALLS_END}{EOS}',  # no call end
        f'{CALLS}{CALL}function{SEP}add\n```json\n{{"a": 1, "b": 2}}',  # cut before the closing fence
        f'｜tool▁calls▁begin｜>{CALL}function{SEP}add\n```json\n{{"a": 1, "b": 2}}\n```{CALL_END}',  # `<` in the prompt
        f'tool▁calls▁begin｜>{CALL}function{SEP}add\n```json\n{{"a": 1, "b": 2}}\n```{CALL_END}',
        f'｜tool▁call▁begin｜>function{SEP}add\n```json\n{{"a": 1, "b": 2}}\n```{CALL_END}',
        f'{CALL}function{SEP}add\n{{"a": 1, "b": 2}}{CALL_END}',  # V3 without the fence
        f'{CALL}function{SEP}add```json\n{{"a": 1, "b": 2}}```{CALL_END}',  # the fence on the name's line
        f'{CALL} function {SEP} add \n ```json\n {{"a": 1, "b": 2}} \n``` \n{CALL_END}',  # spaces around parts
        f'{CALL}add{SEP}{{"a": 1, "b": 2}}',  # V3.1, stopped before the call's end
        f'{CALL}add{SEP}```json\n{{"a": 1, "b": 2}}\n```{CALL_END}',  # V3.1 with a fence
        f'{CALL}add{SEP}"{{\\"a\\": 1, \\"b\\": 2}}"{CALL_END}',  # double-encoded arguments
        f'{CALL}function{SEP}add\n```json\n"{{\\"a\\": 1, \\"b\\": 2}}"\n```{CALL_END}',
    ],
)
def test_the_forms_a_call_takes(text: str) -> None:
    action = PARSER.parse(text)
    assert action.errors == [] and action.text == ""
    assert summary(action) == [("add", {"a": 1, "b": 2}, "call_0")]


def test_text_after_an_unclosed_last_call_is_text() -> None:
    action = PARSER.parse(f'{CALL}add{SEP}{{"a": 1}} and then I wait.')
    assert summary(action) == [("add", {"a": 1}, "call_0")] and action.text == "and then I wait."
    action = PARSER.parse(f'{CALL}function{SEP}add\n```json\n{{"a": 1}}\n``` done{CALLS_END} after')
    assert summary(action) == [("add", {"a": 1}, "call_0")] and action.text == "done after"


def test_text_between_and_after_calls_is_kept() -> None:
    action = PARSER.parse(f"one {v31('a', {})} two {v31('b', {})} three")
    assert [c.name for c in action.tool_calls] == ["a", "b"] and action.text == "one  two  three"


def test_ids_are_positions_and_deterministic() -> None:
    text = "".join(v31("f", {"i": i}) for i in range(20))
    first, second = PARSER.parse(text), PARSER.parse(text)
    assert first == second
    assert [c.id for c in first.tool_calls] == [f"call_{i}" for i in range(20)]


# ---------------------------------------------------------------- reasoning
def test_reasoning_the_prompt_opened_is_not_read() -> None:
    # DeepSeek-V3's generation prompt ends with `<think>\n`: the reply starts inside the reasoning.
    text = f"I could {v31('wrong', {})} but no.\n</think>\n\nSure.{CALLS}{v3('right', {'q': 1})}{CALLS_END}"
    action = PARSER.parse(text)
    assert action.errors == [] and summary(action) == [("right", {"q": 1}, "call_0")]
    assert action.text.startswith("I could " + CALL) and action.text.endswith("</think>\n\nSure.")


def test_think_blocks_are_not_read_and_stay_text() -> None:
    text = f"<think>try {v31('a', {})}</think>{v31('b', {})}<think>and {CALL}c{SEP}</think>"
    action = PARSER.parse(text)
    assert action.errors == [] and [c.name for c in action.tool_calls] == ["b"]
    assert action.text == f"<think>try {v31('a', {})}</think><think>and {CALL}c{SEP}</think>"


def test_an_unclosed_think_is_reasoning_to_the_end() -> None:
    action = PARSER.parse(f"{v31('a', {})}<think>then {v31('b', {})}")
    assert [c.name for c in action.tool_calls] == ["a"] and action.errors == []


def test_a_think_tag_inside_a_calls_arguments_is_not_reasoning() -> None:
    text = f"{v31('write', {'s': '<think>x</think>'})}{v31('b', {})}"  # written raw by the model
    assert summary(PARSER.parse(text)) == [("write", {"s": "<think>x</think>"}, "call_0"), ("b", {}, "call_1")]


@pytest.mark.parametrize("parser", [PARSER, V31], ids=["v3", "v31"])
@pytest.mark.parametrize(
    "text",
    [
        # R1's prompt opens the reasoning: the draft sits before the first `</think>`.
        "Maybe <answer>Lyon</answer>? Let me verify first.\n</think>\n\n{call}",
        "<think>Maybe <answer>Lyon</answer>?</think>\n{call}",
        "{call}<think>then maybe <answer>Lyon</answer>",  # unclosed: reasoning to the end
        "Maybe <answer>Lyon</answer>?</think>Let me check.",  # no call marker at all
    ],
)
def test_an_answer_drafted_in_reasoning_is_not_the_answer(parser: DeepSeekParser, text: str) -> None:
    call = parser.format_call("search", {"q": "capital of France"})
    assert call is not None
    action = parser.parse(text.format(call=call))
    assert action.answer is None and action.errors == []
    assert "<answer>Lyon</answer>" in action.text  # the reasoning stays in the text
    if "{call}" in text:
        assert summary(action) == [("search", {"q": "capital of France"}, "call_0")]


def test_an_answer_after_the_reasoning_is_the_answer() -> None:
    action = PARSER.parse("draft <answer>Lyon</answer></think>\nChecked: <answer>Paris</answer>")
    assert action.answer == "Paris" and action.text == "draft <answer>Lyon</answer></think>\nChecked:"
    action = PARSER.parse("<think>draft <answer>Lyon</answer></think><answer>Paris</answer><think>no</think>")
    assert action.answer == "Paris"


def test_an_answer_in_reasoning_ends_no_deepseek_episode() -> None:
    env = toolenv.ToolEnv(tools=[Weather()], tasks=[{"question": "Weather?", "answer": "20"}], parser="deepseek_v3")
    env.reset(seed=0)
    call = PARSER.format_call("get_weather", {"city": "Paris"}) or ""
    obs, reward, term, _, info = env.step("Maybe <answer>20</answer>?\n</think>\n\n" + call)
    assert (
        not term
        and info.get("answer") is None
        and obs == f"{OUTPUTS}{OUTPUT}20 degrees in Paris{OUTPUT_END}{OUTPUTS_END}"
    )


# ---------------------------------------------------------------- answers
def test_the_answer_tag() -> None:
    assert PARSER.parse(f"It is <answer>Paris</answer>{EOS}").answer == "Paris"
    action = PARSER.parse(v31("now", {}) + " <answer>noon</answer>")
    assert action.answer == "noon" and len(action.tool_calls) == 1
    assert DeepSeekParser(answer_tag=False).parse("<answer>x</answer>").answer is None
    plain = PARSER.parse("just thinking")
    assert plain == ParsedAction(text="just thinking")


def test_an_answer_inside_arguments_is_not_the_answer() -> None:
    action = PARSER.parse(v3("echo", {"text": "<answer>no</answer>"}))
    assert action.answer is None and action.tool_calls[0].arguments == {"text": "<answer>no</answer>"}


# ---------------------------------------------------------------- errors
HOW_V3 = f"Write {CALL}function{SEP}NAME\n```json\n"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (CALL, f"Tool call 1: nothing follows {CALL}"),
        (f"{CALL}  {CALL_END}", f"Tool call 1: nothing follows {CALL}"),
        (f"{CALL}get_weather{CALL_END}", f"Tool call 1 has no {SEP} between the function name and its arguments"),
        (f'{CALL}{SEP}{{"a": 1}}{CALL_END}', "Tool call 1 has no function name"),
        (f"{CALL} {SEP}```json\n{{}}\n```{CALL_END}", "Tool call 1 has no function name"),
        (f"{CALL}f{SEP}{CALL_END}", "Tool call 1 (f): no JSON arguments follow the name (write {} for none)"),
        (f"{CALL}function{SEP}f\n```json\n\n```{CALL_END}", "Tool call 1 (f): no JSON arguments follow the name"),
        (f'{CALL}f{SEP}{{"a": {CALL_END}', "Tool call 1 (f): the arguments are not valid JSON (Expecting value)"),
        (f'{CALL}f{SEP}{{"a": 1}} extra{CALL_END}', "the arguments are not valid JSON (Extra data)"),
        (f"{CALL}f{SEP}[1, 2]{CALL_END}", "Tool call 1 (f): the arguments must be a JSON object"),
        (f"{CALL}function{SEP}f\n```json\nnull\n```{CALL_END}", "the arguments must be a JSON object"),
        (f'{CALL}f{SEP}"[1]"{CALL_END}', "the arguments must be a JSON object"),
        (f'{CALL}f{SEP}"{{bad"{CALL_END}', "the arguments are a string that is not JSON"),
        (f"{CALL}f{SEP}" + "[" * 100_000 + CALL_END, "too deeply nested"),
        (f'{CALL}f{SEP}{{"n": 1' + "0" * 5000 + f"}}{CALL_END}", "Exceeds the limit"),
        (
            f'{CALL}f{SEP}{{"a": ',
            f"the arguments are not valid JSON (Expecting value), and the call is not closed with {CALL_END}",
        ),
        (f'{CALL}f{SEP}{{"a": "cut', "the arguments are not valid JSON (Unterminated string"),
        (f"{CALL}f{SEP}" + "[" * 100_000, "too deeply nested"),
        (f'{CALL}f{SEP}{{"a": 1}}{CALL}', f"Tool call 1 is not closed with {CALL_END}"),
        (CALLS, f"{CALLS} is not followed by a tool call"),
        (f"{CALLS}{CALLS_END}{EOS}", f"{CALLS} is not followed by a tool call"),
        (f'functionget_weather{SEP}{{"a": 1}}', f"{SEP} appears outside a tool call"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = PARSER.parse(text)
    assert action.tool_calls == [] and action.errors and error in action.errors[0], action.errors


def test_an_error_shows_the_parsers_own_layout() -> None:
    (v3_error,) = PARSER.parse(f"{CALL}get_weather{CALL_END}").errors
    (v31_error,) = V31.parse(f"{CALL}get_weather{CALL_END}").errors
    assert HOW_V3 in v3_error
    assert f'Write {CALL}NAME{SEP}{{"argument": value}}{CALL_END} with the arguments as a JSON object.' in v31_error


def test_a_good_call_beside_bad_ones_still_runs() -> None:
    text = f"{CALL}broken{CALL_END}{v3('add', {'a': 1})}\n{CALL}x{SEP}3{CALL_END}{v31('y', {})}"
    action = PARSER.parse(text)
    assert summary(action) == [("add", {"a": 1}, "call_1"), ("y", {}, "call_3")]
    assert [e.split(" ", 3)[2] for e in action.errors] == ["1", "3"]  # numbered by position in the turn


def test_a_call_missing_its_begin_marker_is_reported_beside_a_good_one() -> None:
    action = PARSER.parse(f"{CALLS}{v31('a', {})}b{SEP}{{}}{CALL_END}{CALLS_END}")
    assert [c.name for c in action.tool_calls] == ["a"]
    assert len(action.errors) == 1 and f"{SEP} appears outside a tool call" in action.errors[0]


def test_an_answer_silences_markers_without_a_call() -> None:
    action = PARSER.parse(f"{CALLS}<answer>4</answer>")
    assert action.answer == "4" and action.errors == []


def test_plain_text_with_other_formats_is_not_a_call() -> None:
    for text in ['<tool_call>{"name": "f", "arguments": {}}</tool_call>', '[TOOL_CALLS]f[ARGS]{"a": 1}', "a｜b"]:
        action = PARSER.parse(text)
        assert action.tool_calls == [] and action.errors == [] and action.text == text


@pytest.mark.parametrize(
    "text",
    [
        CALL * 100_000,
        CALLS * 100_000,
        SEP * 100_000,
        f"{CALL}f{SEP}" * 30_000,
        f"{CALL}f{SEP}{{" * 30_000,
        f"{CALL}function{SEP}f\n```json\n" * 30_000,
        CALL + "{" * 100_000,
        "</think>" * 50_000 + CALL,
        "<answer>" * 50_000 + CALL,
        "｜tool▁calls▁begin｜>" * 50_000,
    ],
)
def test_huge_repeated_fragments_parse(text: str) -> None:
    action = PARSER.parse(text)
    assert action.tool_calls == [] and action.errors
    assert len(action.errors) <= text.count(CALL) + 1


def test_huge_reasoning_parses_as_text() -> None:
    text = "<think>" * 50_000 + CALL + "</think" * 50_000
    assert PARSER.parse(text) == ParsedAction(text=text)


def test_a_hundred_thousand_calls_parse() -> None:
    action = PARSER.parse(CALLS + v31("f", {}) * 100_000 + CALLS_END)
    ids = [c.id for c in action.tool_calls]
    assert action.errors == [] and len(set(ids)) == len(ids) == 100_000 and ids[-1] == "call_99999"


markers = st.sampled_from(
    [
        *(CALLS, CALLS_END, CALL, CALL_END, SEP, EOS, "function", "```json\n", "```", "\n", "<think>", "</think>"),
        *("<answer>", "</answer>", "｜", "▁", "tool▁calls▁begin｜>", "{", "}", "[", "]", '"', ":", ",", " ", "\\"),
    ]
)
near_valid = st.lists(markers | st.text(max_size=5), max_size=40).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_valid | st.text())
def test_no_input_makes_it_raise(text: str) -> None:
    for parser in (PARSER, V31, DeepSeekParser(answer_tag=False)):
        action = parser.parse(text)
        assert action == parser.parse(text)
        assert all(isinstance(e, str) and e for e in action.errors)
        assert all(isinstance(c.arguments, dict) and c.name and c.id.startswith("call_") for c in action.tool_calls)
        if "think>" not in text:  # no reasoning: every call marker is a call or an error
            assert len(action.tool_calls) + len(action.errors) >= text.count(CALL)


# ---------------------------------------------------------------- writing calls and results
def test_format_call_writes_what_the_templates_write() -> None:
    assert PARSER.format_call("lookup", {"query": "paris"}, "abcdefghi") == (
        f'{CALLS}{CALL}function{SEP}lookup\n```json\n{{"query": "paris"}}\n```{CALL_END}{CALLS_END}'
    )
    assert V31.format_call("lookup", {"query": "paris"}) == (
        f'{CALLS}{CALL}lookup{SEP}{{"query": "paris"}}{CALL_END}{CALLS_END}'
    )


@pytest.mark.parametrize("name", ['"quoted', "{x}", "[a]", "two\nlines", "a```b", "`tick"])
def test_names_v3_cannot_carry_are_written_in_the_v31_layout(name: str) -> None:
    text = PARSER.format_call(name, {"a": [1]})
    assert text is not None and text.startswith(f"{CALLS}{CALL}{name}{SEP}")
    assert summary(PARSER.parse(text)) == [(name, {"a": [1]}, "call_0")]


@pytest.mark.parametrize("name", ["", " pad", "pad ", f"a{CALL}b", "x<think>", "x</think>", "<｜User｜>"])
def test_names_no_layout_carries_are_refused(name: str) -> None:
    assert PARSER.format_call(name, {}) is None and V31.format_call(name, {}) is None


def test_format_call_escapes_markers_inside_arguments() -> None:
    args = {"q": f"a {CALL_END}{CALLS_END} {CALL}b{SEP}{{}} </think> <think> {EOS} ```", CALL: [SEP, "<｜User｜>"]}
    for parser in (PARSER, V31):
        text = parser.format_call("search", args)
        assert text is not None and text.count("<｜") == 5 and "<think>" not in text and "</think>" not in text
        assert "\\u003c｜tool▁call▁end｜>" in text and "\\u003c/think>" in text
        assert summary(parser.parse(text)) == [("search", args, "call_0")]


names = st.text(st.characters(categories=("L", "N"), include_characters="_-."), min_size=1, max_size=20) | st.text(
    min_size=1, max_size=12
)
strings = st.lists(st.text(max_size=6) | markers, max_size=4).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(strings, kids, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(names, st.dictionaries(strings, json_values, max_size=4)), min_size=1, max_size=3),
    st.sampled_from(["", "\n", " then "]),
    st.booleans(),
)
def test_format_call_round_trips(calls: list[tuple[str, dict[str, Any]]], between: str, new: bool) -> None:
    """What format_call writes (an agent rendering a server's native calls) reads back as those calls."""
    parser = V31 if new else PARSER
    written = [(n, a, parser.format_call(n, a, "id")) for n, a in calls]
    for name, _, text in written:
        if name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            assert text is not None  # every ordinary tool name can be written
    kept = [(n, a, t) for n, a, t in written if t is not None]
    action = parser.parse(between.join(t for _, _, t in kept))
    assert action.errors == []
    assert summary(action) == [(n, a, f"call_{i}") for i, (n, a, _) in enumerate(kept)]
    assert action.text == between.join("" for _ in kept).strip()


def test_results_as_the_templates_write_tool_outputs() -> None:
    results = [
        ToolResult(text="20 degrees", name="get_weather", call_id="call_0"),
        ToolResult(text="noon", name="now", call_id="call_1"),
        ToolResult(text="bad", name="parser", is_error=True),
    ]
    blocks = f"{OUTPUT}20 degrees{OUTPUT_END}{OUTPUT}noon{OUTPUT_END}{OUTPUT}bad{OUTPUT_END}"
    assert PARSER.format_results(results) == f"{OUTPUTS}{blocks}{OUTPUTS_END}"
    assert V31.format_results(results) == blocks
    assert PARSER.format_errors(["x"]) == f"{OUTPUTS}{OUTPUT}x{OUTPUT_END}{OUTPUTS_END}"
    assert V31.format_errors(["x"]) == f"{OUTPUT}x{OUTPUT_END}"
    assert PARSER.format_results([]) == V31.format_results([]) == ""


class Weather(toolenv.Tool):
    """Weather in a city <｜tool▁calls▁begin｜>."""

    name = "get_weather"

    class Args(BaseModel):
        city: str = Field(description="the city <｜tool▁sep｜>")
        unit: str = "c"

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"20 degrees in {args.city}")


def test_instructions_list_the_tools_and_the_format() -> None:
    text = PARSER.instructions([Weather()])
    assert text.startswith("## Tools\nYou have access to the following tools:\n\n### get_weather\nDescription: ")
    params = next(line for line in text.splitlines() if line.startswith("Parameters: "))
    assert json.loads(params[len("Parameters: ") :]) == Weather().schema()["function"]["parameters"]
    assert "<｜tool▁sep｜>" not in params  # the marker in the schema is escaped, the JSON intact
    assert f"{CALLS}{CALL}function{SEP}tool_call_name\n```json\ntool_call_arguments\n```{CALL_END}" in text
    assert text.endswith("write it as <answer>...</answer>.")
    new = V31.instructions([Weather()])
    assert f"{CALLS}{CALL}tool_call_name{SEP}tool_call_arguments{CALL_END}" in new
    assert "chain them directly without separators or spaces" in new
    assert "<answer>" not in DeepSeekParser(answer_tag=False).instructions([Weather()])
    assert DeepSeekParser(answer_tag=False).instructions([]) == ""


def test_both_names_are_registered_with_their_traits() -> None:
    for spec, version in (("deepseek_v3", "v3"), ("deepseek_v31", "v3.1")):
        parser = get_parser(spec)
        assert isinstance(parser, DeepSeekParser) and parser.name == spec and parser.version == version
        assert parser.special_tokens and parser.tool_messages and parser.stop == (CALLS_END,)
        assert parser.bind([Weather()]) is parser
    quiet = get_parser("deepseek_v31", answer_tag=False)
    assert isinstance(quiet, DeepSeekParser) and quiet.answer_tag is False and quiet.version == "v3.1"
    with pytest.raises(ValueError, match="version must be"):
        DeepSeekParser(version="v4")  # type: ignore[arg-type]


def test_an_env_with_the_deepseek_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Weather()], tasks=[{"question": "Weather in Paris?", "answer": "20"}], parser="deepseek_v3", max_turns=6
    )
    obs, _ = env.reset(seed=0)
    assert "### get_weather" in obs and "Weather in Paris?" in obs
    obs, reward, term, trunc, info = env.step(
        f"Need the weather.</think>{CALLS}{v3('get_weather', {'city': 'Paris'})}{CALLS_END}{EOS}"
    )
    assert obs == f"{OUTPUTS}{OUTPUT}20 degrees in Paris{OUTPUT_END}{OUTPUTS_END}"
    assert not term and info["messages"][1].role == "tool" and info["messages"][1].tool_call_id == "call_0"
    obs, *_ = env.step(f"{CALLS}{v31('get_weather', {'town': 'Paris'})}{CALLS_END}")
    assert obs.startswith(f"{OUTPUTS}{OUTPUT}Invalid arguments for tool 'get_weather'")
    obs, *_ = env.step(f"{CALL}get_weather{CALL_END}")
    assert obs.startswith(f"{OUTPUTS}{OUTPUT}Tool call 1 has no {SEP}")
    obs, reward, term, trunc, info = env.step(f"It is 20 degrees. <answer>20</answer>{EOS}")
    assert term and reward == 1.0 and info["answer"] == "20"


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    load_example("deepseek_example").main()
    out = capsys.readouterr().out
    assert out.startswith("## Tools\nYou have access to the following tools:\n\n### convert")
    assert f"observation: '{OUTPUTS}{OUTPUT}212 F{OUTPUT_END}{OUTPUTS_END}'" in out
    assert f"observation: '{OUTPUTS}{OUTPUT}100 C{OUTPUT_END}{OUTPUTS_END}'" in out
    assert "reward=1.0 terminated=True answer='212'" in out


# ---------------------------------------------------------------- the real DeepSeek-V3 chat template
@pytest.fixture(scope="module")
def deepseek_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    trl = pytest.importorskip(
        "trl", reason="the real chat templates come with trl (pip install toolenv[trl]); CI has it"
    )
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("tok"), with_model=False))
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "deepseekv3.jinja").read_text(encoding="utf-8")
    return tok


def test_the_parser_reads_the_real_deepseek_v3_template(deepseek_tok: Any) -> None:
    assert template_mismatch(get_parser("deepseek_v3"), deepseek_tok) is None
    assert template_mismatch(get_parser("deepseek_v31"), deepseek_tok) is None
    problem = template_mismatch(get_parser("hermes"), deepseek_tok)
    assert problem is not None and "'hermes'" in problem and "tool▁call▁begin" in problem


def test_arguments_of_every_type_come_back_from_the_real_template(deepseek_tok: Any) -> None:
    calls = [
        ("search", {"query": 'Paris <b> "x" é', "k": 3, "tags": ["a", "b"], "where": {"lat": 48.8, "on": True}}),
        ("now", {}),
        ("add", {"numbers": [1, -2, 3.5], "note": None}),
    ]
    user = [{"role": "user", "content": "Go."}]
    head = deepseek_tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
            for n, a in calls
        ],
    }
    tools = [
        {"role": "tool", "content": "first"},
        {"role": "tool", "content": "second"},
        {"role": "tool", "content": "third"},
    ]
    whole = deepseek_tok.apply_chat_template([*user, turn, *tools], tokenize=False)
    shared = 0
    while shared < min(len(head), len(whole)) and head[shared] == whole[shared]:
        shared += 1
    reply, outputs = whole[shared:].split(EOS, 1)  # the model's turn ends with the EOS; tool outputs follow
    action = PARSER.parse(reply + EOS)
    assert action.errors == [] and action.text == ""
    assert summary(action) == [(n, a, f"call_{i}") for i, (n, a) in enumerate(calls)]
    # The template writes the three tool messages exactly as format_results writes three results.
    assert outputs == PARSER.format_results([ToolResult(text=m["content"]) for m in tools])
    # What format_call writes for one call is what the template writes for it.
    one = deepseek_tok.apply_chat_template([*user, {**turn, "tool_calls": turn["tool_calls"][:1]}], tokenize=False)
    written = PARSER.format_call(*calls[0])
    assert written is not None and one.endswith(written + EOS)


def test_a_second_call_turn_of_the_real_template_is_read(deepseek_tok: Any) -> None:
    # The template never resets its first-call flag: a second call turn has no <｜tool▁calls▁begin｜>.
    def call(name: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "arguments": json.dumps({"n": name})}}

    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "", "tool_calls": [call("a")]},
        {"role": "tool", "content": "R1"},
        {"role": "assistant", "content": "", "tool_calls": [call("b")]},
    ]
    whole = deepseek_tok.apply_chat_template(messages, tokenize=False)
    second = whole.split(f"R1{OUTPUT_END}", 1)[1]
    assert second.startswith(f"\n{CALL}function{SEP}b\n")
    action = PARSER.parse(second)
    assert action.errors == [] and action.text == "" and summary(action) == [("b", {"n": "b"}, "call_0")]
