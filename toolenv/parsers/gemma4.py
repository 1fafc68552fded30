"""Gemma 4's tool calls (Google's Gemma 4 chat templates; vLLM's `gemma4` parser reads the same text).

```text
<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:[1,2],metric:true}<tool_call|><|tool_response>
```

A call is `call:NAME{...}` between the special tokens `<|tool_call>` and `<tool_call|>`;
several calls follow one another with nothing between them, and after the last one the
model writes `<|tool_response>`, where the tools' results go. The arguments are written in
Gemma's own notation, not JSON: keys are bare (`city:`), strings are delimited by the
`<|"|>` token and carry no escapes, numbers are written as Python prints them (`2.5`,
`1e-07`), booleans as `true`/`false`, null as `null` (the first four template revisions
print Python's `None`), lists as `[a,b]` and objects as `{key:value}` with bare keys. Keys
come in the template's order: sorted case-insensitively (Jinja's `dictsort`).

How the text is read, and why:

- **A hand-written reader.** No library reads this notation, and regexes over it either
  miss nesting or backtrack; the reader here is a small recursive-descent parser (never
  `eval`). Besides what the templates write it takes what models trained on JSON slip into
  and what is unambiguous: `"..."` JSON strings and `"key":` keys, `<|"|>key<|"|>:` keys
  (the way the templates quote keys in tool declarations), white space between tokens, a
  trailing comma, `None`, `True`/`False`, `inf`/`nan`. A bare word that is none of these
  (`city:Paris`) is an error that says to write `<|"|>Paris<|"|>`. A key given twice is an
  error.
- **Bounded and linear.** Each call is read within its own segment: from its `<|tool_call>`
  to the next one (or the end), so an unclosed string or brace never makes the reader rescan
  the calls after it. Containers nest at most 100 levels inside the arguments and a call may
  be at most `max_chars` (100,000 by default) long; past either it is an error, not a
  recursion or a stall. Integers past Python's 4,300 digits are an error too.
- **Errors per call, worded for the model**: no `call:` prefix, no `{...}` arguments, no
  name, a malformed value (with the argument it is in and what was found), text between the
  closing `}` and `<tool_call|>`, a call not closed with `<tool_call|>`. A good call next to
  a bad one still runs.
- **Where the turn ends.** `<|tool_response>` (the marker the model writes after its calls),
  `<turn|>`, `<eos>` and `<|turn>` outside a call end the reply: what follows was not the
  model's to write (a hallucinated tool response, a next turn) and is dropped. A stray
  `<tool_call|>` or `<tool_response|>` is removed from the turn's text.
- **Ids.** The format has none: calls are `call_0`, `call_1`, ... by position in the turn.
- **`special_tokens = True`**: `<|tool_call>`, `<tool_call|>` and `<|"|>` are special tokens
  of Gemma 4's tokenizer; decoding with `skip_special_tokens=True` leaves `call:f{city:Paris}`
  with nothing to find (vLLM turns skipping off for this parser for the same reason).
- **`stop = ("<|tool_response>",)`**: after its calls the model writes `<|tool_response>` and
  waits for the results (llama.cpp ends generation there, vLLM's gemma4 parser treats it as
  a turn boundary). The reply parses the same with or without it.
- **Results** are written as the templates write a tool message,
  `<|tool_response>response:NAME{value:<|"|>TEXT<|"|>}<tool_response|>`, one block per result;
  the env's own messages (parse errors, no name) as one user turn,
  `<|turn>user\\nTEXT<turn|>\\n<|turn>model\\n`. The chat templates have tool messages, so
  `tool_messages` is True. (The release revision of the template, TRL's `gemma4_v2`, wrote
  results as `<|turn>tool` turns instead; it writes calls the same way.)
- **`format_call`** writes a call exactly as the templates do (the current revision's `null`),
  except for what the templates would write unreadably: a key that is not a plain bare key
  (empty, with surrounding spaces, or holding `:,{}[]`, a leading `"` or `<|`) is quoted with
  `<|"|>`, as the templates quote keys in tool declarations. It returns None for what cannot
  be carried at all: a string or key holding `<|"|>` or `<|tool_call>`, a name that is empty,
  padded, or holds `{`, `<|`, `|>` or a line break, values nested over 100 levels, integers
  past 4,300 digits, non-string keys, and values that are not JSON-like.
- **`instructions(tools)`** writes the tool declarations as the current template does
  (`<|tool>declaration:NAME{description:...,parameters:{...}}<tool|>`), from each tool's
  flattened schema with an optional field's `["string", "null"]` type declared the OpenAPI
  way (`nullable:true`, which the template prints), then how to call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers._scan import positional_id
from toolenv.parsers.base import ActionParser, register_parser, tool_call_action
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call

__all__ = ["Gemma4Parser"]

_OPEN, _CLOSE = "<|tool_call>", "<tool_call|>"
_Q = '<|"|>'  # Gemma's string delimiter, a single token
_PREFIX = "call:"
_RESPONSE, _RESPONSE_END = "<|tool_response>", "<tool_response|>"
#: Markers after which nothing is the model's own turn.
_TURN_ENDS = (_RESPONSE, "<turn|>", "<eos>", "<|turn>")
#: Markers removed from the turn's text when they are left over.
_STRAY = (_CLOSE, _RESPONSE_END)
_MAX_DEPTH = 100  # containers inside the arguments object, read and written
_HOW = 'Write <|tool_call>call:NAME{key:value,...}<tool_call|>, with text between <|"|> and <|"|>.'

_WS = re.compile(r"\s*")
#: A bare key: anything up to its `:` but the structural characters and a marker's `<|`.
#: The two alternatives never match the same character, so a failed match never backtracks.
_KEY = re.compile(r"(?:[^:,{}\[\]<]|<(?!\|))+")
#: A bare value (number, true, null, ...): up to white space or a structural character.
_BARE = re.compile(r"[^\s,:{}\[\]<\"]+")
_INT = re.compile(r"[-+]?[0-9]+")
_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_WORDS: dict[str, Any] = {"true": True, "false": False, "True": True, "False": False, "null": None, "None": None}
_SPECIAL_FLOATS = ("inf", "infinity", "nan")
_JSON_STRING = json.JSONDecoder(strict=False)


# ---------------------------------------------------------------------- reading arguments
class _Bad(Exception):
    """A malformed value: what is wrong, where, and in which argument."""

    def __init__(self, problem: str, pos: int) -> None:
        super().__init__(problem)
        self.problem = problem
        self.pos = pos
        self.key: str | None = None


class _Reader:
    """Gemma's argument notation within `text[:end]`.

    Hand-written because no library reads it (the templates print it with Jinja macros, and
    vLLM and transformers each carry their own reader). Recursive descent over positions in
    the text: every step consumes input or fails, strings are found with `str.find`, and
    nesting is bounded by `_MAX_DEPTH`, so reading is linear in the text it covers.
    """

    __slots__ = ("end", "text")

    def __init__(self, text: str, end: int) -> None:
        self.text = text
        self.end = end

    def _ws(self, pos: int) -> int:
        m = _WS.match(self.text, pos, self.end)
        return m.end() if m else pos

    def _found(self, pos: int) -> str:
        return "the end of the call" if pos >= self.end else repr(self.text[pos : min(pos + 20, self.end)])

    def obj(self, pos: int, depth: int) -> tuple[dict[str, Any], int]:
        """The object whose `{` is just before `pos`, and the position after its `}`."""
        text = self.text
        out: dict[str, Any] = {}
        pos = self._ws(pos)
        if pos < self.end and text[pos] == "}":
            return out, pos + 1
        while True:
            key, pos = self._key(pos)
            pos = self._ws(pos)
            if pos >= self.end or text[pos] != ":":
                raise _Bad(f"the key {key[:40]!r} is not followed by : (found {self._found(pos)})", pos)
            try:
                value, pos = self.value(pos + 1, depth + 1)
            except _Bad as exc:
                if depth == 0 and exc.key is None:
                    exc.key = key
                raise
            if key in out:
                raise _Bad(f"{key[:40]!r} is given twice", pos)
            out[key] = value
            pos = self._ws(pos)
            if pos >= self.end:
                raise _Bad("an object is not closed with }", pos)
            if text[pos] == "}":
                return out, pos + 1
            if text[pos] != ",":
                raise _Bad(f"expected , or }} after the value of {key[:40]!r}, found {self._found(pos)}", pos)
            pos = self._ws(pos + 1)
            if pos < self.end and text[pos] == "}":  # a trailing comma
                return out, pos + 1

    def _arr(self, pos: int, depth: int) -> tuple[list[Any], int]:
        text = self.text
        out: list[Any] = []
        pos = self._ws(pos)
        if pos < self.end and text[pos] == "]":
            return out, pos + 1
        while True:
            value, pos = self.value(pos, depth + 1)
            out.append(value)
            pos = self._ws(pos)
            if pos >= self.end:
                raise _Bad("a list is not closed with ]", pos)
            if text[pos] == "]":
                return out, pos + 1
            if text[pos] != ",":
                raise _Bad(f"expected , or ] after a list item, found {self._found(pos)}", pos)
            pos = self._ws(pos + 1)
            if pos < self.end and text[pos] == "]":
                return out, pos + 1

    def _key(self, pos: int) -> tuple[str, int]:
        pos = self._ws(pos)
        if pos >= self.end:
            raise _Bad("an object is not closed with }", pos)
        if self.text.startswith(_Q, pos) or self.text[pos] == '"':
            return self._string(pos)
        m = _KEY.match(self.text, pos, self.end)
        if m is None or not m.group().strip():
            raise _Bad(f"expected key:value, found {self._found(pos)}", pos)
        return m.group().strip(), m.end()

    def _string(self, pos: int) -> tuple[str, int]:
        """The `<|"|>...<|"|>` or `"..."` string at `pos` and the position after it."""
        text = self.text
        if text.startswith(_Q, pos):
            start = pos + len(_Q)
            close = text.find(_Q, start, self.end)
            if close < 0:
                raise _Bad('a string is not closed with <|"|>', self.end)
            return text[start:close], close + len(_Q)
        close = pos + 1  # a JSON string: find its closing quote (one not escaped by a backslash)
        while True:
            close = text.find('"', close, self.end)
            if close < 0:
                raise _Bad('a "..." string is not closed with "', self.end)
            run = close
            while text[run - 1] == "\\":
                run -= 1
            if (close - run) % 2 == 0:
                break
            close += 1
        try:
            value = _JSON_STRING.decode(text[pos : close + 1])
        except json.JSONDecodeError as exc:
            raise _Bad(f'a "..." string is not valid JSON ({exc.msg})', pos) from None
        return str(value), close + 1

    def value(self, pos: int, depth: int) -> tuple[Any, int]:
        """The value at `pos` (after white space), at `depth` containers inside the arguments."""
        pos = self._ws(pos)
        if pos >= self.end:
            raise _Bad("a value is missing at the end of the call", pos)
        c = self.text[pos]
        if c == "<" or c == '"':
            if self.text.startswith(_Q, pos) or c == '"':
                return self._string(pos)
        elif c == "{" or c == "[":
            if depth > _MAX_DEPTH:
                raise _Bad(f"the arguments are nested more than {_MAX_DEPTH} levels deep", pos)
            return self.obj(pos + 1, depth) if c == "{" else self._arr(pos + 1, depth)
        m = _BARE.match(self.text, pos, self.end)
        if m is None:
            raise _Bad(f"expected a value, found {self._found(pos)}", pos)
        return _bare(m.group(), pos), m.end()


def _bare(word: str, pos: int) -> Any:
    """A number, boolean or null written without quotes."""
    if word in _WORDS:
        return _WORDS[word]
    if _INT.fullmatch(word):
        try:
            return int(word)
        except ValueError as exc:  # past the 4,300-digit conversion limit
            raise _Bad(f"the number is too long ({str(exc).split(':', 1)[0]})", pos) from None
    unsigned = word[1:] if word[0] in "+-" else word
    if _NUMBER.fullmatch(word) or unsigned.lower() in _SPECIAL_FLOATS:
        return float(word)
    shown = word[:40]
    raise _Bad(
        f'{shown!r} is not a value: write text as <|"|>{shown}<|"|>, and numbers, true, false and null as they are',
        pos,
    )


# ---------------------------------------------------------------------- writing arguments
def _sorted(d: dict[Any, Any]) -> list[tuple[Any, Any]]:
    """Jinja's `dictsort`: by key, case-insensitively, stable for keys equal but for case."""
    return sorted(d.items(), key=lambda kv: kv[0].lower() if isinstance(kv[0], str) else kv[0])


