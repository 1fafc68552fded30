"""Reasoning kept out of the parse, as vLLM's `--reasoning-parser` keeps it from the tool parser.

A thinking model (Qwen3, DeepSeek-R1, GLM-4.5, QwQ …) writes `<think>…</think>` before it acts,
and may draft a call or an answer there. Served by vLLM with a reasoning parser, that draft is
reasoning content: never run, never the answer. Most formats' parsers read the whole turn (as
verl's own parsers do), so a draft would run in training and not in serving.
`get_parser(name, reasoning=True)` (or `parser_kwargs={"reasoning": True}`) wraps a parser so
it reads only the text outside reasoning, for any format; the reasoning stays in the turn's
`text`. (`glm45`, `deepseek_v3`/`deepseek_v31` and `kimi_k2` already skip reasoning on their own,
and `muse_glimmer` reads no call or answer in a message `to=self`.)

`format_call` writes a reasoning tag inside a call's arguments with its `<` escaped (`\\u003c`),
as `deepseek_v3` and `kimi_k2` do, so the call reads back rather than turning into reasoning;
where the format has no escapes it returns None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers.base import ActionParser
from toolenv.types import ParsedAction, ToolResult

__all__ = ["THINK", "ReasoningParser", "split_reasoning"]

#: The tags of Qwen3, DeepSeek-R1, GLM-4.5, QwQ, Nemotron and most open reasoning models.
THINK = ("<think>", "</think>")


def split_reasoning(text: str, open_tag: str = THINK[0], close_tag: str = THINK[1]) -> tuple[str, str]:
    """`(reasoning, rest)`: every `open…close` block of `text` (an unclosed one runs to the end),
    plus everything before a `close` that no `open` precedes (the generation prompt opened
    it, as Qwen3's and DeepSeek-R1's templates do), and the text outside them."""
    first_close = text.find(close_tag)
    first_open = text.find(open_tag)
    if first_close < 0 and first_open < 0:
        return "", text
    reasoning: list[str] = []
    rest: list[str] = []
    pos = 0
    if first_close >= 0 and not 0 <= first_open < first_close:
        pos = first_close + len(close_tag)
        reasoning.append(text[:pos])
    # str.find from remembered positions: linear even on a megabyte of unclosed tags.
    while (start := text.find(open_tag, pos)) >= 0:
        rest.append(text[pos:start])
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            reasoning.append(text[start:])
            pos = len(text)
            break
        pos = end + len(close_tag)
        reasoning.append(text[start:pos])
    rest.append(text[pos:])
    return "".join(reasoning), "".join(rest)


def _escaped_first(tag: str) -> str:
    """`tag` with its first character written as a JSON/Python `\\uXXXX` escape."""
    code = ord(tag[0])
    if code > 0xFFFF:  # a surrogate pair, as JSON writes it
        code -= 0x10000
        first = f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    else:
        first = f"\\u{code:04x}"
    return first + tag[1:]


def reasoning_tags(value: Any) -> tuple[str, str] | None:
    """The tags a `reasoning=` argument asks for: None for False/None, `THINK` for True, or a
    pair of non-empty strings.

    Raises:
        ValueError: anything else (the message says what is accepted).
    """
    if value is None or value is False:
        return None
    if value is True:
        return THINK
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, str) and v for v in value)
        and value[0] != value[1]
    ):
        return (value[0], value[1])
    raise ValueError(
        f"reasoning must be true, false or two different non-empty tags like ['<think>', '</think>'], got {value!r}"
    )


class ReasoningParser(ActionParser):
    """`inner`, reading only the text outside reasoning blocks; everything else is `inner`'s."""

    def __init__(self, inner: ActionParser, tags: tuple[str, str] = THINK) -> None:
        self.inner = inner
        self.tags = tags
        self.name = inner.name
        self.stop = inner.stop
        # The tags are needed to read a turn: a tokenizer that made them special keeps them when
        # it decodes a reply (`toolenv.parsers.decoding.reply_text`), or every draft would run.
        self.markers = (*inner.markers, *(t for t in tags if t not in inner.markers))
        self.special_tokens = inner.special_tokens
        self.tool_messages = inner.tool_messages

    def parse(self, text: str) -> ParsedAction:
        reasoning, rest = split_reasoning(text, *self.tags)
        if not reasoning:
            return self.inner.parse(text)
        action = self.inner.parse(rest)
        action.text = f"{reasoning.strip()}\n{action.text}".strip()
        return action

    def bind(self, tools: Sequence[Tool]) -> ActionParser:
        inner = self.inner.bind(tools)
        return self if inner is self.inner else ReasoningParser(inner, self.tags)

    def instructions(self, tools: Sequence[Tool]) -> str:
        return self.inner.instructions(tools)

    def answer_instructions(self) -> str:
        return self.inner.answer_instructions()

    def answer_markup(self) -> str | None:
        return self.inner.answer_markup()

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return self.inner.format_results(results)

    def format_errors(self, errors: Sequence[str]) -> str:
        return self.inner.format_errors(errors)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        """`inner`'s call, with the first character of a reasoning tag inside it written as a
        `\\uXXXX` escape (`\\u003c/think>`), which JSON and Python strings read back as the tag:
        written raw, `parse` would take the tag for reasoning and lose the call. None when the
        escaped text does not read back as the same call (a format of raw text, such as
        Qwen3-Coder's XML or a code block, cannot carry a reasoning tag)."""
        text = self.inner.format_call(name, arguments, call_id)
        if text is None or not any(tag in text for tag in self.tags):
            return text
        escaped = text
        for tag in self.tags:
            escaped = escaped.replace(tag, _escaped_first(tag))
        if any(tag in escaped for tag in self.tags):
            return None
        written = self.inner.parse(text).tool_calls
        return escaped if written and self.parse(escaped).tool_calls == written else None

    def __repr__(self) -> str:
        return f"ReasoningParser({self.inner!r}, tags={self.tags!r})"
