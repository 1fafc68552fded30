"""Search-R1 style tags: `<search>q</search>`, `<sql>…</sql>`, `<python>…</python>`, `<answer>…</answer>`."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers.base import ActionParser, register_parser
from toolenv.types import ParsedAction, ToolCall, ToolResult

__all__ = ["DEFAULT_TAGS", "TagParser"]

#: tag -> (tool name, argument name)
DEFAULT_TAGS: dict[str, tuple[str, str]] = {
    "search": ("search", "query"),
    "sql": ("sql", "query"),
    "python": ("python", "code"),
}


class TagParser(ActionParser):
    """Each `<tag>body</tag>` becomes a call of the mapped tool with `body` as its one argument.

    Results come back between `result_open` and `result_close` (Search-R1's
    `<information>`), so the model sees one block per call.
    """

    name = "tags"
    #: Search-R1 appends `\n\n<information>…</information>\n\n` to the model's text.
    continuation = ("\n\n", "\n\n")

    def __init__(
        self,
        tags: Mapping[str, tuple[str, str]] | None = None,
        result_open: str = "<information>",
        result_close: str = "</information>",
        answer_tag: str = "answer",
    ) -> None:
        self.tags = dict(DEFAULT_TAGS if tags is None else tags)
        for tag in [*self.tags, answer_tag]:
            if not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
                raise ValueError(f"tag {tag!r} is not a valid tag name")
        self.result_open = result_open
        self.result_close = result_close
        self.answer_tag = answer_tag
        names = "|".join(re.escape(t) for t in [*self.tags, answer_tag])
        self._pattern = re.compile(rf"<({names})>(.*?)(</\1>|$)", re.DOTALL)
        self.stop = tuple(f"</{t}>" for t in self.tags)

    def parse(self, text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        answer: str | None = None
        rest: list[str] = []
        pos = 0
        for m in self._pattern.finditer(text):
            rest.append(text[pos : m.start()])
            pos = m.end()
            tag, body, close = m.group(1), m.group(2).strip(), m.group(3)
            if not close:
                errors.append(f"<{tag}> is not closed with </{tag}>.")
                continue
            if tag == self.answer_tag:
                answer = body
                continue
            if not body:
                errors.append(f"<{tag}></{tag}> is empty.")
                continue
            tool_name, arg = self.tags[tag]
            calls.append(ToolCall(name=tool_name, arguments={arg: body}, id=f"call_{len(calls)}"))
        rest.append(text[pos:])
        return ParsedAction(tool_calls=calls, answer=answer, text="".join(rest).strip(), errors=errors)

    def bind(self, tools: Sequence[Tool]) -> TagParser:
        """Warn of tools no tag calls: the prompt would not offer them and the model could
        never call them (a silent failure: an env whose tools are never used)."""
        mapped = {tool for tool, _ in self.tags.values()}
        missing = [t.name for t in tools if t.name not in mapped]
        if missing:
            warnings.warn(
                f"the tags parser has no tag for tool(s) {', '.join(map(repr, missing))}, so the "
                f"prompt does not offer them and a model writing tags cannot call them, only one given "
                f"the tools natively (its tags: "
                f"{', '.join(f'<{tag}> -> {tool}' for tag, (tool, _) in self.tags.items())}). A tag "
                "carries one string argument: map one with parser_kwargs={'tags': {TAG: (TOOL, ARGUMENT)}}, "
                "or use a format with JSON arguments such as parser='hermes'",
                UserWarning,
                stacklevel=3,
            )
        return self

    def instructions(self, tools: Sequence[Tool]) -> str:
        summary = {t.name: (t.description.splitlines() or [t.name])[0] for t in tools}
        lines = [
            f"- <{tag}>{arg}</{tag}>: {summary[tool]}" for tag, (tool, arg) in self.tags.items() if tool in summary
        ]
        return (
            "You can use these tools by writing a tag; the result appears between "
            f"{self.result_open} and {self.result_close}:\n" + "\n".join(lines) + "\n" + self.answer_instructions()
        )

    def answer_instructions(self) -> str:
        return f"When you know the final answer, write it as <{self.answer_tag}>...</{self.answer_tag}>."

    def answer_markup(self) -> str:
        return f"<{self.answer_tag}>...</{self.answer_tag}>"

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return "\n".join(f"{self.result_open}{r.text}{self.result_close}" for r in results)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        for tag, (tool, arg) in self.tags.items():
            value = arguments.get(arg)
            if tool == name and set(arguments) == {arg} and isinstance(value, str) and value.strip():
                if f"</{tag}>" in value:
                    return None
                return f"<{tag}>{value}</{tag}>"
        return None  # a tag carries one string argument of one tool


register_parser("tags", TagParser)
