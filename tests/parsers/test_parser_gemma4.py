"""The gemma4 parser: Gemma's argument notation, turn ends, errors, bounds, round trips, the real templates."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import pytest
from _examples import load_example
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import get_parser, template_mismatch
from toolenv.parsers.gemma4 import Gemma4Parser, _gemma_schema
from toolenv.types import ParsedAction, ToolResult

P = Gemma4Parser()
Q = '<|"|>'
OPEN, CLOSE, RESPONSE = "<|tool_call>", "<tool_call|>", "<|tool_response>"
TURN_ENDS = (RESPONSE, "<turn|>", "<eos>", "<|turn>")


def calls(action: ParsedAction) -> list[tuple[str, dict[str, Any], str]]:
    return [(c.name, c.arguments, c.id) for c in action.tool_calls]


def same(a: Any, b: Any) -> bool:
    """Equal and of the same JSON types all the way down (1 is not 1.0, True is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


# ---------------------------------------------------------------- reading calls
def test_one_call() -> None:
    action = P.parse(f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>")
    assert action.errors == [] and action.answer is None and action.text == ""
    assert calls(action) == [("get_weather", {"city": "Paris"}, "call_0")]


def test_several_calls_with_text_around_and_the_stop_marker() -> None:
    text = (
        'Let me check both.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
        '<|tool_call>call:get_weather{city:<|"|>Lyon<|"|>}<tool_call|>\n<|tool_call>call:now{}<tool_call|>'
        "<|tool_response>"
    )
    action = P.parse(text)
    assert action.errors == [] and action.text == "Let me check both."
    assert calls(action) == [
        ("get_weather", {"city": "Paris"}, "call_0"),
        ("get_weather", {"city": "Lyon"}, "call_1"),
        ("now", {}, "call_2"),
    ]


def test_every_value_type_the_templates_write() -> None:
    # What Gemma 4's templates print for {"s": ..., "i": -3, ...}: sorted keys, bare nested keys,
    # Python's float spellings, None (revisions 1-4) or null (revision 5).
    body = (
        f"B:1,big:1e+20,e:1e-07,f:2.5,i:-3,inf:inf,l:[1,{Q}a{Q},[None,false,null]],neg:-0.0,"
        f'o:{{ak:{{deep:{Q}x{Q}}},b c:2,Zk:1}},s:{Q}he said "hi", {{a:b}} [x] <b> é😀\n{Q},t:true'
    )
    (call,) = P.parse(f"<|tool_call>call:f{{{body}}}<tool_call|>").tool_calls
    expected = {
        "B": 1,
        "big": 1e20,
        "e": 1e-07,
        "f": 2.5,
        "i": -3,
        "inf": math.inf,
        "l": [1, "a", [None, False, None]],
        "neg": -0.0,
        "o": {"ak": {"deep": "x"}, "b c": 2, "Zk": 1},
        "s": 'he said "hi", {a:b} [x] <b> é😀\n',
        "t": True,
    }
    assert same(call.arguments, expected)
    assert math.copysign(1, call.arguments["neg"]) == -1


def test_what_models_trained_on_json_slip_into_is_read() -> None:
    text = (
        '<|tool_call> call: search {"query": "a \\"b\\" \\u00e9\\n", <|"|>k y<|"|>: True, n : None ,\n'
        "  xs: [ 1 , 2 , ], nan: nan, big: 1E3, ok: False, }\n<tool_call|>"
    )
    (call,) = P.parse(text).tool_calls
    assert call.name == "search"
    assert math.isnan(call.arguments.pop("nan"))
    assert same(
        call.arguments, {"query": 'a "b" é\n', "k y": True, "n": None, "xs": [1, 2], "big": 1000.0, "ok": False}
    )


def test_strings_carry_anything_but_their_delimiter() -> None:
    raw = 'line 1\nline 2, {"json": [1]} <tool_call|> <|tool_response> <answer>x</answer> \\n \\'
    action = P.parse(f"<|tool_call>call:echo{{text:{Q}{raw}{Q}}}<tool_call|>")
    assert action.errors == [] and action.answer is None
    assert calls(action) == [("echo", {"text": raw}, "call_0")]


@pytest.mark.parametrize("end", ["<|tool_response>", "<turn|>", "<eos>", "<|turn>user\nhi<turn|>"])
def test_the_turn_ends_at_its_end_markers(end: str) -> None:
    call = "<|tool_call>call:f{a:1}<tool_call|>"
    action = P.parse(f"Checking.{call}{end}response:f{{value:{Q}made up{Q}}}<tool_response|>{call}more")
    assert calls(action) == [("f", {"a": 1}, "call_0")] and action.errors == []
    assert action.text == "Checking."


def test_a_hallucinated_answer_after_the_turn_is_not_the_answer() -> None:
    action = P.parse("<|tool_call>call:f{}<tool_call|><|tool_response>response:f{value:1}<answer>1</answer>")
    assert action.answer is None and len(action.tool_calls) == 1


def test_stray_closing_markers_are_not_text() -> None:
    action = P.parse("Done <tool_call|>here<tool_response|>.")
    assert action.text == "Done here." and action.tool_calls == [] and action.errors == []


def test_the_answer_tag() -> None:
    assert P.parse("It is sunny. <answer>sunny</answer><turn|>").answer == "sunny"
    action = P.parse("<|tool_call>call:f{x:1}<tool_call|> <answer>2</answer>")
    assert action.answer == "2" and calls(action) == [("f", {"x": 1}, "call_0")]
    action = P.parse(f"<|tool_call>call:python{{code:{Q}print('<answer>1</answer>'){Q}}}<tool_call|>")
    assert action.answer is None and action.tool_calls[0].arguments == {"code": "print('<answer>1</answer>')"}
    assert Gemma4Parser(answer_tag=False).parse("<answer>x</answer>").answer is None
    plain = P.parse("just thinking")
    assert plain.answer is None and plain.tool_calls == [] and plain.errors == [] and plain.text == "just thinking"


# ---------------------------------------------------------------- errors
HOW = 'Write <|tool_call>call:NAME{key:value,...}<tool_call|>, with text between <|"|> and <|"|>.'


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<|tool_call>", "Tool call 1 does not start with call:NAME{ (it starts '')."),
        ('<|tool_call>{"name": "f"}<tool_call|>', "does not start with call:NAME{"),
        ("<|tool_call>call:get_weather<tool_call|>", "('get_weather') has no arguments in {...}: write call:NAME{}"),
        ('<|tool_call>call:search(query: "x")<tool_call|>', "has no arguments in {...}"),
        ("<|tool_call>call:get_wea", "('get_wea') has no arguments in {...}"),  # cut off
        ("<|tool_call>call: {a:1}<tool_call|>", "Tool call 1 has no function name."),
        ('<|tool_call>call:<|"|>f<|"|>{}<tool_call|>', "'<|\"|>f<|\"|>' is not a function name"),
        (
            "<|tool_call>call:f{city:Paris}<tool_call|>",
            "Tool call 1 (f), argument city: 'Paris' is not a value: write text as <|\"|>Paris<|\"|>, "
            "and numbers, true, false and null as they are. " + HOW,
        ),
        ("<|tool_call>call:f{city:San Francisco}<tool_call|>", "argument city: 'San' is not a value"),
        ("<|tool_call>call:f{a:+-inf}<tool_call|>", "argument a: '+-inf' is not a value"),
        ("<|tool_call>call:f{a:1.2.3}<tool_call|>", "argument a: '1.2.3' is not a value"),
        ('<|tool_call>call:f{city:<|"|>Paris}<tool_call|>', 'argument city: a string is not closed with <|"|>'),
        ("<|tool_call>call:f{a:1", "Tool call 1 (f): an object is not closed with }"),
        ("<|tool_call>call:f{a:{b:1}<tool_call|>", "(f): expected , or } after the value of 'a', found '<tool_call|>'"),
        (
            "<|tool_call>call:f{a:[1,2}<tool_call|>",
            "argument a: expected , or ] after a list item, found '}<tool_call|>'",
        ),
        ("<|tool_call>call:f{a:[1,2", "argument a: a list is not closed with ]"),
        ("<|tool_call>call:f{a:1 b:2}<tool_call|>", "expected , or } after the value of 'a', found 'b:2}<tool_call|>'"),
        ("<|tool_call>call:f{a}<tool_call|>", "the key 'a' is not followed by : (found '}<tool_call|>')"),
        ("<|tool_call>call:f{:1}<tool_call|>", "expected key:value, found ':1}<tool_call|>'"),
        ("<|tool_call>call:f{a:1,,b:2}<tool_call|>", "expected key:value, found ',b:2}"),
        ("<|tool_call>call:f{a:}<tool_call|>", "argument a: expected a value, found '}<tool_call|>'"),
        ("<|tool_call>call:f{a:<b>}<tool_call|>", "argument a: expected a value, found '<b>}"),
        ("<|tool_call>call:f{a:1,a:2}<tool_call|>", "'a' is given twice"),
        ("<|tool_call>call:f{a:{x:1,x:1}}<tool_call|>", "argument a: 'x' is given twice"),
        ('<|tool_call>call:f{a:"x\\q"}<tool_call|>', 'a "..." string is not valid JSON (Invalid \\escape'),
        ('<|tool_call>call:f{a:"x}<tool_call|>', 'a "..." string is not closed with "'),
        ("<|tool_call>call:f{n:" + "9" * 5000 + "}<tool_call|>", "the number is too long (Exceeds the limit (4300"),
        ("<|tool_call>call:f{a:1}", "Tool call 1 (f) is not closed with <tool_call|>."),
        ("<|tool_call>call:f{a:1}<|tool_response>", "write <tool_call|> right after the } that closes the arguments"),
        ("<|tool_call>call:f{a:1}} more<tool_call|>", "write <tool_call|> right after the }"),
        ("<|tool_call>call:f{a:" + "[" * 101 + "]" * 101 + "}<tool_call|>", "nested more than 100 levels deep"),
        ("<|tool_call>call:f{a:" + "{b:" * 150, "argument a: the arguments are nested more than 100 levels deep"),
        ('<|tool_call>call:f{a:<|"|>' + "x" * 100_000 + '<|"|>}<tool_call|>', "longer than 100000 characters"),
        ("<|tool_call>call:" + "f" * 100_001 + "{}<tool_call|>", "longer than 100000 characters"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = P.parse(text)
    assert action.tool_calls == [] and len(action.errors) == 1, action.errors
    assert error in action.errors[0], action.errors[0]
    assert action.errors[0].endswith(HOW) or "longer than" in action.errors[0]


def test_a_good_call_beside_bad_ones_still_runs() -> None:
    text = (
        "<|tool_call>call:f{a:1}<tool_call|><|tool_call>call:g{x}<tool_call|><|tool_call>broken"
        "<|tool_call>call:h{xs:[1,2]}<tool_call|>"
    )
    action = P.parse(text)
    assert calls(action) == [("f", {"a": 1}, "call_0"), ("h", {"xs": [1, 2]}, "call_3")]  # ids by position
    assert [e.split(" ", 3)[2] for e in action.errors] == ["2", "3"]
    assert action.text == ""


def test_a_bad_call_ends_at_its_close_and_the_text_after_it_is_kept() -> None:
    action = P.parse("<|tool_call>call:f{a:oops}<tool_call|> Then I wait.")
    assert action.tool_calls == [] and len(action.errors) == 1 and action.text == "Then I wait."


def test_nesting_up_to_the_bound_is_read() -> None:
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    text = P.format_call("f", {"x": deep})
    assert text is not None and P.parse(text).tool_calls[0].arguments == {"x": deep}
    assert P.format_call("f", {"x": [deep]}) is None  # 101 levels: declined, as parse refuses it


def test_the_size_bound_is_configurable() -> None:
    text = f"<|tool_call>call:f{{x:{Q}{'a' * 50}{Q}}}<tool_call|>"
    small = Gemma4Parser(max_chars=40)
    assert small.parse(text).errors == ["Tool call 1 is longer than 40 characters; shorten the arguments."]
    assert small.format_call("f", {"x": "a" * 50}) is None
    assert Gemma4Parser(max_chars=100).parse(text).tool_calls


HUGE = [
    "<|tool_call>" * 100_000,
    "<|tool_call>call:f{" * 30_000,
    "<|tool_call>call:f{a:" + "[" * 1_000_000,
    "<|tool_call>call:f{a:" + "{b:" * 300_000,
    '<|tool_call>call:f{a:<|"|>' * 30_000,
    '<|tool_call>call:f{a:"' + "\\" * 100_001 + '"}<tool_call|>',
    '<|tool_call>call:f{a:"' + '\\"' * 200_000,
    "<|tool_call>call:f{a:1}<tool_call|>" * 20_000,
    "<answer>" * 50_000 + "<|tool_call>",
    "<" * 1_000_000,
    "<|" * 500_000,
    "<|tool_call>call:" + "f" * 1_000_000,
    "<|tool_call>call:f{" + "k" * 1_000_000,
    "<|tool_call>call:f{a:" + "1" * 1_000_000 + "}<tool_call|>",
    "<|tool_call>call:f{a:" + "1.5e" * 300_000 + "}<tool_call|>",
    "\x00" * 100_000 + "<|tool_call>call:f{a:1}<tool_call|>",
    "<|tool_response>" * 100_000,
    ("<|tool_call>call:f{a:" + "[" * 99) * 1_000,
    "<|tool_call>call:f{" + "a:1," * 200_000 + "}<tool_call|>",
]


@pytest.mark.parametrize("text", HUGE, ids=range(len(HUGE)))
def test_huge_and_deep_inputs_parse(text: str) -> None:
    """Bounded by behaviour: each opened call is a call or one error (how long it takes is measured in bench/)."""
    action = P.parse(text)
    assert isinstance(action, ParsedAction) and all(isinstance(e, str) and e for e in action.errors)
    opened = text.count(OPEN)
    if not any(m in text for m in TURN_ENDS):
        assert len(action.tool_calls) + len(action.errors) == opened


def test_many_calls_in_one_turn() -> None:
    action = P.parse("<|tool_call>call:f{a:1}<tool_call|>" * 20_000)
    assert len(action.tool_calls) == 20_000 and action.errors == []
    assert action.tool_calls[-1].id == "call_19999"


FRAGMENTS = [
    "<|tool_call>",
    "<tool_call|>",
    "call:",
    "call:f{",
    "<|tool_response>",
    "<tool_response|>",
    "<turn|>",
    "<|turn>",
    "<eos>",
    Q,
    "<|",
    "|>",
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    '"',
    "\\",
    "\\u00",
    "a:",
    "1e999",
    "-0",
    "9" * 5000,
    "true",
    "None",
    "nan",
    "+-inf",
    "-",
    "<answer>",
    "</answer>",
    "\n",
    " ",
    "\x00",
    "😀",
    "\ud800",
]
near_valid = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=60).map("".join)
repeated = st.tuples(st.sampled_from(FRAGMENTS) | st.text(min_size=1, max_size=6), st.integers(1, 20_000)).map(
    lambda p: p[0] * p[1]
)


def check(text: str, action: ParsedAction) -> None:
    assert isinstance(action, ParsedAction)
    for call in action.tool_calls:
        assert isinstance(call.name, str) and call.name and isinstance(call.arguments, dict)
        assert call.id.startswith("call_")
    assert all(isinstance(e, str) and e for e in action.errors)
    assert action.answer is None or isinstance(action.answer, str)
    found = len(action.tool_calls) + len(action.errors)
    if any(m in text for m in TURN_ENDS):
        assert found <= text.count(OPEN)
    else:  # every opened call is read: a call or one error
        assert found == text.count(OPEN)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text() | near_valid | repeated)
def test_no_input_makes_it_raise(text: str) -> None:
    for parser in (P, Gemma4Parser(answer_tag=False), Gemma4Parser(max_chars=50)):
        action = parser.parse(text)
        check(text, action)
        assert action == parser.parse(text)


# ---------------------------------------------------------------- writing calls
def test_format_call_writes_what_the_template_writes() -> None:
    args = {"s": "x", "n": None, "l": [1, 2.5, {"k": True}], "b c": 1, "Big": 1e20, "a": {"Z": 1, "y": [None]}}
    text = P.format_call("get_weather", args, "call_9")
    assert text == (
        "<|tool_call>call:get_weather{a:{y:[null],Z:1},b c:1,Big:1e+20,l:[1,2.5,{k:true}],n:null,"
        's:<|"|>x<|"|>}<tool_call|>'
    )
    assert calls(P.parse(text)) == [("get_weather", args, "call_0")]
    assert P.format_call("now", {}) == "<|tool_call>call:now{}<tool_call|>"


def test_format_call_quotes_keys_a_bare_key_cannot_carry() -> None:
    args = {" pad": 1, "a:b": 2, "": 3, '"q': 4, "x,y": 5, "<|x": 6, "{": 7, "ok key": 8}
    text = P.format_call("f", args)
    assert text is not None
    assert "ok key:8" in text and '<|"|> pad<|"|>:1' in text and '<|"|><|"|>:3' in text
    assert P.parse(text).tool_calls[0].arguments == args


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("", {}),
        (" f", {}),
        ("f\n", {}),
        ("a{b", {}),
        ("<|tool_call>", {}),
        ("a|>b", {}),
        ("a\nb", {}),
        ("f", {"x": 'has <|"|> inside'}),
        ("f", {'k<|"|>': 1}),
        ("f", {"x": "<|tool_call>call:g{}"}),
        ("f", {"x": 10**5000}),
        ("f", {"x": {1: "a"}}),
        ("f", {"x": {1, 2}}),
        ("f", {"x": b"raw"}),
        ("f", {"x": object()}),
    ],
)
def test_format_call_declines_what_the_format_cannot_carry(name: str, args: dict[str, Any]) -> None:
    assert P.format_call(name, args) is None


