"""The pythonic (Llama 3.2/4) parser: call lists, literals, errors, bounds, round trips, an env run."""

from __future__ import annotations

import keyword
import math
import re
import unicodedata
from typing import Any

import pytest
from _examples import load_example
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import get_parser
from toolenv.parsers.pythonic import PythonicParser
from toolenv.types import ParsedAction

P = PythonicParser()


def calls(action: ParsedAction) -> list[tuple[str, dict[str, Any], str]]:
    return [(c.name, c.arguments, c.id) for c in action.tool_calls]


# ---------------------------------------------------------------- reading calls
def test_one_call() -> None:
    action = P.parse('[get_weather(city="San Francisco", metric="celsius")]')
    assert action.errors == [] and action.answer is None and action.text == ""
    assert calls(action) == [("get_weather", {"city": "San Francisco", "metric": "celsius"}, "call_0")]


def test_several_calls_and_a_call_without_arguments() -> None:
    action = P.parse("[get_weather(city='Paris'), get_weather(city='Lyon'), get_time()]")
    assert calls(action) == [
        ("get_weather", {"city": "Paris"}, "call_0"),
        ("get_weather", {"city": "Lyon"}, "call_1"),
        ("get_time", {}, "call_2"),
    ]


def test_values_are_python_literals() -> None:
    text = (
        "[f(s='it\\'s \"quoted\"\\n', t='''multi\nline [x] # not a comment''', n=-3, x=+2.5, big=1e100, "
        "neg0=-0.0, inf=1e999, yes=True, no=False, none=None, items=[1, 'a', [None]], pair=(1, 2), "
        "obj={'k': {'deep': [1.5, {'x': None}]}, 'from': 1}, u='\\u00e9😀', cat='a' 'b')]"
    )
    (call,) = P.parse(text).tool_calls
    assert call.arguments == {
        "s": 'it\'s "quoted"\n',
        "t": "multi\nline [x] # not a comment",
        "n": -3,
        "x": 2.5,
        "big": 1e100,
        "neg0": -0.0,
        "inf": math.inf,
        "yes": True,
        "no": False,
        "none": None,
        "items": [1, "a", [None]],
        "pair": [1, 2],  # tuples are JSON arrays
        "obj": {"k": {"deep": [1.5, {"x": None}]}, "from": 1},
        "u": "é😀",
        "cat": "ab",
    }
    assert math.copysign(1, call.arguments["neg0"]) == -1


def test_json_spellings_are_accepted() -> None:
    (call,) = P.parse('[f(a=true, b=false, c=null, d={"x": [true, null]})]').tool_calls
    assert call.arguments == {"a": True, "b": False, "c": None, "d": {"x": [True, None]}}


@pytest.mark.parametrize(
    "text",
    [
        "<|python_start|>[get_weather(city='Paris')]<|python_end|>",
        "<|python_start|>[get_weather(city='Paris')]<|python_end|><|eom|>",
        "<|python_start|>[get_weather(city='Paris')]",  # python_end cut off
        "[get_weather(city='Paris')]<|eot|>",
        "[get_weather(city='Paris')]<|eot_id|>",
        "<|python_tag|>[get_weather(city='Paris')]<|eom_id|>",
        "\n  [\n    get_weather(\n        city='Paris',  # a comment\n    ),\n]\n\n",  # over lines, trailing commas
    ],
)
def test_with_and_without_llama_markers(text: str) -> None:
    action = P.parse(text)
    assert action.errors == [] and action.text == ""
    assert calls(action) == [("get_weather", {"city": "Paris"}, "call_0")]


def test_prose_before_the_list() -> None:
    for text in ["Let me check.\n[get_weather(city='Paris')]", "Let me check: [get_weather(city='Paris')]"]:
        action = P.parse(text)
        assert action.errors == [] and calls(action) == [("get_weather", {"city": "Paris"}, "call_0")]
        assert action.text in ("Let me check.", "Let me check:")