def _carries(s: str) -> bool:
    """A string the format can carry: one that neither ends its string nor opens a call."""
    return _Q not in s and _OPEN not in s


def _key_text(key: Any) -> str | None:
    if not isinstance(key, str) or not _carries(key):
        return None
    plain = key and key == key.strip() and key[0] != '"' and "<|" not in key and not any(c in key for c in ":,{}[]")
    return key if plain else f"{_Q}{key}{_Q}"


def _write(value: Any, depth: int) -> str | None:
    """`value` in Gemma's notation as the templates' `format_argument` writes it, or None."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            return int.__repr__(value)  # the base repr: a subclass may override it
        except ValueError:  # past the 4,300-digit conversion limit
            return None
    if isinstance(value, float):
        return float.__repr__(value)  # Jinja prints str(x): 2.5, 1e-07, 1e+20, inf, nan
    if isinstance(value, str):
        return f"{_Q}{value}{_Q}" if _carries(value) else None
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, (list, tuple)):
        items = []
        for item in value:
            text = _write(item, depth + 1)
            if text is None:
                return None
            items.append(text)
        return f"[{','.join(items)}]"
    if isinstance(value, dict):
        return _write_object(value, depth)
    return None


def _write_object(obj: dict[Any, Any], depth: int) -> str | None:
    if not all(isinstance(k, str) for k in obj):
        return None
    parts = []
    for key, value in _sorted(obj):
        key_text, text = _key_text(key), _write(value, depth + 1)
        if key_text is None or text is None:
            return None
        parts.append(f"{key_text}:{text}")
    return "{" + ",".join(parts) + "}"


def _is_name(name: str) -> bool:
    """A name `parse` reads back unchanged."""
    return bool(name) and name == name.strip() and not any(bad in name for bad in ("{", "<|", "|>", "\n", "\r"))


# ---------------------------------------------------------------------- tool declarations
# Python ports of the Gemma 4 template's `format_function_declaration`, `format_parameters`
# and `format_argument` macros (the current revision), so a text prompt lists the tools in
# the words the model was tuned on. No library writes these.
_STANDARD_KEYS = ("description", "type", "properties", "required", "nullable")


def _jinja_str(value: Any) -> str:
    """What `{{ value }}` prints."""
    return value if isinstance(value, str) else str(value)


def _upper(node: Any, key: str) -> str:
    """`node[key] | upper` (an undefined value prints as "")."""
    if not isinstance(node, dict) or key not in node:
        return ""
    return _jinja_str(node[key]).upper()


def _argument(value: Any) -> str:
    """`format_argument(value)` with its default `escape_keys=True` (keys quoted)."""
    if isinstance(value, str):
        return f"{_Q}{value}{_Q}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_Q}{k}{_Q}:{_argument(v)}" for k, v in _sorted(value)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_argument(v) for v in value) + "]"
    return "null" if value is None else _jinja_str(value)


def _required(names: Any) -> str:
    return "required:[" + ",".join(f"{_Q}{_jinja_str(n)}{_Q}" for n in names) + "]"


def _parameters(properties: dict[str, Any], filter_keys: bool = False) -> str:
    out = []
    for key, value in _sorted(properties):
        if filter_keys and key in _STANDARD_KEYS:
            continue
        out.append(f"{key}:{{{_parameter(value)}}}")
    return ",".join(out)


def _parameter(value: Any) -> str:
    node = value if isinstance(value, dict) else {}
    parts = []
    if node.get("description"):
        parts.append(f"description:{_Q}{_jinja_str(node['description'])}{_Q}")
    kind = _upper(node, "type")
    if kind == "STRING" and node.get("enum"):
        parts.append(f"enum:{_argument(node['enum'])}")
    elif kind == "ARRAY" and isinstance(node.get("items"), dict) and node["items"]:
        items = []
        for item_key, item in _sorted(node["items"]):
            if item is None:
                continue
            if item_key == "properties":
                items.append("properties:{" + (_parameters(item) if isinstance(item, dict) else "") + "}")
            elif item_key == "required":
                items.append(_required(item))
            elif item_key == "type":
                upper = item.upper() if isinstance(item, str) else [_jinja_str(t).upper() for t in item]
                items.append(f"type:{_argument(upper)}")
            else:
                items.append(f"{item_key}:{_argument(item)}")
        parts.append("items:{" + ",".join(items) + "}")
    if node.get("nullable"):
        parts.append("nullable:true")
    if kind == "OBJECT":
        if isinstance(node.get("properties"), dict):
            parts.append("properties:{" + _parameters(node["properties"]) + "}")
        else:
            parts.append("properties:{" + _parameters(node, filter_keys=True) + "}")
        if node.get("required"):
            parts.append(_required(node["required"]))
    if isinstance(node.get("type"), list):  # a union the template cannot print: written as items' types are
        parts.append(f"type:{_argument([_jinja_str(t).upper() for t in node['type']])}")
    else:
        parts.append(f"type:{_Q}{kind}{_Q}")
    return ",".join(parts)


def _declaration(function: dict[str, Any]) -> str:
    """`format_function_declaration(tool)` for an OpenAI function schema."""
    out = f"declaration:{function['name']}{{description:{_Q}{_jinja_str(function.get('description', ''))}{_Q}"
    params = function.get("parameters")
    if params:
        out += ",parameters:{"
        if params.get("properties"):
            out += "properties:{" + _parameters(params["properties"]) + "},"
        if params.get("required"):
            out += _required(params["required"]) + ","
        if params.get("type"):
            out += f"type:{_Q}{_upper(params, 'type')}{_Q}}}"
    return (out + "}").strip()


def _gemma_schema(node: Any) -> Any:
    """A flattened JSON schema in the declarations' terms: an optional field's `["string", "null"]`
    type becomes `type: string, nullable: true` (Gemma's function declarations follow OpenAPI)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _gemma_schema(sub) for name, sub in value.items()}
        elif key in ("items", "parameters"):
            out[key] = _gemma_schema(value)
        else:
            out[key] = value
    kind = out.get("type")
    if isinstance(kind, list) and len(kind) == 2 and "null" in kind:
        out["type"] = kind[1] if kind[0] == "null" else kind[0]
        out["nullable"] = True
    return out


# ---------------------------------------------------------------------- the parser
class Gemma4Parser(ActionParser):
    """Gemma 4's `<|tool_call>call:NAME{...}<tool_call|>` format (vLLM's `gemma4` tool parser)."""

    name = "gemma4"
    stop = (_RESPONSE,)
    special_tokens = True
    tool_messages = True

    def __init__(self, answer_tag: bool = True, max_chars: int = 100_000) -> None:
        self.answer_tag = answer_tag
        self.max_chars = max_chars

    # ------------------------------------------------------------------ parse
    def parse(self, text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        pieces: list[str] = []
        pos = index = 0
        start = text.find(_OPEN)
        while True:
            piece = text[pos : start if start >= 0 else len(text)]
            cut = _turn_end(piece)
            if cut >= 0:  # the model's turn ended here: nothing after it is read
                pieces.append(piece[:cut])
                break
            pieces.append(piece)
            if start < 0:
                break
            body = start + len(_OPEN)
            nxt = text.find(_OPEN, body)
            pos = self._read(text, body, nxt if nxt >= 0 else len(text), index, calls, errors)
            index += 1
            start = nxt
        rest = "".join(pieces)
        if "|>" in rest:
            for marker in _STRAY:
                rest = rest.replace(marker, "")
        return tool_call_action(calls, errors, rest, self.answer_tag)

    def _read(self, text: str, body: int, seg_end: int, index: int, calls: list[ToolCall], errors: list[str]) -> int:
        """Read the call whose `<|tool_call>` ends at `body` (it may run to `seg_end`, where the next
        call opens); append it or its error, and return where the call's text ends."""
        window = min(seg_end, body + self.max_chars)
        close = text.find(_CLOSE, body, seg_end)
        used = close + len(_CLOSE) if close >= 0 else seg_end
        where = f"Tool call {index + 1}"
        too_long = f"{where} is longer than {self.max_chars} characters; shorten the arguments."
        m = _WS.match(text, body, window)
        at = m.end() if m else body
        if not text.startswith(_PREFIX, at, window):
            if window < seg_end and at >= window:
                errors.append(too_long)
            else:
                errors.append(f"{where} does not start with call:NAME{{ (it starts {text[at : at + 30]!r}). {_HOW}")
            return used
        at += len(_PREFIX)
        name_end = close if close >= 0 else seg_end
        brace = text.find("{", at, min(name_end, window))
        if brace < 0:
            if window < name_end:
                errors.append(too_long)
            else:
                head = text[at : min(name_end, at + 60)].strip()
                errors.append(f"{where} ({head!r}) has no arguments in {{...}}: write call:NAME{{}} for none. {_HOW}")
            return used
        name = text[at:brace].strip()
        if not name:
            errors.append(f"{where} has no function name. {_HOW}")
            return used
        if not _is_name(name):
            errors.append(f"{where}: {name[:60]!r} is not a function name. {_HOW}")
            return used
        where = f"{where} ({name[:80]})"
        try:
            arguments, after = _Reader(text, window).obj(brace + 1, 0)
        except _Bad as exc:
            if window < seg_end and exc.pos >= window:
                errors.append(too_long)
            else:
                context = f", argument {exc.key[:80]}" if exc.key is not None else ""
                errors.append(f"{where}{context}: {exc.problem}. {_HOW}")
            resume = text.find(_CLOSE, min(exc.pos, seg_end), seg_end)
            return resume + len(_CLOSE) if resume >= 0 else seg_end
        except RecursionError:  # not reachable with the depth bound; kept so that parse never raises
            errors.append(f"{where}: the arguments are nested too deeply to read. {_HOW}")
            return used
        m = _WS.match(text, after, seg_end)
        after = m.end() if m else after
        if text.startswith(_CLOSE, after, seg_end):
            calls.append(new_call(name, arguments, positional_id(index)))
            return after + len(_CLOSE)
        if after >= seg_end:
            errors.append(f"{where} is not closed with <tool_call|>. {_HOW}")
            return seg_end
        errors.append(f"{where}: write <tool_call|> right after the }} that closes the arguments. {_HOW}")
        resume = text.find(_CLOSE, after, seg_end)
        return resume + len(_CLOSE) if resume >= 0 else seg_end

    # ------------------------------------------------------------------ prompt and results
    def instructions(self, tools: Sequence[Tool]) -> str:
        lines = []
        if tools:
            declarations = "".join(
                f"<|tool>{_declaration(_gemma_schema(t.flat_schema()['function']))}<tool|>" for t in tools
            )
            lines += [
                declarations,
                "To call a function, write <|tool_call>call:NAME{key:value,...}<tool_call|>. Write text between "
                '<|"|> and <|"|> (city:<|"|>Paris<|"|>), numbers, true, false and null as they are, lists as '
                "[a,b] and objects as {key:value}. Write several calls one after another; the results come back "
                "as <|tool_response>response:NAME{value:...}<tool_response|>.",
            ]
        if self.answer_tag:
            lines.append("When you know the final answer, write it as <answer>...</answer>.")
        return "\n".join(lines)

    def format_results(self, results: Sequence[ToolResult]) -> str:
        blocks: list[str] = []
        said: list[str] = []
        for r in results:
            if r.name and r.name != "parser":
                blocks.append(f"{_RESPONSE}response:{r.name}{{value:{_Q}{r.text}{_Q}}}{_RESPONSE_END}")
            else:  # not a tool's answer: the env speaks, as a user turn
                said.append(r.text)
        if said:
            blocks.append("<|turn>user\n" + "\n".join(said).strip() + "<turn|>\n<|turn>model\n")
        return "".join(blocks)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        if not isinstance(name, str) or not _is_name(name) or not isinstance(arguments, dict):
            return None
        body = _write_object(arguments, 0)
        if body is None or len(_PREFIX) + len(name) + len(body) > self.max_chars:
            return None
        return f"{_OPEN}{_PREFIX}{name}{body}{_CLOSE}"


def _turn_end(piece: str) -> int:
    """Where the first marker that ends the model's turn is in `piece`, or -1."""
    if "<" not in piece:
        return -1
    found = [at for at in (piece.find(m) for m in _TURN_ENDS) if at >= 0]
    return min(found) if found else -1


register_parser("gemma4", Gemma4Parser)