def test_format_call_writes_python_float_spellings() -> None:
    text = P.format_call("f", {"hi": math.inf, "lo": -math.inf, "tiny": 1e-7, "n": math.nan})
    assert text == "<|tool_call>call:f{hi:inf,lo:-inf,n:nan,tiny:1e-07}<tool_call|>"
    args = P.parse(text).tool_calls[0].arguments
    assert args["hi"] == math.inf and args["lo"] == -math.inf and args["tiny"] == 1e-7 and math.isnan(args["n"])


names = st.text(
    st.characters(blacklist_characters="{<|>\r\n", blacklist_categories=("Cs",)), min_size=1, max_size=16
).filter(lambda s: s == s.strip() and bool(s))
#: Pieces of strings: the notation's punctuation, markers, words it reads as values, unicode.
STRING_BITS = [*"\"'{}[],:<|>\\\n ", "<tool_call|>", "<|tool_response>", "<turn|>", "<answer>", "</answer>"]
STRING_BITS += ["None", "true", "1e5", "é", "😀", "\x00"]
strings = st.lists(st.text(max_size=6) | st.sampled_from(STRING_BITS), max_size=5).map("".join)
safe_strings = strings.filter(lambda s: Q not in s and OPEN not in s)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**300), max_value=10**300)
    | st.floats(allow_nan=False)
    | safe_strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(safe_strings, kids, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(names, st.dictionaries(safe_strings, json_values, max_size=4)), min_size=1, max_size=4),
    st.sampled_from(["", "Let me look.\n", "<|channel>thought\nplan<channel|>"]),
    st.sampled_from(["", "\n", "\n\n", " "]),
    st.sampled_from(["", "<|tool_response>", "<turn|>", "\n"]),
)
def test_format_call_round_trips(calls_: list[tuple[str, dict[str, Any]]], before: str, sep: str, after: str) -> None:
    """What format_call writes reads back as exactly those calls, types and all, however they are joined."""
    written = [P.format_call(n, a) for n, a in calls_]
    assert all(t is not None for t in written), written
    action = P.parse(before + sep.join(t or "" for t in written) + after)
    assert action.errors == []
    assert [c.name for c in action.tool_calls] == [n for n, _ in calls_]
    assert all(same(c.arguments, a) for c, (_, a) in zip(action.tool_calls, calls_))
    assert [c.id for c in action.tool_calls] == [f"call_{i}" for i in range(len(calls_))]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=12), st.dictionaries(strings, json_values | strings, max_size=3))