def test_several_lists_at_the_end_are_all_read() -> None:
    action = P.parse("Two lookups.\n[get_weather(city='Paris')]\n[get_time()]")
    assert calls(action) == [("get_weather", {"city": "Paris"}, "call_0"), ("get_time", {}, "call_1")]
    assert action.text == "Two lookups."


@pytest.mark.parametrize(
    "text",
    [
        "The primes are [2, 3, 5].",
        "See [1] and [the docs](https://example.com).",
        "I could call [get_weather(city='Paris')] but I already know it.",  # a list inside a sentence
        "[" * 1000,
        "Lists look like [f(x=1)] and, as here, end the reply: [1, 2]",
    ],
)
def test_brackets_in_prose_are_text(text: str) -> None:
    action = P.parse(text)
    assert action.tool_calls == [] and action.errors == [] and action.text == text


def test_a_list_that_is_not_last_gives_way_to_the_one_that_is() -> None:
    action = P.parse("I tried [get_time(zone='x')] before; now:\n[get_weather(city='Paris')]")
    assert calls(action) == [("get_weather", {"city": "Paris"}, "call_0")]
    assert action.text == "I tried [get_time(zone='x')] before; now:"


@pytest.mark.parametrize(
    "first",
    ['[get_weather(city="Paris")]', '[get_weather(city="Paris"]', "<|python_start|>[get_weather(city='Paris')]"],
)
def test_a_list_that_starts_the_reply_is_never_dropped_silently(first: str) -> None:
    # The first list is followed by prose (or never closes): it does not run, and the turn says so
    # even when a later list ends the reply and runs.
    action = P.parse(f'{first}\nThen I also need the time:\n[get_time(tz="CET")]')
    assert calls(action) == [("get_time", {"tz": "CET"}, "call_0")]
    assert len(action.errors) == 1 and action.errors[0].startswith(
        "The call list at the start of the reply did not run."
    )
    alone = P.parse(f"{first}\nThen I also need the time.")
    assert alone.tool_calls == [] and len(alone.errors) == 1
    assert action.errors[0].endswith(alone.errors[0])
    # An answer ends the turn: no error for a list it leaves behind.
    answered = P.parse(f"{first}\nSo:\n[get_time()] <answer>noon</answer>")
    assert answered.answer == "noon" and answered.errors == []


