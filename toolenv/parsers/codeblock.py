"""Fenced code blocks: each ```python block is a call of the code tool."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers.base import ActionParser, register_parser
from toolenv.types import ParsedAction, ToolCall, ToolResult

__all__ = ["CodeBlockParser"]


class CodeBlockParser(ActionParser):
    """Each ```` ```python ```` block calls `tool` with argument `arg`; output returns in ```` ```output ````."""

    name = "codeblock"

    def __init__(
        self, tool: str = "python", arg: str = "code", languages: Sequence[str] = ("python", "py", "python3", "py3")
    ) -> None:
        self.tool = tool
        self.arg = arg
        self.languages = tuple(languages)
        # Longest first, so "python3" is not read as "python" followed by a stray "3"; the tag
        # in any case, as Markdown readers take it (models write ```Python too).
        langs = "|".join(re.escape(lang) for lang in sorted(languages, key=len, reverse=True))
        self._pattern = re.compile(rf"```(?:{langs})[ \t]*\n(.*?)(```|$)", re.DOTALL | re.IGNORECASE)

    def parse(self, text: str) -> ParsedAction:
        # The answer comes out first: a fenced block inside <answer> is the answer, not a call.
        answer, text = self.find_answer(text)
        calls: list[ToolCall] = []
        errors: list[str] = []
        for m in self._pattern.finditer(text):
            if not m.group(2):
                errors.append("A ```python block is not closed with ```.")
                continue
            code = m.group(1)
            if code.strip():
                calls.append(ToolCall(name=self.tool, arguments={self.arg: code}, id=f"call_{len(calls)}"))
        rest = self._pattern.sub("", text)
        return ParsedAction(tool_calls=calls, answer=answer, text=rest.strip(), errors=errors)

    def instructions(self, tools: Sequence[Tool]) -> str:
        return (
            "Write Python in a ```python fenced block to run it; its output comes back in an "
            "```output block. When you know the final answer, write it as <answer>...</answer>."
        )

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return "\n".join(f"```output\n{r.text}\n```" for r in results)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        code = arguments.get(self.arg)
        if name != self.tool or set(arguments) != {self.arg} or not isinstance(code, str) or "```" in code:
            return None
        return f"```{self.languages[0]}\n{code}\n```"


register_parser("codeblock", CodeBlockParser)
