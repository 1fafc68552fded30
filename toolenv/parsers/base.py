"""The parser interface and the name lookup used by `ToolEnv(parser="hermes")`."""

from __future__ import annotations

import abc
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from toolenv._schema import openai_schema
from toolenv._tool import Tool
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_parsed

__all__ = ["ANSWER_INSTRUCTION", "ActionParser", "answer_markup_of", "get_parser", "parser_names"]

_OPEN, _CLOSE = "<answer>", "</answer>"
#: The sentence of the formats' instructions that says how to give the final answer.
ANSWER_INSTRUCTION = "When you know the final answer, write it as <answer>...</answer>."
#: `<tag>...</tag>` in an answer instruction: the markup it tells the model to write.
_MARKUP = re.compile(r"<([A-Za-z_][\w-]*)>\.\.\.</\1>")


class ActionParser(abc.ABC):
    """Turns one model turn into tool calls and/or a final answer, and formats results back.

    `parse` must never raise: malformed input yields `ParsedAction.errors`.
    """

    name: str = ""
    #: Strings after which generation should stop so the env can answer the call.
    stop: tuple[str, ...] = ()
    #: True when the format is written in the tokenizer's special tokens (Harmony's
    #: `<|channel|>`...): a trainer must decode with `skip_special_tokens=False` for it.
    special_tokens: bool = False
    #: Markers besides `stop` that the format needs to read some turns (LFM2's
    #: `<|tool_call_start|>`, which closes a call list that text may follow): a trainer that
    #: finds one of them or of `stop` among the tokenizer's special tokens keeps special
    #: tokens when it decodes a reply (`toolenv.parsers.decoding.reply_text`).
    markers: tuple[str, ...] = ()
    #: True when chat templates have tool messages for this format (Hermes, Harmony): a chat
    #: trainer sends results back as `tool` messages rather than as a user turn.
    tool_messages: bool = False
    #: Text put before and after an observation that continues the model's own text in one
    #: growing prompt (a completions API, verl's `observation_role: inline`), rather than
    #: entering a chat as a message.
    continuation: tuple[str, str] = ("\n", "\n")
    #: True when the format's calls must end the turn (pythonic's `[name(...)]` list): a turn
    #: written from parsed calls and an answer puts the answer first (`toolenv.env.written_turn`).
    calls_end_turn: bool = False

    @abc.abstractmethod
    def parse(self, text: str) -> ParsedAction:
        """Parse one turn of model output."""

    @abc.abstractmethod
    def instructions(self, tools: Sequence[Tool]) -> str:
        """The text that tells a model which tools exist and how to call them."""

    def answer_instructions(self) -> str:
        """How to give the final answer, the part of `instructions` that is not about the tools
        (empty when the format reads no answer). It is the whole prompt text an env gives when
        the chat template or the API lists the tools itself (native tool calling): the tools
        described twice, the second time in another wording, only lengthen the prompt."""
        return ANSWER_INSTRUCTION if getattr(self, "answer_tag", False) is True else ""

    def answer_markup(self) -> str | None:
        """The tags a final answer is written in, as `answer_instructions` names them
        (`<answer>...</answer>`, a tag parser's `<final>...</final>`), for a prompt or a message
        that names them; None when it names none (the format reads no answer, or takes a
        channel's plain text, as `HarmonyParser(answer_tag=False)` does)."""
        found = _MARKUP.search(self.answer_instructions())
        return found.group(0) if found else None

    @abc.abstractmethod
    def format_results(self, results: Sequence[ToolResult]) -> str:
        """The observation text for a turn's results, with this format's markers."""

    def bind(self, tools: Sequence[Tool]) -> ActionParser:
        """This parser for an env with `tools` (the env calls it once). A format whose
        arguments are untyped text (Qwen3-Coder's XML) returns a copy that knows each
        argument's JSON type; the others need nothing and return themselves."""
        return self

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        """Action text that this parser reads back as the call `name(**arguments)`, or None
        when the format cannot express it (agents use it to turn a server's native tool calls
        into the text the env parses)."""
        return None

    def continue_with(self, observation: str) -> str:
        """`observation` as the text appended to the model's own text (see `continuation`)."""
        before, after = self.continuation
        return f"{before}{observation}{after}"

    def format_errors(self, errors: Sequence[str]) -> str:
        """The observation for a turn whose action could not be used."""
        return self.format_results([ToolResult.error(e) for e in errors])

    @staticmethod
    def find_answer(text: str) -> tuple[str | None, str]:
        """The last `<answer>…</answer>` in `text` and the text with answers removed."""
        # str.find, not a regex: `<answer>(.*?)</answer>` rescans to the end from every
        # unclosed `<answer>`, which is quadratic (minutes on a 240 kB reply of them).
        spans: list[tuple[int, int]] = []
        pos = 0
        while (start := text.find(_OPEN, pos)) >= 0:
            end = text.find(_CLOSE, start + len(_OPEN))
            if end < 0:
                break
            spans.append((start, end + len(_CLOSE)))
            pos = end + len(_CLOSE)
        if not spans:
            return None, text
        last_start, last_end = spans[-1]
        answer = text[last_start + len(_OPEN) : last_end - len(_CLOSE)].strip()
        rest, prev = [], 0
        for a, b in spans:
            rest.append(text[prev:a])
            prev = b
        rest.append(text[prev:])
        return answer, "".join(rest)