def test_the_answer_tag() -> None:
    assert P.parse("It is sunny. <answer>sunny</answer>").answer == "sunny"
    assert P.parse("<answer>[1, 2]</answer>").answer == "[1, 2]"
    action = P.parse("<answer>a</answer> [f(x=1)]")
    assert action.answer == "a" and calls(action) == [("f", {"x": 1}, "call_0")]
    # a list followed by an answer is not a call: the answer ends the episode
    action = P.parse("[f(x=1)]\n<answer>2</answer>")
    assert action.answer == "2" and action.tool_calls == [] and action.errors == []
    # an answer inside a string argument is the argument's
    action = P.parse("[python(code='print(\"<answer>1</answer>\")')]")
    assert action.answer is None and calls(action) == [("python", {"code": 'print("<answer>1</answer>")'}, "call_0")]
    assert PythonicParser(answer_tag=False).parse("<answer>x</answer>").answer is None


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[get_weather('Paris')]", "Call 1 (get_weather): write every argument as param=value; positional"),
        ("[f(*xs)]", "positional arguments are not accepted"),
        ("[f(**kw)]", "write every argument as param=value, without **"),
        ("[f(x=y)]", "the value of x is the name y (quote it if it is text), not a literal"),
        ("[f(x=open('a'))]", "the value of x is a function call, not a literal"),
        ("[f(x=__import__('os').system('ls'))]", "the value of x is a function call"),
        ("[f(x=1 + 2)]", "the value of x is an expression"),
        ("[f(x=--1)]", "the value of x is an expression"),
        ("[f(x=f'{y}')]", "the value of x is an expression"),
        ("[f(x=lambda: 1)]", "the value of x is an expression"),
        ("[f(x={1, 2})]", "a set (write a list)"),
        ("[f(x=b'raw')]", "the value of x is bytes (write a string)"),
        ("[f(x=1j)]", "the value of x is a complex number"),
        ("[f(x=...)]", "the value of x is an expression"),
        ("[f(x={1: 'a'})]", "a dict with a key that is not a string"),
        ("[f(x={**d})]", "a dict with ** unpacking"),
        ("[f(a=1, a=2)]", "argument a is given twice"),
        ('[os.system(command="rm -rf /")]', "Call 1 (os.system): call a tool by its plain name"),
        ("[a.b.c.d(x=1)]", "(a.b.c.d)"),
        ("[f(x=1)(y=2)]", "call a tool by its name"),
        ("[f(x=1)[0]]", "Call 1 is not a function call"),
        ("[f(x=1) for f in fs]", "not a comprehension"),
        ("[f(x=)]", "The call list is not valid Python ("),  # Python's message, which varies by version
        ("[f(x=1, y=[1)]", "The call list is not valid Python (closing parenthesis ')' does not match"),
        ("[f(x='unterminated)]", "The call list is not valid Python (unterminated string literal"),
        ("[f(x=1)", "The call list is not valid Python ('[' was never closed"),
        ("[f(x='\x00')]", "source code string cannot contain null bytes"),  # SyntaxError or ValueError
        ("[f(x=" + "9" * 5000 + ")]", "Exceeds the limit (4300"),
        ("[f(x=1)]\nDone.", "Text follows the call list: end your reply with the list"),
        ("[f(x=" + "[" * 300 + "]" * 300 + ")]", "nested more than 200 levels deep"),  # the scanner stops
        ("[f(x=" + "[" * 300, "nested more than 200 levels deep"),
        ("[f(x=1" + "+1" * 40_000 + ")]", "(f): the value of x is an expression|could not be read (nested too deeply)"),
        ("[f(x=" + "-" * 60_000 + "1)]", "The call list could not be read (nested too deeply)"),
        ("[f(x='" + "a" * 100_000 + "')]", "The call list is longer than 100000 characters"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = P.parse(text)
    assert action.tool_calls == [] and len(action.errors) == 1, action.errors
    assert any(e in action.errors[0] for e in error.split("|")), action.errors[0]  # a|b: Python versions differ


def test_a_good_call_beside_a_bad_one_still_runs() -> None:
    action = P.parse("[f(x=1), g(2), os.path(p='a'), h(y=[1, 2]), 'text']")
    assert calls(action) == [("f", {"x": 1}, "call_0"), ("h", {"y": [1, 2]}, "call_3")]  # ids by position
    assert [e.split(" ", 2)[:2] for e in action.errors] == [["Call", "2"], ["Call", "3"], ["Call", "5"]]


def test_nesting_up_to_pythons_limit_is_read() -> None:
    deep: Any = []
    for _ in range(197):  # with the list and the call's parentheses: 200 levels, Python's limit
        deep = [deep]
    action = P.parse(f"[f(x={deep!r})]")
    assert action.errors == [] and action.tool_calls[0].arguments == {"x": deep}


def test_the_size_bound_is_configurable() -> None:
    text = "[f(x='" + "a" * 50 + "')]"
    assert PythonicParser(max_chars=40).parse(text).errors == [
        "The call list is longer than 40 characters; shorten the arguments."
    ]
    assert PythonicParser(max_chars=40).format_call("f", {"x": "a" * 50}) is None
    assert PythonicParser(max_chars=100).parse(text).tool_calls


HUGE = [
    "[" * 1_000_000,
    "(" * 100_000,
    "[a(" * 300_000 + "]",
    "[f(x=" + "[" * 100_000,
    "x [a(" * 200_000 + "]",
    "[f(x='''" * 100_000 + "]",
    "[a(x=" + "[]" * 500_000 + "]",
    ("[a(x=" + "[]" * 60_000) * 10 + "]",
    "[a(x=1)] " * 20_000,
    "[f(x='" + "\\" * 100_001 + "')]",
    " " * 1_000_000 + "[a(x=1)]",
    "[a(x=1)]" + "<|eot|> " * 100_000,
    "[f(x=" + "a." * 100_000 + "b)]",
    "[f(x=a" + "[0]" * 30_000 + ")]",
    "\x00" * 100_000 + "[f(x=1)]",
]


@pytest.mark.parametrize("text", HUGE, ids=range(len(HUGE)))
def test_huge_and_deep_inputs_parse(text: str) -> None:
    """Each is bounded before `ast` sees it (how long they take is measured in bench/, not here)."""
    action = P.parse(text)
    assert isinstance(action, ParsedAction) and all(isinstance(e, str) and e for e in action.errors)


FRAGMENTS = [
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    "f(",
    "get_weather(",
    "[f(",
    "x=",
    "=",
    ", ",
    "'",
    '"',
    "'''",
    '"""',
    "\\",
    "#",
    "\n",
    " ",
    "1",
    "-",
    "1e999",
    "9" * 5000,
    "True",
    "null",
    "os.system",
    "**",
    "*",
    "lambda",
    "<|python_start|>",
    "<|python_end|>",
    "<|eot|>",
    "<|eom_id|>",
    "<answer>",
    "</answer>",
    "\x00",
    "😀",
    "\ud800",
    "ﬁ",
]
near_valid = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=60).map("".join)
repeated = st.tuples(st.sampled_from(FRAGMENTS) | st.text(min_size=1, max_size=6), st.integers(1, 20_000)).map(
    lambda p: p[0] * p[1]
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text() | near_valid | repeated)
def test_no_input_makes_it_raise(text: str) -> None:
    for parser in (P, PythonicParser(answer_tag=False), PythonicParser(max_chars=50)):
        action = parser.parse(text)
        assert isinstance(action, ParsedAction)
        for call in action.tool_calls:
            assert isinstance(call.name, str) and isinstance(call.arguments, dict) and call.id.startswith("call_")
        assert all(isinstance(e, str) and e for e in action.errors)
        assert action == parser.parse(text)


