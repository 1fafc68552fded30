"""Mistral's tool calls, in both layouts its tokenizers have used (vLLM's `mistral` parser reads the same text).

```text
[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}
[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}
[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]
```

The first is what v11+ tokenizers write (Mistral Small 3.2, Magistral, Devstral; v11 puts
the call id in `[CALL_ID]`, v13 drops it), the last the v3 layout of Mistral 7B v0.3 and
Mixtral: a JSON list after the control token.

Either layout may follow prose, and a turn may hold several calls: each `[TOOL_CALLS]` starts
a call (v11) or a JSON list of calls (v3; a single object is read as a list of one). The
call runs to the next `[TOOL_CALLS]`; text after its JSON is text. A trailing `</s>` (the
EOS, kept when a trainer decodes with special tokens) is dropped. `NAME{...}` without
`[ARGS]` is read too, as vLLM does for tokenizers that drop it from the text.

Design choices:

- `special_tokens = True`: `[TOOL_CALLS]`, `[ARGS]` and `[CALL_ID]` are control tokens, and a
  decode with `skip_special_tokens=True` leaves `get_weather{"city": "Paris"}` with nothing to
  find (vLLM turns skipping off for this parser for the same reason).
- `tool_messages = True`: Mistral's chat templates have tool messages.
- `stop = ()`: a call turn ends with the EOS token, which vLLM and SGLang stop on by default;
  there is no end-of-call marker (the next `[TOOL_CALLS]` starts another call in the same
  turn), so no stop string could end a turn sooner.
- Call ids: Mistral's templates and mistral-common accept only 9 ASCII letters and digits. A
  model's id of that shape is kept; otherwise the call gets `call00000`, `call00001`, … by its
  position in the turn, deterministic so that two identical runs compare equal.
- `format_results` writes the v7/v11 form, `[TOOL_RESULTS]ID[TOOL_CONTENT]text[/TOOL_RESULTS]`,
  one block per result in order, or `[TOOL_RESULTS]text[/TOOL_RESULTS]` (the v13 form) for a
  result without a call id (parse errors). v3 templates write `{"content": ..., "call_id": ...}`
  instead; send results as tool messages to have the model's own template render them.
- `format_call` writes the v11 layout (`[CALL_ID]` only for a Mistral-shaped id), and the v3
  JSON list for a name that layout cannot carry (one with `[`, `{` or `<`, a leading `"` or
  surrounding spaces). Control tokens inside JSON strings are escaped (`[` as `\\u005b`, the
  `<` of `</s>` as `\\u003c`), so that they can neither split the call nor become control
  tokens when the text is tokenized.

Scanning is linear: one `str.find` pass for the markers, then searches bounded by each call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeGuard

from toolenv._tool import Tool
from toolenv.parsers._json import call_arguments, decode_json, encode_json, json_problem
from toolenv.parsers.base import ActionParser, register_parser, tool_call_action
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call

__all__ = ["MistralParser"]

_CALLS, _ARGS, _CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_RESULTS, _CONTENT, _RESULTS_END = "[TOOL_RESULTS]", "[TOOL_CONTENT]", "[/TOOL_RESULTS]"
_TOOLS, _TOOLS_END = "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"
_EOS = "</s>"
#: Control tokens that must not appear verbatim inside a JSON string this parser writes.
_CONTROL = (
    _CALLS,
    _ARGS,
    _CALL_ID,
    _RESULTS,
    _CONTENT,
    _RESULTS_END,
    _TOOLS,
    _TOOLS_END,
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[THINK]",
    "[/THINK]",
)
_HOW = "Write [TOOL_CALLS]NAME[ARGS]{...} with the arguments as a JSON object."
_HOW_LIST = 'Write [TOOL_CALLS][{"name": ..., "arguments": {...}}].'
_DECODER = json.JSONDecoder()


def _call_id(index: int) -> str:
    """The id of the turn's `index`-th call when the model gives none: 9 letters and digits."""
    if index < len(_CALL_IDS):
        return _CALL_IDS[index]
    return f"call{index:05d}" if index < 100_000 else f"{index % 10**9:09d}"


