"""Llama 3.1/3.2/3.3 JSON tool calls: the reply is `{"name": ..., "parameters": {...}}`.

```text
Let me look that up.
<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "now", "parameters": {}}
```

This is the "JSON based tool calling" of Meta's Llama 3.1 chat template (also used by 3.2
and 3.3 for custom tools); vLLM's `llama3_json` tool parser reads the same text. Choices:

- **Where calls are.** A call has no closing marker, so the parser looks for JSON objects
  and decodes each once with `json.JSONDecoder.raw_decode` (no regex over JSON). In prose it
  looks only at objects whose first key is `"name"`, `"parameters"` or `"arguments"` (or
  that open with `"type": "function"`): Llama writes `"name"` first, and any other `{` in
  prose is then text at no cost. After `<|python_tag|>`, and at the very start of the
  reply, any `{"` is taken as a call. A decoded object is a call when it has a `"name"` and
  `"parameters"` (or `"arguments"`, which vLLM also accepts); a decoded object that is not
  a call stays text, with all it nests (an object never decoded is not skipped either: a
  call inside `{"result": ...}` is still read). Calls may be separated by `;` (Llama's habit, which vLLM reads),
  by line breaks or by nothing, and a JSON list of calls is read too (older vLLM parsers
  took that form; the current one reads the objects inside it, as this does when the list
  holds anything but calls).
- **`<|python_tag|>` is optional.** It is a special token, so a trainer decoding with
  `skip_special_tokens=True` loses it; the parser reads the same calls with or without it,
  hence `special_tokens = False`. When present it marks where the calls start: what follows
  it and should be a call but is not (nothing callable, broken JSON, a `"name"` without
  `"parameters"`) is an error.
- **Errors, not guesses.** A call-like object whose JSON does not decode is a call the model
  got wrong, reported with the decoder's reason (a cut-off call says so); scanning resumes
  where the decoder stopped, so the calls after it still run. A non-string `"name"`,
  `"parameters"` that is not an object, and both `"parameters"` and `"arguments"` with
  different values are errors too. Double-encoded parameters (a string holding a JSON
  object) are decoded, as with Hermes. Line breaks and tabs written raw inside strings are
  accepted (`strict=False`): code arguments often come that way and mean only one thing.
- **Linear time.** Every candidate is decoded from its start once and consumed up to where
  the decoder stopped. Decoding starts in a 4 kB window, since a `JSONDecodeError` counts
  the lines before its position and a reply of many broken calls would otherwise be
  quadratic; only a value that runs past the window is decoded again on the whole text.
- **Results** come back one JSON line per call, in call order: `{"output": "..."}`, or
  `{"error": "..."}` for a failed call. Llama's templates send a tool's result as an
  `ipython` message; vLLM's template wraps it as `{"output": ...}`. With `tool_messages = True`
  chat trainers send each result as a tool message instead.
- **No stop strings.** A call ends with `<|eom_id|>` or `<|eot_id|>`, and both are end-of-
  sequence ids in the Llama 3.1/3.2/3.3 `generation_config.json`, which vLLM, SGLang and
  transformers stop on already. As special tokens they are absent from text decoded with
  `skip_special_tokens=True`, so a stop string would not match anyway; a `}` stop string
  would cut calls short. Those tokens are dropped from the turn's text when present.
- **Instructions** use the wording of Meta's template with the tools in the system prompt,
  each tool's JSON schema indented by 4 as the template does. They leave out the template's
  `Environment: ipython` line, which also turns on Llama's built-in code interpreter (code
  after `<|python_tag|>`); put it in the env's `system_prompt` to have it.
- `format_call` writes Meta's template's own form, `{"name": ..., "parameters": {...}}`,
  with `<|` escaped inside strings so a marker in an argument stays text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, TypeGuard

from toolenv._tool import Tool
from toolenv.parsers._json import decode_json, encode_json, json_problem
from toolenv.parsers.base import ActionParser, register_parser
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call, new_parsed

__all__ = ["Llama3JSONParser"]

_PYTHON_TAG = "<|python_tag|>"
#: Special tokens that may end a decoded turn (kept when decoding with special tokens).
_DROPPED = (_PYTHON_TAG, "<|eom_id|>", "<|eot_id|>", "<|end_of_text|>")
_DECODER = json.JSONDecoder(strict=False)
_FORMAT = 'Write {"name": "function name", "parameters": {...}}.'

_CALL_KEYS = r'\{\s*"(?:name|parameters|arguments)"\s*:|\{\s*"type"\s*:\s*"function"'
_LIST = rf"\[(?=\s*(?:{_CALL_KEYS}))"
#: Where a call starts in prose: a `{` whose first key is a call's, or a list of such objects.
_CALL_START = re.compile(rf"(?={_CALL_KEYS})|{_LIST}")
#: Where a call starts after `<|python_tag|>` or at the start of the reply: any `{"`.
_ANY_START = re.compile(rf'\{{(?=\s*")|{_LIST}')
_SEPARATOR = re.compile(r"\s*;")
_QUOTE_OR_BRACE = re.compile(r'["{}]')

#: Decode in a window of this many characters first: a `JSONDecodeError` counts the lines
#: before its position, so failing on the whole text from every broken call would be quadratic.
_WINDOW = 4096
#: Errors this close to the window's end may be the window's doing (`tr` of a cut `true`).
_MARGIN = 16


def _decode_at(text: str, start: int) -> tuple[Any, int, str | None]:
    """The JSON value at `start`: `(value, end, None)`, or `(None, where, problem)` when it
    does not decode (`where` is -1 when the decoder does not say: deep nesting, huge ints)."""
    if len(text) - start > _WINDOW:
        window = text[start : start + _WINDOW]
        value, end, problem = _decode(window, 0)
        if problem is None:
            return value, start + end, None
        if end < 0:  # too deep within the window already (its numbers are too short to be too long)
            return None, end, problem
        if end < len(window) - _MARGIN and not problem.startswith("Unterminated string"):
            return None, start + end, problem
    return _decode(text, start)


def _decode(text: str, start: int) -> tuple[Any, int, str | None]:
    try:
        value, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        return None, exc.pos, exc.msg
    except (ValueError, RecursionError) as exc:  # ints past 4300 digits, deep nesting
        return None, -1, json_problem(exc)
    return value, end, None


def _string_end(text: str, pos: int) -> int:
    """The index after the `"` closing the JSON string whose body starts at `pos`, or -1."""
    while (quote := text.find('"', pos)) >= 0:
        body = text[pos:quote]
        if (len(body) - len(body.rstrip("\\"))) % 2 == 0:  # not escaped by an odd run of `\`
            return quote + 1
        pos = quote + 1
    return -1


def _group_end(text: str, start: int) -> int:
    """The index after the `}` matching the `{` at `start` (strings skipped), or the end of
    the text if there is none: where a call ends when the decoder could not say."""
    depth = 0
    pos = start
    while (m := _QUOTE_OR_BRACE.search(text, pos)) is not None:
        at = m.start()
        char = text[at]
        if char == '"':
            pos = _string_end(text, at + 1)
            if pos < 0:
                break
            continue
        depth += 1 if char == "{" else -1
        pos = at + 1
        if depth == 0:
            return pos
    return len(text)


class _Reader:
    """The calls and errors of one reply, in order."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self.attempts = 0
        self._content_end = -1

    def content_end(self) -> int:
        """Where the reply's content ends, before trailing space and special tokens: a decode
        error there means the call was cut off."""
        if self._content_end < 0:
            text = self.text
            end = len(text.rstrip())
            while token := next((t for t in _DROPPED if text.endswith(t, 0, end)), None):
                end -= len(token)
                while end and text[end - 1].isspace():
                    end -= 1
            self._content_end = end
        return self._content_end

    def call(self, obj: dict[str, Any]) -> None:
        """Read one decoded call attempt."""
        index = self.attempts
        self.attempts += 1
        where = f"Tool call {index + 1}"
        name = obj.get("name")
        if not isinstance(name, str):
            self.errors.append(f'{where} needs a string "name" (the function to call). {_FORMAT}')
            return
        if "parameters" in obj:
            key = "parameters"
            if "arguments" in obj and obj["arguments"] != obj["parameters"]:
                self.errors.append(f'{where} gives both "parameters" and "arguments"; give only "parameters".')
                return
        elif "arguments" in obj:
            key = "arguments"
        else:
            self.errors.append(f'{where} has no "parameters"; give them as a JSON object ({{}} for none). {_FORMAT}')
            return
        args = obj[key]
        if isinstance(args, str):  # some models double-encode the arguments
            try:
                args = decode_json(args)
            except (ValueError, RecursionError):
                args = None
            if not isinstance(args, dict):
                self.errors.append(f'{where}: "{key}" is a string; write the arguments as a JSON object, not a string.')
                return
        if not isinstance(args, dict):
            self.errors.append(f'{where}: "{key}" must be a JSON object of argument names and values.')
            return
        call_id = obj.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{index}"
        self.calls.append(new_call(name, args, call_id))

    def broken(self, where: int, problem: str) -> None:
        """A call attempt whose JSON did not decode (the decoder stopped at `where`)."""
        self.attempts += 1
        call = f"Tool call {self.attempts}"
        if problem.startswith("Unterminated string") or where >= self.content_end():
            self.errors.append(f"{call} is cut off before its JSON ends: close every string, [ and {{. {_FORMAT}")
        else:
            self.errors.append(f"{call} is not valid JSON ({problem}). {_FORMAT}")