# ---------------------------------------------------------------- writing calls
def test_format_call_writes_python_literals() -> None:
    args = {"city": "São Paulo", "days": [1, 2], "opts": {"unit": "c", "x-y": None}, "ok": True, "t": -0.5}
    text = P.format_call("get_weather", args, "call_9")
    assert text == ("[get_weather(city='São Paulo', days=[1, 2], opts={'unit': 'c', 'x-y': None}, ok=True, t=-0.5)]")
    assert calls(P.parse(text)) == [("get_weather", args, "call_0")]
    assert P.format_call("now", {}) == "[now()]"


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("get-weather", {}),  # not an identifier
        ("class", {}),  # a keyword
        ("f", {"from": 1}),
        ("f", {"2x": 1}),
        ("f", {"a b": 1}),
        ("ﬁnd", {}),  # Python would read the name as "find" (NFKC)
        ("f", {"x": math.nan}),
        ("f", {"x": 10**5000}),
        ("f", {"x": {1: "a"}}),
        ("f", {"x": {1, 2}}),
        ("f", {"x": b"raw"}),
        ("f", {"x": (lambda: 1)}),
    ],
)
def test_format_call_declines_what_the_format_cannot_carry(name: str, args: dict[str, Any]) -> None:
    assert P.format_call(name, args) is None


def test_format_call_declines_values_nested_too_deeply() -> None:
    deep: Any = 1
    for _ in range(101):
        deep = [deep]
    assert P.format_call("f", {"x": deep}) is None
    assert P.parse(P.format_call("f", {"x": deep[0]}) or "").tool_calls[0].arguments == {"x": deep[0]}


def test_format_call_writes_infinity_as_a_literal() -> None:
    text = P.format_call("f", {"hi": math.inf, "lo": -math.inf})
    assert text == "[f(hi=1e999, lo=-1e999)]"
    assert P.parse(text).tool_calls[0].arguments == {"hi": math.inf, "lo": -math.inf}


