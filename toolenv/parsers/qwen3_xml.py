"""Qwen3-Coder's XML tool calls: one `<parameter=...>` block of raw text per argument.

```text
<tool_call>
<function=run_sql>
<parameter=query>
SELECT name FROM singer WHERE age > 30
</parameter>
</function>
</tool_call>
```

Arguments arrive as text, unquoted (code and SQL need no JSON escaping, which is the point
of the format). Bound to an env's tools (`bind`), the parser reads each argument by its
JSON-schema type: strings stay as written, numbers, booleans, arrays and objects are
decoded. Unbound, every argument stays text and the tool's Pydantic model coerces what it
can. Results come back in `<tool_response>` blocks, as with Hermes. One `<tool_call>` block
may hold several `<function=…>` blocks; each is a call, as vLLM's `qwen3_coder` parser has it,
and so is each `<function=…>` block of a reply with no `<tool_call>` at all (Qwen3-Coder often
drops the opening tag; vLLM reads those too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers._json import encode_json, same_json
from toolenv.parsers._scan import SchemaBound, param_kind, schema_kinds, typed_value
from toolenv.parsers.base import ActionParser, register_parser, tool_call_action
from toolenv.parsers.hermes import scan_tool_call_blocks, tool_responses
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call

__all__ = ["Qwen3XMLParser"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
#: Open blocks per reply also read up to the next `</tool_call>` (`_whole_block`).
_MAX_TAG_IN_PARAMETERS = 8
_FUNCTION, _FUNCTION_END = "<function=", "</function>"
_PARAMETER, _PARAMETER_END = "<parameter=", "</parameter>"
#: The `</tool_call>` of a function written without its opening `<tool_call>`.
_ORPHAN_CLOSE = re.compile(r"\s*</tool_call>")


def _strip_newline(value: str) -> str:
    """The text between the tags, less the one line break the format puts on each side."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


