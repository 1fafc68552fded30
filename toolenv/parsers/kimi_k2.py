"""Kimi K2 tool calls (Moonshot's Kimi-K2-Instruct and K2-Thinking), written in special tokens.

vLLM reads the same text with `--tool-call-parser kimi_k2`. The model writes its calls after
any text, in one section; each call's id names the function and numbers the call in the turn:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(one line in the model's output; it is cut here for width.) The chat template writes an
assistant turn's calls exactly so, with the id taken from the call (`functions.NAME:INDEX`,
INDEX counting the turn's calls from 0), and each tool result as a turn of its own:
`<|im_system|>NAME<|im_middle|>## Return of functions.get_weather:0\\n…<|im_end|>`.

How the text is read, and why:

- **Calls are keyed on `<|tool_call_begin|>`.** The section markers are optional (vLLM needs
  the opening one; a server that stops on the closing one drops it) and are removed from the
  turn's text, as is the `<|tool_call_section_begin|>` spelling some replies use. A call ends
  at its `<|tool_call_end|>`. One not closed before the next `<|tool_call_begin|>` is an error;
  one not closed before `<|tool_calls_section_end|>` or the end of the text (generation
  stopped) is read anyway, and what follows its JSON is text. Text around the calls is kept.
- **Names and ids.** The id is what precedes `<|tool_call_argument_begin|>`, kept as written
  (stripped): the call's `id`, which the template echoes in `## Return of …`. The name is the
  id without its `:INDEX` and without one leading `functions.`; as vLLM does, `NAME:INDEX` is
  accepted, and so is a bare `functions.NAME` or `NAME`. (vLLM keeps only the text after the
  last dot, so a tool named `web.search` would come back as `search`; here it stays whole.)
- **Arguments** are one JSON object; a JSON string holding one (double encoding) is decoded.
- **Reasoning is never a call.** K2-Thinking writes `<think>…</think>` before its text and
  calls. As vLLM's `kimi_k2` reasoning parser does, reasoning ends at `</think>` or, when the
  model goes straight to its calls, at `<|tool_calls_section_begin|>`; a reply with `</think>`
  before any `<think>` starts in reasoning (a generation prompt that opened it, as K2.5's
  does). Calls and `<answer>` inside reasoning are not read; the reasoning stays in `text`.
- **Where the turn ends.** `<|im_end|>` ends the model's turn; what follows it or any other
  role marker (`<|im_system|>`, `<|im_user|>`, `<|im_assistant|>`: a hallucinated tool result
  or next turn) was not the model's to write and is dropped.
- **Errors**, per call and worded for the model: nothing after `<|tool_call_begin|>`, no
  `<|tool_call_argument_begin|>`, no id or name, no arguments, JSON that does not decode
  (numbers too long for Python and nesting deeper than the recursion limit included),
  arguments that are not an object, a call not closed before the next. For the turn: a
  `<|tool_call_argument_begin|>` outside any call, and a section with no call in it (not
  reported when the turn gives an `<answer>`). A good call next to a bad one still runs.
- `special_tokens = True`: every marker is a special token of Kimi's tokenizer (vLLM turns
  `skip_special_tokens` off for this parser).
- `stop = ("<|tool_calls_section_end|>",)`: it ends the turn's calls; the template writes only
  `<|im_end|>` after it. Calls are read the same with or without it.
- `tool_messages = True`. `format_results` writes each result as the template writes a tool
  message, a whole `<|im_system|>…<|im_end|>` turn (as Harmony's results are whole messages,
  since each carries its own header); the env's own messages (parse errors, which answer no
  call) come back together as one user turn, as `reply_messages` sends them to a chat template.
  (Kimi-K2-Instruct-0905's template file indents the content line by four spaces, an artifact
  of its layout; this writes the content right after the line break, as other renderings do.)
- `instructions(tools)` declares the tools as the template's `tool_declare` turn does (`# Tools`
  and the JSON list of schemas), then a line on the call format and one on `<answer>`.
- `format_call` writes one call in its own section, as the template does. The id is `call_id`
  when it reads back as `name` (`functions.NAME:INDEX`), else `functions.NAME:N` with N from
  a positional `call_N` id (0 otherwise). Inside JSON strings the `<` of `<|` and of the think
  tags is written `\\u003c`, so an argument can neither end the call nor open reasoning. A name
  that is empty, padded, or holds a marker or think tag cannot be written (None).

Scanning is linear: one pass of `str.find` with remembered positions; each call's body is
read once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers._json import call_arguments, call_json
from toolenv.parsers._scan import MarkerFinder
from toolenv.parsers.base import ActionParser, reasoning_runs, register_parser
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call, new_parsed

__all__ = ["KimiK2Parser"]

_SECTION, _SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
#: The singular spelling some replies use (not a special token; tinker's Kimi renderer reads it too).
_SECTION_ALT, _SECTION_ALT_END = "<|tool_call_section_begin|>", "<|tool_call_section_end|>"
_CALL, _ARG, _CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_THINK, _THINK_END = "<think>", "</think>"
_PREFIX = "functions."
#: Markers after which nothing is the model's turn: its end, and the start of any other turn.
_TURN_ENDS = ("<|im_end|>", "<|im_system|>", "<|im_user|>", "<|im_assistant|>")
_SYSTEM, _USER, _MIDDLE, _END = "<|im_system|>", "<|im_user|>", "<|im_middle|>", "<|im_end|>"
_HOW = (
    f'Write {_CALL}functions.NAME:INDEX{_ARG}{{"argument": value}}{_CALL_END} with the arguments as a '
    f"JSON object, all of a turn's calls between {_SECTION} and {_SECTION_END}."
)


def _short(text: str) -> str:
    """`text` cut to one line of at most 80 characters, for an error message."""
    return (text[:160].splitlines() or [""])[0][:80]


def _escape(text: str) -> str:
    """JSON text with the `<` of every `<|…|>` marker and think tag written `\\u003c` (JSON puts
    `<` nowhere but inside strings, where the escape is the same character)."""
    if "<" in text:
        text = text.replace("<|", "\\u003c|")
        text = text.replace(_THINK, "\\u003cthink>").replace(_THINK_END, "\\u003c/think>")
    return text


def _name_of(call_id: str) -> str:
    """The function name in a call id: `functions.NAME:INDEX`, `NAME:INDEX`, `functions.NAME` or
    `NAME` (the id stripped of white space)."""
    base, colon, index = call_id.rpartition(":")
    index = index.strip()
    if colon and index.isascii() and index.isdigit():
        call_id = base.strip()
    return call_id.removeprefix(_PREFIX).strip() if call_id.startswith(_PREFIX) else call_id


def _writable(name: str) -> bool:
    """True for a name a call id can carry and give back: not empty or padded, no marker or think tag."""
    return (
        isinstance(name, str)
        and bool(name)
        and name == name.strip()
        and "<|" not in name
        and _THINK not in name
        and _THINK_END not in name
    )


def _cut_turn_end(text: str) -> str:
    """`text` up to the first marker that ends the model's turn (all of it when there is none)."""
    if "<|im_" not in text:
        return text
    found = [at for at in (text.find(m) for m in _TURN_ENDS) if at >= 0]
    return text[: min(found)] if found else text


