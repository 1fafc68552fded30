"""Fenced code blocks: each ```python block is a call of the code tool.

The code is what lies between the opening fence's line and the closing fence, less the one line
break before the closing fence (`format_call` writes it), so a block round-trips exactly. The
text is read once, in order: an `<answer>` inside a block's code is code (a program may print
its result in answer tags), while a fenced block inside `<answer>…</answer>` is the answer, not a
call. As with `ActionParser.find_answer`, the last closed `<answer>` outside blocks is the answer.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers.base import ANSWER_INSTRUCTION, ActionParser, register_parser
from toolenv.types import ParsedAction, ToolCall, ToolResult

__all__ = ["CodeBlockParser"]

_OPEN, _CLOSE = "<answer>", "</answer>"
_FENCE = "```"


class CodeBlockParser(ActionParser):
    """Each ```` ```python ```` block calls `tool` with argument `arg`; output returns in ```` ```output ````."""

    name = "codeblock"
    #: The model writing an ```` ```output ```` block itself is inventing its code's result
    #: (and, after it, an answer built on it): generation stops there, as ToRL's does, and the
    #: env's real output follows.
    stop = ("```output",)

    def __init__(
        self, tool: str = "python", arg: str = "code", languages: Sequence[str] = ("python", "py", "python3", "py3")
    ) -> None:
        self.tool = tool
        self.arg = arg
        self.languages = tuple(languages)
        # Longest first, so "python3" is not read as "python" followed by a stray "3"; the tag
        # in any case, as Markdown readers take it (models write ```Python too).
        langs = "|".join(re.escape(lang) for lang in sorted(languages, key=len, reverse=True))
        self._fence = re.compile(rf"```(?:{langs})[ \t]*\n", re.IGNORECASE)

    def parse(self, text: str) -> ParsedAction:
        # One pass in order: a block's code is passed through verbatim (an `<answer>` inside it
        # is code), and a fenced block inside `<answer>…</answer>` is the answer, not a call.
        calls: list[ToolCall] = []
        errors: list[str] = []
        rest: list[str] = []
        answer: str | None = None
        pos = 0
        # Remembered positions (-2: not searched yet, -1: none left) keep the scan linear.
        fence: re.Match[str] | None = None
        fence_done = False
        close = opened = -2
        while pos < len(text):
            if not fence_done and (fence is None or fence.start() < pos):
                fence = self._fence.search(text, pos)
                fence_done = fence is None
            if opened != -1 and opened < pos:
                opened = text.find(_OPEN, pos)
            if opened >= 0 and (fence is None or opened < fence.start()):
                end = text.find(_CLOSE, opened + len(_OPEN))
                if end < 0:  # unclosed: no answer from here on, but blocks after it are still read
                    opened = -1
                    continue
                rest.append(text[pos:opened])
                answer = text[opened + len(_OPEN) : end].strip()
                pos = end + len(_CLOSE)
                continue
            if fence is None:
                break
            rest.append(text[pos : fence.start()])
            body = fence.end()
            if close != -1 and close < body:
                close = text.find(_FENCE, body)
            if close < 0:
                errors.append("A ```python block is not closed with ```.")
                pos = len(text)
                break
            code = text[body:close]
            code = code[:-1] if code.endswith("\n") else code  # the line break before the fence is the format's
            if code.strip():
                calls.append(ToolCall(name=self.tool, arguments={self.arg: code}, id=f"call_{len(calls)}"))
            pos = close + len(_FENCE)
        rest.append(text[pos:])
        return ParsedAction(tool_calls=calls, answer=answer, text="".join(rest).strip(), errors=errors)

    def bind(self, tools: Sequence[Tool]) -> CodeBlockParser:
        """Warn of tools other than the code tool: the prompt does not offer them and the
        model cannot call them."""
        missing = [t.name for t in tools if t.name != self.tool]
        if missing:
            warnings.warn(
                f"the codeblock parser calls only {self.tool!r} (with the code of a fenced block), so "
                f"the model cannot call tool(s) {', '.join(map(repr, missing))}; use a format with "
                "JSON arguments such as parser='hermes' for them",
                UserWarning,
                stacklevel=3,
            )
        return self

    def instructions(self, tools: Sequence[Tool]) -> str:
        return (
            "Write Python in a ```python fenced block to run it; its output comes back in an "
            f"```output block. {self.answer_instructions()}"
        )

    def answer_instructions(self) -> str:
        return ANSWER_INSTRUCTION

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return "\n".join(f"```output\n{r.text}\n```" for r in results)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        code = arguments.get(self.arg)
        if name != self.tool or set(arguments) != {self.arg} or not isinstance(code, str) or "```" in code:
            return None
        return f"```{self.languages[0]}\n{code}\n```"


register_parser("codeblock", CodeBlockParser)
