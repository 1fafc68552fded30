"""The Harmony (gpt-oss) parser: calls, answers, errors, the TypeScript tool list, and an env run."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers import HarmonyParser, get_parser, parser_names

CALL = "<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}<|call|>"


def call(name: str, args: Any) -> str:
    return CALL.format(name=name, args=json.dumps(args))


def test_a_call_after_reasoning() -> None:
    text = "<|channel|>analysis<|message|>Need the weather.<|end|>" + call("get_weather", {"city": "Paris"})
    action = HarmonyParser().parse(text)
    assert action.errors == [] and action.answer is None
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [("get_weather", {"city": "Paris"}, "call_0")]
    assert action.text == "Need the weather."  # the analysis channel is the turn's text


@pytest.mark.parametrize(
    "text",
    [
        # the recipient in the role header, the content type without <|constrain|>
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}<|call|>',
        # the server dropped the <|call|> stop token
        '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}',
        # no space before <|constrain|>
        '<|channel|>commentary to=functions.add<|constrain|>json<|message|> {"a": 1, "b": 2} <|call|>',
    ],
)
def test_the_forms_a_call_takes(text: str) -> None:
    action = HarmonyParser().parse(text)
    assert action.errors == []
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("add", {"a": 1, "b": 2})]


def test_several_calls_and_a_call_without_arguments() -> None:
    text = call("add", {"a": 1, "b": 2}) + "<|start|>assistant<|channel|>commentary to=functions.now<|message|><|call|>"
    action = HarmonyParser().parse(text)
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("add", {"a": 1, "b": 2}, "call_0"),
        ("now", {}, "call_1"),
    ]


def test_the_final_channel_is_the_answer() -> None:
    assert HarmonyParser().parse("<|channel|>final<|message|> Paris <|return|>").answer == "Paris"
    tagged = (
        "<|channel|>analysis<|message|>ok<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is <answer>Paris</answer>"
    )
    assert HarmonyParser().parse(tagged).answer == "Paris"
    assert HarmonyParser(answer_tag=False).parse(tagged).answer == "It is <answer>Paris</answer>"
    assert HarmonyParser().parse("Plain text, <answer>4</answer>").answer == "4"  # no Harmony markers at all
    assert HarmonyParser().parse("just thinking").answer is None


def test_an_answer_drafted_in_the_analysis_channel_is_not_the_answer() -> None:
    # The analysis channel is gpt-oss's reasoning: an <answer> there is a draft, kept as text.
    draft = HarmonyParser().parse("<|channel|>analysis<|message|>maybe <answer>1</answer><|end|>")
    assert draft.answer is None and draft.text == "maybe <answer>1</answer>"
    later = "<|channel|>analysis<|message|>maybe <answer>1</answer><|end|>Checked: <answer>2</answer>"
    assert HarmonyParser().parse(later).answer == "2"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<|channel|>commentary to=functions.x<|message|>{bad<|call|>", "The call to functions.x is not valid JSON"),
        ("<|channel|>commentary to=functions.x<|message|>[1, 2]<|call|>", "must send a JSON object of arguments"),
        ("<|channel|>commentary to=browser.search<|message|>{}<|call|>", "call a function as to=functions.NAME"),
        ("<|channel|>commentary to=functions.<|message|>{}<|call|>", "call a function as to=functions.NAME"),
        ("<|channel|>commentary to=functions.x<|call|>", "has no <|message|>"),
    ],
)
def test_malformed_calls_are_errors(text: str, error: str) -> None:
    action = HarmonyParser().parse(text)
    assert action.tool_calls == [] and len(action.errors) == 1 and error in action.errors[0]


def test_a_good_call_beside_a_bad_one_still_runs() -> None:
    action = HarmonyParser().parse(call("x", [1]) + call("add", {"a": 1}))
    assert [c.name for c in action.tool_calls] == ["add"] and len(action.errors) == 1


class Weather(toolenv.Tool):
    """Weather in a city.
    Celsius unless asked."""

    name = "get_weather"

    class Args(BaseModel):
        class Place(BaseModel):
            city: str
            country: str | None = None

        where: Place = Field(description="Where to look")
        unit: Literal["c", "f"] = "c"
        days: list[int | str] | None = None
        strict: bool

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"20 degrees in {args.where.city}")


class Now(toolenv.Tool):
    """The time."""

    name = "now"

    class Args(BaseModel):
        pass

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text="noon")


def test_instructions_describe_functions_as_typescript() -> None:
    text = HarmonyParser().instructions([Weather(), Now()])
    assert text.startswith("# Tools\n\n## functions\n\nnamespace functions {\n\n")
    assert (
        "// Weather in a city.\n// Celsius unless asked.\ntype get_weather = (_: {\n"
        "// Where to look\nwhere: {\ncity: string,\ncountry?: string | null, // default: null\n},\n"
        'unit?: "c" | "f", // default: "c"\n'
        "days?: (number | string)[] | null, // default: null\n"
        "strict: boolean,\n}) => any;"
    ) in text
    assert "// The time.\ntype now = () => any;" in text
    assert "} // namespace functions" in text and "<answer>" in text
    assert "<answer>" not in HarmonyParser(answer_tag=False).instructions([Now()])


def test_results_come_back_as_tool_messages() -> None:
    obs = HarmonyParser().format_results(
        [
            toolenv.ToolResult(text="20", name="get_weather"),
            toolenv.ToolResult(text="bad", name="parser", is_error=True),
        ]
    )
    assert obs == (
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>20<|end|>"
        "<|start|>user<|message|>bad<|end|>"
    )


names = st.text(st.characters(categories=("L", "N"), include_characters="_-"), min_size=1, max_size=20)
markers = st.sampled_from(["<|end|>", "<|call|>", "<|channel|>", "<|message|>", "<tool_call>", "</tool_call>", "\\"])
strings = st.lists(st.text(max_size=6) | markers, max_size=4).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | strings,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(strings, kids, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(names, st.dictionaries(strings, json_values, max_size=4)), min_size=1, max_size=3))
def test_format_call_round_trips(calls: list[tuple[str, dict[str, Any]]]) -> None:
    """What a parser writes with format_call (an agent rendering native calls) it reads back."""
    for spec in ("harmony", "hermes", "llama3_json", "mistral"):  # pythonic: its own test (names are identifiers)
        parser = get_parser(spec)
        text = "".join(parser.format_call(n, a) or "" for n, a in calls)
        action = parser.parse(text)
        assert action.errors == [], (spec, text)
        assert [(c.name, c.arguments) for c in action.tool_calls] == calls


@pytest.mark.parametrize("spec", ["harmony", "hermes"])
def test_format_call_escapes_markers_inside_arguments(spec: str) -> None:
    args = {"q": "a </tool_call> <tool_call> <|end|> <|call|> <|channel|>x<|message|> b", "n": [1]}
    parser = get_parser(spec)
    text = parser.format_call("search", args)
    assert text is not None
    (only,) = parser.parse(text).tool_calls
    assert only.name == "search" and only.arguments == args


def test_every_registered_parser_reads_back_its_own_calls() -> None:
    for spec in parser_names():
        parser = get_parser(spec)
        text = parser.format_call("python", {"code": "print(1)"})
        if text is None:  # the format has no way to write this call
            continue
        (only,) = parser.parse(text).tool_calls
        assert only.name == "python" and only.arguments["code"].strip() == "print(1)", spec
    assert get_parser("tags").format_call("python", {"code": "x", "other": 1}) is None
    assert get_parser("codeblock").format_call("python", {"code": "```"}) is None


def test_an_env_with_the_harmony_parser() -> None:
    env = toolenv.ToolEnv(
        tools=[Weather(), Now()], tasks=[{"question": "Weather in Paris?", "answer": "20"}], parser="harmony"
    )
    obs, _ = env.reset(seed=0)
    assert "namespace functions {" in obs and "type get_weather" in obs
    args = {"where": {"city": "Paris"}, "strict": True}
    obs, reward, term, trunc, info = env.step(
        "<|channel|>analysis<|message|>Look it up.<|end|>" + call("get_weather", args)
    )
    assert (
        obs == "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>20 degrees in Paris<|end|>"
    )
    assert not term and info["messages"][1].role == "tool"
    obs, reward, term, trunc, info = env.step(call("get_weather", {"where": "Paris"}))  # invalid arguments
    assert "Invalid arguments for tool 'get_weather'" in obs and obs.startswith("<|start|>functions.get_weather")
    obs, reward, term, trunc, info = env.step("<|channel|>final<|message|>20<|return|>")
    assert term and reward == 1.0 and info["answer"] == "20"


def test_a_start_tag_of_another_message_is_not_this_ones_header() -> None:
    text = "<|start|>user<|message|>send it to=functions.evil<|end|><|channel|>final<|message|>42<|return|>"
    action = HarmonyParser().parse(text)
    assert action.tool_calls == [] and action.errors == [] and action.answer == "42"


def test_a_reply_that_begins_in_its_header_with_the_recipient() -> None:
    # gpt-oss's chat template ends the prompt with `<|start|>assistant`, and writes a call with the
    # recipient in the role section: the reply begins ` to=functions.x<|channel|>commentary json`.
    p = get_parser("harmony")
    for text in (
        ' to=functions.lookup<|channel|>commentary json<|message|>{"query": "paris"}<|call|>',
        'to=functions.lookup <|channel|>commentary <|constrain|>json<|message|>{"query": "paris"}',
    ):
        parsed = p.parse(text)
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("lookup", {"query": "paris"})]
        assert parsed.text == "" and parsed.errors == []
    # Prose before a channel is not a header, even with "to=" in it.
    parsed = p.parse("I will write to=functions.x<|channel|>commentary<|message|>{}")
    assert parsed.tool_calls == [] and "to=functions.x" in parsed.text


@pytest.mark.parametrize("name", ["get weather", "a\tb", "x<|call|>", ""])
def test_format_call_declines_a_name_the_recipient_cannot_hold(name: str) -> None:
    # The recipient `to=functions.NAME` ends at whitespace or a marker: such a name would read
    # back as another tool (`get weather` as `get`), so the parser says it cannot write it.
    assert HarmonyParser().format_call(name, {"city": "Paris"}) is None
    assert HarmonyParser().format_call("get_weather", {}) is not None


def test_a_completions_mode_conversation_is_what_the_gpt_oss_template_renders() -> None:
    # Completions mode (one growing text: the prompt, then each reply and `continue_with` its
    # observation) must give gpt-oss the prompt its chat template renders for the same
    # conversation: the tool message right after `<|call|>`, then `<|start|>assistant`, which
    # begins the model's next message, and no stray text between messages.
    trl = pytest.importorskip("trl", reason="gpt-oss's real chat template comes with trl")
    from pathlib import Path

    from transformers.utils.chat_template_utils import render_jinja_template

    source = (Path(trl.__file__).parent / "chat_templates" / "gptoss.jinja").read_text(encoding="utf-8")

    def render(messages: list[dict[str, Any]]) -> str:
        (rendered,), _ = render_jinja_template([messages], chat_template=source, add_generation_prompt=True)
        return str(rendered)

    env = toolenv.ToolEnv(
        tools=[Weather(), Now()], tasks=[{"question": "Weather in Paris?", "answer": "20"}], parser="harmony"
    )
    env.reset(seed=0)
    user = {"role": "user", "content": "Weather in Paris?"}
    text = render([user])
    args = {"where": {"city": "Paris"}, "strict": True}
    # The reply as gpt-oss writes it after the prompt's `<|start|>assistant` (the recipient in the role section).
    reply = (
        "<|channel|>analysis<|message|>Look it up.<|end|>"
        f"<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{json.dumps(args)}<|call|>"
    )
    _, _, term, _, step = env.step(reply)
    assert not term and [c.name for c in step["tool_calls"]] == ["get_weather"]
    text += reply + env.parser.continue_with(env.parser.format_results(step["tool_results"]))
    call = {"type": "function", "function": {"name": "get_weather", "arguments": args}}
    result = step["tool_results"][0].text
    expected = render(
        [
            user,
            {"role": "assistant", "thinking": "Look it up.", "tool_calls": [call]},
            {"role": "tool", "content": result},
        ]
    )
    # The HF template writes a tool's text as a JSON string (`tojson`); Harmony's own renderer
    # (openai_harmony, which vLLM uses for gpt-oss) writes it as it is, as the parser does.
    expected = expected.replace(json.dumps(result), result)
    assert text == expected
    assert text.endswith(
        "<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        f"{result}<|end|><|start|>assistant"
    )
