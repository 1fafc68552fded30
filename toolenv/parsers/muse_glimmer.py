"""Meta's Muse Glimmer tool calls: ATEM blocks in messages addressed to the tool (vLLM: `muse_glimmer`).

```text
<|start|>assistant to=self<|message|>The user wants the weather.<|eom|>
<|start|>assistant to=get_weather<|message|><atem:function_calls>
<atem:invoke name="get_weather">
<atem:parameter name="city">Paris</atem:parameter>
<atem:parameter name="days">[1, 2]</atem:parameter>
</atem:invoke>
</atem:function_calls><|eot|>
```

(without the line breaks between messages: the template writes none). A turn is a run of
messages, `<|start|>assistant to=RECIPIENT<|message|>BODY` each, ended by `<|eom|>` (more
follows) or `<|eot|>` (the turn is over). The recipient says what the body is: `self` is
reasoning, `user` is the reply, anything else is a tool, and the body is then one ATEM call
(TRL's `muse_glimmer.jinja` writes one message per call, the name both in `to=` and in
`<atem:invoke>`). The generation prompt is `<|start|>assistant`, so a reply starts inside its
first header: ` to=self<|message|>…`. Values are written as the template writes them: a
string as it is (no quotes, no escapes, white space kept), None as `null`, booleans as
`true`/`false`, lists and objects as JSON, numbers as Python prints them.

How the text is read, and why:

- **Messages first.** The special tokens `<|start|>`, `<|message|>`, `<|eom|>`, `<|eot|>`
  and `<|end_of_text|>` cut the reply into messages before anything else is read, so a
  broken message never swallows the next one. A message also ends where the next one starts
  (a lost `<|eom|>`), and a `<|message|>` with no `<|start|>` before it takes its header from
  the ` to=NAME` just before it, as vLLM's parser does.
- **Where the turn ends.** `<|eot|>` and `<|end_of_text|>` (the EOS ids of the model's
  generation config), and a `<|start|>` that opens a message of another role (`user`,
  `tool`, `system`: a hallucinated tool output or next turn): nothing after is read.
- **Calls are read only where they are addressed to a tool.** Markup in a message to
  `self` (reasoning), to `user` or to no one (a bare `<|message|>`) is never a call, as in
  vLLM. Text outside any message is read for calls too: a reply decoded with
  `skip_special_tokens=True` has no messages left, only its ATEM blocks (vLLM reads the
  text so only when it has no message header at all). The `<atem:function_calls>` wrapper
  is optional, and one block may hold several `<atem:invoke>` (the system prompt's `...`
  allows it). The invoke's name is the call's name (the recipient may be a namespace);
  bound to an env's tools, a doubled name (`search.search`, which the prompt's `"search.*"`
  recipient invites for a bare `search`) is read as the tool's name, as vLLM does.
- **Values by type** (`typed_value`, shared with `glm45`): bound to the env's tools, a
  string parameter keeps exactly what was written (a `str | None` one reads `null` as None,
  which the template writes for None), other types are decoded as JSON (`True`/`False` are
  accepted for booleans), and a value that does not decode stays text for the tool's
  validation to report; where the type is unknown (unbound, a tool or parameter the env does
  not have, a union such as `int | str`) a value that is JSON is decoded and anything else
  stays text, as vLLM reads every value. A value ends at the first `</atem:parameter>`;
  `</atem:invoke>` or `<atem:invoke` inside a value are text.
- **Errors per call, one line each, worded for the model**: a malformed `<atem:invoke>` or
  `<atem:parameter>` tag, an empty name or key, a parameter not closed, an invoke not closed
  before the next one, `</atem:function_calls>` or the end of its message, a key given twice,
  text between the parameters, a message to a tool with no `<atem:invoke>` in it, a header
  to a tool with no `<|message|>`. A good call beside a bad one still runs; ids are
  `call_0`, `call_1`, … by position (the format has none).
- **Reasoning and answer.** `to=self` bodies are reasoning: kept in the turn's `text` (as
  Harmony's analysis), never read for calls or `<answer>`. The last `<answer>` in the other
  text is the answer: messages to `user`, text outside messages, and the text of messages to
  a tool outside their calls (the `<atem:function_calls>` wrapper leaves the text).
- `special_tokens = True`: the framing tokens are special tokens of the model's tokenizer;
  decoded with `skip_special_tokens=True` the recipients run into the text.
- `stop = ("<|eot|>",)`: the template ends the last call of a turn with `<|eot|>` before the
  tool results (and puts `<|eom|>` between calls), so a turn with several calls is never cut.
- `tool_messages = True`. `format_results` writes what the template writes for the messages
  `reply_messages` sends: for each result that answers a call,
  `<|start|>tool NAME<|message|><tool_output name="NAME">\\nTEXT\\n</tool_output><|eot|>` (NAME
  is the call's id when the result has no name, as the template falls back to it); the env's
  own messages (parse errors, which answer no call) as one user message.
- `format_call` writes one call message exactly as the template does, from `<|start|>` to
  `</atem:function_calls>`: the end token is left out (the template writes `<|eom|>` or
  `<|eot|>` by what follows, and servers drop the stop string). A value whose raw text
  would not read back as itself (`"42"` for a parameter that is not a string, a string
  holding `</atem:parameter>` or a framing token) is written as JSON, with the `<` of
  `</atem:parameter>` and of every `<|` written `\\u003c`. It returns None for what cannot
  be carried: a name that is empty, holds white space, `"` or `<|`, is `self` or `user`, or
  is a doubled name a bound parser reads as its tool's; a key that is empty, padded or holds
  `"` or `<|`; a string parameter's value holding `</atem:parameter>` or a framing token (it
  is read as written, so JSON would stay JSON); values that are not JSON (NaN, sets,
  integers past 4,300 digits).

Scanning is linear: one pass over the `<|` of the text for the messages, then `str.find`
with remembered positions (`MarkerFinder`) inside them; each value is decoded once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from toolenv._tool import Tool
from toolenv.parsers._scan import MarkerFinder, SchemaBound, positional_id, typed_value, write_typed
from toolenv.parsers.base import ActionParser, register_parser, tool_call_action
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call, new_parsed

__all__ = ["MuseGlimmerParser"]

_START, _MESSAGE, _EOM, _EOT, _EOS = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>", "<|end_of_text|>"
_FRAME = (_START, _MESSAGE, _EOM, _EOT, _EOS)
_CALLS, _CALLS_END = "<atem:function_calls>", "</atem:function_calls>"
_INVOKE, _INVOKE_END = "<atem:invoke", "</atem:invoke>"
_PARAM, _PARAM_END = "<atem:parameter", "</atem:parameter>"
_SELF, _USER = "self", "user"
#: What a raw value cannot hold: it would end the value, or split the message.
_BREAKS = (_PARAM_END, *_FRAME)
_HOW = (
    'Write each call as <atem:invoke name="NAME"> with each argument as '
    '<atem:parameter name="KEY">VALUE</atem:parameter>, then </atem:invoke>, '
    "in a message <|start|>assistant to=NAME<|message|>."
)
_ATTR = re.compile(r"""\s+name\s*=\s*(["'])""")
_TAG_END = re.compile(r"\s*>")
_WS = re.compile(r"\s*")

_INTRO = (
    "In this environment you have access to a set of tools you can use to answer the user's question.\n\n"
    'You can invoke a function by writing a "<atem:function_calls>" block like the following:\n'
    '<atem:function_calls>\n<atem:invoke name="$FUNCTION_NAME">\n'
    '<atem:parameter name="$PARAMETER_NAME">$PARAMETER_VALUE</atem:parameter>\n'
    "...\n</atem:invoke>\n</atem:function_calls>\n\n"
    "String and scalar parameters should be specified as is, while lists and objects should use JSON format. "
    "Note that spaces for string values are not stripped. "
    "The output is not expected to be valid XML and is parsed with regular expressions.\n"
    "Here are the functions available in JSONSchema format:\n"
    "// Tool metadata\n"
)
_EXAMPLE = (
    "\n\nHere's an example of how to call a function in the tool set:\n"
    "(If the tool namespace is not specified, invoke the function directly as `example_function_name` "
    "rather than `example_tool_name.example_function_name`)\n\n"
    "to=example_tool_name.example_function_name\n\n"
    '<atem:function_calls>\n<atem:invoke name="example_tool_name.example_function_name">\n'
    '<atem:parameter name="example_parameter_1">value_1</atem:parameter>\n'
    '<atem:parameter name="example_parameter_2">This is the value for the second parameter\n'
    'that can span\n"multiple" lines\n</atem:parameter>\n'
    "</atem:invoke>\n</atem:function_calls>"
)


def _frame(text: str) -> Iterator[tuple[str, int]]:
    """Each framing token of `text` and where it is, in order (every `<|` is looked at once)."""
    pos = 0
    while (at := text.find("<|", pos)) >= 0:
        for marker in _FRAME:
            if text.startswith(marker, at):
                yield marker, at
                pos = at + len(marker)
                break
        else:
            pos = at + 2


def _header(head: str) -> tuple[str, str | None]:
    """The role and recipient of a header written after `<|start|>` (`assistant to=NAME`)."""
    words = head.split(None, 3)[:3]
    role = words[0] if words and not words[0].startswith("to=") else ""
    recipient = next((w[3:] for w in words if w.startswith("to=")), "")
    return role, recipient or None


def _trailing_header(text: str, start: int, end: int) -> tuple[int, str | None]:
    """For a `<|message|>` with no `<|start|>` before it: where its header begins in
    `text[start:end]` (a last word `to=NAME`, with an `assistant` before it) and the recipient;
    `(end, None)` when there is none, `(start, None)` when the text is a bare `assistant`."""
    chunk = text[start:end].rstrip()
    words = chunk.rsplit(None, 2)
    if not words or words == ["assistant"]:
        return start, None
    last = words[-1]
    if not last.startswith("to=") or len(last) == 3:
        return end, None
    head = len(chunk) - len(last)
    if len(words) > 1 and words[-2] == "assistant":
        head = len(chunk[:head].rstrip()) - len("assistant")
    return start + head, last[3:]


def _short(text: str) -> str:
    """`text` cut to one line of at most 80 characters, for an error message."""
    return (text[:160].splitlines() or [""])[0][:80]


def _escape(text: str) -> str:
    """JSON text with the `<` of every marker that would break a call written `\\u003c` (JSON puts
    `<` nowhere but in strings, where the escape is the same character)."""
    if "<" in text:
        text = text.replace(_PARAM_END, "\\u003c" + _PARAM_END[1:]).replace("<|", "\\u003c|")
    return text


class _Turn:
    """One reply being read: its calls, errors and text pieces (text, is_reasoning), in order."""

    def __init__(self, parser: MuseGlimmerParser, text: str) -> None:
        self.parser = parser
        self.text = text
        self.find = MarkerFinder(text)
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self.pieces: list[tuple[str, bool]] = []
        self.index = 0

    # ---------------------------------------------------------------- messages
    def read(self) -> None:
        """Cut the reply into messages and read each one."""
        text = self.text
        in_header = in_body = False
        recipient: str | None = None
        kept = body = 0  # where the current chunk starts; where the open message's body starts
        for marker, at in _frame(text):
            if in_header:
                role, recipient = _header(text[kept:at])
                if role not in ("", "assistant"):
                    return  # another role's message: the turn is over
                in_header = False
                if marker == _MESSAGE:
                    in_body, body = True, at + len(_MESSAGE)
                    kept = body
                    continue
                self._headless(recipient)
            elif marker == _MESSAGE:
                head, name = _trailing_header(text, kept, at)
                if in_body:
                    self._message(recipient, body, head)
                else:
                    self._outside(kept, head)
                in_body, recipient, body = True, name, at + len(_MESSAGE)
                kept = body
                continue
            elif in_body:
                self._message(recipient, body, at)
                in_body = False
            else:
                self._outside(kept, at)
            if marker in (_EOT, _EOS):
                return
            in_header = marker == _START
            kept = at + len(marker)
        if in_header:
            role, recipient = _header(text[kept:])
            if role in ("", "assistant"):
                self._headless(recipient)
        elif in_body:
            self._message(recipient, body, len(text))
        else:
            self._outside(kept, len(text))

    def _headless(self, recipient: str | None) -> None:
        """A header with no `<|message|>` after it: an error when it addressed a tool."""
        if recipient is not None and recipient not in (_SELF, _USER):
            self.errors.append(
                f"Tool call {self.index + 1} ({recipient[:80]}): the header to={recipient[:80]} is not "
                f"followed by <|message|> and the call. {_HOW}"
            )
            self.index += 1

    def _outside(self, start: int, end: int) -> None:
        """Text outside any message: calls in it are read (a reply decoded without its special tokens)."""
        if start < end:
            self._calls(start, end, None)

    def _message(self, recipient: str | None, start: int, end: int) -> None:
        if recipient == _SELF:
            self.pieces.append((self.text[start:end], True))
        elif recipient is None or recipient == _USER:
            self.pieces.append((self.text[start:end], False))
        else:
            self._calls(start, end, recipient)

    # ---------------------------------------------------------------- calls
    def _calls(self, start: int, end: int, recipient: str | None) -> None:
        """Read the `<atem:invoke>` calls in `text[start:end]`; the text around them is the turn's."""
        text, find = self.text, self.find
        pos, found = start, False
        rest: list[str] = []
        while True:
            at = find(_INVOKE, pos)
            if at < 0 or at >= end:
                rest.append(text[pos:end])
                break
            rest.append(text[pos:at])
            found = True
            pos = self._invoke(at, end)
        if recipient is not None and not found:
            self.errors.append(
                f"Tool call {self.index + 1} ({recipient[:80]}): the message to={recipient[:80]} holds no "
                f"<atem:invoke> call. {_HOW}"
            )
            self.index += 1
        left = "".join(rest)
        if found and "atem:function_calls>" in left:
            left = left.replace(_CALLS, "").replace(_CALLS_END, "")
        self.pieces.append((left, False))

    def _attr(self, pos: int, end: int) -> tuple[str | None, int]:
        """The `name` of a tag whose `<atem:…` ends at `pos` and the position after its `>`, or
        (None, pos) when the tag is not ` name="…">`."""
        m = _ATTR.match(self.text, pos, end)
        if m is None:
            return None, pos
        close = self.find(m.group(1), m.end())
        if close < 0 or close >= end:
            return None, pos
        tail = _TAG_END.match(self.text, close + 1, end)
        if tail is None:
            return None, pos
        return self.text[m.end() : close], tail.end()

    def _skip(self, pos: int, end: int) -> int:
        """Where reading resumes after a broken call: past its `</atem:invoke>`, or at the next call."""
        close, nxt = self.find(_INVOKE_END, pos), self.find(_INVOKE, pos)
        if 0 <= close < end and (nxt < 0 or close < nxt):
            return close + len(_INVOKE_END)
        return nxt if 0 <= nxt < end else end

    def _invoke(self, at: int, end: int) -> int:
        """Read the call whose `<atem:invoke` is at `at`; returns where reading goes on."""
        text, index = self.text, self.index
        self.index += 1
        where = f"Tool call {index + 1}"
        raw, pos = self._attr(at + len(_INVOKE), end)
        if raw is None:
            self.errors.append(f'{where}: the <atem:invoke> tag is malformed; write <atem:invoke name="NAME">. {_HOW}')
            return self._skip(pos, end)
        name = self.parser._resolve(raw.strip())
        if not name:
            self.errors.append(f"{where}: the <atem:invoke> tag has an empty name. {_HOW}")
            return self._skip(pos, end)
        where = f"{where} ({_short(name)})"
        args: dict[str, Any] = {}
        while True:
            m = _WS.match(text, pos, end)
            pos = m.end() if m else pos
            if pos >= end or text.startswith(_INVOKE, pos) or text.startswith(_CALLS_END, pos):
                self.errors.append(f"{where} is not closed with </atem:invoke>. {_HOW}")
                return pos
            if text.startswith(_INVOKE_END, pos):
                self.calls.append(new_call(name, args, positional_id(index)))
                return pos + len(_INVOKE_END)
            if not text.startswith(_PARAM, pos):
                stray = text[pos : pos + 60].split("\n", 1)[0]
                self.errors.append(
                    f"{where}: unexpected text {stray!r}; every argument goes in an <atem:parameter>. {_HOW}"
                )
                return self._skip(pos, end)
            raw, value = self._attr(pos + len(_PARAM), end)
            if raw is None:
                self.errors.append(
                    f'{where}: an <atem:parameter> tag is malformed; write <atem:parameter name="KEY">. {_HOW}'
                )
                return self._skip(pos + len(_PARAM), end)
            key = raw.strip()
            if not key:
                self.errors.append(f"{where}: an <atem:parameter> has an empty name. {_HOW}")
                return self._skip(value, end)
            close = self.find(_PARAM_END, value)
            if close < 0 or close >= end:
                self.errors.append(f"{where}: the parameter {key[:80]!r} is not closed with </atem:parameter>. {_HOW}")
                return self._skip(value, end)
            if key in args:
                self.errors.append(f"{where}: argument {key[:80]!r} is given twice.")
                return self._skip(close, end)
            args[key] = typed_value(text[value:close], self.parser._kind(name, key))
            pos = close + len(_PARAM_END)

    # ---------------------------------------------------------------- result
    def action(self, answer_tag: bool) -> ParsedAction:
        """The turn's action: the last `<answer>` outside reasoning is the answer."""
        answer: str | None = None
        out: list[str] = []
        for piece, reasoning in self.pieces:
            if answer_tag and not reasoning and "<answer>" in piece:
                found, piece = ActionParser.find_answer(piece)
                answer = found if found is not None else answer
            piece = piece.strip()
            if piece:
                out.append(piece)
        return new_parsed(self.calls, answer, "\n".join(out), self.errors)


class MuseGlimmerParser(SchemaBound, ActionParser):
    """Muse Glimmer's ATEM calls (`<atem:invoke name=…>`) in messages addressed `to=` the tool.

    Args:
        answer_tag: read `<answer>…</answer>` outside reasoning and calls as the final answer.
    """

    name = "muse_glimmer"
    stop = (_EOT,)
    special_tokens = True
    tool_messages = True

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    def _resolve(self, name: str) -> str:
        """The env's tool for a doubled name (`search.search` for `search`), else `name`."""
        if not self._types or name in self._types:
            return name
        head, dot, tail = name.partition(".")
        return head if dot and head == tail and head in self._types else name

    # ------------------------------------------------------------------ parse
    def parse(self, text: str) -> ParsedAction:
        if "<|" not in text and "<atem:" not in text:  # plain text or a bare answer
            return tool_call_action([], [], text, self.answer_tag)
        turn = _Turn(self, text)
        turn.read()
        return turn.action(self.answer_tag)

    # ------------------------------------------------------------------ prompt, results, calls
    def instructions(self, tools: Sequence[Tool]) -> str:
        lines = []
        if tools:
            fns = [t.schema()["function"] for t in tools]
            spaces = list(dict.fromkeys(str(fn["name"]).split(".")[0] for fn in fns))
            meta = "".join(json.dumps({"name": ns, "description": ""}, ensure_ascii=False) + "\n" for ns in spaces)
            schemas = "".join(
                "\n"
                + json.dumps(
                    {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")},
                    ensure_ascii=False,
                )
                for fn in fns
            )
            recipients = ", ".join(['"self"', *(f'"{ns}.*"' for ns in spaces), '"user"'])
            lines.append(f"{_INTRO}{meta}// Function schemas{schemas}{_EXAMPLE}\n\n# Valid recipients: {recipients}.")
        if self.answer_tag:
            lines.append(self.answer_instructions())
        return "\n".join(lines)

    def answer_instructions(self) -> str:
        if not self.answer_tag:
            return ""
        return "When you know the final answer, write it as <answer>...</answer> in your message to=user."

    def format_results(self, results: Sequence[ToolResult]) -> str:
        out: list[str] = []
        said: list[str] = []
        for r in results:
            if r.call_id:  # a tool's answer: a tool message (the template names it by the call's id without a name)
                name = r.name or r.call_id
                out.append(f'{_START}tool {name}{_MESSAGE}<tool_output name="{name}">\n{r.text}\n</tool_output>{_EOT}')
            else:  # answers no call (a parse error): the env speaks, as one user message
                said.append(r.text)
        if said:
            out.append(f"{_START}user{_MESSAGE}" + "\n".join(said) + _EOT)
        return "".join(out)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        if not isinstance(name, str) or not name or len(name.split(None, 1)) != 1 or name != name.strip():
            return None
        if '"' in name or "<|" in name or name in (_SELF, _USER) or not isinstance(arguments, dict):
            return None
        if self._resolve(name) != name:  # a doubled name the env reads as its tool's (`search.search`)
            return None
        params: list[str] = []
        for key, value in arguments.items():
            if not isinstance(key, str) or not key.strip() or key != key.strip() or '"' in key or "<|" in key:
                return None
            written = write_typed(value, self._kind(name, key), _BREAKS, _escape)
            if written is None:
                return None
            params.append(f'{_PARAM} name="{key}">{written}{_PARAM_END}\n')
        return (
            f'{_START}assistant to={name}{_MESSAGE}{_CALLS}\n{_INVOKE} name="{name}">\n'
            f"{''.join(params)}{_INVOKE_END}\n{_CALLS_END}"
        )


register_parser("muse_glimmer", MuseGlimmerParser)