def test_format_call_reads_back_or_declines(name: str, args: dict[str, Any]) -> None:
    text = P.format_call(name, args)
    if text is not None:
        (call,) = P.parse(text).tool_calls
        assert call.name == name and same(call.arguments, args)
    else:  # declined only for a name parse would not read back, or a string holding a marker
        bad_name = not name or name != name.strip() or any(b in name for b in ("{", "<|", "|>", "\n", "\r"))
        assert bad_name or not carried(args)


def carried(value: Any) -> bool:
    """No string in `value` (keys included) holds the string delimiter or a call opener."""
    if isinstance(value, str):
        return Q not in value and OPEN not in value
    if isinstance(value, dict):
        return all(carried(k) and carried(v) for k, v in value.items())
    if isinstance(value, list):
        return all(carried(v) for v in value)
    return True


@st.composite
def corrupted(draw: st.DrawFn) -> str:
    """A valid call, then cut, spliced or given a stray fragment."""
    text = P.format_call(draw(names), draw(st.dictionaries(safe_strings, json_values, max_size=3)))
    assert text is not None
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, len(text)))
    mode = draw(st.sampled_from(["cut", "delete", "insert"]))
    if mode == "cut":
        return text[:i]
    if mode == "delete":
        return text[:i] + text[j:]
    return text[:i] + draw(st.sampled_from(FRAGMENTS)) + text[i:]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(corrupted(), min_size=1, max_size=3).map("".join))