_CALL_IDS = tuple(f"call{i:05d}" for i in range(16))


def _head(call_id: str) -> str:
    """What goes between `[TOOL_RESULTS]` and a result's text: its call id, when it has one."""
    return f"{call_id}{_CONTENT}" if call_id else ""


def _mistral_id(value: Any) -> TypeGuard[str]:
    """True for an id Mistral's templates accept: exactly 9 ASCII letters and digits."""
    return isinstance(value, str) and len(value) == 9 and value.isascii() and value.isalnum()


def _json_prefix(text: str) -> tuple[Any, int]:
    """The JSON value at the start of `text` and where it ends (text after it is not JSON).

    Raises:
        ValueError, RecursionError: no JSON value starts `text`.
    """
    try:
        return decode_json(text), len(text)
    except (ValueError, RecursionError):
        pass  # trailing text, or not JSON: the stdlib decoder finds out which
    value, end = _DECODER.raw_decode(text)
    return value, end


def _escape(text: str) -> str:
    """JSON text with control tokens inside its strings written as JSON escapes."""
    if "[" in text:
        for marker in _CONTROL:
            if marker in text:
                text = text.replace(marker, "\\u005b" + marker[1:])
    if "<" in text:
        text = text.replace(_EOS, "\\u003c/s>").replace("<s>", "\\u003cs>")
    return text


class MistralParser(ActionParser):
    """Mistral's `[TOOL_CALLS]` format, the v11+ layout and the older JSON list alike."""

    name = "mistral"
    stop = ()
    special_tokens = True
    tool_messages = True

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    def parse(self, text: str) -> ParsedAction:
        tail = text.rstrip()
        if tail.endswith(_EOS):  # the EOS, when the trainer decodes with special tokens
            text = tail[: -len(_EOS)]
        calls: list[ToolCall] = []
        errors: list[str] = []
        start = text.find(_CALLS)
        if start >= 0:
            pieces: list[str] = []
            pos = index = 0
            while start >= 0:
                pieces.append(text[pos:start])
                body = start + len(_CALLS)
                nxt = text.find(_CALLS, body)
                stop = nxt if nxt >= 0 else len(text)
                segment = text[body:stop]
                used, index = _read_segment(segment, index, calls, errors)
                pieces.append(segment[used:])
                pos, start = stop, nxt
            pieces.append(text[pos:])
            text = "".join(pieces)
        return tool_call_action(calls, errors, text, self.answer_tag)

    def instructions(self, tools: Sequence[Tool]) -> str:
        lines = []
        if tools:
            schemas = _escape(json.dumps([t.schema() for t in tools], ensure_ascii=False))
            lines += [
                f"{_TOOLS}{schemas}{_TOOLS_END}",
                "To call a function, write [TOOL_CALLS], its name, [ARGS] and its arguments as a JSON object: "
                '[TOOL_CALLS]NAME[ARGS]{"argument": value}. Start each call with its own [TOOL_CALLS].',
            ]
        if self.answer_tag:
            lines.append("When you know the final answer, write it as <answer>...</answer>.")
        return "\n".join(lines)

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return "".join(f"{_RESULTS}{_head(r.call_id)}{r.text}{_RESULTS_END}" for r in results)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        if not name.strip():
            return None  # no layout carries a call without a name
        if name == name.strip() and name[0] != '"' and not any(c in name for c in "[{<"):
            ident = f"{_CALL_ID}{call_id}" if _mistral_id(call_id) else ""
            args = encode_json(arguments)
            return None if args is None else f"{_CALLS}{name}{ident}{_ARGS}{_escape(args)}"
        # The v3 layout, whose JSON name can be any string.
        call = {"name": name, "arguments": arguments, **({"id": call_id} if call_id else {})}
        text = encode_json(call)
        return None if text is None else f"{_CALLS}[{_escape(text)}]"


