"""`ToolEnv.step` never raises on any action text, and malformed actions get error observations."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolenv
from toolenv import tool
from toolenv.parsers import parser_names

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "<python>",
    "</python>",
    "```python\n",
    "```",
    "{",
    "}",
    '"name"',
    '"arguments"',
    ":",
    ",",
    '"add"',
    '"search"',
    '{"a": 1, "b": 2}',
    "\x00",
    "\n",
    "😀",
    "1" * 5000,
    # Kimi K2 and Muse Glimmer
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|start|>assistant to=add<|message|>",
    " to=self<|message|>",
    '<atem:invoke name="add">',
    '<atem:parameter name="a">',
    "</atem:parameter>",
    "</atem:invoke>",
    "<|eom|>",
    # Harmony and Qwen3-XML
    "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>",
    "<|channel|>final<|message|>",
    "<|call|>",
    "<|return|>",
    "<function=add>",
    "<parameter=a>",
    "</parameter>",
    "</function>",
    # GLM-4.5
    "<tool_call>add\n",
    "<arg_key>a</arg_key>",
    "<arg_value>",
    "</arg_value>",
    # DeepSeek V3 and V3.1
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n",
    "<｜tool▁call▁begin｜>add<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<think>",
    "</think>",
    # Gemma 4
    "<|tool_call>call:add{",
    "a:1,b:2}",
    '<|"|>',
    "<tool_call|>",
    "<turn|>",
]
actions = (
    st.text()
    | st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=5), max_size=30).map("".join)
    | st.builds(
        lambda name, args: f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>",
        st.sampled_from(["add", "search", "python", "nope", ""]),
        st.dictionaries(st.sampled_from(["a", "b", "query", "code", "zzz"]), st.integers() | st.text(max_size=5)),
    )
)


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@tool
def search(query: str) -> str:
    """Pretend to search."""
    return f"results for {query[:20]}"


@tool
def python(code: str) -> str:
    """Pretend to run code."""
    return f"ran {len(code)} chars"


@pytest.fixture(scope="module", params=parser_names())  # every registered parser: a new one is covered at once
def env(request: pytest.FixtureRequest) -> Iterator[toolenv.ToolEnv]:
    with warnings.catch_warnings():  # tags/codeblock cannot call `add`: known, and beside the point here
        warnings.filterwarnings("ignore", r"the (tags|codeblock) parser", UserWarning)
        e = toolenv.ToolEnv(
            tools=[add, search, python],
            tasks=[{"question": "2+3?", "answer": "5"}],
            parser=request.param,
            reward={"exact_match": 1.0, "format": 0.1, "penalties": 1.0, "tool_success": 0.1},
            max_turns=3,
        )
    yield e
    e.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(action=actions)
def test_step_never_raises(env: toolenv.ToolEnv, action: str) -> None:
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs, str)
    assert math.isfinite(float(reward))
    parsed = info["action"]
    assert parsed == env.parser.parse(action)
    results = info["tool_results"]
    if parsed.answer is None:
        assert not terminated and results  # something always comes back
    if parsed.errors or (not parsed.tool_calls and parsed.answer is None):
        # Malformed: the model sees an error observation.
        assert any(r.is_error for r in results)
        errors = [r for r in results if r.is_error and r.name == "parser"]
        # The errors reach the model in the format's own markers (Llama's JSON escapes quotes).
        assert errors and obs == env.parser.format_results(results)
    assert set(info["reward_components"]) == {"exact_match", "format", "penalties", "tool_success"}


def test_malformed_hermes_action_gets_error_observation() -> None:
    env = toolenv.ToolEnv(tools=[add], tasks=[{"question": "2+3?", "answer": "5"}], parser="hermes")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>')
    assert obs.startswith("<tool_response>") and "not valid JSON" in obs
    assert not terminated and not truncated and reward == 0.0
    obs, *_ = env.step("I will not call anything.")
    assert "No tool call and no final answer" in obs
    obs, _, _, _, info = env.step('<tool_call>{"name": "add", "arguments": {"a": "x", "b": 2}}</tool_call>')
    assert "Invalid arguments" in obs or "for tool 'add'" in obs
    assert info["tool_results"][0].is_error
    env.close()


def test_malformed_tags_and_codeblock_actions_get_error_observations() -> None:
    tags = toolenv.ToolEnv(tools=[search], tasks=[{"question": "q", "answer": "a"}], parser="tags")
    tags.reset(seed=0)
    obs, *_ = tags.step("<search>unclosed query")
    assert obs == "<information><search> is not closed with </search>.</information>"
    tags.close()
    code = toolenv.ToolEnv(tools=[python], tasks=[{"question": "q", "answer": "a"}], parser="codeblock")
    code.reset(seed=0)
    obs, *_ = code.step("```python\nprint(1)")
    assert obs == "```output\nA ```python block is not closed with ```.\n```"
    code.close()


def test_huge_and_control_character_actions() -> None:
    env = toolenv.ToolEnv(tools=[add], tasks=[{"question": "q", "answer": "a"}], parser="hermes", max_turns=10)
    env.reset(seed=0)
    for action in ["<answer>" * 50_000, "<tool_call>" * 20_000, "\x00\x01\x02\x1b[2J", "[" * 200_000, "", "\ud800"]:
        obs, _, terminated, _, info = env.step(action)
        assert isinstance(obs, str) and not terminated
        assert any(r.is_error for r in info["tool_results"])
    env.close()


def test_an_env_warns_of_tools_its_prompted_format_cannot_call() -> None:
    """`tags` and `codeblock` call only the tools they map; an env given another tool (the
    README's `add` with `parser="tags"`) offers it nowhere in the prompt, and the model can
    never call it. The env says so when it is built, naming the tool and what to do."""
    task = [{"question": "2+3?", "answer": "5"}]
    with pytest.warns(UserWarning, match=r"the tags parser has no tag for tool\(s\) 'add'") as caught:
        toolenv.ToolEnv(tools=[add, search], tasks=task, parser="tags").close()
    assert "'search'" not in str(caught[0].message) and "parser='hermes'" in str(caught[0].message)
    with pytest.warns(UserWarning, match=r"the codeblock parser calls only 'python'.*'add'"):
        toolenv.ToolEnv(tools=[add, python], tasks=task, parser="codeblock").close()
    mapped = {"tags": {"plus": ("add", "expression")}}
    for parser, kwargs, tools in [("tags", {}, [search]), ("tags", mapped, [add]), ("codeblock", {}, [python])]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            toolenv.ToolEnv(tools=tools, tasks=task, parser=parser, parser_kwargs=kwargs).close()


@pytest.mark.parametrize("spec", parser_names())
def test_answer_instructions_are_the_instructions_answer_part_without_the_tools(spec: str) -> None:
    """What a prompt says when the chat template or the API lists the tools (native tool calling):
    how to answer, in the words of the full instructions, and nothing about the tools."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"the (tags|codeblock) parser", UserWarning)
        parser = toolenv.get_parser(spec).bind([add, search, python])
    answer = parser.answer_instructions()
    full = parser.instructions([add, search, python])
    assert answer, spec  # every format here reads a final answer by default
    assert answer in full and len(answer) < len(full), spec
    assert not any(word in answer for word in ("add", "search", "python", "{", "function")), (spec, answer)
    try:
        without = toolenv.get_parser(spec, answer_tag=False)
    except TypeError:  # the format always reads an answer
        return
    assert "<answer>" not in without.answer_instructions(), spec