identifiers = (
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
    | st.text(st.characters(categories=("L", "N", "Pc")), min_size=1, max_size=8)
).filter(lambda s: s.isidentifier() and not keyword.iskeyword(s))
strings = st.lists(
    st.text(max_size=8)
    | st.sampled_from(["'", '"', "'''", '"""', "\\", "\n", "\r", "\x00", "]", ")", "#", "<answer>", "<|eot|>"]),
    max_size=5,
).map("".join)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**300), max_value=10**300)
    | st.floats(allow_nan=False)
    | strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(strings, kids, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(identifiers, st.dictionaries(identifiers, json_values, max_size=4)), min_size=1, max_size=4),
    st.sampled_from(["", "Let me look.\n", "<|python_start|>"]),
    st.sampled_from(["", "\n", "<|python_end|>", "<|eot|>"]),
)
def test_format_call_round_trips(calls_: list[tuple[str, dict[str, Any]]], before: str, after: str) -> None:
    """What format_call writes reads back as exactly that call, alone or one list per line."""
    written = [P.format_call(n, a) for n, a in calls_]
    kept = [(n, a) for (n, a), text in zip(calls_, written, strict=True) if text is not None]
    for (n, a), text in zip(calls_, written, strict=True):
        if text is None:  # declined only for a name Python would normalise (NFKC) or not find
            assert any(unicodedata.normalize("NFKC", k) != k or not re.fullmatch(r"[^\W\d]\w*", k) for k in [n, *a])
    action = P.parse(before + "\n".join(t for t in written if t is not None) + after)
    assert action.errors == []
    assert [(c.name, c.arguments) for c in action.tool_calls] == kept
    assert [c.id for c in action.tool_calls] == [f"call_{i}" for i in range(len(kept))]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=12), st.dictionaries(st.text(max_size=8), json_values, max_size=3))
def test_format_call_reads_back_or_declines(name: str, args: dict[str, Any]) -> None:
    text = P.format_call(name, args)
    if text is not None:
        assert [(c.name, c.arguments) for c in P.parse(text).tool_calls] == [(name, args)]


# ---------------------------------------------------------------- prompt, results, registration
class Weather(toolenv.Tool):
    """Weather in a city."""

    name = "get_weather"

    class Args(BaseModel):
        city: str = Field(description="the city")
        days: list[int] = Field(default_factory=list, description="days ahead")

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"20 degrees in {args.city}, days {args.days}")


def test_instructions_give_the_format_and_the_functions_as_json() -> None:
    text = P.instructions([Weather()])
    assert "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]" in text
    assert "Here is a list of functions in JSON format that you can invoke." in text
    assert '"name": "get_weather"' in text and '"description": "the city"' in text
    assert '"type": "function"' not in text  # Llama lists the function objects themselves
    assert text.endswith("When you know the final answer, write it as <answer>...</answer>.")
    assert "<answer>" not in PythonicParser(answer_tag=False).instructions([Weather()])


def test_results_are_blocks_headed_by_the_tool() -> None:
    obs = P.format_results(
        [
            toolenv.ToolResult(text="20", name="get_weather"),
            toolenv.ToolResult(text="no such city", name="get_weather", is_error=True),
            toolenv.ToolResult(text="Call 3 is not a function call.", name="parser", is_error=True),
        ]
    )
    assert obs == "get_weather returned:\n20\n\nget_weather failed:\nno such city\n\nCall 3 is not a function call."


def test_registered_with_its_attributes() -> None:
    parser = get_parser("pythonic")
    assert isinstance(parser, PythonicParser) and parser.name == "pythonic"
    assert parser.stop == () and not parser.special_tokens and parser.tool_messages
    assert get_parser("pythonic", answer_tag=False).answer_tag is False
    assert parser.bind([Weather()]) is parser