class Qwen3XMLParser(SchemaBound, ActionParser):
    """Qwen3-Coder's format (vLLM's `qwen3_xml`/`qwen3_coder` tool parsers read the same text)."""

    name = "qwen3_xml"
    stop = (_CLOSE,)
    tool_messages = True

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    def parse(self, text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        if _OPEN not in text:  # skip the scan for plain text and bare answers
            if _FUNCTION in text:
                return self._parse_bare(text)
            return tool_call_action(calls, errors, text, self.answer_tag)
        pieces: list[str] = []
        pos = index = tries = 0  # index: the next call's position in the turn (its id and error number)
        for start, end, body, closed in scan_tool_call_blocks(text):
            if start < pos:
                continue  # a `<tool_call>` inside a parameter of the block read before
            pieces.append(text[pos:start])
            pos = end
            if not closed and end < len(text) and tries < _MAX_TAG_IN_PARAMETERS:
                # vLLM reads a block to its first `</tool_call>`: a `<tool_call>` before it is text
                # in a parameter (a file about tool calls). Each try reads to the close: a few at most.
                tries += 1
                whole = self._whole_block(text, start, index)
                if whole is not None:
                    calls += whole[0]
                    index += len(whole[0])
                    pos = whole[1]
                    continue
            if not closed:
                # An open block that ends the reply is read, as vLLM's `<tool_call>(.*?)$` reads it
                # (generation stopped on `</tool_call>`, which servers leave out of the text), when
                # it holds whole calls; one followed by another block, or cut off, is an error.
                found: list[ToolCall] = []
                problems: list[str] = []
                after = self._read_block(body, index, found, problems) if end == len(text) else index
                if found and not problems:
                    calls += found
                    index = after
                else:
                    errors.append(f"Tool call {index + 1} is not closed with </tool_call>.")
                    index += 1
                continue
            index = self._read_block(body, index, calls, errors)
        pieces.append(text[pos:])
        return tool_call_action(calls, errors, "".join(pieces), self.answer_tag)

    def _parse_bare(self, text: str) -> ParsedAction:
        """A turn with `<function=…>` blocks and no `<tool_call>`: Qwen3-Coder often drops the
        opening tag (and keeps the closing one), and vLLM's `qwen3_coder` parser then reads
        every function block of the reply, so the env does too. A `</tool_call>` right after a
        function is its block's close and leaves the text with it."""
        calls: list[ToolCall] = []
        errors: list[str] = []
        pieces: list[str] = []
        pos = index = 0
        head = text.find(_FUNCTION)
        while head >= 0:
            pieces.append(text[pos:head])
            call, err, end = self._decode(text, head, index)
            if err is not None:
                errors.append(err)
            elif call is not None:
                calls.append(call)
            index += 1
            if end < 0:  # not closed: the rest of the reply is this function's
                pos = len(text)
                break
            orphan = _ORPHAN_CLOSE.match(text, end)
            pos = orphan.end() if orphan else end
            head = text.find(_FUNCTION, pos)
        pieces.append(text[pos:])
        return tool_call_action(calls, errors, "".join(pieces), self.answer_tag)

    def _whole_block(self, text: str, start: int, index: int) -> tuple[list[ToolCall], int] | None:
        """The calls of the block opening at `start` read to the first `</tool_call>` after it,
        and where it ends; None when it has no close or any part of it is an error."""
        close = text.find(_CLOSE, start + len(_OPEN))
        if close < 0:
            return None
        found: list[ToolCall] = []
        problems: list[str] = []
        self._read_block(text[start + len(_OPEN) : close], index, found, problems)
        return (found, close + len(_CLOSE)) if found and not problems else None

    def _read_block(self, body: str, index: int, calls: list[ToolCall], errors: list[str]) -> int:
        """Append the calls of one `<tool_call>` block (or their errors); return the next call's
        index. Every `<function=…>…</function>` in the block is a call of its own, as vLLM's
        `qwen3_coder` parser reads them; a function runs to its first `</function>`."""
        head = body.find(_FUNCTION)
        if head < 0:
            errors.append(f"Tool call {index + 1} has no <function=NAME>.")
            return index + 1
        while head >= 0:
            call, err, end = self._decode(body, head, index)
            if err is not None:
                errors.append(err)
            elif call is not None:
                calls.append(call)
            index += 1
            if end < 0:  # not closed: nothing after it can be told apart from its parameters
                break
            head = body.find(_FUNCTION, end)
        return index

    def _decode(self, body: str, head: int, index: int) -> tuple[ToolCall | None, str | None, int]:
        """The function at `body[head:]` (at `<function=`): the call or its error, and where the
        function ends (after its `</function>`; -1 when it is not closed)."""
        where = f"Tool call {index + 1}"
        name_end = body.find(">", head)
        if name_end < 0:
            return None, f"{where}: <function= is not closed with >.", -1
        name = body[head + len(_FUNCTION) : name_end].strip()
        stop = body.find(_FUNCTION_END, name_end)
        end = stop + len(_FUNCTION_END) if stop >= 0 else -1
        if not name:
            return None, f"{where}: <function=> names no function.", end
        if stop < 0:
            return None, f"{where}: <function={name[:80]}> is not closed with </function>.", -1
        types = self._types.get(name, {})
        args: dict[str, Any] = {}
        pos = name_end + 1
        while (p := body.find(_PARAMETER, pos, stop)) >= 0:
            key_end = body.find(">", p, stop)
            if key_end < 0:
                return None, f"{where}: <parameter= is not closed with >.", end
            key = body[p + len(_PARAMETER) : key_end].strip()
            value_end = body.find(_PARAMETER_END, key_end, stop)
            if value_end < 0:
                return None, f"{where}: <parameter={key[:80]}> is not closed with </parameter>.", end
            if not key:
                return None, f"{where}: a <parameter=> has no name.", end
            if key in args:
                return None, f"{where}: parameter {key[:80]!r} is given twice.", end
            args[key] = _typed(_strip_newline(body[key_end + 1 : value_end]), types.get(key))
            pos = value_end + len(_PARAMETER_END)
        return new_call(name, args, f"call_{index}"), None, end

    def instructions(self, tools: Sequence[Tool]) -> str:
        blocks = []
        for t in tools:
            fn = t.flat_schema()["function"]
            params = fn.get("parameters", {})
            required = set(params.get("required", ()))
            lines = [
                "<function>",
                f"<name>{fn['name']}</name>",
                f"<description>{fn.get('description', '')}</description>",
            ]
            lines.append("<parameters>")
            for key, prop in (params.get("properties") or {}).items():
                kind = (
                    " | ".join(sorted(schema_kinds(prop)))
                    if isinstance(prop, Mapping) and schema_kinds(prop)
                    else "any"
                )
                lines.append(f"<parameter>\n<name>{key}</name>\n<type>{kind}</type>")
                if prop.get("description"):
                    lines.append(f"<description>{prop['description']}</description>")
                lines.append(f"<required>{str(key in required).lower()}</required>\n</parameter>")
            lines += ["</parameters>", "</function>"]
            blocks.append("\n".join(lines))
        answer = "When you know the final answer, write it as <answer>...</answer>." if self.answer_tag else ""
        return (
            "# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
            + "\n".join(blocks)
            + "\n</tools>\n\nTo call a function, reply in this format:\n\n"
            "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter>\nvalue\n"
            "</parameter>\n</function>\n</tool_call>\n\n"
            "Write each parameter's value as plain text (no quotes or escaping); arrays and objects as JSON. " + answer
        ).rstrip()

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return tool_responses(results)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        params = []
        props = self._types.get(name)
        for key, value in arguments.items():
            schema = props.get(key) if props is not None else None
            as_written = isinstance(value, str) and same_json(_typed(value, schema), value)
            text = value if as_written else encode_json(value)
            if text is None:
                return None
            if not isinstance(key, str) or not key.strip() or key != key.strip() or ">" in key:
                return None
            if any(tag in text for tag in (_PARAMETER_END, _FUNCTION_END, _CLOSE, _OPEN)):
                return None  # raw text cannot hold the format's own closing tags
            if isinstance(schema, Mapping) and not same_json(_typed(text, schema), value):
                return None  # e.g. a number for a string parameter, or the text "null" for one that may be null
            params.append(f"{_PARAMETER}{key}>\n{text}\n{_PARAMETER_END}")
        if not name.strip() or name != name.strip() or ">" in name or _FUNCTION_END in name:
            return None
        return "\n".join([_OPEN, f"{_FUNCTION}{name}>", *params, _FUNCTION_END, _CLOSE])


def _typed(value: str, schema: Any) -> Any:
    """`value` read by its parameter's type (`typed_value`, Python literals allowed for arrays and
    objects as vLLM reads them); text for a parameter the tool does not have."""
    if not isinstance(schema, Mapping):
        return value
    return typed_value(value, param_kind(schema), literals=True)


register_parser("qwen3_xml", Qwen3XMLParser)
