"""The Llama 3 JSON parser: calls with and without <|python_tag|>, errors, round trips, an env run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import get_parser
from toolenv.parsers.llama3_json import Llama3JSONParser

TAG = "<|python_tag|>"


def call(name: str, params: Any, key: str = "parameters") -> str:
    return json.dumps({"name": name, key: params})


def calls_of(text: str, parser: Llama3JSONParser | None = None) -> list[tuple[str, dict[str, Any], str]]:
    action = (parser or Llama3JSONParser()).parse(text)
    assert action.errors == [], action.errors
    return [(c.name, c.arguments, c.id) for c in action.tool_calls]


def test_a_reply_that_is_one_call() -> None:
    action = Llama3JSONParser().parse(call("get_weather", {"city": "Paris", "days": [1, 2]}))
    assert action.errors == [] and action.answer is None and action.text == ""
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}, "call_0")
    ]


@pytest.mark.parametrize(
    "text",
    [
        f"{call('add', {'a': 1})}; {call('now', {})}",  # Llama's own separator
        f"{TAG}{call('add', {'a': 1})}; {call('now', {})}<|eom_id|>",  # with the special tokens kept
        f"{call('add', {'a': 1})}\n{call('now', {})}",  # one per line
        f"{call('add', {'a': 1})}{call('now', {})}",  # back to back
        f"[{call('add', {'a': 1})}, {call('now', {})}]",  # a JSON list of calls
        f"{TAG}[{call('add', {'a': 1})},\n{call('now', {})}]<|eot_id|>",
        f"{call('add', {'a': 1}, 'arguments')};{call('now', {}, 'arguments')}",  # "arguments", as vLLM accepts
    ],
)
def test_several_calls(text: str) -> None:
    action = Llama3JSONParser().parse(text)
    assert action.errors == [] and action.text == ""
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("add", {"a": 1}, "call_0"),
        ("now", {}, "call_1"),
    ]


def test_the_python_tag_is_optional() -> None:
    """A trainer decoding with skip_special_tokens=True loses the tag: same calls either way."""
    body = f"{call('search', {'q': 'Paris'})}; {call('search', {'q': 'Lyon'})}"
    expected = [("search", {"q": "Paris"}, "call_0"), ("search", {"q": "Lyon"}, "call_1")]
    assert calls_of(TAG + body) == calls_of(body) == expected
    assert calls_of(f"Let me search.\n{TAG}{body}") == calls_of(f"Let me search.\n{body}")
    parser = Llama3JSONParser()
    assert not parser.special_tokens and parser.tool_messages and parser.stop == ()


def test_prose_then_a_call() -> None:
    text = 'I need the weather first, so I will call {"get_weather"}.\n' + call("get_weather", {"city": "Paris"})
    action = Llama3JSONParser().parse(text)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert action.text == 'I need the weather first, so I will call {"get_weather"}.' and action.errors == []


@pytest.mark.parametrize(
    "text",
    [
        'A dict like {"a": 1} or {a: 1}, a set {1, 2}, and braces {{ }}.',
        'The user is {"name": "Bob", "age": 3}: a name is not a call without parameters.',
        'Say {"text": "use {\\"name\\": \\"f\\"} in JSON"} to me.',
        'An unclosed { and a quote { " in prose.',
        '{"answer": 42} is JSON but no call.',
    ],
)
def test_json_and_braces_in_prose_are_text(text: str) -> None:
    action = Llama3JSONParser().parse(text)
    assert action.tool_calls == [] and action.errors == [] and action.text == text


def test_json_that_is_not_a_call_keeps_what_it_nests() -> None:
    text = '{"type": "function", "function": {"name": "f", "parameters": {}}} is the OpenAI shape.'
    action = Llama3JSONParser().parse(text)
    assert action.tool_calls == [] and action.errors == [] and action.text == text
    # Only call-like objects are decoded in prose: one led by another key is not, nor skipped.
    action = Llama3JSONParser().parse('So {"result": {"name": "f", "parameters": {}}}')
    assert [c.name for c in action.tool_calls] == ["f"] and action.text == 'So {"result": }'


def test_the_answer_tag() -> None:
    assert Llama3JSONParser().parse("It is Paris. <answer>Paris</answer>").answer == "Paris"
    assert Llama3JSONParser(answer_tag=False).parse("<answer>Paris</answer>").answer is None
    # An <answer> inside a call's arguments is an argument, not the answer.
    action = Llama3JSONParser().parse(call("python", {"code": "print('<answer>1</answer>')"}))
    assert action.answer is None and action.tool_calls[0].arguments == {"code": "print('<answer>1</answer>')"}
    # A call and an answer in one turn: both are read.
    action = Llama3JSONParser().parse(call("now", {}) + "\n<answer>noon</answer><|eot_id|>")
    assert [c.name for c in action.tool_calls] == ["now"] and action.answer == "noon" and action.text == ""


def test_other_call_shapes_llama_writes() -> None:
    typed = {"type": "function", "name": "f", "parameters": {"x": 1}}
    assert calls_of(json.dumps(typed)) == [("f", {"x": 1}, "call_0")]
    assert calls_of(json.dumps({"name": "f", "parameters": json.dumps({"x": 1})})) == [("f", {"x": 1}, "call_0")]
    assert calls_of(json.dumps({"name": "f", "parameters": {"x": 1}, "id": "mine"})) == [("f", {"x": 1}, "mine")]
    # A line break written raw inside a string (code often comes that way).
    assert calls_of('{"name": "python", "parameters": {"code": "x = 1\nprint(x)"}}') == [
        ("python", {"code": "x = 1\nprint(x)"}, "call_0")
    ]
    # Any "name"-led object opens a call at the start of the reply or after the tag.
    assert calls_of(f'{TAG}{{"id": "c1", "name": "f", "parameters": {{}}}}') == [("f", {}, "c1")]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"name": "f", "parameters": {"x": 1}', "is cut off before its JSON ends"),
        ('{"name": "f", "parameters": {"q": "abc', "is cut off before its JSON ends"),
        ('{"name": "f", "parameters": {"x": 1}<|eom_id|>', "is cut off before its JSON ends"),
        ('Sure. {"name": "f", "parameters": {x: 1}}', "is not valid JSON (Expecting property name"),
        ('{"name": "f", "parameters": {"x": 1}} }', None),  # a stray } after a good call is text
        ('{"name": 5, "parameters": {}}', 'needs a string "name"'),
        ('{"name": null, "parameters": {}}', 'needs a string "name"'),
        ('{"parameters": {"x": 1}}', 'needs a string "name"'),
        ('{"name": "f", "parameters": [1, 2]}', '"parameters" must be a JSON object'),
        ('{"name": "f", "arguments": 3}', '"arguments" must be a JSON object'),
        ('{"name": "f", "parameters": "x=1"}', '"parameters" is a string; write the arguments as a JSON object'),
        ('{"name": "f", "parameters": "[1]"}', '"parameters" is a string; write the arguments as a JSON object'),
        ('{"name": "f", "parameters": {"x": 1}, "arguments": {"x": 2}}', 'gives both "parameters" and "arguments"'),
        ('{"name": "f"}', 'has no "parameters"'),
        (f'{TAG}{{"name": "f"}}', 'has no "parameters"'),
        (f'{TAG}{{"city": "Paris"', "is cut off before its JSON ends"),
        (f'{TAG}brave_search.call(query="x")', "<|python_tag|> is not followed by a function call"),
        (f"{TAG}<|eom_id|>", "<|python_tag|> is not followed by a function call"),
        ('{"name": "f", "parameters": {"n": ' + "9" * 5000 + "}}", "is not valid JSON (Exceeds the limit"),
        ('{"name": "f", "parameters": ' + "[" * 50_000 + "]" * 50_000 + "}", "is not valid JSON (too deeply nested)"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str | None) -> None:
    action = Llama3JSONParser().parse(text)
    if error is None:
        assert action.errors == [] and len(action.tool_calls) == 1
        return
    assert action.tool_calls == [] and len(action.errors) == 1, action
    assert error in action.errors[0] and action.errors[0].startswith(("Tool call 1", TAG)), action.errors
    assert action.errors[0].endswith(("}}.", '"parameters".', "not a string.", "values.")), action.errors[0]


def test_the_calls_after_a_broken_one_still_run() -> None:
    # The first call lacks its closing brace; the decoder stops at the `;` and reading resumes.
    text = '{"name": "a", "parameters": {"x": 1}; {"name": "b", "parameters": {"y": 2}}'
    action = Llama3JSONParser().parse(text)
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [("b", {"y": 2}, "call_1")]
    assert len(action.errors) == 1 and action.errors[0].startswith("Tool call 1 is not valid JSON")
    # The same past a huge integer and bad parameters.
    text = '{"name": "a", "parameters": {"n": ' + "1" * 5000 + "}}; " + call("b", {}) + "; " + call("c", [1])
    action = Llama3JSONParser().parse(text)
    assert [(c.name, c.id) for c in action.tool_calls] == [("b", "call_1")]
    assert action.errors[0].startswith("Tool call 1 is not valid JSON (Exceeds the limit")
    assert action.errors[1].startswith('Tool call 3: "parameters" must be a JSON object')


def test_instructions_follow_metas_template() -> None:
    class Weather(toolenv.Tool):
        """Weather in a city."""

        name = "get_weather"

        class Args(BaseModel):
            city: str = Field(description="the city")

    text = Llama3JSONParser().instructions([Weather()])
    assert text.startswith(
        "You have access to the following functions. To call a function, please respond with JSON for a "
        'function call. Respond in the format {"name": function name, "parameters": dictionary of argument '
        'name and its value}. Do not use variables.\n\n{\n    "type": "function",\n    "function": {\n'
    )
    assert json.dumps(Weather().schema(), indent=4) in text
    assert "one after another, separated by semicolons." in text
    assert text.endswith("When you know the final answer, write it as <answer>...</answer>.")
    assert "<answer>" not in Llama3JSONParser(answer_tag=False).instructions([Weather()])


def test_results_are_one_json_line_per_call() -> None:
    obs = Llama3JSONParser().format_results(
        [
            toolenv.ToolResult(text="20 °C\nsunny", name="get_weather"),
            toolenv.ToolResult(text="Unknown tool 'x'.", name="x", is_error=True),
        ]
    )
    assert obs == '{"output": "20 °C\\nsunny"}\n{"error": "Unknown tool \'x\'."}'
    assert [json.loads(line) for line in obs.splitlines()] == [
        {"output": "20 °C\nsunny"},
        {"error": "Unknown tool 'x'."},
    ]


names = st.text(min_size=1, max_size=20)
markers = st.sampled_from(
    [TAG, "<|eom_id|>", "<|eot_id|>", "<answer>", "</answer>", "; ", "{", "}", '{"name": "x", "parameters": {}}', "\\"]
)
strings = st.lists(st.text(max_size=6) | markers, max_size=4).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(strings, kids, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(names, st.dictionaries(strings, json_values, max_size=4)), min_size=1, max_size=3),
    st.sampled_from(["", "; ", ";", "\n", " "]),
    st.booleans(),
)
def test_format_call_round_trips(calls: list[tuple[str, dict[str, Any]]], sep: str, tag: bool) -> None:
    """What format_call writes (an agent rendering native calls) reads back as exactly that call."""
    parser = get_parser("llama3_json")
    text = (TAG if tag else "") + sep.join(parser.format_call(n, a) or "" for n, a in calls)
    action = parser.parse(text)
    assert action.errors == [], text
    assert [(c.name, c.arguments) for c in action.tool_calls] == calls
    assert action.answer is None and action.text == ""


def test_format_call_writes_metas_form_and_escapes_markers() -> None:
    parser = Llama3JSONParser()
    assert parser.format_call("add", {"a": 1}, "call_9") == '{"name": "add", "parameters": {"a": 1}}'
    text = parser.format_call("say", {"text": "<|python_tag|> then <|eot_id|>"})
    assert "<|" not in text
    assert calls_of(text) == [("say", {"text": "<|python_tag|> then <|eot_id|>"}, "call_0")]


@pytest.mark.parametrize(
    "text",
    [
        "{" * 100_000,
        '{"' * 50_000,
        '{"name":' * 12_500,
        '[{"name":' * 11_000,
        '{"a":"\\"{' * 11_000,
        TAG + '{"' * 50_000,
        '{"name":x' * 12_000,
        call("f", {"x": 1}) * 2_500,
        "Some prose. " + '{"a": {' * 15_000,
    ],
)
def test_huge_adversarial_replies_parse(text: str) -> None:
    """Scanning resumes where each decode stopped, so these take milliseconds (no timing here)."""
    action = Llama3JSONParser().parse(text)
    assert all(isinstance(e, str) and e for e in action.errors)


class Weather(toolenv.Tool):
    """Current temperature in a city."""

    name = "get_weather"

    class Args(BaseModel):
        city: str = Field(description="the city")
        unit: str = "c"

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"20 degrees {args.unit.upper()} in {args.city}")


def test_an_env_with_the_llama3_json_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Weather()],
        tasks=[{"question": "How warm is Paris?", "answer": "20"}],
        parser=Llama3JSONParser(),
        reward="exact_match",
    )
    obs, _ = env.reset(seed=0)
    assert '"name": "get_weather"' in obs and "How warm is Paris?" in obs
    obs, reward, term, trunc, info = env.step(f"{TAG}{call('get_weather', {'city': 'Paris'})}<|eom_id|>")
    assert obs == '{"output": "20 degrees C in Paris"}'
    assert (reward, term, trunc) == (0.0, False, False)
    assert [m.role for m in info["messages"]] == ["assistant", "tool"]
    obs, *_ = env.step(call("get_weather", {"town": "Paris"}))  # invalid arguments: an error result
    assert obs.startswith('{"error": "Invalid arguments for tool \'get_weather\'')
    obs, reward, term, trunc, info = env.step("It is 20 degrees. <answer>20</answer>")
    assert (reward, term, trunc) == (1.0, True, False)
    assert info["answer"] == "20" and info["reward_components"] == {"exact_match": 1.0}
    env.close()
    assert isinstance(get_parser("llama3_json"), Llama3JSONParser)
