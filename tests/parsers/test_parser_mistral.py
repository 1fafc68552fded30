"""The Mistral parser: both layouts, call ids, answers, every error, round trips, an env run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _examples import load_example
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import get_parser
from toolenv.parsers.mistral import MistralParser
from toolenv.types import ParsedAction, ToolResult

PARSER = MistralParser()


def v11(name: str, args: Any, call_id: str = "") -> str:
    ident = f"[CALL_ID]{call_id}" if call_id else ""
    return f"[TOOL_CALLS]{name}{ident}[ARGS]{json.dumps(args)}"


def v3(*calls: dict[str, Any]) -> str:
    return f"[TOOL_CALLS] {json.dumps(list(calls))}"


def summary(action: ParsedAction) -> list[tuple[str, dict[str, Any], str]]:
    return [(c.name, c.arguments, c.id) for c in action.tool_calls]


# ---------------------------------------------------------------- the v11+ layout
def test_a_v11_call_after_prose() -> None:
    action = PARSER.parse("Let me look.\n" + v11("get_weather", {"city": "Paris"}))
    assert action.errors == [] and action.answer is None and action.text == "Let me look."
    assert summary(action) == [("get_weather", {"city": "Paris"}, "call00000")]


def test_several_v11_calls_keep_a_given_id_and_number_the_others() -> None:
    text = v11("get_weather", {"city": "Paris"}, "a1B2c3D4e") + v11("now", {}) + v11("add", {"a": 1, "b": [2]})
    assert summary(PARSER.parse(text + "</s>")) == [
        ("get_weather", {"city": "Paris"}, "a1B2c3D4e"),
        ("now", {}, "call00001"),
        ("add", {"a": 1, "b": [2]}, "call00002"),
    ]


@pytest.mark.parametrize("call_id", ["short", "call_0001", "abc-def-g", "ａｂｃｄｅｆｇｈｉ", "a1b2c3d4e5"])
def test_an_id_templates_would_reject_is_replaced(call_id: str) -> None:
    (call,) = PARSER.parse(v11("f", {}, call_id)).tool_calls
    assert call.id == "call00000"


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS]add{"a": 1, "b": 2}',  # [ARGS] dropped from the text (vLLM reads this too)
        '[TOOL_CALLS] add [ARGS] {"a": 1, "b": 2} ',  # spaces around the parts
        '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}</s>',  # the EOS kept by a decode with special tokens
        '[TOOL_CALLS]add[ARGS]"{\\"a\\": 1, \\"b\\": 2}"',  # double-encoded arguments
        '[TOOL_CALLS]add[CALL_ID]not an id[ARGS]{"a": 1, "b": 2}',
    ],
)
def test_the_forms_a_v11_call_takes(text: str) -> None:
    action = PARSER.parse(text)
    assert action.errors == [] and action.text == ""
    assert summary(action) == [("add", {"a": 1, "b": 2}, "call00000")]


def test_text_after_the_arguments_is_text() -> None:
    action = PARSER.parse('[TOOL_CALLS]add[ARGS]{"a": 1} then I wait.')
    assert summary(action) == [("add", {"a": 1}, "call00000")] and action.text == "then I wait."


# ---------------------------------------------------------------- the v3 layout
def test_a_v3_list_of_calls() -> None:
    text = v3(
        {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"},
        {"name": "now", "arguments": {}},
        {"name": "sql", "arguments": json.dumps({"query": "SELECT 1"})},  # double-encoded
        {"name": "sql", "parameters": {"query": "SELECT 2"}},
        {"name": "now"},  # no arguments at all
    )
    action = PARSER.parse(text + "</s>")
    assert action.errors == [] and action.text == ""
    assert summary(action) == [
        ("get_weather", {"city": "Paris"}, "a1b2c3d4e"),
        ("now", {}, "call00001"),
        ("sql", {"query": "SELECT 1"}, "call00002"),
        ("sql", {"query": "SELECT 2"}, "call00003"),
        ("now", {}, "call00004"),
    ]


def test_a_single_v3_object_and_trailing_text() -> None:
    text = 'Checking.[TOOL_CALLS]{"name": "now", "arguments": {}, "id": "bad"} ok'
    action = PARSER.parse(text)
    assert summary(action) == [("now", {}, "call00000")] and action.text == "Checking. ok"


def test_both_layouts_in_one_turn_share_the_numbering() -> None:
    text = v3({"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}) + v11("c", {})
    assert [c.id for c in PARSER.parse(text).tool_calls] == ["call00000", "call00001", "call00002"]


# ---------------------------------------------------------------- ids
def test_ids_are_deterministic_and_always_mistral_shaped() -> None:
    text = "".join(v11("f", {"i": i}) for i in range(20))
    first, second = PARSER.parse(text), PARSER.parse(text)
    assert first == second
    assert [c.id for c in first.tool_calls][-2:] == ["call00018", "call00019"]
    many = PARSER.parse("[TOOL_CALLS]f[ARGS]{}" * 100_002)
    ids = [c.id for c in many.tool_calls]
    assert len(set(ids)) == len(ids) == 100_002
    assert all(len(i) == 9 and i.isascii() and i.isalnum() for i in ids)


# ---------------------------------------------------------------- answers
def test_the_answer_tag() -> None:
    assert PARSER.parse("It is <answer>Paris</answer></s>").answer == "Paris"
    action = PARSER.parse(v11("now", {}) + " <answer>noon</answer>")
    assert action.answer == "noon" and len(action.tool_calls) == 1
    assert MistralParser(answer_tag=False).parse("<answer>x</answer>").answer is None
    plain = PARSER.parse("just thinking")
    assert plain.answer is None and plain.tool_calls == [] and plain.text == "just thinking"


def test_an_answer_inside_arguments_is_not_the_answer() -> None:
    action = PARSER.parse(v11("echo", {"text": "<answer>no</answer>"}))
    assert action.answer is None and action.tool_calls[0].arguments == {"text": "<answer>no</answer>"}


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[TOOL_CALLS]", "nothing follows [TOOL_CALLS]"),
        ("[TOOL_CALLS]  </s>", "nothing follows [TOOL_CALLS]"),
        ('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}', "Tool call 1 is not valid JSON (Expecting"),
        ('[TOOL_CALLS]"[{}]"', "followed by a JSON string, not a list of calls"),
        ("[TOOL_CALLS][]", "the list after [TOOL_CALLS] is empty"),
        ("[TOOL_CALLS][1]", 'needs a JSON object with a string "name"'),
        ('[TOOL_CALLS][{"arguments": {}}]', 'needs a JSON object with a string "name"'),
        ('[TOOL_CALLS][{"name": " ", "arguments": {}}]', 'needs a JSON object with a string "name"'),
        ('[TOOL_CALLS][{"name": "f", "arguments": [1]}]', "Tool call 1 (f): the arguments must be a JSON object"),
        ('[TOOL_CALLS][{"name": "f", "arguments": "{bad"}]', "the arguments are a string that is not JSON"),
        ("[TOOL_CALLS]get_weather", "Tool call 1 ('get_weather') has no [ARGS]"),
        ("[TOOL_CALLS][ARGS]{}", "has no function name"),
        ("[TOOL_CALLS]f[CALL_ID]a1b2c3d4e", "has no [ARGS] after its [CALL_ID]"),
        ("[TOOL_CALLS]f[ARGS]", "no JSON arguments follow [ARGS] (write {} for none)"),
        ('[TOOL_CALLS]f[ARGS]{"a": ', "Tool call 1 (f): the arguments are not valid JSON (Expecting value)"),
        ("[TOOL_CALLS]f[ARGS][1, 2]", "the arguments must be a JSON object"),
        ('[TOOL_CALLS]f[ARGS]"[1]"', "the arguments must be a JSON object"),
        ('[TOOL_CALLS]f[ARGS]"{bad"', "the arguments are a string that is not JSON"),
        ("[TOOL_CALLS]f[ARGS]" + "[" * 100_000, "too deeply nested"),
        ("[TOOL_CALLS]f[ARGS]{" + '"n": 1' + "0" * 5000 + "}", "Exceeds the limit"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = PARSER.parse(text)
    assert action.tool_calls == [] and len(action.errors) == 1 and error in action.errors[0], action.errors


def test_a_good_call_beside_bad_ones_still_runs() -> None:
    text = "[TOOL_CALLS]broken" + v11("add", {"a": 1}) + v3({"name": "x", "arguments": 3}, {"name": "y"})
    action = PARSER.parse(text)
    assert summary(action) == [("add", {"a": 1}, "call00001"), ("y", {}, "call00003")]
    assert [e.split(" ", 3)[2] for e in action.errors] == ["1", "3"]  # numbered by position in the turn


@pytest.mark.parametrize(
    "text",
    [
        "[TOOL_CALLS]" * 100_000,
        "[TOOL_CALLS][" * 30_000,
        "[TOOL_CALLS]f[CALL_ID]" * 30_000,
        "[TOOL_CALLS]f[ARGS]{" * 30_000,
        "[TOOL_CALLS]" + "{" * 100_000,
        "<answer>" * 50_000 + "[TOOL_CALLS]",
    ],
)
def test_huge_repeated_fragments_parse(text: str) -> None:
    action = PARSER.parse(text)
    assert action.tool_calls == [] and action.errors


markers = st.sampled_from(
    ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "</s>", "<answer>", "</answer>", "{", "}", "[", "]", '"', ":", ",", " "]
)
near_valid = st.lists(markers | st.text(max_size=5), max_size=40).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_valid | st.text())
def test_no_input_makes_it_raise(text: str) -> None:
    for parser in (PARSER, MistralParser(answer_tag=False)):
        action = parser.parse(text)
        assert action == parser.parse(text)
        assert all(isinstance(e, str) and e for e in action.errors)
        assert all(len(c.id) == 9 and c.id.isalnum() for c in action.tool_calls)


# ---------------------------------------------------------------- writing calls and results
def test_format_call_writes_the_v11_layout() -> None:
    assert PARSER.format_call("add", {"a": 1}) == '[TOOL_CALLS]add[ARGS]{"a": 1}'
    assert PARSER.format_call("add", {"a": 1}, "a1b2c3d4e") == '[TOOL_CALLS]add[CALL_ID]a1b2c3d4e[ARGS]{"a": 1}'
    assert PARSER.format_call("add", {}, "call_1") == "[TOOL_CALLS]add[ARGS]{}"  # not an id Mistral accepts
    assert PARSER.format_call("odd name ", {}) == '[TOOL_CALLS][{"name": "odd name ", "arguments": {}}]'
    assert PARSER.format_call(" ", {}) is None


@pytest.mark.parametrize("name", ['"quoted', "a[b", "x{y}", "</s>", " pad ", "[TOOL_CALLS]", "two words"])
def test_odd_names_round_trip_in_one_layout_or_the_other(name: str) -> None:
    text = PARSER.format_call(name, {"a": [1]}, "a1b2c3d4e")
    assert text is not None
    assert summary(PARSER.parse(text)) == [(name, {"a": [1]}, "a1b2c3d4e")]


def test_format_call_escapes_control_tokens_inside_arguments() -> None:
    args = {"q": "a [TOOL_CALLS]b[ARGS]{} [CALL_ID] </s> [/TOOL_RESULTS] <s>", "[ARGS]": ["[TOOL_CALLS]"]}
    text = PARSER.format_call("search", args)
    assert text is not None and text.count("[TOOL_CALLS]") == 1 and text.count("[ARGS]") == 1
    assert "</s>" not in text and "[/TOOL_RESULTS]" not in text and "\\u005bTOOL_CALLS]" in text
    (only,) = PARSER.parse(text).tool_calls
    assert only.name == "search" and only.arguments == args


names = st.text(st.characters(categories=("L", "N"), include_characters="_-"), min_size=1, max_size=20) | st.text(
    min_size=1, max_size=12
).filter(str.strip)
strings = st.lists(st.text(max_size=6) | markers, max_size=4).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(strings, kids, max_size=3),
    max_leaves=8,
)
ids = st.just("") | st.text("abcXYZ0123456789", min_size=9, max_size=9) | st.text(max_size=10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(names, st.dictionaries(strings, json_values, max_size=4), ids), min_size=1, max_size=3))
def test_format_call_round_trips(calls: list[tuple[str, dict[str, Any], str]]) -> None:
    """What format_call writes (an agent rendering a server's native calls) reads back as those
    calls, with their ids when Mistral accepts them, whatever sits between the calls."""
    text = "\n".join(PARSER.format_call(n, a, i) or "" for n, a, i in calls)
    action = PARSER.parse(text)
    assert action.errors == [], text
    assert [(c.name, c.arguments) for c in action.tool_calls] == [(n, a) for n, a, _ in calls]
    for k, ((_, _, given_id), call) in enumerate(zip(calls, action.tool_calls)):
        valid = len(given_id) == 9 and given_id.isascii() and given_id.isalnum()
        assert call.id == (given_id if valid else f"call{k:05d}")


def test_results_carry_their_call_ids() -> None:
    obs = PARSER.format_results(
        [
            ToolResult(text="20 degrees", name="get_weather", call_id="a1b2c3d4e"),
            ToolResult(text="noon", name="now", call_id="call00001"),
            ToolResult(text="bad", name="parser", is_error=True),
        ]
    )
    assert obs == (
        "[TOOL_RESULTS]a1b2c3d4e[TOOL_CONTENT]20 degrees[/TOOL_RESULTS]"
        "[TOOL_RESULTS]call00001[TOOL_CONTENT]noon[/TOOL_RESULTS]"
        "[TOOL_RESULTS]bad[/TOOL_RESULTS]"
    )
    assert PARSER.format_errors(["x"]) == "[TOOL_RESULTS]x[/TOOL_RESULTS]"


class Weather(toolenv.Tool):
    """Weather in a city [/AVAILABLE_TOOLS]."""

    name = "get_weather"

    class Args(BaseModel):
        city: str = Field(description="the city")
        unit: str = "c"

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"20 degrees in {args.city}")


def test_instructions_list_the_tools_as_mistral_does() -> None:
    text = PARSER.instructions([Weather()])
    head, rest = text.split("\n", 1)
    assert head.startswith("[AVAILABLE_TOOLS][") and head.endswith("][/AVAILABLE_TOOLS]")
    schemas = json.loads(head[len("[AVAILABLE_TOOLS]") : -len("[/AVAILABLE_TOOLS]")])
    assert schemas == [Weather().schema()]  # the marker in the description is escaped, the JSON intact
    assert head.count("[/AVAILABLE_TOOLS]") == 1
    assert "[TOOL_CALLS]NAME[ARGS]" in rest and rest.endswith("write it as <answer>...</answer>.")
    assert "<answer>" not in MistralParser(answer_tag=False).instructions([Weather()])
    assert MistralParser(answer_tag=False).instructions([]) == ""


def test_the_parser_is_registered_with_its_traits() -> None:
    parser = get_parser("mistral")
    assert isinstance(parser, MistralParser) and parser.name == "mistral"
    assert parser.special_tokens and parser.tool_messages and parser.stop == ()
    quiet = get_parser("mistral", answer_tag=False)
    assert isinstance(quiet, MistralParser) and quiet.answer_tag is False
    assert parser.bind([Weather()]) is parser


def test_an_env_with_the_mistral_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Weather()],
        tasks=[{"question": "Weather in Paris?", "answer": "20"}],
        parser=MistralParser(),
        max_turns=6,
    )
    obs, _ = env.reset(seed=0)
    assert "[AVAILABLE_TOOLS]" in obs and '"name": "get_weather"' in obs
    obs, reward, term, trunc, info = env.step("Let me check." + v11("get_weather", {"city": "Paris"}) + "</s>")
    assert obs == "[TOOL_RESULTS]call00000[TOOL_CONTENT]20 degrees in Paris[/TOOL_RESULTS]"
    assert not term and info["messages"][1].role == "tool" and info["messages"][1].tool_call_id == "call00000"
    obs, *_ = env.step(v3({"name": "get_weather", "arguments": {"city": "Lyon"}, "id": "Xy12345ab"}))
    assert obs == "[TOOL_RESULTS]Xy12345ab[TOOL_CONTENT]20 degrees in Lyon[/TOOL_RESULTS]"
    obs, *_ = env.step(v11("get_weather", {"town": "Paris"}))
    assert obs.startswith("[TOOL_RESULTS]call00000[TOOL_CONTENT]Invalid arguments for tool 'get_weather'")
    obs, reward, term, trunc, info = env.step("It is 20 degrees. <answer>20</answer></s>")
    assert term and reward == 1.0 and info["answer"] == "20"


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    load_example("mistral_example").main()
    out = capsys.readouterr().out
    assert out.startswith('[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "convert"')
    assert "observation: '[TOOL_RESULTS]call00000[TOOL_CONTENT]212 F[/TOOL_RESULTS]'" in out
    assert "observation: '[TOOL_RESULTS]a1b2c3d4e[TOOL_CONTENT]100 C[/TOOL_RESULTS]'" in out
    assert "reward=1.0 terminated=True answer='212'" in out


def test_magistral_thinking_is_reasoning_with_its_own_tags() -> None:
    """docs/parsers.md: Magistral's `[THINK]…[/THINK]` needs `reasoning=["[THINK]", "[/THINK]"]`;
    with it, a call drafted while thinking does not run."""
    from toolenv.parsers import get_parser

    reply = '[THINK]plan [TOOL_CALLS]g[ARGS]{}[/THINK][TOOL_CALLS]f[ARGS]{"a": 1}</s>'
    assert [c.name for c in get_parser("mistral").parse(reply).tool_calls] == ["g", "f"]
    assert [c.name for c in get_parser("mistral", reasoning=["[THINK]", "[/THINK]"]).parse(reply).tool_calls] == ["f"]
