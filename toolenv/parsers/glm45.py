"""GLM-4.5 and GLM-4.6 tool calls (vLLM reads the same text with `--tool-call-parser glm45`).

```text
<think>The user wants the weather.</think>
<tool_call>get_weather
<arg_key>city</arg_key>
<arg_value>Paris</arg_value>
<arg_key>days</arg_key>
<arg_value>[1, 2]</arg_value>
</tool_call>
```

The name follows `<tool_call>` on its own line, then one `<arg_key>`/`<arg_value>` pair per
argument. The chat template (TRL's `glm4moe.jinja`) writes a string value as it is, with no
quotes or escapes, and any other value as JSON (`tojson`); several calls follow one another,
one per line, and the model then writes `<|observation|>`, where the tools' results go.

How the text is read, and why:

- **Values by type.** Bound to an env's tools (`bind`, done by `ToolEnv`), each value is read
  by its parameter's JSON-schema type: a string stays exactly as written (white space and
  all), an integer, number, boolean, array or object is decoded as JSON (`True`/`False` are
  accepted for booleans). A value that does not decode stays text, and the tool's validation
  reports it to the model. A string that may be null (`str | None`) stays text too, but for
  `null`, which is None (the template writes None so). Where the type is unknown (an unbound
  parser, a tool or parameter the env does not have, a union such as `int | str`) a value
  that is JSON is decoded and anything else stays text, as TRL's response parser for this
  template reads it.
- **Lenient where it is unambiguous**: the name may be followed directly by `<arg_key>` (as
  GLM-4.7 writes it), a call may have no arguments, and white space between the tags is
  free. Keys and the name are stripped; values are not.
- **Errors per call, worded for the model**: no name, JSON inside `<tool_call>` (the Hermes
  format), a name that is not alone on its line, an `<arg_key>` or `<arg_value>` that is not
  closed, a key without a value or a value without a key, an empty key, a key given twice,
  text outside the pairs, a call not closed with `</tool_call>` (it ends where the next
  `<tool_call>` opens, so the calls after it still run; unless it reads whole up to the
  `</tool_call>` after that, as vLLM reads it, with the `<tool_call>` text inside an
  `<arg_value>`). A good call next to a bad one still
  runs. Ids are `call_0`, `call_1`, … by position: the format has none.
- **Reasoning is never a call.** Every `<think>…</think>` block (to the end of the text when
  unclosed) is reasoning, and so is everything before a `</think>` that no `<think>` opens
  (a generation prompt that opened it). Calls and `<answer>` inside reasoning are not read;
  the reasoning stays in the turn's `text`, as with Hermes.
- **Where the turn ends.** `<|observation|>`, `<|user|>` and `<|endoftext|>` are the
  end-of-turn ids of GLM's `generation_config.json`: what follows one was not the model's to
  write (a hallucinated tool response, a next turn) and is dropped.
- `special_tokens = True`: `<tool_call>`, `<arg_key>`, `<arg_value>`, `<think>` and their
  closing tags are special tokens of GLM's tokenizer, so decoding with
  `skip_special_tokens=True` leaves `get_weather\\ncity\\nParis` with nothing to find (vLLM
  turns skipping off for this parser for the same reason).
- `stop = ("<|observation|>",)`: the model writes it after its last call and waits for the
  results. It is also an EOS id servers stop on; a turn with several calls is never cut.
- `instructions(tools)` is the system prompt the template writes for `tools`, word for word,
  then a line on how to write values and one on `<answer>`.
- `tool_messages = True`: GLM's template has tool messages. `format_results` writes what it
  writes after `<|observation|>` (the role token is the chat template's, as `<|im_start|>user`
  is for Hermes): one `<tool_response>` block per result, in order; the env's own messages
  (parse errors) come back in the same blocks, as with `qwen3_xml`.
- `format_call` writes a call exactly as the template does. Where that text would not read
  back as the same call it writes JSON instead: a string value for a parameter that is not
  a string (or of unknown type) that would decode as something else (`"42"`), or one holding
  a closing tag, is written as a JSON string; inside JSON the `<` of `</arg_value>`,
  `<tool_call>`, `</tool_call>`, `</think>` and the end-of-turn tokens is written `\\u003c`.
  It returns None for what cannot be carried: a non-string value for a string parameter
  (None for `str | None` is `null`), a string parameter's value holding a closing tag or
  end-of-turn token (or `"null"` for `str | None`), a name or key that is empty, padded or
  holds one (or a line break, or a leading `{` or `[`, for a name), values that are not JSON
  (NaN, sets, integers past 4,300 digits).

Scanning is linear: one pass of `str.find` with remembered positions; each call's body is
read once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers._scan import MarkerFinder, SchemaBound, positional_id, typed_value, write_typed
from toolenv.parsers.base import ActionParser, reasoning_runs, register_parser, tool_call_action, tools_json
from toolenv.parsers.hermes import tool_responses
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call, new_parsed

__all__ = ["Glm45Parser"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
#: Calls per reply not closed before the next `<tool_call>` that are also read up to their
#: `</tool_call>`, as vLLM reads them (a `<tool_call>` inside a value).
_MAX_TAG_IN_VALUES = 8
_KEY, _KEY_END = "<arg_key>", "</arg_key>"
_VALUE, _VALUE_END = "<arg_value>", "</arg_value>"
_THINK, _THINK_END = "<think>", "</think>"
#: End-of-turn ids of GLM-4.5/4.6's generation config: nothing after one is the model's turn.
_TURN_ENDS = ("<|observation|>", "<|user|>", "<|endoftext|>")
#: What raw text inside a call cannot hold: it would end the value or the call, open another
#: call, close reasoning the parser thinks the prompt opened, or end the turn.
_BREAKS = (_VALUE_END, _OPEN, _CLOSE, _THINK_END, *_TURN_ENDS)
_KEY_BREAKS = (_KEY, _KEY_END, _VALUE, *_BREAKS)
_NAME_BREAKS = ("\n", _KEY, _KEY_END, _VALUE, *_BREAKS)
_HOW = (
    "Write <tool_call>NAME on its own line, then each argument as <arg_key>KEY</arg_key> and "
    "<arg_value>VALUE</arg_value> on lines of their own, then </tool_call>."
)
_WS = re.compile(r"\s*")


def _has(text: str, markers: Sequence[str]) -> bool:
    return any(m in text for m in markers)


def _escape(text: str) -> str:
    """JSON text with the `<` of every marker that would break a call written `\\u003c` (JSON
    puts `<` nowhere but inside strings, where the escape is the same character)."""
    if "<" in text:
        for marker in _BREAKS:
            if marker in text:
                text = text.replace(marker, "\\u003c" + marker[1:])
    return text


class Glm45Parser(SchemaBound, ActionParser):
    """GLM-4.5/4.6's `<tool_call>NAME<arg_key>…</arg_key><arg_value>…</arg_value></tool_call>` format."""

    name = "glm45"
    stop = (_TURN_ENDS[0],)
    special_tokens = True
    tool_messages = True

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    # ------------------------------------------------------------------ parse
    def parse(self, text: str) -> ParsedAction:
        text = _cut_turn_end(text)
        if "<" not in text or not _has(text, (_OPEN, _THINK, _THINK_END)):  # plain text or a bare answer
            return tool_call_action([], [], text, self.answer_tag)
        find = MarkerFinder(text)
        calls: list[ToolCall] = []
        errors: list[str] = []
        #: The turn's text in order, as (text, is_reasoning); reasoning is never read.
        pieces: list[tuple[str, bool]] = []
        pos = index = tries = 0
        first_end = find(_THINK_END, 0)
        if first_end >= 0 and not 0 <= find(_THINK, 0) < first_end:
            pos = first_end + len(_THINK_END)  # the reply starts in reasoning the prompt opened
            pieces.append((text[:pos], True))
        while True:
            call, think = find(_OPEN, pos), find(_THINK, pos)
            if call < 0 and think < 0:
                pieces.append((text[pos:], False))
                break
            if think >= 0 and (call < 0 or think < call):
                pieces.append((text[pos:think], False))
                end = find(_THINK_END, think + len(_THINK))
                if end < 0:  # unclosed: reasoning to the end of the text
                    pieces.append((text[think:], True))
                    break
                pos = end + len(_THINK_END)
                pieces.append((text[think:pos], True))
                continue
            pieces.append((text[pos:call], False))
            body = call + len(_OPEN)
            close, nxt = find(_CLOSE, body), find(_OPEN, body)
            whole = False
            if 0 <= nxt < close and tries < _MAX_TAG_IN_VALUES and 0 <= find(_VALUE, body) < nxt:
                # vLLM reads a call to its first `</tool_call>`: a `<tool_call>` after an <arg_value>
                # and before that close is text in the value (a file about tool calls) when the call
                # reads so. Each try reads to the close: a few at most.
                tries += 1
                whole = self._read(text[body:close], index)[1] is None
            if close >= 0 and (nxt < 0 or close < nxt or whole):
                found, err = self._read(text[body:close], index)
                if found is not None:
                    calls.append(found)
                if err is not None:
                    errors.append(err)
                pos = close + len(_CLOSE)
            else:
                pos = nxt if nxt >= 0 else len(text)
                head = text[body : min(pos, body + 200)].strip().split("\n", 1)[0].split("<", 1)[0][:80]
                where = f"Tool call {index + 1} ({head})" if head else f"Tool call {index + 1}"
                errors.append(f"{where} is not closed with </tool_call>. {_HOW}")
            index += 1
        if not any(reasoning for _, reasoning in pieces):
            return tool_call_action(calls, errors, "".join(p for p, _ in pieces), self.answer_tag)
        return self._action(calls, errors, pieces)

    def _action(self, calls: list[ToolCall], errors: list[str], pieces: list[tuple[str, bool]]) -> ParsedAction:
        """The turn's action when it has reasoning: an `<answer>` counts only outside it."""
        runs = reasoning_runs(pieces)
        answer: str | None = None
        out: list[str] = []
        for run, reasoning in runs:
            if self.answer_tag and not reasoning and "<answer>" in run:
                found, run = self.find_answer(run)
                answer = found if found is not None else answer
            out.append(run)
        return new_parsed(calls, answer, "".join(out).strip(), errors)

    def _read(self, body: str, index: int) -> tuple[ToolCall | None, str | None]:
        """One call's body (between `<tool_call>` and `</tool_call>`): the call, or its error."""
        where = f"Tool call {index + 1}"
        first = body.find(_KEY)
        head = body if first < 0 else body[:first]
        name = head.strip()
        if not name or name.startswith(_VALUE):
            if name:
                return None, f"{where} has an <arg_value> but no function name. {_HOW}"
            return None, f"{where} has no function name: write it right after <tool_call>. {_HOW}"
        if name[0] in "{[":
            return None, (
                f"{where} holds JSON ({name[:60]!r}); this format writes the name, then each argument in "
                f"<arg_key> and <arg_value> tags. {_HOW}"
            )
        if _has(name, ("\n", _KEY_END, _VALUE, _VALUE_END)):
            line = name.split("\n", 1)[0].strip()
            return None, (
                f"{where} ({line[:80]}): the function name must stand alone after <tool_call>, with every "
                f"argument in an <arg_key>/<arg_value> pair. {_HOW}"
            )
        where = f"{where} ({name[:80]})"
        args: dict[str, Any] = {}
        n = len(body)
        pos = n if first < 0 else first
        while True:
            m = _WS.match(body, pos)
            pos = m.end() if m else pos
            if pos >= n:
                return new_call(name, args, positional_id(index)), None
            if not body.startswith(_KEY, pos):
                if body.startswith(_VALUE, pos):
                    return None, f"{where}: an <arg_value> has no <arg_key> before it. {_HOW}"
                stray = body[pos : pos + 60].split("\n", 1)[0]
                return None, f"{where}: unexpected text {stray!r}; every argument goes in <arg_key>/<arg_value>. {_HOW}"
            start = pos + len(_KEY)
            key_end = body.find(_KEY_END, start)
            if key_end < 0 or _has(body[start:key_end], (_KEY, _VALUE)):
                return None, f"{where}: an <arg_key> is not closed with </arg_key>. {_HOW}"
            key = body[start:key_end].strip()
            if not key:
                return None, f"{where}: an <arg_key></arg_key> is empty; write the argument's name in it. {_HOW}"
            m = _WS.match(body, key_end + len(_KEY_END))
            at = m.end() if m else key_end + len(_KEY_END)
            if not body.startswith(_VALUE, at):
                return None, f"{where}: <arg_key>{key[:80]}</arg_key> is not followed by <arg_value>. {_HOW}"
            value_end = body.find(_VALUE_END, at + len(_VALUE))
            if value_end < 0:
                return None, f"{where}: the <arg_value> of {key[:80]!r} is not closed with </arg_value>. {_HOW}"
            if key in args:
                return None, f"{where}: argument {key[:80]!r} is given twice."
            args[key] = typed_value(body[at + len(_VALUE) : value_end], self._kind(name, key), literals=True)
            pos = value_end + len(_VALUE_END)

    # ------------------------------------------------------------------ prompt, results, calls
    def instructions(self, tools: Sequence[Tool]) -> str:
        lines = []
        if tools:
            lines.append(
                "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n"
                f"<tools>\n{tools_json(tools)}\n</tools>\n\n"
                "For each function call, output the function name and arguments within the following XML format:\n"
                "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
                "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>\n"
                "Write a string value as it is, without quotes; numbers, booleans, arrays and objects as JSON."
            )
        if self.answer_tag:
            lines.append("When you know the final answer, write it as <answer>...</answer>.")
        return "\n".join(lines)

    def format_results(self, results: Sequence[ToolResult]) -> str:
        return tool_responses(results)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        if not isinstance(name, str) or not name.strip() or name != name.strip() or name[0] in "{[":
            return None
        if _has(name, _NAME_BREAKS) or not isinstance(arguments, dict):
            return None
        lines = [f"{_OPEN}{name}"]
        for key, value in arguments.items():
            if not isinstance(key, str) or not key.strip() or key != key.strip() or _has(key, _KEY_BREAKS):
                return None
            text = write_typed(value, self._kind(name, key), _BREAKS, _escape, literals=True)
            if text is None:
                return None
            lines.append(f"{_KEY}{key}{_KEY_END}\n{_VALUE}{text}{_VALUE_END}")
        lines.append(_CLOSE)
        return "\n".join(lines)


def _cut_turn_end(text: str) -> str:
    """`text` up to the first end-of-turn token (all of it when there is none)."""
    if "<|" not in text:
        return text
    found = [at for at in (text.find(m) for m in _TURN_ENDS) if at >= 0]
    return text[: min(found)] if found else text


register_parser("glm45", Glm45Parser)