def test_corrupted_calls_are_calls_or_errors(text: str) -> None:
    check(text, P.parse(text))


# ---------------------------------------------------------------- prompt, results, registration
class Inner(BaseModel):
    a: int = Field(description="an int")
    tags: list[str] = Field(default_factory=list)


class Weather(toolenv.Tool):
    """Weather in a city."""

    name = "get_weather"

    class Args(BaseModel):
        city: str = Field(description="the city")
        days: list[int] = Field(default_factory=list, description="days ahead")
        unit: Literal["c", "f"] = "c"
        inner: Inner | None = None
        note: str | None = None
        grid: list[list[float]] = Field(default_factory=list)
        many: list[Inner] = Field(default_factory=list)

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"20 degrees in {args.city}, days {args.days}")


@toolenv.tool
def now() -> str:
    """The time."""
    return "noon"


def test_instructions_declare_the_tools_as_gemma_does() -> None:
    text = P.instructions([Weather(), now])
    declarations, how, answer = text.split("\n")
    assert declarations.startswith('<|tool>declaration:get_weather{description:<|"|>Weather in a city.<|"|>')
    assert 'city:{description:<|"|>the city<|"|>,type:<|"|>STRING<|"|>}' in declarations
    assert 'note:{nullable:true,type:<|"|>STRING<|"|>}' in declarations  # Optional: OpenAPI's nullable
    assert 'unit:{enum:[<|"|>c<|"|>,<|"|>f<|"|>],type:<|"|>STRING<|"|>}' in declarations
    assert declarations.endswith(
        '<|tool>declaration:now{description:<|"|>The time.<|"|>,parameters:{type:<|"|>OBJECT<|"|>}}<tool|>'
    )
    assert how.startswith("To call a function, write <|tool_call>call:NAME{key:value,...}<tool_call|>.")
    assert answer == "When you know the final answer, write it as <answer>...</answer>."
    assert "<answer>" not in Gemma4Parser(answer_tag=False).instructions([Weather()])
    assert Gemma4Parser(answer_tag=False).instructions([]) == ""


