"""Property-based proof that no input string makes the built-in parsers raise.

Strategies: arbitrary unicode text, control characters, near-valid inputs built
from the formats' own fragments (tags, fences, JSON pieces), valid calls with
random corruptions (truncation, insertion, deletion), and round trips of valid calls.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from toolenv.parsers import CodeBlockParser, HermesParser, TagParser, get_parser
from toolenv.types import ParsedAction

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(SETTINGS, max_examples=300)
PARSERS = [
    get_parser("hermes"),
    get_parser("tags"),
    get_parser("codeblock"),
    get_parser("harmony"),
    get_parser("qwen3_xml"),
    get_parser("llama3_json"),
    get_parser("pythonic"),
    get_parser("mistral"),
    get_parser("glm45"),
    get_parser("deepseek_v3"),
    get_parser("deepseek_v31"),
    get_parser("gemma4"),
    get_parser("kimi_k2"),
    get_parser("muse_glimmer"),
]

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_call",
    "tool_call>",
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "<sql>",
    "</sql>",
    "<python>",
    "</python>",
    "<think>",
    "</think>",
    "<information>",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|call|>",
    "<|end|>",
    "<|return|>",
    "<|constrain|>",
    " to=functions.",
    "commentary",
    "final",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<|python_tag|>",
    "<|eom_id|>",
    "<|eot_id|>",
    ";",
    '{"name":',
    '"parameters":',
    "[f(",
    "x=",
    "'''",
    "<|python_start|>",
    "<|python_end|>",
    "<|eot|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "</s>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<|observation|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "function<｜tool▁sep｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<｜end▁of▁sentence｜>",
    "```json\n",
    "<|tool_call>",
    "<tool_call|>",
    "call:",
    '<|"|>',
    "<|tool_response>",
    "<turn|>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "functions.f:0",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<|im_end|>",
    "<|im_system|>",
    "<|start|>assistant to=f",
    " to=self",
    "<|message|>",
    "<|eom|>",
    "<|eot|>",
    "<|end_of_text|>",
    "<atem:function_calls>",
    '<atem:invoke name="f">',
    '<atem:parameter name="a">',
    "</atem:parameter>",
    "</atem:invoke>",
    "</atem:function_calls>",
    "```python\n",
    "```py\n",
    "```",
    "```output\n",
    "\n",
    " ",
    "{",
    "}",
    "[",
    "]",
    '"',
    ":",
    ",",
    '"name"',
    '"arguments"',
    '"parameters"',
    '"id"',
    '"add"',
    "null",
    "true",
    "1e999",
    "-0",
    "1" * 5000,
    "\\u0000",
    "\\ud800",
    "\\",
    "\x00",
    "\x1b[31m",
    "\u202e",
    "😀",
    "é",
    "\ufeff",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8,
)
call_objects = st.fixed_dictionaries(
    {"name": st.text(max_size=12), "arguments": st.dictionaries(st.text(max_size=8), json_values, max_size=4)}
)

control_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x1F) | st.sampled_from('<>/{}"`\\'), max_size=200)
near_valid = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=40).map("".join)


@st.composite
def corrupted_calls(draw: st.DrawFn) -> str:
    """A valid hermes call, then cut, spliced or double-encoded."""
    obj = draw(call_objects)
    if draw(st.booleans()):
        obj = {**obj, "arguments": json.dumps(obj["arguments"])}
    body = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    n = len(body)
    i = draw(st.integers(0, n))
    j = draw(st.integers(i, n))
    mode = draw(st.sampled_from(["cut", "delete", "insert", "keep"]))
    if mode == "cut":
        body = body[:i]
    elif mode == "delete":
        body = body[:i] + body[j:]
    elif mode == "insert":
        body = body[:i] + draw(st.sampled_from(FRAGMENTS)) + body[i:]
    close = draw(st.sampled_from(["</tool_call>", "", "</tool_call", "<tool_call>"]))
    return f"{draw(st.text(max_size=10))}<tool_call>{body}{close}{draw(near_valid)}"


@st.composite
def huge(draw: st.DrawFn) -> str:
    """A fragment repeated tens of thousands of times (unclosed tags, deep nesting)."""
    frag = draw(
        st.sampled_from(
            [
                "<tool_call>",
                "<tool_call>[",
                "<search>",
                "```python\n",
                "<answer>",
                "{",
                "[",
                "a",
                "<|channel|>",
                "<|channel|>commentary to=functions.x<|message|>{",
                "<|start|>",
                '{"name":',
                "<|python_tag|>{",
                "[a(",
                "[f(x='''",
                "[TOOL_CALLS]",
                "[TOOL_CALLS][",
                "[TOOL_CALLS]f[ARGS]{",
                "<tool_call>f\n<arg_key>a</arg_key><arg_value>",
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{",
                "<｜tool▁call▁begin｜>f<｜tool▁sep｜>[",
                "<|tool_call>call:f{a:{",
                '<|tool_call>call:f{a:<|"|>',
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{",
                "<think><|tool_call_begin|>",
                '<|start|>assistant to=f<|message|><atem:invoke name="f"><atem:parameter name="a">',
                " to=f<|message|><atem:invoke",
            ]
        )
    )
    return frag * draw(st.integers(1_000, 30_000))


any_input = st.text() | control_text | near_valid | corrupted_calls() | st.text(max_size=5).map(lambda s: s * 2000)


def check(action: ParsedAction) -> None:
    """What every parse result must satisfy, whatever the input."""
    assert isinstance(action, ParsedAction)
    for call in action.tool_calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict) and isinstance(call.id, str)
    assert all(isinstance(e, str) and e for e in action.errors)
    assert action.answer is None or isinstance(action.answer, str)


@SETTINGS
@given(any_input)
def test_no_input_makes_a_parser_raise(text: str) -> None:
    for parser in PARSERS:
        check(parser.parse(text))


@settings(max_examples=40, deadline=None)
@given(huge())
def test_huge_inputs_parse(text: str) -> None:
    for parser in PARSERS:
        check(parser.parse(text))


@SETTINGS
@given(corrupted_calls())
@example('<tool_call>{"name": "", "<tool_call>arguments": {}}</tool_call>')  # found by CI: one call, as vLLM reads it
def test_corrupted_hermes_calls_are_errors_or_calls(text: str) -> None:
    action = HermesParser().parse(text)
    check(action)
    # Every opened call either parsed or produced an error the model can read, but for a
    # `<tool_call>` inside another call's body up to its `</tool_call>`: as vLLM reads it, that
    # may be text in the call's arguments (when the whole body decodes), not a call of its own.
    opens = text.count("<tool_call>")
    got = len(action.tool_calls) + len(action.errors)
    if _a_call_opens_inside_another(text):
        assert 1 <= got <= opens
    else:
        assert got == opens


def _a_call_opens_inside_another(text: str) -> bool:
    """Whether a `<tool_call>` comes after another one before that one's first `</tool_call>`."""
    start = text.find("<tool_call>")
    while start >= 0:
        nxt = text.find("<tool_call>", start + 1)
        close = text.find("</tool_call>", start)
        if nxt >= 0 and (close < 0 or nxt < close):
            return True
        start = nxt
    return False