def _is_attempt(obj: Any, strict: bool) -> TypeGuard[dict[str, Any]]:
    """A decoded value that means to be a call: an object with a "name" and parameters or,
    where the reply's calls start (`strict`), an object with either."""
    if not isinstance(obj, dict):
        return False
    params = "parameters" in obj or "arguments" in obj
    return ("name" in obj or params) if strict else ("name" in obj and params)


def _scan(text: str, tag_end: int, reader: _Reader) -> list[str]:
    """Read the calls in `text` into `reader` (`tag_end`: where `<|python_tag|>` ends, or -1);
    return the pieces of text outside them.

    Each candidate is decoded once from its start. A call, or a broken one, is consumed up to
    where the decoder stopped; JSON that is not a call is prose, skipped with all it nests.
    """
    pieces: list[str] = []
    kept = pos = 0  # text[kept:] is not yet in pieces; candidates are searched from pos
    first = len(text) - len(text.lstrip())
    while True:
        if pos <= first and _ANY_START.match(text, first):
            start = first
        elif 0 <= tag_end <= pos:
            m = _ANY_START.search(text, pos)
            if m is None:
                break
            start = m.start()
        else:
            m = _CALL_START.search(text, pos, tag_end if tag_end >= 0 else len(text))
            if m is None and tag_end >= 0:
                m = _ANY_START.search(text, tag_end)
            if m is None:
                break
            start = m.start()
        strict = start == first or 0 <= tag_end <= start
        obj, end, problem = _decode_at(text, start)
        if text[start] == "[":  # a JSON list of calls
            if problem is not None or not (isinstance(obj, list) and obj and all(_is_attempt(o, True) for o in obj)):
                pos = start + 1  # read its objects one by one
                continue
            for o in obj:
                reader.call(o)
        elif problem is not None:
            reader.broken(end, problem)
            if end < 0:
                end = _group_end(text, start)
            elif problem.startswith("Unterminated string"):
                end = len(text)  # the string runs to the end: nothing after it is a call
            end = max(end, start + 1)
        elif _is_attempt(obj, strict):
            reader.call(obj)
        else:
            pos = end  # JSON in prose, with all it nests
            continue
        pieces.append(text[kept:start])
        sep = _SEPARATOR.match(text, end)
        pos = kept = sep.end() if sep else end
    pieces.append(text[kept:])
    return pieces