def test_results_are_tool_response_blocks_and_the_env_speaks_as_the_user() -> None:
    obs = P.format_results(
        [
            ToolResult(text="20", name="get_weather", call_id="call_0"),
            ToolResult(text="no such city", name="get_weather", is_error=True, call_id="call_1"),
            ToolResult(text="Tool call 3 is broken.", name="parser", is_error=True),
            ToolResult(text="  And another.\n", is_error=True),
        ]
    )
    assert obs == (
        '<|tool_response>response:get_weather{value:<|"|>20<|"|>}<tool_response|>'
        '<|tool_response>response:get_weather{value:<|"|>no such city<|"|>}<tool_response|>'
        "<|turn>user\nTool call 3 is broken.\n  And another.<turn|>\n<|turn>model\n"
    )
    assert P.format_errors(["x"]) == "<|turn>user\nx<turn|>\n<|turn>model\n"


def test_registered_with_its_attributes() -> None:
    parser = get_parser("gemma4")
    assert isinstance(parser, Gemma4Parser) and parser.name == "gemma4"
    assert parser.stop == ("<|tool_response>",) and parser.special_tokens and parser.tool_messages
    quiet = get_parser("gemma4", answer_tag=False, max_chars=10)
    assert isinstance(quiet, Gemma4Parser) and quiet.answer_tag is False and quiet.max_chars == 10
    assert parser.bind([Weather()]) is parser


