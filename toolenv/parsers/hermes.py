"""Hermes/Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from toolenv.parsers.base import ActionParser, register_parser, tools_json
from toolenv.tool import Tool
from toolenv.types import ParsedAction, ToolCall, ToolResult

__all__ = ["HermesParser"]

# A call ends at its `</tool_call>`; an unclosed one ends where the next `<tool_call>` opens
# (so one forgotten close does not swallow the calls after it) or at the end of the text.
_CALL = re.compile(r"<tool_call>((?:(?!<tool_call>).)*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)


class HermesParser(ActionParser):
    """The format of Qwen2.5/Qwen3 and Hermes chat templates (and verl's `hermes` parser)."""

    name = "hermes"
    stop = ("</tool_call>",)

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    def parse(self, text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        for i, m in enumerate(_CALL.finditer(text)):
            body = m.group(1).strip()
            if not m.group(0).endswith("</tool_call>"):
                errors.append(f"Tool call {i + 1} is not closed with </tool_call>.")
                continue
            call, err = _decode_call(body, i)
            if err:
                errors.append(err)
            elif call is not None:
                calls.append(call)
        rest = _CALL.sub("", text)
        answer, rest = self.find_answer(rest) if self.answer_tag else (None, rest)
        return ParsedAction(tool_calls=calls, answer=answer, text=rest.strip(), errors=errors)

    def instructions(self, tools: Sequence[Tool]) -> str:
        return (
            "You may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{tools_json(tools)}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
            "When you know the final answer, write it as <answer>...</answer>."
        )

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in results)


def _decode_call(body: str, index: int) -> tuple[ToolCall | None, str | None]:
    try:
        obj: Any = json.loads(body)
    except (ValueError, RecursionError) as exc:  # ValueError: also ints past Python's 4300-digit limit
        return None, (
            f"Tool call {index + 1} is not valid JSON ({_json_problem(exc)}). "
            'Write {"name": ..., "arguments": {...}}.'
        )
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, f'Tool call {index + 1} needs a JSON object with a string "name".'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None, f'Tool call {index + 1}: "arguments" is a string that is not JSON.'
    if not isinstance(args, dict):
        return None, f'Tool call {index + 1}: "arguments" must be a JSON object.'
    call_id = obj.get("id")
    return ToolCall(name=obj["name"], arguments=args, id=call_id if isinstance(call_id, str) else f"call_{index}"), None


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "too deeply nested"
    return str(exc).split(":", 1)[0]  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"


register_parser("hermes", HermesParser)
