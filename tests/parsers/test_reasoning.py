"""`reasoning=True`: any parser reads only the text outside reasoning, as vLLM's reasoning parsers do."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolenv
from toolenv.parsers import ReasoningParser, get_parser, parser_names
from toolenv.parsers.reasoning import split_reasoning

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def test_split_reasoning_finds_every_block() -> None:
    assert split_reasoning("no tags") == ("", "no tags")
    assert split_reasoning("a<think>x</think>b<think>y</think>c") == ("<think>x</think><think>y</think>", "abc")
    # The generation prompt opened the block: the reply starts inside it.
    assert split_reasoning("x</think>rest") == ("x</think>", "rest")
    assert split_reasoning("a<think>unclosed <tool_call>") == ("<think>unclosed <tool_call>", "a")
    assert split_reasoning("[r]a[/r]b", "[r]", "[/r]") == ("[r]a[/r]", "b")


@pytest.mark.parametrize("name", [n for n in parser_names() if get_parser(n).format_call("add", {"a": 1, "b": 2})])
def test_a_call_drafted_in_reasoning_does_not_run(name: str) -> None:
    plain = get_parser(name)
    call = plain.format_call("add", {"a": 1, "b": 2}, "call_0")
    assert call is not None
    wrapped = get_parser(name, reasoning=True).bind([add])  # bound as an env binds it (typed values)
    assert isinstance(wrapped, ReasoningParser) and wrapped.name == name
    drafted = f"<think>maybe {call}</think>Let me think again."
    assert wrapped.parse(drafted).tool_calls == []
    assert "maybe" in wrapped.parse(drafted).text  # the reasoning stays in the turn's text
    real = wrapped.parse(f"<think>I need a sum.</think>{call}")
    assert [(c.name, c.arguments) for c in real.tool_calls] == [("add", {"a": 1, "b": 2})]
    assert real.text.startswith("<think>I need a sum.</think>")


@pytest.mark.parametrize("name", ["hermes", "tags", "qwen3_xml", "pythonic", "mistral"])
def test_an_answer_drafted_in_reasoning_does_not_end_the_episode(name: str) -> None:
    assert get_parser(name).parse("<think>maybe <answer>1</answer></think> check").answer == "1"  # unwrapped
    wrapped = get_parser(name, reasoning=True)
    assert wrapped.parse("<think>maybe <answer>1</answer></think> check").answer is None
    assert wrapped.parse("maybe <answer>1</answer></think> check").answer is None  # prompt-opened block
    assert wrapped.parse("<think>so 2</think><answer>2</answer>").answer == "2"


def test_custom_tags_and_bad_values() -> None:
    parser = get_parser("hermes", reasoning=["<|thought|>", "<|/thought|>"])
    assert parser.parse("<|thought|><answer>1</answer><|/thought|>").answer is None
    assert get_parser("hermes", reasoning=False).parse("<think><answer>1</answer></think>").answer == "1"
    for bad in ("yes", ["<think>"], ["<t>", "<t>"], ["", "</t>"], 1):
        with pytest.raises(ValueError, match="reasoning must be"):
            get_parser("hermes", reasoning=bad)


def test_the_wrapper_keeps_the_format() -> None:
    inner = get_parser("qwen3_xml")
    wrapped = get_parser(inner, reasoning=True)
    assert isinstance(wrapped, ReasoningParser) and wrapped.inner is inner
    assert (wrapped.stop, wrapped.special_tokens, wrapped.tool_messages) == (
        inner.stop,
        inner.special_tokens,
        inner.tool_messages,
    )
    assert wrapped.instructions([add]) == inner.instructions([add])
    results = [toolenv.ToolResult(text="3", name="add", call_id="call_0")]
    assert wrapped.format_results(results) == inner.format_results(results)
    assert wrapped.format_errors(["bad"]) == inner.format_errors(["bad"])
    # Bound to the env's tools, Qwen3-XML reads values by type: the wrapper binds its inner parser.
    bound = wrapped.bind([add])
    assert isinstance(bound, ReasoningParser) and bound.inner is not inner
    call = inner.format_call("add", {"a": 1, "b": 2})
    assert bound.parse(f"<think>x</think>{call}").tool_calls[0].arguments == {"a": 1, "b": 2}


THINK_ARGS = [
    {"code": 'out = reply.split("</think>")[-1]'},
    {"code": "print('<think>')"},
    {"code": "<think>a</think> and </think><think>", "n": [1, "</think>"]},
]


@pytest.mark.parametrize("args", THINK_ARGS)
@pytest.mark.parametrize("name", parser_names())
def test_a_think_tag_in_a_calls_arguments_reads_back_or_is_declined(name: str, args: dict[str, object]) -> None:
    wrapped = get_parser(name, reasoning=True)
    text = wrapped.format_call("python", args, "call_0")
    if get_parser(name).format_call("python", args, "call_0") is None:
        assert text is None
    if text is None:  # the format has no escapes (raw text): it cannot carry the tag
        assert name not in {"hermes", "llama3_json", "mistral", "pythonic", "harmony", "deepseek_v3", "kimi_k2"}
        return
    for reply in (text, f"<think>I will split.</think>{text}", f"I will split.</think>\n{text}"):
        action = wrapped.parse(reply)
        assert [(c.name, c.arguments) for c in action.tool_calls] == [("python", args)], reply
        assert action.errors == []


def test_the_wrapper_escapes_think_tags_only_where_needed() -> None:
    wrapped = get_parser("hermes", reasoning=True)
    plain = get_parser("hermes").format_call("python", {"code": "x"})
    assert wrapped.format_call("python", {"code": "x"}) == plain  # no tag: the inner text as it is
    text = wrapped.format_call("python", {"code": "a</think>b"})
    assert text is not None and "</think>" not in text and "\\u003c/think>" in text
    custom = get_parser("hermes", reasoning=["\U0001f914", "</\U0001f914>"])
    written = custom.format_call("python", {"code": "\U0001f914 hmm </\U0001f914>"})
    assert written is not None and "\U0001f914" not in written
    assert custom.parse(written).tool_calls[0].arguments == {"code": "\U0001f914 hmm </\U0001f914>"}
    assert get_parser("qwen3_xml", reasoning=True).format_call("python", {"code": "</think>"}) is None


def test_an_env_with_reasoning_runs_only_the_real_call() -> None:
    env = toolenv.ToolEnv(
        tools=[add],
        tasks=[{"question": "1+2?", "answer": "3"}],
        parser_kwargs={"reasoning": True},
    )
    env.reset(seed=0)
    draft = '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 5}}</tool_call>'
    real = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    obs, reward, terminated, _, _ = env.step(f"<think>First {draft}? No.</think>{real}")
    assert obs == "<tool_response>\n3\n</tool_response>" and not terminated
    obs, reward, terminated, _, _ = env.step("<think>draft <answer>10</answer></think><answer>3</answer>")
    assert terminated and reward == 1.0
    env.close()


@SETTINGS
@given(
    st.lists(st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "x", "\n"]), max_size=60)
)
def test_no_input_makes_a_wrapped_parser_raise(pieces: list[str]) -> None:
    text = "".join(pieces)
    reasoning, rest = split_reasoning(text)
    assert len(reasoning) + len(rest) == len(text)
    for name in ("hermes", "tags", "glm45", "harmony"):
        action = get_parser(name, reasoning=True).parse(text)
        assert action.answer is None or "<think>" not in action.answer


def test_huge_unclosed_reasoning_is_linear() -> None:
    text = "<think>" * 200_000
    assert get_parser("hermes", reasoning=True).parse(text).tool_calls == []
    assert split_reasoning("</think>" * 200_000)[1] == "</think>" * 199_999
