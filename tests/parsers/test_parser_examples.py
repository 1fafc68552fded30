"""Example tests: what the built-in parsers make of typical and tricky model turns."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolenv.parsers import CodeBlockParser, HermesParser, TagParser, get_parser, parser_names
from toolenv.parsers.base import ActionParser
from toolenv.types import ToolResult


def hermes_call(obj: object) -> str:
    return f"<tool_call>\n{json.dumps(obj)}\n</tool_call>"


# ---------------------------------------------------------------- hermes
def test_hermes_several_calls_in_one_turn() -> None:
    text = (
        "<think>two lookups</think>\n"
        + hermes_call({"name": "search", "arguments": {"query": "Paris"}})
        + hermes_call({"name": "search", "arguments": {"query": "Lyon", "k": 3}, "id": "mine"})
        + hermes_call({"name": "add", "arguments": {}})
    )
    action = HermesParser().parse(text)
    assert action.errors == []
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("search", {"query": "Paris"}, "call_0"),
        ("search", {"query": "Lyon", "k": 3}, "mine"),
        ("add", {}, "call_2"),
    ]
    assert action.text == "<think>two lookups</think>"
    assert action.answer is None


def test_hermes_double_encoded_and_parameters_alias() -> None:
    text = hermes_call({"name": "sql", "arguments": json.dumps({"query": "SELECT 1"})}) + hermes_call(
        {"name": "sql", "parameters": {"query": "SELECT 2"}}
    )
    action = HermesParser().parse(text)
    assert [c.arguments for c in action.tool_calls] == [{"query": "SELECT 1"}, {"query": "SELECT 2"}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{bad json", "is not valid JSON"),
        ('["name", "x"]', 'string "name"'),
        ('{"arguments": {}}', 'string "name"'),
        ('{"name": 3}', 'string "name"'),
        ('{"name": "x", "arguments": "not json"}', "is a string that is not JSON"),
        ('{"name": "x", "arguments": [1, 2]}', "must be a JSON object"),
        ('{"name": "x", "arguments": "[1]"}', "must be a JSON object"),
        ('{"name": "x", "arguments": {"n": ' + "9" * 5000 + "}}", "is not valid JSON"),  # int past 4300 digits
        ("[" * 100_000 + "]" * 100_000, "is not valid JSON"),  # deeper than the recursion limit
    ],
)
def test_hermes_bad_calls_become_errors(body: str, message: str) -> None:
    action = HermesParser().parse(f"<tool_call>{body}</tool_call>")
    assert action.tool_calls == []
    assert len(action.errors) == 1 and message in action.errors[0]
    assert action.errors[0].startswith("Tool call 1")


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "x", "arguments": {"s": "\\ud800 lone surrogate escape"}}',
        '{"name": "x", "arguments": {"s": "\ud800 raw lone surrogate"}}',
        '{"name": "x", "arguments": {"n": ' + "9" * 400 + "}}",  # past a 64-bit integer
        '{"name": "x", "arguments": {"f": NaN, "g": -Infinity, "h": 1e400}}',
        '{"name": "x", "arguments": {"a": 1, "a": 2, "nested": [{"k": null}, true, "\\u00e9"]}}',
    ],
)
def test_hermes_decodes_json_exactly_as_the_json_module(body: str) -> None:
    # The fast decoder hands everything it refuses to `json`; the result never differs.
    (call,) = HermesParser().parse(f"<tool_call>{body}</tool_call>").tool_calls
    expected = json.loads(body)["arguments"]
    assert json.dumps(call.arguments) == json.dumps(expected)


def test_hermes_unclosed_call_does_not_swallow_the_next() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}\n'
        + hermes_call({"name": "b", "arguments": {"x": 1}})
        + '<tool_call>{"name": "c"'
    )
    action = HermesParser().parse(text)
    assert [c.name for c in action.tool_calls] == ["b"]
    assert action.errors == [
        "Tool call 1 is not closed with </tool_call>.",
        "Tool call 3 is not closed with </tool_call>.",
    ]


def test_hermes_a_tool_call_tag_inside_the_arguments_is_text() -> None:
    # vLLM's hermes parser reads a call to its first `</tool_call>`, so a model that writes the tag
    # itself inside a string (code or docs about tool calls) makes one call there; so must the env.
    write = '<tool_call>{"name": "write", "arguments": {"text": "wrap it in <tool_call> tags"}}</tool_call>'
    action = HermesParser().parse("Writing." + write + "\n" + hermes_call({"name": "b", "arguments": {}}))
    assert action.errors == [] and action.text == "Writing."
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("write", {"text": "wrap it in <tool_call> tags"}, "call_0"),
        ("b", {}, "call_1"),
    ]


def test_hermes_good_and_bad_calls_mix() -> None:
    text = hermes_call({"name": "a", "arguments": {}}) + "<tool_call>{oops}</tool_call>"
    action = HermesParser().parse(text)
    assert [c.name for c in action.tool_calls] == ["a"]
    assert len(action.errors) == 1 and action.errors[0].startswith("Tool call 2")


def test_hermes_answer() -> None:
    action = HermesParser().parse("thinking <answer> first </answer> more <answer>\n Paris \n</answer> done")
    assert action.answer == "Paris"
    assert action.text == "thinking  more  done"
    assert action.is_final
    # An <answer> inside a call's JSON is an argument, not the answer.
    inside = HermesParser().parse(hermes_call({"name": "echo", "arguments": {"s": "<answer>x</answer>"}}))
    assert inside.answer is None and inside.tool_calls[0].arguments == {"s": "<answer>x</answer>"}
    assert HermesParser(answer_tag=False).parse("<answer>x</answer>").answer is None


def test_hermes_unclosed_answer_is_no_answer() -> None:
    action = HermesParser().parse("<answer>Paris")
    assert action.answer is None and action.text == "<answer>Paris"


def test_hermes_format_results_and_stop() -> None:
    parser = HermesParser()
    out = parser.format_results([ToolResult(text="5"), ToolResult.error("boom")])
    assert out == "<tool_response>\n5\n</tool_response>\n<tool_response>\nboom\n</tool_response>"
    assert parser.stop == ("</tool_call>",)


# ---------------------------------------------------------------- tags
def test_tags_default_mapping_and_answer() -> None:
    action = TagParser().parse(
        "<search> who is X </search><sql>SELECT 1</sql><python>print(1)</python><answer>42</answer>"
    )
    assert [(c.name, c.arguments) for c in action.tool_calls] == [
        ("search", {"query": "who is X"}),
        ("sql", {"query": "SELECT 1"}),
        ("python", {"code": "print(1)"}),
    ]
    assert action.answer == "42" and action.errors == []


def test_tags_mapping_is_configurable() -> None:
    parser = TagParser(
        tags={"lookup": ("wiki", "title"), "calc": ("calculator", "expression")},
        result_open="<result>",
        result_close="</result>",
        answer_tag="final",
    )
    action = parser.parse("<lookup>Paris</lookup> and <calc>2+2</calc> then <search>ignored</search><final>4</final>")
    assert [(c.name, c.arguments) for c in action.tool_calls] == [
        ("wiki", {"title": "Paris"}),
        ("calculator", {"expression": "2+2"}),
    ]
    assert action.answer == "4"
    assert "<search>ignored</search>" in action.text  # unmapped tags are plain text
    assert (
        parser.format_results([ToolResult(text="a"), ToolResult(text="b")]) == "<result>a</result>\n<result>b</result>"
    )
    assert set(parser.stop) == {"</lookup>", "</calc>"}
    assert get_parser("tags", tags={"q": ("search", "query")}).parse("<q>x</q>").tool_calls[0].name == "search"


def test_tags_errors() -> None:
    action = TagParser().parse("<search></search><sql>SELECT 1")
    assert action.tool_calls == []
    assert action.errors == ["<search></search> is empty.", "<sql> is not closed with </sql>."]
    assert TagParser().parse("<answer>unclosed").errors == ["<answer> is not closed with </answer>."]


def test_tags_nested_tags_stay_in_the_body() -> None:
    action = TagParser().parse("<search>a <search>b</search> c</search>")
    assert action.tool_calls[0].arguments == {"query": "a <search>b"}
    assert "c</search>" in action.text


@pytest.mark.parametrize("bad", ["1abc", "a b", "", "x>"])
def test_tags_invalid_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a valid tag name"):
        TagParser(tags={bad: ("t", "a")})


def test_tags_default_result_markers() -> None:
    assert TagParser().format_results([ToolResult(text="doc")]) == "<information>doc</information>"


def test_an_observation_continuing_the_models_text_is_glued_as_the_formats_trainers_do() -> None:
    """Search-R1 appends `\n\n<information>…</information>\n\n` to the model's text; other
    formats get one line break on each side."""
    tags = TagParser()
    assert tags.continue_with(tags.format_results([ToolResult(text="doc")])) == "\n\n<information>doc</information>\n\n"
    assert get_parser("hermes").continue_with("<tool_response>\n5\n</tool_response>") == (
        "\n<tool_response>\n5\n</tool_response>\n"
    )


# ---------------------------------------------------------------- codeblock
def test_codeblock_blocks_are_calls() -> None:
    text = "Compute:\n```python\nx = 2\nprint(x * 3)\n```\nand\n```py\nprint(1)\n```\n```bash\nls\n```"
    action = CodeBlockParser().parse(text)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [
        ("python", {"code": "x = 2\nprint(x * 3)"}),
        ("python", {"code": "print(1)"}),
    ]
    assert "```bash" in action.text and action.errors == []


def test_codeblock_tags_in_any_case_and_python3() -> None:
    text = "```Python\nprint(1)\n```\n```python3\nprint(2)\n```\n```PY\nprint(3)\n```"
    action = CodeBlockParser().parse(text)
    assert [c.arguments["code"] for c in action.tool_calls] == ["print(1)", "print(2)", "print(3)"]
    assert action.errors == [] and action.text == ""


def test_codeblock_empty_unclosed_and_answer() -> None:
    action = CodeBlockParser().parse("```python\n\n```\n<answer>6</answer>")
    assert action.tool_calls == [] and action.answer == "6" and action.errors == []
    unclosed = CodeBlockParser().parse("```python\nprint(1)\n")
    assert unclosed.tool_calls == [] and unclosed.errors == ["A ```python block is not closed with ```."]


def test_codeblock_an_answer_inside_the_code_is_code() -> None:
    parser = CodeBlockParser()
    code = 'x = 6 * 7\nprint(f"<answer>{x}</answer>")'
    action = parser.parse("Compute it:\n" + (parser.format_call("python", {"code": code}) or ""))
    assert action.answer is None and action.errors == [] and action.text == "Compute it:"
    assert [c.arguments for c in action.tool_calls] == [{"code": code}]
    # Text outside the blocks still gives the answer; a block inside the answer is the answer.
    text = "```python\nprint('<answer>no</answer>')\n```\n<answer>```python\n42\n```</answer> after"
    action = parser.parse(text)
    assert [c.arguments for c in action.tool_calls] == [{"code": "print('<answer>no</answer>')"}]
    assert action.answer == "```python\n42\n```" and action.text == "after"
    # The last closed answer outside blocks wins; an unclosed one ends the search, not the blocks.
    action = parser.parse(
        "<answer>a</answer>```python\n<answer>b</answer>\n```<answer>c</answer><answer>d```py\n1\n```"
    )
    assert action.answer == "c" and [c.arguments["code"] for c in action.tool_calls] == ["<answer>b</answer>", "1"]
    assert action.text == "<answer>d"


def test_codeblock_code_round_trips_without_an_added_line_break() -> None:
    parser = CodeBlockParser()
    for code in ("print(1)", "print(1)\n", "\nx = 1\n\n", "a\r"):
        action = parser.parse(parser.format_call("python", {"code": code}) or "")
        assert [c.arguments["code"] for c in action.tool_calls] == [code]
    assert parser.parse("```python\nprint(1)```").tool_calls[0].arguments == {"code": "print(1)"}


def test_codeblock_is_configurable() -> None:
    parser = CodeBlockParser(tool="sandbox", arg="source", languages=("js",))
    action = parser.parse("```js\nconsole.log(1)\n```\n```python\nprint(1)\n```")
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("sandbox", {"source": "console.log(1)"})]
    assert parser.format_results([ToolResult(text="1")]) == "```output\n1\n```"


# ---------------------------------------------------------------- shared
def test_find_answer_takes_the_last_closed_answer() -> None:
    assert ActionParser.find_answer("<answer>a</answer><answer>b</answer><answer>c") == ("b", "<answer>c")
    assert ActionParser.find_answer("none") == (None, "none")
    many = "<answer>" * 50_000  # linear scan: this once took minutes
    assert ActionParser.find_answer(many) == (None, many)


def test_parser_names() -> None:
    assert {"hermes", "tags", "codeblock"} <= set(parser_names())
    with pytest.raises(ValueError, match="unknown parser"):
        get_parser("nope")


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("spec", parser_names())
@pytest.mark.parametrize(
    "value",
    [{1, 2}, float("nan"), float("inf"), 10**5000, _deep(100_000)],
    ids=["set", "nan", "inf", "huge-int", "too-deep"],
)
def test_format_call_declines_what_json_cannot_hold(spec: str, value: Any) -> None:
    # An agent writes native calls back as text with format_call: a value JSON cannot hold makes
    # it say "cannot write this" (None), never raise in the middle of a rollout; what a format
    # can write (NaN and infinities, which Python's JSON writes) reads back as one call.
    parser = get_parser(spec)
    text = parser.format_call("search", {"query": value})
    if text is not None:
        assert isinstance(value, float), (spec, text)
        action = parser.parse(text)
        assert [c.name for c in action.tool_calls] == ["search"] and action.errors == [], (spec, text)


def test_hermes_reads_a_last_call_whose_close_was_the_stop_string() -> None:
    # vLLM's hermes parser reads `<tool_call>(.*?)</tool_call>|<tool_call>(.*)`: a call left open
    # at the end of the reply is still a call. That is every call turn of a server that stops on
    # `stop=["</tool_call>"]` and, as the OpenAI API does, leaves the stop string out of the text.
    text = 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "Paris"}}\n'
    action = HermesParser().parse(text)
    assert action.errors == []
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [("search", {"query": "Paris"}, "call_0")]
    assert action.text == "Let me look."
    two = hermes_call({"name": "a", "arguments": {}}) + '\n<tool_call>\n{"name": "b", "arguments": {"x": 1}}'
    assert [(c.name, c.arguments) for c in HermesParser().parse(two).tool_calls] == [("a", {}), ("b", {"x": 1})]


def test_hermes_an_open_last_call_cut_off_mid_json_is_still_an_error() -> None:
    action = HermesParser().parse('<tool_call>\n{"name": "search", "arguments": {"query": "Par')
    assert action.tool_calls == []
    assert action.errors == ["Tool call 1 is not closed with </tool_call>."]
