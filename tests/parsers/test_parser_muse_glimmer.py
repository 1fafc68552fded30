"""The Muse Glimmer parser: messages and recipients, where the turn ends, values read by type,
answers, every error, round trips, the real chat template, adversarial input, an env run and
the example."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from _examples import load_example
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import detect_parser, get_parser, template_mismatch
from toolenv.parsers.muse_glimmer import MuseGlimmerParser
from toolenv.types import ParsedAction, ToolResult

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

START, MESSAGE, EOM, EOT, EOS = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>", "<|end_of_text|>"
FRAMING = (START, MESSAGE, EOM, EOT, EOS)


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


class Now(toolenv.Tool):
    """What time it is."""

    name = "clock.now"

    class Args(BaseModel):
        pass

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text="noon")


PARSER = MuseGlimmerParser()
BOUND = PARSER.bind([Search(), Now()])


def atem(name: str, *pairs: tuple[str, str]) -> str:
    """An ATEM block as the template writes it, with the values written as given."""
    params = "".join(f'<atem:parameter name="{k}">{v}</atem:parameter>\n' for k, v in pairs)
    return f'<atem:function_calls>\n<atem:invoke name="{name}">\n{params}</atem:invoke>\n</atem:function_calls>'


def msg(recipient: str, body: str) -> str:
    return f"{START}assistant to={recipient}{MESSAGE}{body}"


def reply(*messages: str) -> str:
    """Messages as a reply: the first one's `<|start|>assistant` is the generation prompt's, and
    the template puts `<|eom|>` between them."""
    return EOM.join(messages).removeprefix(f"{START}assistant")


def in_tool_message(body: str) -> str:
    return msg("search", body)


def summary(action: ParsedAction) -> list[tuple[str, dict[str, Any], str]]:
    return [(c.name, c.arguments, c.id) for c in action.tool_calls]


def as_json(value: Any) -> str:
    """JSON that tells 1, 1.0 and True apart (== does not)."""
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------- messages and recipients
def test_a_turn_as_the_template_writes_it() -> None:
    text = reply(
        msg("self", "The user wants cats."),
        msg("search", atem("search", ("query", "cats"), ("limit", "2"))),
        msg("clock.now", atem("clock.now")),
    )
    assert text.startswith(" to=self<|message|>The user wants cats.<|eom|><|start|>assistant to=search")
    action = BOUND.parse(text)
    assert action.errors == [] and action.answer is None and action.text == "The user wants cats."
    assert summary(action) == [("search", {"query": "cats", "limit": 2}, "call_0"), ("clock.now", {}, "call_1")]


@pytest.mark.parametrize(
    "body",
    [
        '<atem:invoke name="f">\n<atem:parameter name="a">1</atem:parameter>\n</atem:invoke>',  # no wrapper
        "<atem:invoke name='f'><atem:parameter name='a'>1</atem:parameter></atem:invoke>",  # single quotes
        '<atem:invoke  name = "f" >\n\n<atem:parameter\nname="a" >1</atem:parameter>\n\n</atem:invoke>',
        '<atem:function_calls><atem:invoke name=" f "><atem:parameter name=" a ">1</atem:parameter></atem:invoke>',
    ],
)
def test_the_forms_a_call_takes(body: str) -> None:
    action = PARSER.parse(msg("f", body))
    assert action.errors == [] and action.text == "" and summary(action) == [("f", {"a": 1}, "call_0")]


def test_one_block_may_hold_several_invokes() -> None:
    block = atem("a", ("x", "1")).replace(
        "</atem:invoke>\n", '</atem:invoke>\n<atem:invoke name="b">\n</atem:invoke>\n'
    )
    assert summary(PARSER.parse(msg("a", block))) == [("a", {"x": 1}, "call_0"), ("b", {}, "call_1")]


@pytest.mark.parametrize(
    "head",
    [" to=self" + MESSAGE, msg("user", ""), f"{START}assistant{MESSAGE}", MESSAGE, f"{START}{MESSAGE}"],
)
def test_markup_to_self_user_or_no_one_is_not_a_call(head: str) -> None:
    body = f"I could {atem('search', ('query', 'x'))} but will not."
    assert BOUND.parse(head + body + EOT) == ParsedAction(text=body)


def test_the_invoke_names_the_call_not_the_recipient() -> None:
    # The recipient may be a namespace (the prompt lists "search.*"); the call is the invoke's.
    action = PARSER.parse(msg("search.*", atem("search", ("query", "x"))))
    assert summary(action) == [("search", {"query": "x"}, "call_0")] and action.errors == []


@pytest.mark.parametrize(
    ("name", "bound", "unbound"),
    [
        ("search.search", "search", "search.search"),  # a doubled name, as "search.*" invites
        ("clock.now", "clock.now", "clock.now"),  # a tool with a namespace is its own name
        ("nope.nope", "nope.nope", "nope.nope"),  # not a tool: left as written
        ("x.search", "x.search", "x.search"),
        ("search.search.search", "search.search.search", "search.search.search"),
    ],
)
def test_a_doubled_name_is_the_env_tools_when_bound(name: str, bound: str, unbound: str) -> None:
    text = msg(name, atem(name))
    assert [c.name for c in BOUND.parse(text).tool_calls] == [bound]
    assert [c.name for c in PARSER.parse(text).tool_calls] == [unbound]


def test_a_lost_eom_does_not_swallow_the_next_message() -> None:
    call = atem("search", ("query", "x"))
    for text in (
        f" to=self{MESSAGE}thinking{msg('search', call)}",  # the next <|start|> ends the message
        f" to=self{MESSAGE}thinking to=search{MESSAGE}{call}",  # a header without <|start|>
        f" to=self{MESSAGE}thinking assistant to=search{MESSAGE}{call}",
        f"{MESSAGE}thinking to=search{MESSAGE}{call}",
    ):
        action = PARSER.parse(text)
        assert summary(action) == [("search", {"query": "x"}, "call_0")] and action.text == "thinking", text


def test_a_reply_may_start_with_its_call() -> None:
    action = BOUND.parse(f" to=search{MESSAGE}{atem('search', ('query', 'x'))}")
    assert summary(action) == [("search", {"query": "x"}, "call_0")] and action.text == ""


# ---------------------------------------------------------------- where the turn ends
@pytest.mark.parametrize(
    "end",
    [EOT, EOS, f"{START}tool search{MESSAGE}", f"{START}user{MESSAGE}", f"{START}system{MESSAGE}", f"{START}tool"],
)
def test_nothing_after_the_end_of_the_turn_is_read(end: str) -> None:
    text = (
        reply(msg("self", "go"), msg("search", atem("search", ("query", "a"))))
        + end
        + '<tool_output name="search">\nmade up\n</tool_output>'
        + EOT
        + msg("search", atem("search", ("query", "b")))
        + msg("user", "<answer>z</answer>")
    )
    action = PARSER.parse(text)
    assert summary(action) == [("search", {"query": "a"}, "call_0")] and action.answer is None
    assert action.text == "go"


def test_eom_does_not_end_the_turn() -> None:
    text = reply(msg("self", "a"), msg("search", atem("search")), msg("user", "It is <answer>4</answer>."))
    action = PARSER.parse(text + EOT)
    assert [c.name for c in action.tool_calls] == ["search"] and action.answer == "4" and action.text == "a\nIt is ."


def test_a_reply_decoded_without_special_tokens_still_gives_its_calls() -> None:
    # skip_special_tokens=True drops the framing: the calls are read from the bare ATEM blocks,
    # and the recipients run into the text.
    text = reply(msg("self", "Think."), msg("search", atem("search", ("query", "x"), ("limit", "3"))))
    for token in FRAMING:
        text = text.replace(token, "")
    action = BOUND.parse(text)
    assert action.errors == [] and summary(action) == [("search", {"query": "x", "limit": 3}, "call_0")]
    assert action.text == "to=selfThink.assistant to=search"


# ---------------------------------------------------------------- values
def test_values_are_read_by_type_when_bound() -> None:
    text = msg(
        "search",
        atem(
            "search",
            ("query", "SELECT [a] FROM t\nWHERE x < 3 AND y = 'z' </atem:invoke>"),  # stays text
            ("limit", "5"),
            ("score", "2.5"),
            ("exact", "true"),
            ("tags", '["a", "b"]'),
            ("window", '{"start": 1, "end": null}'),
            ("options", '{"deep": {"k": [1, {"x": true}]}}'),
            ("note", "null"),
        ),
    )
    action = BOUND.parse(text)
    assert action.errors == []
    assert [(c.name, as_json(c.arguments)) for c in action.tool_calls] == [
        (
            "search",
            as_json(
                {
                    "query": "SELECT [a] FROM t\nWHERE x < 3 AND y = 'z' </atem:invoke>",
                    "limit": 5,
                    "score": 2.5,
                    "exact": True,
                    "tags": ["a", "b"],
                    "window": {"start": 1, "end": None},
                    "options": {"deep": {"k": [1, {"x": True}]}},
                    "note": None,
                }
            ),
        )
    ]


@pytest.mark.parametrize(
    "value",
    [
        "42",
        "[1, 2]",
        '{"a": 1}',
        "true",
        "null",
        '"quoted"',
        "  padded \n",
        "",
        '<atem:invoke name="x">',
        "</atem:invoke>",
    ],
)
def test_a_string_parameter_keeps_exactly_what_was_written(value: str) -> None:
    (only,) = BOUND.parse(msg("search", atem("search", ("query", value), ("note", value)))).tool_calls
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
        ("tags", "['a', 'b']", "['a', 'b']"),  # not JSON: stays text (never eval'd)
        ("window", "{start: 1}", "{start: 1}"),
        ("limit", "[" * 10_000, "[" * 10_000),  # too deep for the decoder
        ("limit", "1" * 5000, "1" * 5000),  # past Python's 4300-digit limit
        ("either", "5", 5),  # a union: JSON when it is JSON
        ("either", "five", "five"),
    ],
)
def test_values_that_do_not_decode_stay_text(key: str, written: str, read: Any) -> None:
    (only,) = BOUND.parse(msg("search", atem("search", ("query", "q"), (key, written)))).tool_calls
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
        (only,) = parser.parse(msg("other", atem("other", ("v", written)))).tool_calls
        assert as_json(only.arguments["v"]) == as_json(read)
    (only,) = BOUND.parse(msg("search", atem("search", ("query", "q"), ("unknown_key", written)))).tool_calls
    assert as_json(only.arguments["unknown_key"]) == as_json(read)


# ---------------------------------------------------------------- answers
def test_the_answer_is_read_outside_reasoning() -> None:
    call = atem("search", ("query", "<answer>no</answer>"))  # inside a value: never the answer
    text = reply(
        msg("self", "maybe <answer>1</answer>"),
        msg("search", f"Checking. <answer>2</answer>{call}"),  # beside a call
        msg("user", "So <answer>3</answer>."),
    )
    action = PARSER.parse(text)
    assert action.answer == "3" and action.text == "maybe <answer>1</answer>\nChecking.\nSo ."
    assert action.tool_calls[0].arguments == {"query": "<answer>no</answer>"}
    assert PARSER.parse(text.replace("<answer>3</answer>", "three")).answer == "2"
    assert PARSER.parse(f"Outside <answer>4</answer> {msg('self', 'x')}").answer == "4"
    assert PARSER.parse(msg("self", "only <answer>1</answer>")).answer is None
    assert MuseGlimmerParser(answer_tag=False).parse(msg("user", "<answer>x</answer>")).answer is None
    assert PARSER.parse("just text") == ParsedAction(text="just text")


# ---------------------------------------------------------------- errors
HOW = 'Write each call as <atem:invoke name="NAME"> with each argument as <atem:parameter name="KEY">VALUE'
PARAM_A = '<atem:parameter name="query">a</atem:parameter>'


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (in_tool_message("<atem:invoke>\n</atem:invoke>"), "Tool call 1: the <atem:invoke> tag is malformed"),
        (in_tool_message("<atem:invoke name=search></atem:invoke>"), "the <atem:invoke> tag is malformed"),
        (in_tool_message(f'<atem:invoke name="search"\n{PARAM_A}</atem:invoke>'), "<atem:invoke> tag is malformed"),
        (in_tool_message('<atem:invoke name="search></atem:invoke>'), "the <atem:invoke> tag is malformed"),
        (in_tool_message('<atem:invoke name="  "></atem:invoke>'), "Tool call 1: the <atem:invoke> tag has an empty"),
        (
            in_tool_message('<atem:invoke name="search"><atem:parameter name=query>a</atem:parameter></atem:invoke>'),
            "Tool call 1 (search): an <atem:parameter> tag is malformed",
        ),
        (
            in_tool_message('<atem:invoke name="search"><atem:parameter name="">a</atem:parameter></atem:invoke>'),
            "Tool call 1 (search): an <atem:parameter> has an empty name",
        ),
        (
            in_tool_message('<atem:invoke name="search"><atem:parameter name="query">a</atem:invoke>'),
            "Tool call 1 (search): the parameter 'query' is not closed with </atem:parameter>",
        ),
        (in_tool_message(f'<atem:invoke name="search">{PARAM_A}'), "Tool call 1 (search) is not closed with"),
        (
            in_tool_message(f'<atem:function_calls>\n<atem:invoke name="search">\n{PARAM_A}\n</atem:function_calls>'),
            "Tool call 1 (search) is not closed with </atem:invoke>",
        ),
        (
            in_tool_message(f'<atem:invoke name="search">{PARAM_A}{EOM}{msg("user", "ok")}'),
            "Tool call 1 (search) is not closed with </atem:invoke>",
        ),
        (
            in_tool_message(f'<atem:invoke name="search">{PARAM_A}{PARAM_A}</atem:invoke>'),
            "Tool call 1 (search): argument 'query' is given twice.",
        ),
        (
            in_tool_message(f'<atem:invoke name="search">please {PARAM_A}</atem:invoke>'),
            "Tool call 1 (search): unexpected text 'please <atem:parameter",
        ),
        (in_tool_message("I will search for it."), "Tool call 1 (search): the message to=search holds no"),
        (f"{START}assistant to=search{EOT}", "Tool call 1 (search): the header to=search is not followed by"),
        (f" to=self{MESSAGE}x{EOM}{START}assistant to=search", "the header to=search is not followed by <|message|>"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = BOUND.parse(text)
    assert action.tool_calls == [] and len(action.errors) == 1, action
    assert error in action.errors[0], action.errors
    assert HOW in action.errors[0] or "given twice" in error
    assert len(action.errors[0].splitlines()) == 1


def test_a_good_call_beside_bad_ones_still_runs() -> None:
    text = reply(
        msg("self", "several"),
        msg("search", '<atem:invoke name="search">\n' + atem("search", ("query", "ok"))),  # 1 unclosed, 2 good
        msg("search", "no call"),  # 3
        msg("f", atem("f", ("a", "1"), ("a", "2"))),  # 4
        msg("g", atem("g", ("b", "[1]"))),  # 5
    )
    action = PARSER.parse(text)
    assert summary(action) == [("search", {"query": "ok"}, "call_1"), ("g", {"b": [1]}, "call_4")]
    assert [e.split(" ", 3)[2] for e in action.errors] == ["1", "3", "4"]  # numbered by position in the turn
    assert action.text == "several\nno call"  # a message to a tool without a call stays in the text


def test_errors_name_the_call_on_one_line() -> None:
    text = msg("x", '<atem:invoke name="two\nlines">\nstray</atem:invoke>')
    (error,) = PARSER.parse(text).errors
    assert error.startswith("Tool call 1 (two): unexpected text 'stray</atem:invoke>'") and "\n" not in error


# ---------------------------------------------------------------- adversarial input
MB = 1_000_000


@pytest.mark.parametrize(
    "text",
    [
        START * (MB // len(START)),
        MESSAGE * (MB // len(MESSAGE)),
        (" to=f" + MESSAGE) * (MB // 16),
        ("<|start|>assistant to=f") * (MB // 22),
        "<atem:invoke" * (MB // 12),
        '<atem:invoke name="' * (MB // 19),
        ' to=f<|message|><atem:invoke name="f">' + '<atem:parameter name="a">' * (MB // 25),
        ' to=f<|message|><atem:invoke name="f">' + " " * MB,
        ' to=f<|message|><atem:invoke name="f"' + " " * MB,
        ' to=f<|message|><atem:invoke name="' + "x" * MB,
        " to=f<|message|>" + '<atem:invoke name="f">' * (MB // 22),
        "<|" * (MB // 2),
        " to=" + " " * MB + MESSAGE,
    ],
)
def test_a_megabyte_of_repeated_fragments_parses(text: str) -> None:
    action = BOUND.parse(text)
    assert action.tool_calls == [] and all(len(e) < 1000 for e in action.errors[:10])


@pytest.mark.parametrize(
    "text",
    [
        " to=self<|message|>" + atem("f") * 20_000,  # reasoning: no calls
        "<answer>" * (MB // 8),
        "<atem:function_calls>" * (MB // 21),
        EOT * (MB // 7) + atem("f"),
    ],
)
def test_a_megabyte_without_calls_has_no_errors(text: str) -> None:
    action = BOUND.parse(text)
    assert action.tool_calls == [] and action.errors == [] and action.answer is None


def test_many_calls_and_arguments_parse() -> None:
    action = PARSER.parse(reply(*(msg("f", atem("f", ("i", str(i)))) for i in range(20_000))))
    assert action.errors == [] and len(action.tool_calls) == 20_000
    assert action.tool_calls[-1].arguments == {"i": 19_999} and action.tool_calls[-1].id == "call_19999"
    (only,) = PARSER.parse(msg("f", atem("f", *((f"k{i}", str(i)) for i in range(30_000))))).tool_calls
    assert len(only.arguments) == 30_000 and only.arguments["k29999"] == 29_999


markers = st.sampled_from(
    [
        *(START, MESSAGE, EOM, EOT, EOS, "assistant", " to=self", " to=user", " to=f", "to=", "tool", "user"),
        *(
            "<atem:function_calls>",
            "</atem:function_calls>",
            '<atem:invoke name="f">',
            "<atem:invoke",
            "</atem:invoke>",
        ),
        *('<atem:parameter name="a">', "<atem:parameter", "</atem:parameter>", " name=", '"', "'", ">", "<"),
        *("<answer>", "</answer>", "{", "[", "1", "true", "null", "\n", " ", "\x00", "😀", "\ud800"),
    ]
)
near_valid = st.lists(markers | st.text(max_size=5), max_size=40).map("".join)


@SETTINGS
@given(near_valid | st.text())
def test_no_input_makes_it_raise(text: str) -> None:
    for parser in (PARSER, BOUND, MuseGlimmerParser(answer_tag=False)):
        action = parser.parse(text)
        assert action == parser.parse(text)
        assert all(isinstance(e, str) and e and len(e.splitlines()) == 1 for e in action.errors)
        assert all(isinstance(c.name, str) and c.name and isinstance(c.arguments, dict) for c in action.tool_calls)
        assert len(action.tool_calls) <= text.count("<atem:invoke")


GOOD = '<atem:invoke name="f">\n<atem:parameter name="a">1</atem:parameter>\n</atem:invoke>'
BAD = [
    "<atem:invoke>\n</atem:invoke>",
    '<atem:invoke name="">\n</atem:invoke>',
    '<atem:invoke name="f">\n<atem:parameter a>1</atem:parameter>\n</atem:invoke>',
    '<atem:invoke name="f">\n<atem:parameter name="">1</atem:parameter>\n</atem:invoke>',
    '<atem:invoke name="f">\n<atem:parameter name="a">1</atem:parameter><atem:parameter name="a">2</atem:parameter>\n'
    "</atem:invoke>",
    '<atem:invoke name="f">\nstray\n</atem:invoke>',
    '<atem:invoke name="f">\n<atem:parameter name="a">1</atem:parameter>\n',  # not closed
]
BETWEEN = ["", "\n", " text ", f"{EOM}{START}assistant to=f{MESSAGE}", "</atem:function_calls>\n<atem:function_calls>"]


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from([GOOD, *BAD]), st.sampled_from(BETWEEN)), min_size=1, max_size=12))
def test_every_opened_call_is_a_call_or_an_error(units: list[tuple[str, str]]) -> None:
    text = " to=f" + MESSAGE + "".join(unit + between for unit, between in units[:-1]) + units[-1][0]
    action = PARSER.parse(text)
    assert [c.id for c in action.tool_calls] == [f"call_{i}" for i, (u, _) in enumerate(units) if u == GOOD]
    assert all(c.arguments == {"a": 1} for c in action.tool_calls)
    assert len(action.errors) == sum(u != GOOD for u, _ in units)


# ---------------------------------------------------------------- writing calls
def test_format_call_writes_the_template_layout() -> None:
    assert PARSER.format_call("lookup", {"query": "paris"}) == (
        '<|start|>assistant to=lookup<|message|><atem:function_calls>\n<atem:invoke name="lookup">\n'
        '<atem:parameter name="query">paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls>'
    )
    assert PARSER.format_call("now", {}, "call_7") == msg("now", atem("now"))
    args = {"query": "42", "limit": 3, "tags": ["x"], "window": {"start": 1}, "exact": False, "note": None}
    assert BOUND.format_call("search", args) == msg(
        "search",
        atem(
            "search",
            ("query", "42"),  # a string parameter: raw, as the template writes it
            ("limit", "3"),
            ("tags", '["x"]'),
            ("window", '{"start": 1}'),
            ("exact", "false"),
            ("note", "null"),
        ),
    )


def test_format_call_writes_json_where_raw_text_would_read_back_differently() -> None:
    # unbound, "42" written raw would read back as 42: it is written as a JSON string
    assert PARSER.format_call("f", {"a": "42"}) == msg("f", atem("f", ("a", '"42"')))
    args = {"a": "x </atem:parameter> <|eot|> <|start|>", "b": ["</atem:parameter>"], "c": " padded "}
    text = PARSER.format_call("f", args)
    assert text is not None and text.count("</atem:parameter>") == 3 and text.count("<|") == 2  # its own framing
    assert "\\u003c/atem:parameter>" in text and "\\u003c|eot|>" in text
    assert PARSER.parse(text).tool_calls[0].arguments == args
    (only,) = BOUND.parse(BOUND.format_call("search", {"query": "q", "limit": "7"}) or "").tool_calls
    assert only.arguments == {"query": "q", "limit": "7"}  # a string for an int parameter stays a string


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("", {}),
        ("two words", {}),
        (" f", {}),
        ("f\n", {}),
        ('f"', {}),
        ("f<|eot|>", {}),
        ("self", {}),  # its message would be reasoning
        ("user", {}),  # ... or the reply
        ("search.search", {}),  # bound: read back as `search`
        ("f", {"": 1}),
        ("f", {" a": 1}),
        ("f", {'a"': 1}),
        ("f", {"a<|start|>": 1}),
        ("f", {"a": float("nan")}),
        ("f", {"a": 10**5000}),
        ("f", {"a": {1, 2}}),
        ("f", [1]),
        ("search", {"query": 5}),  # a number for a string parameter would read back as text
        ("search", {"query": "a</atem:parameter>"}),  # a string parameter cannot carry its closing tag
        ("search", {"query": "a<|eom|>"}),  # ... nor a framing token
        ("search", {"query": "q", "note": "null"}),  # `str | None`: written null, it would read back as None
    ],
)
def test_format_call_declines_what_cannot_be_read_back(name: str, args: Any) -> None:
    assert BOUND.format_call(name, args) is None


names = st.text(st.characters(categories=("L", "N"), include_characters="_-.:"), min_size=1, max_size=20) | st.text(
    min_size=1, max_size=12
)
keys = st.text(st.characters(categories=("L", "N"), include_characters="_- "), min_size=1, max_size=8) | st.text(
    min_size=1, max_size=8
)
strings = st.lists(st.text(max_size=6) | markers, max_size=4).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(strings, kids, max_size=3),
    max_leaves=8,
)


def writable_name(name: str) -> bool:
    return bool(name) and len(name.split()) == 1 and name == name.split()[0] and name not in ("self", "user")


@SETTINGS
@given(st.lists(st.tuples(names, st.dictionaries(keys, json_values, max_size=4)), min_size=1, max_size=3))
def test_format_call_round_trips(calls: list[tuple[str, dict[str, Any]]]) -> None:
    """What format_call writes (an agent rendering a server's native calls) reads back as exactly
    those calls, 1, 1.0 and True told apart, one message each as the template joins them; it
    declines only names and keys the format cannot carry."""
    written = [(n, a, PARSER.format_call(n, a)) for n, a in calls]
    for name, args, text in written:
        carried = writable_name(name) and '"' not in name and "<|" not in name
        carried = carried and all(k == k.strip() and '"' not in k and "<|" not in k for k in args)
        assert (text is not None) == carried
    kept = [(n, a) for n, a, text in written if text is not None]
    action = PARSER.parse(EOM.join(text for *_, text in written if text is not None))
    assert action.errors == [] and action.text == ""
    assert [(c.name, as_json(c.arguments), c.id) for c in action.tool_calls] == [
        (n, as_json(a), f"call_{i}") for i, (n, a) in enumerate(kept)
    ]


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
        breaks = ("</atem:parameter>", START, MESSAGE, EOM, EOT, EOS)
        assert args.get("note") == "null" or any(t in v for v in strs for t in breaks)
        return
    (only,) = BOUND.parse(text).tool_calls
    assert as_json(only.arguments) == as_json(args)


# ---------------------------------------------------------------- results, instructions, registration
def test_results_are_written_as_the_template_writes_tool_messages() -> None:
    results = [
        ToolResult(text="20 degrees", name="get_weather", call_id="call_0"),
        ToolResult(text="noon", name="clock.now", call_id="call_1"),
        ToolResult(text="bad", name="parser", is_error=True),  # answers no call: the env speaks
        ToolResult(text="worse", is_error=True),
    ]
    assert PARSER.format_results(results) == (
        '<|start|>tool get_weather<|message|><tool_output name="get_weather">\n20 degrees\n</tool_output><|eot|>'
        '<|start|>tool clock.now<|message|><tool_output name="clock.now">\nnoon\n</tool_output><|eot|>'
        "<|start|>user<|message|>bad\nworse<|eot|>"
    )
    assert PARSER.format_results([ToolResult(text="x", call_id="c9")]) == (
        '<|start|>tool c9<|message|><tool_output name="c9">\nx\n</tool_output><|eot|>'  # no name: the call's id
    )
    assert PARSER.format_errors(["x"]) == "<|start|>user<|message|>x<|eot|>"
    assert PARSER.format_results([]) == ""


def test_instructions_are_the_templates_tool_section() -> None:
    text = PARSER.instructions([Search(), Now()])
    assert text.startswith("In this environment you have access to a set of tools")
    assert '// Tool metadata\n{"name": "search", "description": ""}\n{"name": "clock", "description": ""}\n' in text
    schema = Search().schema()["function"]
    line = {"name": "search", "description": "Search the catalogue.", "parameters": schema["parameters"]}
    assert f"// Function schemas\n{json.dumps(line, ensure_ascii=False)}\n" in text
    assert '\n\n# Valid recipients: "self", "search.*", "clock.*", "user".\n' in text
    assert text.endswith("When you know the final answer, write it as <answer>...</answer> in your message to=user.")
    assert "<answer>" not in MuseGlimmerParser(answer_tag=False).instructions([Search()])
    assert MuseGlimmerParser(answer_tag=False).instructions([]) == ""


def test_the_parser_is_registered_with_its_traits() -> None:
    parser = get_parser("muse_glimmer")
    assert isinstance(parser, MuseGlimmerParser) and parser.name == "muse_glimmer"
    assert parser.special_tokens and parser.tool_messages and parser.stop == (EOT,)
    quiet = get_parser("muse_glimmer", answer_tag=False)
    assert isinstance(quiet, MuseGlimmerParser) and quiet.answer_tag is False
    assert parser.bind([]) is not parser and BOUND is not PARSER  # bound copies, never shared state


def test_an_env_with_the_muse_glimmer_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Search()], tasks=[{"question": "Find cats", "answer": "3"}], parser="muse_glimmer", max_turns=6
    )
    obs, _ = env.reset(seed=0)
    assert '# Valid recipients: "self", "search.*", "user".' in obs and "Find cats" in obs
    call = atem("search", ("query", "cats"), ("limit", "2"), ("tags", '["pets"]'))
    obs, reward, term, trunc, info = env.step(reply(msg("self", "search"), msg("search", call)))
    assert obs == (
        '<|start|>tool search<|message|><tool_output name="search">\n'
        "cats limit=2 tags=['pets']\n</tool_output><|eot|>"
    )
    assert not term and info["messages"][1].role == "tool" and info["messages"][1].tool_call_id == "call_0"
    obs, *_ = env.step(msg("search.search", atem("search.search", ("query", "cats"), ("limit", "two"))))
    assert obs.startswith('<|start|>tool search<|message|><tool_output name="search">\nInvalid arguments for tool')
    obs, *_ = env.step(msg("search", atem("search", ("query", "a"), ("query", "b"))))
    assert obs.startswith("<|start|>user<|message|>Tool call 1 (search): argument 'query' is given twice.")
    obs, reward, term, trunc, info = env.step(reply(msg("self", "done"), msg("user", "Three: <answer>3</answer>")))
    assert term and reward == 1.0 and info["answer"] == "3"


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    load_example("muse_glimmer_example").main()
    out = capsys.readouterr().out
    assert out.startswith("In this environment you have access to a set of tools")
    assert '# Valid recipients: "self", "forecast.*", "max_of.*", "user".' in out
    assert "--- call_0: forecast({'city': 'Paris', 'days': 2})\n--- text: 'I need the next two days in Paris.'" in out
    assert "--- call_0: max_of({'values': [18, 21]})" in out  # `max_of.max_of`, read as the env's tool
    assert (
        "--- observation: '<|start|>tool max_of<|message|><tool_output name=\"max_of\">\\n21\\n</tool_output><|eot|>'"
        in out
    )
    assert "reward=1.0 terminated=True answer='21'" in out


# ---------------------------------------------------------------- the real chat template
@pytest.fixture(scope="module")
def templates() -> Path:
    trl = pytest.importorskip("trl", reason="Muse Glimmer's chat template comes with trl (pip install toolenv[trl])")
    return Path(trl.__file__).parent / "chat_templates"


@pytest.fixture(scope="module")
def muse_tok(templates: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("tok"), with_model=False))
    tok.chat_template = (templates / "muse_glimmer.jinja").read_text(encoding="utf-8")
    return tok


TOOLS = [Search(), Now()]
USER: list[dict[str, Any]] = [{"role": "user", "content": "Find cats"}]
REAL_ARGS: dict[str, Any] = {
    "query": 'cats & "dogs" <3\n  second line ',
    "limit": 7,
    "score": 2.5,
    "exact": True,
    "tags": ["pets", "a b", "é"],
    "window": {"start": 1, "end": None},
    "options": {"deep": {"k": [1, 2.5, {"x": True}]}},
    "note": None,
}
REAL_CALLS: list[dict[str, Any]] = [
    {"id": "a", "type": "function", "function": {"name": "search", "arguments": REAL_ARGS}},
    {"id": "b", "type": "function", "function": {"name": "search", "arguments": {"query": "42"}}},
    {"id": "c", "type": "function", "function": {"name": "clock.now", "arguments": {}}},
]


def render(tok: Any, messages: list[dict[str, Any]], **kw: Any) -> str:
    return str(tok.apply_chat_template(messages, tools=[t.schema() for t in TOOLS], tokenize=False, **kw))


def test_the_real_template_is_read_by_muse_glimmer_and_not_by_hermes(muse_tok: Any) -> None:
    assert template_mismatch(get_parser("muse_glimmer"), muse_tok) is None
    problem = template_mismatch(get_parser("hermes"), muse_tok)
    assert problem is not None and '<atem:invoke name="lookup">' in problem and "'muse_glimmer' reads it" in problem
    assert detect_parser(muse_tok) == "muse_glimmer"


def test_calls_rendered_by_the_real_template_read_back_exactly(muse_tok: Any) -> None:
    head = render(muse_tok, USER, add_generation_prompt=True)
    assistant = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Search, then the time.",
        "tool_calls": REAL_CALLS,
    }
    whole = render(muse_tok, [*USER, assistant])
    assert head.endswith("<|start|>assistant") and whole.startswith(head)
    action = BOUND.parse(whole[len(head) :])
    assert action.errors == [] and action.text == "Search, then the time."
    assert [(c.name, as_json(c.arguments), c.id) for c in action.tool_calls] == [
        ("search", as_json(REAL_ARGS), "call_0"),
        ("search", as_json({"query": "42"}), "call_1"),  # a string parameter: "42" stays a string
        ("clock.now", "{}", "call_2"),
    ]
    # ... and format_call writes what the template writes, message for message
    written = [BOUND.format_call(c["function"]["name"], c["function"]["arguments"]) or "" for c in REAL_CALLS]
    reasoning = "<|start|>assistant to=self<|message|>Search, then the time.<|eom|>"
    assert whole[len(head) - len("<|start|>assistant") :] == reasoning + EOM.join(written) + EOT


def test_a_reply_to_the_user_is_the_answer(muse_tok: Any) -> None:
    head = render(muse_tok, USER, add_generation_prompt=True)
    assistant = {"role": "assistant", "content": "Three. <answer>3</answer>", "reasoning_content": "Counted."}
    action = PARSER.parse(render(muse_tok, [*USER, assistant])[len(head) :])
    assert action == ParsedAction(answer="3", text="Counted.\nThree.")


def test_results_are_what_the_real_template_writes_for_tool_messages(muse_tok: Any) -> None:
    turn: list[dict[str, Any]] = [*USER, {"role": "assistant", "content": "", "tool_calls": REAL_CALLS}]
    tools = [
        {"role": "tool", "tool_call_id": "a", "content": "one"},  # the template finds the name by the id
        {"role": "tool", "name": "search", "content": "two\nlines"},
        {"role": "tool", "tool_call_id": "zz", "content": "three"},  # no such call: named by its id
    ]
    head, whole = render(muse_tok, turn), render(muse_tok, [*turn, *tools])
    results = [
        ToolResult(text="one", name="search", call_id="a"),
        ToolResult(text="two\nlines", name="search", call_id="b"),
        ToolResult(text="three", call_id="zz"),
    ]
    assert whole[len(head) :] == PARSER.format_results(results)


def test_instructions_are_the_real_templates_system_prompt(muse_tok: Any) -> None:
    system = render(muse_tok, USER).split("Reasoning strength: high.\n\n", 1)[1].split(EOT, 1)[0]
    assert MuseGlimmerParser(answer_tag=False).instructions(TOOLS) == system


def test_the_training_template_writes_the_same_text(muse_tok: Any, templates: Path) -> None:
    # TRL's `_training` variant adds {% generation %} marks for assistant-only loss: the text a
    # model is trained on is the text it is served with.
    training = copy.deepcopy(muse_tok)
    training.chat_template = (templates / "muse_glimmer_training.jinja").read_text(encoding="utf-8")
    turn: list[dict[str, Any]] = [
        *USER,
        {"role": "assistant", "content": "", "reasoning_content": "x", "tool_calls": REAL_CALLS},
    ]
    tools = [{"role": "tool", "tool_call_id": "a", "content": "one"}]
    assert render(training, [*turn, *tools]) == render(muse_tok, [*turn, *tools])
