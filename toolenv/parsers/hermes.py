"""Hermes/Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers._json import decode_json, encode_json, json_problem
from toolenv.parsers._scan import positional_id
from toolenv.parsers.base import ActionParser, register_parser, tool_call_action, tools_json
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call

__all__ = ["HermesParser", "read_tool_call_blocks", "scan_tool_call_blocks", "tool_responses"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
#: Open blocks per reply whose body is also tried up to the next `</tool_call>` (`_whole_call`).
_MAX_TAG_IN_ARGUMENTS = 8


def scan_tool_call_blocks(text: str) -> Iterator[tuple[int, int, str, bool]]:
    """Yield `(start, end, body, closed)` for each `<tool_call>` in `text`.

    A call ends at its `</tool_call>`; an unclosed one ends where the next `<tool_call>`
    opens (so one forgotten close does not swallow the calls after it) or at the end.
    str.find with remembered positions keeps this linear (and ~4x faster than the
    equivalent tempered regex) even on adversarial input.
    """
    pos = 0
    close = nxt = -2  # -2: not searched yet
    while (start := text.find(_OPEN, pos)) >= 0:
        body = start + len(_OPEN)
        if close != -1 and close < body:
            close = text.find(_CLOSE, body)
        if nxt != -1 and nxt < body:
            nxt = text.find(_OPEN, body)
        if close >= 0 and (nxt < 0 or close < nxt):
            pos = close + len(_CLOSE)
            yield start, pos, text[body:close], True
        else:
            pos = nxt if nxt >= 0 else len(text)
            yield start, pos, text[body:pos], False


def read_tool_call_blocks(
    text: str, decode: Callable[[str, int], tuple[ToolCall | None, str | None]]
) -> tuple[list[ToolCall], list[str], str]:
    """The calls in every `<tool_call>` block of `text` (each body read by `decode(body, index)`),
    the errors, and the text outside the blocks. A block not closed before the next one is an
    error, unless its body up to the `</tool_call>` after it decodes, as vLLM reads it: the next
    `<tool_call>` was text inside its arguments. The last block may be open (generation stopped
    on `</tool_call>`, which servers leave out of the text), and is read when its body decodes."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    if _OPEN not in text:  # skip the scan for plain text and bare answers
        return calls, errors, text
    pieces: list[str] = []
    pos = count = tries = 0
    for start, end, body, closed in scan_tool_call_blocks(text):
        if start < pos:
            continue  # a `<tool_call>` inside the arguments of the call read before
        pieces.append(text[pos:start])
        pos = end
        i, count = count, count + 1
        if not closed and end < len(text) and tries < _MAX_TAG_IN_ARGUMENTS:
            tries += 1  # each try decodes to the close: a few keep a reply of open tags linear
            whole = _whole_call(text, start, i, decode)
            if whole is not None:
                calls.append(whole[0])
                pos = whole[1]
                continue
        # An open call that ends the reply is read, as vLLM's `<tool_call>(.*)` reads it: the
        # server stopped on `</tool_call>` and left the stop string out of the text.
        call, err = decode(body, i) if closed or end == len(text) else (None, "")
        if not closed and (err or end < len(text)):
            errors.append(f"Tool call {i + 1} is not closed with </tool_call>.")
            continue
        if err:
            errors.append(err)
        elif call is not None:
            calls.append(call)
    pieces.append(text[pos:])
    return calls, errors, "".join(pieces)


def _whole_call(
    text: str, start: int, index: int, decode: Callable[[str, int], tuple[ToolCall | None, str | None]]
) -> tuple[ToolCall, int] | None:
    """The call whose body runs from the `<tool_call>` at `start` to the first `</tool_call>`
    after it, other `<tool_call>`s included (text in its arguments), and where it ends; None
    when there is no close or that body does not decode."""
    close = text.find(_CLOSE, start + len(_OPEN))
    if close < 0:
        return None
    call, _ = decode(text[start + len(_OPEN) : close], index)
    return (call, close + len(_CLOSE)) if call is not None else None


def tool_responses(results: Sequence[ToolResult]) -> str:
    """Results in `<tool_response>` blocks, as the Qwen chat templates write them."""
    return "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in results)


class HermesParser(ActionParser):
    """The format of Qwen2.5/Qwen3 and Hermes chat templates (and verl's `hermes` parser)."""

    name = "hermes"
    stop = ("</tool_call>",)
    tool_messages = True

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    def parse(self, text: str) -> ParsedAction:
        one = text.find(_OPEN)
        if one >= 0 and text.find(_OPEN, one + len(_OPEN)) < 0:
            # The common turn: exactly one call. Same result as `_parse_scan`, without its
            # generator and piece list (this path runs on almost every step).
            close = text.find(_CLOSE, one + len(_OPEN))
            if close >= 0:
                call, err = _decode_call(text[one + len(_OPEN) : close].strip(), 0)
                rest = text[:one] + text[close + len(_CLOSE) :]
                return tool_call_action([call] if call is not None else [], [err] if err else [], rest, self.answer_tag)
        return self._parse_scan(text)

    def _parse_scan(self, text: str) -> ParsedAction:
        """Any number of calls, closed or not."""
        return tool_call_action(
            *read_tool_call_blocks(text, lambda body, i: _decode_call(body.strip(), i)), self.answer_tag
        )

    def instructions(self, tools: Sequence[Tool]) -> str:
        return (
            "You may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{tools_json(tools)}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
            + (f"\n{how}" if (how := self.answer_instructions()) else "")  # none with answer_tag=False
        )

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return tool_responses(results)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        body = {"name": name, "arguments": arguments, **({"id": call_id} if call_id else {})}
        # A tag inside a JSON string would end the call early; `\u003c` is the same character.
        text = encode_json(body)
        if text is None:
            return None
        for tag in (_OPEN, _CLOSE):
            text = text.replace(tag, "\\u003c" + tag[1:])
        return f"{_OPEN}\n{text}\n{_CLOSE}"


def _decode_call(body: str, index: int) -> tuple[ToolCall | None, str | None]:
    try:
        obj: Any = decode_json(body)
    except (ValueError, RecursionError) as exc:  # ValueError: also ints past Python's 4300-digit limit
        return None, (
            f"Tool call {index + 1} is not valid JSON ({json_problem(exc)}). "
            'Write {"name": ..., "arguments": {...}}.'
        )
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, f'Tool call {index + 1} needs a JSON object with a string "name".'
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = decode_json(args)
        except (ValueError, RecursionError):
            return None, f'Tool call {index + 1}: "arguments" is a string that is not JSON.'
    if not isinstance(args, dict):
        return None, f'Tool call {index + 1}: "arguments" must be a JSON object.'
    call_id = obj.get("id")
    if not isinstance(call_id, str):
        call_id = positional_id(index)
    return new_call(obj["name"], args, call_id), None


register_parser("hermes", HermesParser)