def tool_call_action(calls: list[ToolCall], errors: list[str], rest: str, answer_tag: bool) -> ParsedAction:
    """The turn's `ParsedAction` from the calls a parser found, its errors and the text around
    the calls; an `<answer>` in that text is the answer when `answer_tag` is on."""
    answer, rest = ActionParser.find_answer(rest) if answer_tag and "<answer>" in rest else (None, rest)
    return new_parsed(calls, answer, rest.strip(), errors)


def reasoning_runs(pieces: Sequence[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """A turn's pieces of text, as `(text, is_reasoning)`, with each stretch of plain pieces
    joined into one run between the reasoning runs (a plain run may be empty)."""
    runs: list[tuple[str, bool]] = []
    plain: list[str] = []
    for piece, reasoning in pieces:
        if reasoning:
            runs += [("".join(plain), False), (piece, True)]
            plain = []
        else:
            plain.append(piece)
    runs.append(("".join(plain), False))
    return runs


def tools_json(tools: Sequence[Tool]) -> str:
    """One JSON schema per line, the layout Qwen/Hermes chat templates use inside `<tools>`."""
    return "\n".join(
        _schema_line(t.name, t.description, t.Args)
        if type(t).schema is Tool.schema
        else json.dumps(t.schema(), ensure_ascii=False)
        for t in tools
    )


@functools.lru_cache(maxsize=4096)
def _schema_line(name: str, description: str, args: type[BaseModel]) -> str:
    """A tool's schema line, made once: every env renders its tools into its prompt when built
    (the runner builds one env per concurrent episode), and the line depends only on these."""
    return json.dumps(openai_schema(name, description, args), ensure_ascii=False)


_FACTORIES: dict[str, Callable[..., ActionParser]] = {}


def register_parser(name: str, factory: Callable[..., ActionParser]) -> None:
    """Make `factory` available as `parser=name`."""
    _FACTORIES[name] = factory


def parser_names() -> list[str]:
    """Names accepted by `get_parser`."""
    return sorted(_FACTORIES)


def get_parser(spec: str | ActionParser, *, reasoning: Any = False, **kwargs: Any) -> ActionParser:
    """An `ActionParser` from a name (`hermes`, `tags`, `codeblock`, `harmony`, `qwen3_xml`,
    `llama3_json`, `pythonic`, `mistral`, `glm45`, `deepseek_v3`, `deepseek_v31`, `gemma4`,
    `kimi_k2`, `muse_glimmer`) or the parser itself.

    Args:
        reasoning: True (or a pair of tags, e.g. `["<think>", "</think>"]`) to read only the text
            outside reasoning blocks, as vLLM's `--reasoning-parser` does (`ReasoningParser`).
        kwargs: the named parser's own arguments.

    Raises:
        ValueError: unknown name (the message lists the known ones), or a bad `reasoning`.
    """
    if reasoning is None or reasoning is False:  # the usual case: no import (0.5 µs) per env built
        tags = None
    else:
        from toolenv.parsers.reasoning import reasoning_tags

        tags = reasoning_tags(reasoning)
    if isinstance(spec, ActionParser):
        parser = spec
    else:
        try:
            factory = _FACTORIES[spec]
        except KeyError:
            if spec == "auto":
                raise ValueError(
                    "parser='auto' needs the model's tokenizer: name the parser, or pick it with "
                    "toolenv.parsers.detect_parser(tokenizer) (verl's agent loop does this for 'auto')"
                ) from None
            raise ValueError(f"unknown parser {spec!r}; known parsers: {', '.join(parser_names())}") from None
        parser = factory(**kwargs)
    if tags is None:
        return parser
    from toolenv.parsers.reasoning import ReasoningParser

    return ReasoningParser(parser, tags)


def answer_markup_of(spec: str | ActionParser, parser_kwargs: Mapping[str, Any] | None = None) -> str | None:
    """The answer markup (`ActionParser.answer_markup`) of the parser `spec` and `parser_kwargs`
    make, for an env that words its prompt before `ToolEnv` builds that parser (Spider's, the
    code envs'): a prompt must ask for the tags the parser reads."""
    return get_parser(spec, **dict(parser_kwargs or {})).answer_markup()