def test_an_env_with_the_pythonic_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Weather()],
        tasks=[{"question": "Weather in Paris?", "answer": "20"}],
        parser=PythonicParser(),
        reward="exact_match",
        max_turns=5,
    )
    obs, _ = env.reset(seed=0)
    assert "[func_name1(" in obs and '"name": "get_weather"' in obs
    obs, reward, term, trunc, info = env.step("Let me check.\n[get_weather(city='Paris', days=[1, 2])]")
    assert obs == "get_weather returned:\n20 degrees in Paris, days [1, 2]"
    assert not term and info["messages"][1].role == "tool" and info["messages"][1].tool_call_id == "call_0"
    obs, *_ = env.step("[get_weather(town='Paris')]")
    assert obs.startswith("get_weather failed:\nInvalid arguments for tool 'get_weather'")
    obs, *_ = env.step("[get_weather('Paris')]")
    assert obs == "Call 1 (get_weather): write every argument as param=value; positional arguments are not accepted."
    obs, reward, term, trunc, info = env.step("It is 20 degrees. <answer>20</answer>")
    assert term and reward == 1.0 and info["answer"] == "20"
    env.close()


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    load_example("pythonic_example").main()
    out = capsys.readouterr().out
    assert "[func_name1(params_name1=params_value1" in out and '"name": "population"' in out
    assert "--- call_1: population({'city': 'Lyon'})" in out
    assert "observation: 'population returned:\\n2102650\\n\\npopulation returned:\\n513275'" in out
    assert "--- call_0: add({'numbers': [2102650, 513275]})" in out
    assert "reward=1.0 terminated=True answer='2615925'" in out


def test_an_invalid_escape_in_a_string_is_read_without_a_warning() -> None:
    """`"\\d"` is valid Python whose compile warns; a model's regex must not print to stderr."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        action = P.parse(r'[grep(pattern="\d+ items")]')
    assert action.errors == [] and action.tool_calls[0].arguments == {"pattern": "\\d+ items"}


def test_lfm2_wraps_the_list_in_tool_call_markers() -> None:
    p = get_parser("pythonic")
    parsed = p.parse("Let me look.<|tool_call_start|>[lookup(query='paris'), f(a=1)]<|tool_call_end|><|im_end|>")
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("lookup", {"query": "paris"}), ("f", {"a": 1})]
    assert parsed.text == "Let me look." and parsed.errors == []
    bare = p.parse("[lookup(query='paris')] and more")  # without the markers, the list must end the reply
    assert bare.tool_calls == [] and "Text follows the call list" in bare.errors[0]


def test_lfm2_may_write_text_after_its_closed_call_list() -> None:
    """LFM2/LFM2.5's model cards show the model writing its reply's text after
    `<|tool_call_end|>`; vLLM's `lfm2` parser reads the wrapped list and keeps that text."""
    p = get_parser("pythonic")
    card = (
        '<|tool_call_start|>[get_candidate_status(candidate_id="12345")]<|tool_call_end|>'
        "Checking the current status of candidate ID 12345.<|im_end|>"
    )
    parsed = p.parse(card)
    assert [(c.name, c.arguments, c.id) for c in parsed.tool_calls] == [
        ("get_candidate_status", {"candidate_id": "12345"}, "call_0")
    ]
    assert parsed.errors == [] and parsed.text == "Checking the current status of candidate ID 12345."
    bad = p.parse("Sure.<|tool_call_start|>[lookup(query=x)]<|tool_call_end|> Looking it up.")
    assert bad.tool_calls == [] and "not a literal" in bad.errors[0] and bad.text == "Sure. Looking it up."
    answered = p.parse("<|tool_call_start|>[f(a=1)]<|tool_call_end|>Done. <answer>4</answer>")
    assert answered.answer == "4" and [c.name for c in answered.tool_calls] == ["f"]


def test_lfm2_5_line_breaks_written_raw_inside_a_string_are_read() -> None:
    """LFM2.5's chat template writes a string argument as `'` + value + `'`, escaping nothing:
    a value with a line break (code, SQL, a multi-line message) reaches the model, and so comes
    back from it, with the line break raw inside the quotes. That is not valid Python, yet the
    call is unambiguous, and vLLM's `lfm2` parser escapes such control characters before `ast`
    reads the list; the env must read the same call."""
    p = get_parser("pythonic")
    reply = "Running it.<|tool_call_start|>[python(code='x = 1\nprint(x)\r\n', n=2), f()]<|tool_call_end|><|im_end|>"
    parsed = p.parse(reply)
    assert parsed.errors == []
    assert calls(parsed) == [("python", {"code": "x = 1\nprint(x)\r\n", "n": 2}, "call_0"), ("f", {}, "call_1")]
    assert parsed.text == "Running it."
    # What Python reads already is read as before: a line continuation inside a string, a
    # triple-quoted string, a comment with an apostrophe, line breaks between arguments.
    valid = "<|tool_call_start|>[f(a='one \\\ntwo', b='''x\ny''',  # it's here\n c=\"q\")]<|tool_call_end|>"
    assert calls(p.parse(valid)) == [("f", {"a": "one two", "b": "x\ny", "c": "q"}, "call_0")]