def _read_segment(segment: str, index: int, calls: list[ToolCall], errors: list[str]) -> tuple[int, int]:
    """Read what follows one `[TOOL_CALLS]` (up to the next): the calls go to `calls`, the
    problems to `errors`. Returns how much of `segment` the calls used (the rest is text)
    and the index of the turn's next call."""
    body = segment.lstrip()
    lead = len(segment) - len(body)
    if not body:
        errors.append(f"Tool call {index + 1}: nothing follows [TOOL_CALLS]. {_HOW}")
        return len(segment), index + 1
    if body[0] in '[{"' and not body.startswith((_ARGS, _CALL_ID)):
        return _read_list(body, lead, segment, index, calls, errors)
    return _read_named(body, lead, segment, index, calls, errors)


def _read_list(
    body: str, lead: int, segment: str, index: int, calls: list[ToolCall], errors: list[str]
) -> tuple[int, int]:
    """The v3 layout: a JSON list of `{"name", "arguments", "id"}` objects (or one object)."""
    try:
        value, used = _json_prefix(body)
    except (ValueError, RecursionError) as exc:  # ValueError: also ints past Python's 4300-digit limit
        errors.append(f"Tool call {index + 1} is not valid JSON ({json_problem(exc)}). {_HOW_LIST}")
        return len(segment), index + 1
    if isinstance(value, str):
        errors.append(
            f"Tool call {index + 1}: [TOOL_CALLS] is followed by a JSON string, not a list of calls. {_HOW_LIST}"
        )
        return lead + used, index + 1
    items = value if isinstance(value, list) else [value]
    if not items:
        errors.append(f"Tool call {index + 1}: the list after [TOOL_CALLS] is empty. {_HOW_LIST}")
        return lead + used, index + 1
    for item in items:
        where = f"Tool call {index + 1}"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
            errors.append(f'{where} needs a JSON object with a string "name". {_HOW_LIST}')
        else:
            name: str = item["name"]
            raw = item["arguments"] if "arguments" in item else item.get("parameters", {})
            args = call_arguments(raw, f"{where} ({name[:80]})")
            if isinstance(args, str):
                errors.append(args)
            else:
                call_id = item.get("id")
                calls.append(new_call(name, args, call_id if _mistral_id(call_id) else _call_id(index)))
        index += 1
    return lead + used, index


def _read_named(
    body: str, lead: int, segment: str, index: int, calls: list[ToolCall], errors: list[str]
) -> tuple[int, int]:
    """The v11 layout: `NAME[ARGS]{...}`, `NAME[CALL_ID]ID[ARGS]{...}` or `NAME{...}`."""
    where = f"Tool call {index + 1}"
    marks = [at for at in (body.find(_ARGS), body.find(_CALL_ID), body.find("{")) if at >= 0]
    if not marks:
        errors.append(f"{where} ({body.strip()[:80]!r}) has no [ARGS]. {_HOW}")
        return len(segment), index + 1
    name_end = min(marks)
    name = body[:name_end].strip()
    if not name:
        errors.append(f"{where} has no function name. {_HOW}")
        return len(segment), index + 1
    where = f"{where} ({name[:80]})"
    call_id = ""
    args_at = name_end
    if body.startswith(_CALL_ID, name_end):
        id_at = name_end + len(_CALL_ID)
        ends = [at for at in (body.find(_ARGS, id_at), body.find("{", id_at)) if at >= 0]
        if not ends:
            errors.append(f"{where} has no [ARGS] after its [CALL_ID]. {_HOW}")
            return len(segment), index + 1
        args_at = min(ends)
        call_id = body[id_at:args_at].strip()
    if body.startswith(_ARGS, args_at):
        args_at += len(_ARGS)
    rest = body[args_at:]
    json_text = rest.lstrip()
    if not json_text:
        errors.append(f"{where}: no JSON arguments follow [ARGS] (write {{}} for none).")
        return len(segment), index + 1
    try:
        value, used = _json_prefix(json_text)
    except (ValueError, RecursionError) as exc:
        errors.append(f"{where}: the arguments are not valid JSON ({json_problem(exc)}). {_HOW}")
        return len(segment), index + 1
    args = call_arguments(value, where)
    if isinstance(args, str):
        errors.append(args)
    else:
        calls.append(new_call(name, args, call_id if _mistral_id(call_id) else _call_id(index)))
    return lead + args_at + (len(rest) - len(json_text)) + used, index + 1


register_parser("mistral", MistralParser)