def test_an_env_with_the_gemma4_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Weather()],
        tasks=[{"question": "Weather in Paris?", "answer": "20"}],
        parser="gemma4",
        reward="exact_match",
        max_turns=5,
    )
    obs, _ = env.reset(seed=0)
    assert "<|tool>declaration:get_weather{" in obs and "<|tool_call>call:NAME{" in obs
    obs, reward, term, trunc, info = env.step(
        f"Let me check.<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:[1,2]}}<tool_call|><|tool_response>"
    )
    assert (
        obs == '<|tool_response>response:get_weather{value:<|"|>20 degrees in Paris, days [1, 2]<|"|>}<tool_response|>'
    )
    assert not term and info["messages"][1].role == "tool" and info["messages"][1].tool_call_id == "call_0"
    obs, *_ = env.step(f"<|tool_call>call:get_weather{{town:{Q}Paris{Q}}}<tool_call|>")
    assert obs.startswith("<|tool_response>response:get_weather{value:<|\"|>Invalid arguments for tool 'get_weather'")
    obs, *_ = env.step("<|tool_call>call:get_weather{city:Paris}<tool_call|>")
    assert obs.startswith("<|turn>user\nTool call 1 (get_weather), argument city: 'Paris' is not a value")
    assert obs.endswith("<turn|>\n<|turn>model\n")
    obs, reward, term, trunc, info = env.step("It is 20 degrees. <answer>20</answer><turn|>")
    assert term and reward == 1.0 and info["answer"] == "20"
    env.close()


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    load_example("gemma4_example").main()
    out = capsys.readouterr().out
    assert out.startswith("<|tool>declaration:population{description:")
    assert "--- call_1: population({'city': 'Lyon'})" in out
    assert (
        'observation: \'<|tool_response>response:population{value:<|"|>2102650<|"|>}<tool_response|>'
        '<|tool_response>response:population{value:<|"|>513275<|"|>}<tool_response|>\''
    ) in out
    assert "--- call_0: add({'numbers': [2102650, 513275]})" in out
    assert "reward=1.0 terminated=True answer='2615925'" in out