@ROUND_TRIP
@given(st.lists(call_objects, min_size=1, max_size=4), st.booleans(), st.text(alphabet=" \n\tabc.", max_size=20))
def test_hermes_round_trip(objs: list[dict[str, Any]], double_encode: bool, between: str) -> None:
    assume(all("<tool_call>" not in json.dumps(o) and "</tool_call>" not in json.dumps(o) for o in objs))
    parts = []
    for o in objs:
        payload = {**o, "arguments": json.dumps(o["arguments"])} if double_encode else o
        parts.append(f"<tool_call>\n{json.dumps(payload, ensure_ascii=False)}\n</tool_call>")
    action = HermesParser().parse(between.join(parts))
    assert action.errors == []
    assert [(c.name, c.arguments) for c in action.tool_calls] == [(o["name"], o["arguments"]) for o in objs]
    assert [c.id for c in action.tool_calls] == [f"call_{i}" for i in range(len(objs))]


tag_bodies = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() and "<" not in s)


@ROUND_TRIP
@given(
    st.lists(st.tuples(st.sampled_from(["search", "sql", "python"]), tag_bodies), min_size=1, max_size=4), tag_bodies
)
def test_tags_round_trip(calls: list[tuple[str, str]], answer: str) -> None:
    text = "".join(f"<{t}>{b}</{t}>" for t, b in calls) + f"<answer>{answer}</answer>"
    action = TagParser().parse(text)
    assert action.errors == []
    expected = {"search": ("search", "query"), "sql": ("sql", "query"), "python": ("python", "code")}
    assert [(c.name, c.arguments) for c in action.tool_calls] == [
        (expected[t][0], {expected[t][1]: b.strip()}) for t, b in calls
    ]
    assert action.answer == answer.strip()


@ROUND_TRIP
@given(
    # `<answer>` included: inside a block it is code, and the code round-trips verbatim.
    st.lists(
        st.lists(st.one_of(st.text(max_size=20), st.sampled_from(["<answer>", "</answer>", "\n"])), max_size=6)
        .map("".join)
        .filter(lambda s: s.strip() and "```" not in s),
        min_size=1,
        max_size=3,
    )
)
def test_codeblock_round_trip(blocks: list[str]) -> None:
    text = "Let me compute.\n" + "\n".join(f"```python\n{b}\n```" for b in blocks)
    action = CodeBlockParser().parse(text)
    assert action.errors == []
    assert [c.arguments["code"] for c in action.tool_calls] == blocks
    assert action.answer is None and action.text == "Let me compute."
    assert all(c.name == "python" for c in action.tool_calls)
    written = "\n".join(CodeBlockParser().format_call("python", {"code": b}) or "" for b in blocks)
    assert CodeBlockParser().parse(written).tool_calls == action.tool_calls


@SETTINGS
@given(any_input)
def test_parsers_are_deterministic(text: str) -> None:
    for parser in PARSERS:
        assert parser.parse(text) == parser.parse(text)


@SETTINGS
@given(
    any_input | corrupted_calls().map(lambda s: s.replace("<tool_call>", "", 1) if s.count("<tool_call>") > 1 else s)
)
def test_hermes_one_call_path_agrees_with_the_full_scan(text: str) -> None:
    """The one-call shortcut must give exactly what the general scan gives."""
    for parser in (HermesParser(), HermesParser(answer_tag=False)):
        assert parser.parse(text) == parser._parse_scan(text)