class _Turn:
    """The calls and errors of one reply, read in order."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self.attempts = 0

    def read(self, body: str, closed: bool) -> str:
        """Read one call's body (the text after `<|tool_call_begin|>`); returns the text that
        follows its JSON when the call is not closed (it is the turn's text)."""
        index = self.attempts
        self.attempts += 1
        where = f"Tool call {index + 1}"
        arg = body.find(_ARG)
        if arg < 0:
            if not body.strip():
                self.errors.append(f"{where}: nothing follows {_CALL}. {_HOW}")
            else:
                self.errors.append(
                    f"{where} ({_short(body.strip())}) has no {_ARG} between the call id and its arguments. {_HOW}"
                )
            return ""
        call_id = body[:arg].strip()
        if not call_id:
            self.errors.append(f"{where} has no call id: write functions.NAME:INDEX after {_CALL}. {_HOW}")
            return ""
        name = _name_of(call_id)
        if not name:
            self.errors.append(f"{where} ({_short(call_id)}) has no function name in its id. {_HOW}")
            return ""
        where = f"{where} ({_short(name)})"
        json_text = body[arg + len(_ARG) :].strip()
        if not json_text:
            self.errors.append(f"{where}: no JSON arguments follow {_ARG} (write {{}} for none). {_HOW}")
            return ""
        decoded = call_json(json_text, closed, where, _CALL_END, _HOW)
        if isinstance(decoded, str):
            self.errors.append(decoded)
            return ""
        value, rest = decoded
        arguments = call_arguments(value, where)
        if isinstance(arguments, str):
            self.errors.append(arguments)
        else:
            self.calls.append(new_call(name, arguments, call_id))
        return rest

    def unclosed(self, body: str) -> None:
        """A call cut short by the next `<|tool_call_begin|>`."""
        self.attempts += 1
        head = body[:200].split(_ARG, 1)[0].strip()
        where = f"Tool call {self.attempts} ({_short(head)})" if head else f"Tool call {self.attempts}"
        self.errors.append(f"{where} is not closed with {_CALL_END}. {_HOW}")


class KimiK2Parser(ActionParser):
    """Kimi K2's `<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{…}<|tool_call_end|>`
    calls (vLLM's `kimi_k2` parser).

    Args:
        answer_tag: read `<answer>…</answer>` outside the calls and reasoning as the final answer.
    """

    name = "kimi_k2"
    stop = (_SECTION_END,)
    special_tokens = True
    tool_messages = True

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    # ------------------------------------------------------------------ parse
    def parse(self, text: str) -> ParsedAction:
        text = _cut_turn_end(text)
        if "<|tool_" not in text and "think>" not in text:
            return self._action([], [], [(text, False)], [])  # plain text or a bare answer
        find = MarkerFinder(text)
        turn = _Turn()
        #: The turn's text in order, as (text, is_reasoning); reasoning is never read.
        pieces: list[tuple[str, bool]] = []
        opened = stray = False  # a section begin / an argument marker outside calls and reasoning

        def plain(start: int, end: int) -> None:
            nonlocal opened, stray
            if start < end:
                piece = text[start:end]
                opened = opened or _SECTION in piece or _SECTION_ALT in piece
                stray = stray or _ARG in piece
                pieces.append((piece, False))

        def reasoning_end(start: int) -> tuple[int, int]:
            """Where reasoning from `start` ends, and where the text after it starts: at `</think>`,
            or before a section begin that comes first (the model went on to call), or the end."""
            close = find(_THINK_END, start)
            opens = [at for at in (find(_SECTION, start), find(_SECTION_ALT, start)) if at >= 0]
            section = min(opens, default=-1)
            if section >= 0 and (close < 0 or section < close):
                return section, section
            if close < 0:
                return len(text), len(text)
            return close + len(_THINK_END), close + len(_THINK_END)

        pos = 0
        first_end = find(_THINK_END, 0)
        if first_end >= 0 and not 0 <= find(_THINK, 0) < first_end:  # the prompt opened reasoning
            end, pos = reasoning_end(0)
            if end:
                pieces.append((text[:end], True))
        while pos < len(text):
            call, think = find(_CALL, pos), find(_THINK, pos)
            if call < 0 and think < 0:
                plain(pos, len(text))
                break
            if think >= 0 and (call < 0 or think < call):  # reasoning: kept as text, never read
                plain(pos, think)
                end, pos = reasoning_end(think + len(_THINK))
                pieces.append((text[think:end], True))
                continue
            plain(pos, call)
            body = call + len(_CALL)
            close, nxt = find(_CALL_END, body), find(_CALL, body)
            outer = min([at for at in (find(_SECTION_END, body), find(_SECTION_ALT_END, body)) if at >= 0], default=-1)
            stop = min([at for at in (nxt, outer) if at >= 0], default=len(text))
            if 0 <= close < stop:
                turn.read(text[body:close], closed=True)
                pos = close + len(_CALL_END)
            elif stop == nxt:
                turn.unclosed(text[body:nxt])
                pos = nxt
            else:  # not closed before the section ends: generation stopped, read what is there
                after = turn.read(text[body:stop], closed=False)
                if after:
                    pieces.append((after, False))
                pos = stop
        orphans: list[str] = []
        if stray:
            orphans.append(f"{_ARG} appears outside a tool call: start each call with {_CALL}. {_HOW}")
        elif opened and not turn.attempts:
            orphans.append(f"{_SECTION} is not followed by a tool call: start each call with {_CALL}. {_HOW}")
        return self._action(turn.calls, turn.errors, pieces, orphans)

    def _action(
        self, calls: list[ToolCall], errors: list[str], pieces: list[tuple[str, bool]], orphans: list[str]
    ) -> ParsedAction:
        """The turn's action from its pieces of text: section markers leave the text, an `<answer>`
        counts only outside reasoning; `orphans` are errors for call markers without a call,
        which a turn that gives the answer does not need to hear."""
        runs = reasoning_runs(pieces)
        answer: str | None = None
        out: list[str] = []
        for run, reasoning in runs:
            if not reasoning:
                if "<|tool_" in run:
                    for marker in (_SECTION, _SECTION_END, _SECTION_ALT, _SECTION_ALT_END):
                        run = run.replace(marker, "")
                if self.answer_tag and "<answer>" in run:
                    found, run = self.find_answer(run)
                    answer = found if found is not None else answer
            out.append(run)
        if orphans and answer is None:
            errors.extend(orphans)
        return new_parsed(calls, answer, "".join(out).strip(), errors)

    # ------------------------------------------------------------------ prompt, results, calls
    def instructions(self, tools: Sequence[Tool]) -> str:
        # The template declares the tools as a JSON list (`tools | tojson`) in a `tool_declare`
        # turn; the model was tuned on that, so the list is given the same way, then the format.
        lines: list[str] = []
        if tools:
            declared = _escape(json.dumps([t.schema() for t in tools], ensure_ascii=False))
            lines += [
                "# Tools",
                declared,
                "",
                f"To call tools, write {_SECTION} after any text, then each call as "
                f'{_CALL}functions.NAME:INDEX{_ARG}{{"argument": value}}{_CALL_END}, then {_SECTION_END}. '
                "INDEX counts the calls of the turn from 0; the arguments are a JSON object.",
            ]
        if self.answer_tag:
            lines += ["", "When you know the final answer, write it as <answer>...</answer>."]
        return "\n".join(lines).strip()

    def format_results(self, results: Sequence[ToolResult]) -> str:
        out: list[str] = []
        said: list[str] = []
        for r in results:
            if r.call_id:  # a tool's answer: a tool message, as the template writes one
                out.append(f"{_SYSTEM}{r.name or 'tool'}{_MIDDLE}## Return of {r.call_id}\n{r.text}{_END}")
            else:  # answers no call (a parse error): the env speaks, as a user turn
                said.append(r.text)
        if said:
            out.append(f"{_USER}user{_MIDDLE}" + "\n".join(said) + _END)
        return "".join(out)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        if not _writable(name) or not isinstance(arguments, dict):
            return None
        try:
            args = _escape(json.dumps(arguments, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError, RecursionError):  # not JSON, NaN, ints past 4300 digits, too deep
            return None
        if not (isinstance(call_id, str) and _writable(call_id) and _name_of(call_id) == name):
            index = call_id[len("call_") :] if isinstance(call_id, str) and call_id.startswith("call_") else ""
            call_id = f"{_PREFIX}{name}:{index if index.isascii() and index.isdigit() else 0}"
        return f"{_SECTION}{_CALL}{call_id}{_ARG}{args}{_CALL_END}{_SECTION_END}"


register_parser("kimi_k2", KimiK2Parser)