# ---------------------------------------------------------------- the real Gemma 4 templates
TEMPLATES = ["gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5"]
#: One call with every kind of value; the string holds the notation's own punctuation.
ARGS: dict[str, Any] = {
    "query": 'He said "hi", {a:b} [x] <b> it\'s 50% é😀\nline: 2,3',
    "limit": 5,
    "neg": -3,
    "ratio": 2.5,
    "tiny": 1e-07,
    "exact": True,
    "fuzzy": False,
    "cursor": None,
    "tags": ["a,b", 1, [None, True], {"k": "v"}],
    "filters": {"Zone": "eu", "range": {"from": 1, "to": 2.0}, "two words": [], "empty": {}},
    "Upper": "sorted case-insensitively",
}


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("trl", reason="the real chat templates come with trl (pip install toolenv[trl]); CI has it")
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    return AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("tok"), with_model=False))


def use_template(tok: Any, name: str) -> None:
    trl = pytest.importorskip("trl", reason="the real chat templates come with trl")
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def rendered_call(tok: Any, name: str, args: dict[str, Any]) -> str:
    """What the template appends to the prompt for an assistant turn holding the call `name(**args)`."""
    user = [{"role": "user", "content": "Go."}]
    head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": args}}
    whole = tok.apply_chat_template([*user, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False)
    assert whole.startswith(head)
    return str(whole[len(head) :])


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_parser_reads_the_real_templates_and_hermes_does_not(tok: Any, template: str) -> None:
    use_template(tok, template)
    assert template_mismatch(get_parser("gemma4"), tok) is None
    problem = template_mismatch(get_parser("hermes"), tok)
    assert problem is not None and '<|tool_call>call:lookup{query:<|"|>paris<|"|>}<tool_call|>' in problem


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_value_type_reads_back_from_the_real_templates(tok: Any, template: str) -> None:
    use_template(tok, template)
    written = rendered_call(tok, "search", ARGS)
    action = P.parse(written)
    assert action.errors == [] and action.text == "", written
    (call,) = action.tool_calls
    assert call.name == "search" and same(call.arguments, ARGS), written


@pytest.mark.parametrize("template", TEMPLATES)
def test_format_call_writes_what_the_real_templates_write(tok: Any, template: str) -> None:
    use_template(tok, template)
    written = rendered_call(tok, "search", ARGS)
    mine = P.format_call("search", ARGS)
    assert mine is not None
    if template != "gemma4_v5":  # the earlier revisions print Python's None for null
        mine = mine.replace(":null", ":None").replace("[null", "[None")
    assert written.startswith(mine), (written, mine)


@pytest.mark.parametrize("template", ["gemma4", "gemma4_v3", "gemma4_v4", "gemma4_v5"])
def test_results_and_declarations_are_written_as_the_real_templates_write_them(tok: Any, template: str) -> None:
    use_template(tok, template)
    user = [{"role": "user", "content": "Go."}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    turn = [*user, {"role": "assistant", "content": "", "tool_calls": [call]}]
    before = tok.apply_chat_template(turn, tokenize=False)
    # A result is named by its call's id, else by the message's name.
    replies = [
        {"role": "tool", "tool_call_id": "c1", "content": "20 degrees"},
        {"role": "tool", "name": "now", "content": "x"},
    ]
    after = tok.apply_chat_template([*turn, *replies], tokenize=False, add_generation_prompt=True)
    results = [ToolResult(text="20 degrees", name="get_weather", call_id="c1"), ToolResult(text="x", name="now")]
    assert after == before.removesuffix(RESPONSE) + P.format_results(results)
    # The env's messages come back as the template writes a user turn (and the prompt for the model's reply).
    with_user = tok.apply_chat_template(
        [*turn, {"role": "user", "content": "oops"}], tokenize=False, add_generation_prompt=True
    )
    assert with_user == before + P.format_errors(["oops"])
    # The tool declarations of a text prompt are the ones the template writes into its system turn.
    tools = [Weather(), now]
    schemas = [{"type": "function", "function": _gemma_schema(t.flat_schema()["function"])} for t in tools]
    system = tok.apply_chat_template(user, tools=schemas, tokenize=False)
    declarations = P.instructions(tools).split("\n")[0]
    assert system.startswith(f"<|turn>system\n{declarations}<turn|>\n")


def test_diffusion_gemma_writes_calls_the_same_way(tok: Any) -> None:
    """DiffusionGemma's template (TRL's `diffusion_gemma`) shares Gemma 4's call format."""
    use_template(tok, "diffusion_gemma")
    assert template_mismatch(get_parser("gemma4"), tok) is None
    (call,) = P.parse(rendered_call(tok, "search", ARGS)).tool_calls
    assert same(call.arguments, ARGS)


def test_gemma4_thinking_is_reasoning_with_its_channel_tags() -> None:
    """docs/parsers.md: Gemma 4's thought channel needs `reasoning=["<|channel>", "<channel|>"]`."""
    from toolenv.parsers import get_parser

    thought = "<|channel>thought I will call <|tool_call>call:g{}<tool_call|><channel|>"
    reply = thought + "<|tool_call>call:f{a:1}<tool_call|>"
    assert [c.name for c in get_parser("gemma4").parse(reply).tool_calls] == ["g", "f"]
    parser = get_parser("gemma4", reasoning=["<|channel>", "<channel|>"])
    assert [c.name for c in parser.parse(reply).tool_calls] == ["f"]