def test_lfm2_5_real_template_calls_with_multiline_strings_read_back(tmp_path: Any) -> None:
    """The round trip through the model's own template: what LFM2.5's template writes for a
    call whose argument spans lines, the parser reads as that call."""
    trl = pytest.importorskip("trl", reason="the real chat templates come with trl")
    from pathlib import Path

    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path, with_model=False))
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "lfm2_2_5.jinja").read_text(encoding="utf-8")
    args = {"query": "SELECT name\nFROM singer\nWHERE age > 30", "limit": 5}
    call = {"type": "function", "function": {"name": "run_sql", "arguments": args}}
    user = [{"role": "user", "content": "hi"}]
    head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template([*user, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False)
    reply = whole[len(head) :]
    assert "'SELECT name\nFROM singer" in reply  # the template writes the line breaks raw
    parsed = get_parser("pythonic").parse(reply)
    assert parsed.errors == [] and [(c.name, c.arguments) for c in parsed.tool_calls] == [("run_sql", args)]


def test_lfm2_5_an_apostrophe_inside_a_string_is_read_as_vllm_reads_it() -> None:
    """LFM2.5's template writes `'` + value + `'` unescaped, so the model writes `'It's here'`.
    vLLM's `lfm2` parser closes such a string at the one later quote that makes the list valid
    Python; a trainer reading it as an error would score a served call as no call."""
    p = get_parser("pythonic")
    reply = "<|tool_call_start|>[say(text='It's here', n=1)]<|tool_call_end|>Said.<|im_end|>"
    parsed = p.parse(reply)
    assert parsed.errors == [] and calls(parsed) == [("say", {"text": "It's here", "n": 1}, "call_0")]
    assert parsed.text == "Said."
    shell = "<|tool_call_start|>[run(command='sed -n '1,9p' f.py\nwc -l f.py')]<|tool_call_end|>"
    assert calls(p.parse(shell)) == [("run", {"command": "sed -n '1,9p' f.py\nwc -l f.py"}, "call_0")]
    dq = '<|tool_call_start|>[say(text="He said "hi" twice")]<|tool_call_end|>'
    assert calls(p.parse(dq)) == [("say", {"text": 'He said "hi" twice'}, "call_0")]
    # The rule's reading where only the last quote repairs the list, as vLLM reads it too.
    two = p.parse("<|tool_call_start|>[f(a='It's', b='ok's')]<|tool_call_end|>")
    assert calls(two) == [("f", {"a": "It's', b='ok's"}, "call_0")]


@pytest.mark.parametrize(
    "block",
    [
        "[f(a='It's', b='ok')]",  # closing after `It's` or after `ok` both parse: ambiguous, as vLLM finds
        "[f(a='It's here', b=)]",  # no closing quote makes the list valid
        "[f(a='It's here')] [g(b=1)",  # the block is not a list either way
    ],
)
def test_lfm2_5_an_apostrophe_that_no_single_quote_repairs_stays_an_error(block: str) -> None:
    parsed = get_parser("pythonic").parse(f"<|tool_call_start|>{block}<|tool_call_end|>")
    assert parsed.tool_calls == [] and parsed.errors and "not valid Python" in parsed.errors[0]


def test_an_apostrophe_outside_lfm2_markers_is_still_an_error() -> None:
    # vLLM's `pythonic` and `llama4_pythonic` parsers repair nothing: neither does the bare format.
    parsed = get_parser("pythonic").parse("[say(text='It's here')]")
    assert parsed.tool_calls == [] and "not valid Python" in parsed.errors[0]


def test_lfm2_5_real_template_calls_with_apostrophes_read_back(tmp_path: Any) -> None:
    trl = pytest.importorskip("trl", reason="the real chat templates come with trl")
    from pathlib import Path

    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path, with_model=False))
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "lfm2_2_5.jinja").read_text(encoding="utf-8")
    # The string with apostrophes comes last: after it, a later string's closing quote would
    # repair the list as well (`message='…, to=\'bob'`), which vLLM finds ambiguous and drops.
    args = {"to": "bob", "message": "It's done, isn't it?\nSee 'notes'."}
    call = {"type": "function", "function": {"name": "send", "arguments": args}}
    user = [{"role": "user", "content": "hi"}]
    head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template([*user, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False)
    reply = whole[len(head) :]
    assert "'It's done" in reply  # the template writes the apostrophes unescaped
    parsed = get_parser("pythonic").parse(reply)
    assert parsed.errors == [] and [(c.name, c.arguments) for c in parsed.tool_calls] == [("send", args)]


def test_lfm2_5_zero_padded_integers_are_read_as_vllm_reads_them() -> None:
    """`month=07` is not valid Python (leading zeros), yet LFM2 models write dates so; vLLM's
    `lfm2` parser strips the zeros of such an integer outside strings, and so must the env."""
    p = get_parser("pythonic")
    parsed = p.parse("<|tool_call_start|>[get_date(month=07, day=09, year=2025, tz='07:00')]<|tool_call_end|>")
    assert parsed.errors == [] and calls(parsed) == [
        ("get_date", {"month": 7, "day": 9, "year": 2025, "tz": "07:00"}, "call_0")
    ]
    # Valid literals stay as Python reads them: zero, floats, exponents, hex, a padded float.
    valid = "<|tool_call_start|>[f(a=00, b=07.5, c=1e07, d=0x07, e=1.07, g=[01, 0])]<|tool_call_end|>"
    assert calls(p.parse(valid)) == [("f", {"a": 0, "b": 7.5, "c": 1e7, "d": 7, "e": 1.07, "g": [1, 0]}, "call_0")]
    # With an apostrophe to repair as well, both repairs apply, as in vLLM.
    both = p.parse("<|tool_call_start|>[note(month=07, text='It's due')]<|tool_call_end|>")
    assert calls(both) == [("note", {"month": 7, "text": "It's due"}, "call_0")]
    # Outside LFM2's markers the format is Llama's, whose vLLM parsers repair nothing.
    assert "leading zeros" in p.parse("[get_date(month=07)]").errors[0]


def test_lfm2_5_parameters_named_after_python_keywords_are_read_as_vllm_reads_them() -> None:
    """`convert(from='USD', to='EUR')` is a schema LFM2 sees often, and `from=` is not valid
    Python; vLLM's `lfm2` parser renames such parameters to parse the list and restores them."""
    p = get_parser("pythonic")
    parsed = p.parse(
        "<|tool_call_start|>[convert(amount=5, from='USD', to='EUR'), f(class=1, x='from=2')]<|tool_call_end|>"
    )
    assert parsed.errors == [] and calls(parsed) == [
        ("convert", {"amount": 5, "from": "USD", "to": "EUR"}, "call_0"),
        ("f", {"class": 1, "x": "from=2"}, "call_1"),
    ]
    # An error names the parameter as the model wrote it.
    bad = p.parse("<|tool_call_start|>[convert(from=usd)]<|tool_call_end|>")
    assert bad.tool_calls == [] and "the value of from is" in bad.errors[0]
    # Keyword values (True, None) and `==` are not parameters; the bare Llama format renames nothing.
    assert calls(p.parse("<|tool_call_start|>[f(in=True, b=None)]<|tool_call_end|>")) == [
        ("f", {"in": True, "b": None}, "call_0")
    ]
    assert "not valid Python" in p.parse("[convert(from='USD')]").errors[0]
