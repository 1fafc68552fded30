"""gpt-oss's Harmony format: tool calls are assistant messages addressed `to=functions.NAME`.

```text
<|channel|>analysis<|message|>Need the weather.<|end|>
<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
```

Results come back as tool messages (`<|start|>functions.get_weather to=assistant<|channel|>
commentary<|message|>...<|end|>`), and the final answer is the `final` channel's message.
The text must keep the special tokens (decode with `skip_special_tokens=False`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from toolenv._tool import Tool
from toolenv.parsers._json import decode_json, encode_json, json_problem
from toolenv.parsers.base import ActionParser, register_parser
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call, new_parsed

__all__ = ["HarmonyParser"]

_START, _CHANNEL, _MESSAGE, _CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_PREFIX = "functions."


class _Message(NamedTuple):
    """One assistant message: its channel, recipient (`functions.x` or ""), body and span."""

    channel: str
    recipient: str
    body: str
    start: int
    end: int


def _recipient(header: str) -> str:
    at = header.find("to=")
    if at < 0:
        return ""
    rest = header[at + 3 :]
    for stop in (" ", "\n", "\t", "<|"):
        cut = rest.find(stop)
        if cut >= 0:
            rest = rest[:cut]
    return rest


def _scan(text: str) -> Iterator[_Message | str]:
    """Each message in `text`, or an error string for a header without `<|message|>`.

    A message starts at `<|channel|>` (with its `<|start|>role` header just before it, if
    any) and its body ends at `<|end|>`, `<|call|>`, `<|return|>`, the next message or the
    end of the text: generation stops at `<|call|>`, and servers often drop the stop token.
    Every search is bounded by the next `<|channel|>`, so the scan is linear in the text.
    """
    pos = 0
    ch = text.find(_CHANNEL)
    while ch >= 0:
        head_at = ch + len(_CHANNEL)
        nxt = text.find(_CHANNEL, head_at)
        bound = nxt if nxt >= 0 else len(text)
        msg = text.find(_MESSAGE, head_at, bound)
        if msg < 0:
            yield f"A message header ({text[head_at : min(bound, head_at + 40)]!r}) has no <|message|>."
            ch = nxt
            continue
        role_at = text.rfind(_START, pos, ch)
        role_header = text[role_at + len(_START) : ch] if role_at >= 0 else ""
        if _MESSAGE in role_header or any(m in role_header for m in _ENDS):
            role_at, role_header = -1, ""  # a `<|start|>` that began some other message, not this one's header
        if role_at < 0 and pos == 0 and text[:ch].lstrip().startswith("to="):
            # The reply begins inside its header: the prompt ended `<|start|>assistant` and the model
            # put the recipient in the role section (` to=functions.x<|channel|>commentary json...`),
            # as gpt-oss's own chat template writes a call.
            role_at, role_header = 0, text[:ch]
        header = text[head_at:msg]
        body_at = msg + len(_MESSAGE)
        end = bound
        for marker in (*_ENDS, _START):
            at = text.find(marker, body_at, end)
            if at >= 0:
                end = at
        after = end
        for marker in _ENDS:
            if text.startswith(marker, end):
                after = end + len(marker)
                break
        channel = header.replace(_CONSTRAIN, " ").split(maxsplit=1)[0] if header.strip() else ""
        start = role_at if role_at >= 0 else ch  # (role_at 0 with no `<|start|>`: the reply began in the header)
        yield _Message(channel, _recipient(role_header) or _recipient(header), text[body_at:end], start, after)
        pos = after
        ch = nxt


class HarmonyParser(ActionParser):
    """gpt-oss's format; the answer is the `final` channel's message (or an `<answer>` in it)."""

    name = "harmony"
    stop = ("<|call|>",)
    special_tokens = True
    tool_messages = True
    # In one growing text (completions mode) the tool messages follow `<|call|>` directly, and
    # `<|start|>assistant` opens the model's next message, as gpt-oss's prompts end: a newline
    # between messages is text outside any message, which the model never saw in training.
    continuation = ("", "<|start|>assistant")

    def __init__(self, answer_tag: bool = True) -> None:
        self.answer_tag = answer_tag

    def parse(self, text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        pieces: list[str] = []
        reasoning: list[str] = []  # analysis bodies: kept as text, never read for an answer
        answer: str | None = None
        pos = 0
        if _CHANNEL in text:
            for item in _scan(text):
                if isinstance(item, str):
                    errors.append(item)
                    continue
                pieces.append(text[pos : item.start])
                pos = item.end
                if item.recipient:
                    self._call(item, len(calls) + len(errors), calls, errors)
                elif item.channel == "final":
                    answer = self._final(item.body)
                elif item.channel == "analysis":
                    reasoning.append(item.body)
                else:
                    pieces.append(item.body)
        pieces.append(text[pos:])
        rest = "".join(pieces)
        if answer is None and self.answer_tag and "<answer>" in rest:
            answer, rest = self.find_answer(rest)
        if reasoning:
            rest = "\n".join([*reasoning, rest])
        return new_parsed(calls, answer, rest.strip(), errors)

    def _final(self, body: str) -> str:
        if self.answer_tag and "<answer>" in body:
            tagged, _ = self.find_answer(body)
            if tagged is not None:
                return tagged
        return body.strip()

    @staticmethod
    def _call(msg: _Message, index: int, calls: list[ToolCall], errors: list[str]) -> None:
        recipient = msg.recipient[:80]
        if not msg.recipient.startswith(_PREFIX) or len(msg.recipient) == len(_PREFIX):
            errors.append(f"Message to {recipient!r}: call a function as to=functions.NAME.")
            return
        body = msg.body.strip()
        try:
            args: Any = decode_json(body) if body else {}
        except (ValueError, RecursionError) as exc:
            errors.append(f"The call to {recipient} is not valid JSON ({json_problem(exc)}).")
            return
        if not isinstance(args, dict):
            errors.append(f"The call to {recipient} must send a JSON object of arguments.")
            return
        calls.append(new_call(msg.recipient[len(_PREFIX) :], args, f"call_{index}"))

    def instructions(self, tools: Sequence[Tool]) -> str:
        defs = "\n\n".join(_typescript(t.flat_schema()["function"]) for t in tools)
        return (
            "# Tools\n\n## functions\n\nnamespace functions {\n\n"
            f"{defs}\n\n"
            "} // namespace functions\n\n"
            "Call a function with a message in the commentary channel addressed to=functions.NAME, "
            f"whose content is a JSON object of its arguments. {self.answer_instructions()}"
        )

    def answer_instructions(self) -> str:
        answer = " as <answer>...</answer>" if self.answer_tag else ""
        return f"Give the final answer in the final channel{answer}."

    def format_results(self, results: Sequence[ToolResult]) -> str:
        out = []
        for r in results:
            if r.name and r.name != "parser":
                out.append(f"<|start|>functions.{r.name} to=assistant<|channel|>commentary<|message|>{r.text}<|end|>")
            else:  # not a tool's answer: the env speaks
                out.append(f"<|start|>user<|message|>{r.text}<|end|>")
        return "".join(out)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        if not name or _recipient(f"to={name}") != name:
            return None  # the recipient ends at whitespace or a marker: this name cannot be written
        # A marker inside a JSON string would end the message; `\u003c` is the same character.
        body = encode_json(arguments)
        if body is None:
            return None
        body = body.replace("<|", "\\u003c|")
        return f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}<|call|>"


# ---------------------------------------------------------------------- tool definitions
# The Harmony prompt describes functions as TypeScript types. No library writes them from a
# JSON schema, so this covers what Pydantic's schemas use and says `any` for the rest.
def _typescript(fn: dict[str, Any]) -> str:
    lines = [f"// {line}" for line in (fn.get("description") or "").splitlines() if line.strip()]
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    if not props:
        lines.append(f"type {fn['name']} = () => any;")
        return "\n".join(lines)
    lines.append(f"type {fn['name']} = (_: {{")
    lines.extend(_fields(params))
    lines.append("}) => any;")
    return "\n".join(lines)


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required") or ())
    out: list[str] = []
    for key, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        out.extend(f"// {line}" for line in (prop.get("description") or "").splitlines() if line.strip())
        default = f" // default: {json.dumps(prop['default'], ensure_ascii=False)}" if "default" in prop else ""
        out.append(f"{key}{'' if key in required else '?'}: {_type(prop)},{default}")
    return out


def _type(schema: Any, depth: int = 0) -> str:
    if not isinstance(schema, dict) or depth > 8:
        return "any"
    if "enum" in schema:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"]) or "never"
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list) and options:
        return " | ".join(_type(o, depth + 1) for o in options)
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_type({**schema, "type": k}, depth + 1) for k in kind)
    if kind == "string":
        return "string"
    if kind in ("integer", "number"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "null":
        return "null"
    if kind == "array":
        item = _type(schema.get("items"), depth + 1)
        return f"({item})[]" if " | " in item else f"{item}[]"
    if kind == "object" and schema.get("properties"):
        return "{\n" + "\n".join(_fields(schema)) + "\n}"
    if kind == "object":
        return "object"
    return "any"


register_parser("harmony", HarmonyParser)