class Llama3JSONParser(ActionParser):
    """Meta's Llama 3.x JSON tool calls (vLLM's `llama3_json` tool parser reads the same text)."""

    name = "llama3_json"
    stop: tuple[str, ...] = ()
    tool_messages = True

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    def parse(self, text: str) -> ParsedAction:
        reader = _Reader(text)
        tag = text.find(_PYTHON_TAG)
        tag_end = tag + len(_PYTHON_TAG) if tag >= 0 else -1
        rest = "".join(_scan(text, tag_end, reader)) if "{" in text else text
        if "<|" in rest:
            for token in _DROPPED:
                rest = rest.replace(token, "")
        answer = None
        if self.answer_tag and "<answer>" in rest:
            answer, rest = self.find_answer(rest)
        if tag >= 0 and reader.attempts == 0 and answer is None:
            reader.errors.append(f"{_PYTHON_TAG} is not followed by a function call. {_FORMAT}")
        return new_parsed(reader.calls, answer, rest.strip(), reader.errors)

    def instructions(self, tools: Sequence[Tool]) -> str:
        schemas = "\n\n".join(json.dumps(t.schema(), indent=4, ensure_ascii=False) for t in tools)
        answer = "\n\nWhen you know the final answer, write it as <answer>...</answer>." if self.answer_tag else ""
        return (
            "You have access to the following functions. To call a function, please respond with JSON "
            "for a function call. Respond in the format "
            '{"name": function name, "parameters": dictionary of argument name and its value}. '
            "Do not use variables.\n\n"
            f"{schemas}\n\n"
            "To call several functions at once, write their JSON calls one after another, separated by semicolons."
            + answer
        )

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return "\n".join(json.dumps({"error" if r.is_error else "output": r.text}, ensure_ascii=False) for r in results)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        # A special token inside a JSON string would be tokenized as one; `\u003c` is the same character.
        text = encode_json({"name": name, "parameters": arguments})
        return None if text is None else text.replace("<|", "\\u003c|")


register_parser("llama3_json", Llama3JSONParser)
