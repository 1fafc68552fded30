"""DeepSeek-V3 and DeepSeek-V3.1 tool calls, written in the tokenizer's special tokens.

vLLM reads the same text with `--tool-call-parser deepseek_v3` and `deepseek_v31`. DeepSeek-V3
(and DeepSeek-R1, whose template writes calls the same way) writes each call as `function`,
the name on its own line and the arguments in a fenced JSON block; V3.1 drops the type and
the fence:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>

(the V3.1 call on one line; it is cut here for width)

The markers use FULLWIDTH VERTICAL LINE (U+FF5C) and LOWER ONE EIGHTH BLOCK (U+2581), not
ASCII `|` and `_`. One parser reads both layouts, even in one turn; `DeepSeekParser(version=
"v3.1")` (registered as `deepseek_v31`) differs only in what it writes: calls in `format_call`,
tool outputs in `format_results`, the format in `instructions` and in its error messages.

Design choices:

- **Calls are keyed on `<｜tool▁call▁begin｜>`.** The outer `<｜tool▁calls▁begin｜>` and
  `<｜tool▁calls▁end｜>` are optional (servers and models drop them, and DeepSeek's templates
  leave the first one out of a second call turn); they and the EOS `<｜end▁of▁sentence｜>` are
  removed from the turn's text. A call ends at its `<｜tool▁call▁end｜>`. One that is not closed
  before the next `<｜tool▁call▁begin｜>` is an error; one that is not closed before
  `<｜tool▁calls▁end｜>` or the end of the text (generation stopped on a stop string) is read
  anyway, and what follows its JSON is text.
- **Layout.** The body is split at the first `<｜tool▁sep｜>`. When what comes before it is
  `function` and what follows is not JSON, it is V3's `NAME` line then the arguments;
  otherwise it is V3.1's `NAME<｜tool▁sep｜>ARGUMENTS`. A ```` ```json ```` fence around the
  arguments is optional in both layouts. Double-encoded arguments (a JSON string holding an
  object) are decoded.
- **A reply that starts inside a marker.** A chat template's generation prompt may share the
  first characters of the call turn (the DeepSeek-V3 template TRL ships ends the prompt with
  `<think>\\n`, and a call turn starts `<｜tool▁calls▁begin｜>`: both begin with `<`), so the
  text after it starts `｜tool▁calls▁begin｜>…`. A reply that starts with the tail of
  `<｜tool▁calls▁begin｜>` or `<｜tool▁call▁begin｜>` is read as if it had the whole marker.
- **Reasoning is never a call.** As vLLM's reasoning parsers do, a reply with `</think>`
  before any `<think>` starts in reasoning (the generation prompt opened it), and every
  `<think>…</think>` block (to the end of the text when unclosed) is reasoning; markers inside
  reasoning are not read, and neither is an `<answer>` drafted there: only one outside reasoning
  is the answer. The reasoning stays in the turn's `text`, as with Hermes. (So a raw
  `</think>` inside the arguments of a reply's first call hides the call; `format_call` escapes it.)
- **Errors**, per call, worded with the layout the parser writes: nothing after
  `<｜tool▁call▁begin｜>`, no `<｜tool▁sep｜>`, no name, no arguments, JSON that does not decode
  (numbers too long for Python and nesting deeper than the recursion limit included), arguments
  that are not an object (or a string holding one), a call not closed before the next. For the
  turn: a `<｜tool▁sep｜>` outside any call (a call that lost its begin marker), and
  `<｜tool▁calls▁begin｜>` with no call. A good call next to a bad one still runs.
- **Ids:** DeepSeek's templates carry no call ids; calls get `call_0`, `call_1`, … by their
  position in the turn.
- `special_tokens = True`: every marker is a special token, and decoding with
  `skip_special_tokens=True` leaves `functionget_weather` with nothing to find.
- `stop = ("<｜tool▁calls▁end｜>",)`: it ends the turn's calls; the template writes only the
  EOS after it. Calls are read the same with or without it.
- `tool_messages = True`: DeepSeek's templates have tool messages.
- `format_results` writes what the templates write for tool messages: V3 wraps the outputs in
  `<｜tool▁outputs▁begin｜>…<｜tool▁outputs▁end｜>`, each in `<｜tool▁output▁begin｜>…
  <｜tool▁output▁end｜>`; V3.1 writes the inner blocks only. The env's own messages (parse
  errors) come back in the same blocks, as with Hermes and Mistral.
- `format_call` writes one call as the template does, with the outer markers and without the
  EOS. Inside JSON strings the `<` of a marker and of `<think>`/`</think>` is written `\\u003c`,
  so an argument can neither split the call nor turn into a special token. V3's layout cannot
  carry a name with a line break or a fence, or one that starts like JSON; such a name is
  written in V3.1's layout, which the parser reads too. A name with a marker or a think tag,
  or with surrounding white space, cannot be written (None).

Scanning is linear: one pass of `str.find` with remembered positions, and each call's body is
decoded once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, Literal

from toolenv._tool import Tool
from toolenv.parsers._json import call_arguments, call_json, encode_json
from toolenv.parsers._scan import MarkerFinder, positional_id
from toolenv.parsers.base import ActionParser, reasoning_runs, register_parser
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call, new_parsed

__all__ = ["DeepSeekParser"]

_CALLS, _CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_CALL, _CALL_END, _SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_OUTPUTS, _OUTPUTS_END = "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>"
_OUTPUT, _OUTPUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
_EOS = "<｜end▁of▁sentence｜>"
_BAR = "｜"  # FULLWIDTH VERTICAL LINE: in every DeepSeek marker
_THINK, _THINK_END = "<think>", "</think>"
_FENCE = "```"
#: How the arguments may start in V3.1's layout (a V3 name line starts with none of these).
_ARGS_START = ("{", "[", '"', "`")

_HOW_V3 = (
    f'Write {_CALL}function{_SEP}NAME\n```json\n{{"argument": value}}\n```{_CALL_END} '
    "with the arguments as a JSON object."
)
_HOW_V31 = f'Write {_CALL}NAME{_SEP}{{"argument": value}}{_CALL_END} with the arguments as a JSON object.'


def _escape(text: str) -> str:
    """JSON text with the `<` of DeepSeek's markers and of think tags inside strings written as
    `\\u003c` (JSON puts `<` nowhere but in strings, where the escape is the same character)."""
    if "<" in text:
        text = text.replace("<" + _BAR, "\\u003c" + _BAR)
        text = text.replace(_THINK, "\\u003cthink>").replace(_THINK_END, "\\u003c/think>")
    return text


def _restore_cut_marker(text: str) -> str:
    """`text` with the whole opening marker when it starts with the tail of one (the generation
    prompt shared its first characters, e.g. `｜tool▁calls▁begin｜>` after a prompt ending `<`)."""
    if text[:1] == "<" or _BAR not in text[: len(_CALLS)]:  # whole markers start with "<": none was cut
        return text
    for marker in (_CALLS, _CALL):
        for cut in range(1, len(marker) - 1):
            if text.startswith(marker[cut:]):
                return marker + text[len(marker) - cut :]
    return text


def _strip_fence(text: str) -> str:
    """The arguments' text without white space and a ```` ```json ```` fence around it."""
    text = text.strip()
    if text.startswith(_FENCE):
        line_end = text.find("\n")
        text = text[line_end + 1 :] if line_end >= 0 else text[len(_FENCE) :].removeprefix("json")
        text = text.strip()
    if text.endswith(_FENCE):  # valid JSON never ends with a backtick: this is the closing fence
        text = text[: -len(_FENCE)].rstrip()
    return text


def _writable(name: str) -> bool:
    """True for a name either layout can carry: no markers or think tags, no surrounding space."""
    return (
        isinstance(name, str)
        and bool(name)
        and name == name.strip()
        and "<" + _BAR not in name
        and _THINK not in name
        and _THINK_END not in name
    )


def _v3_name(name: str) -> bool:
    """True for a name V3's layout can carry on its line: one line, no fence, not JSON-like."""
    return "\n" not in name and _FENCE not in name and not name.startswith(_ARGS_START)


class _Turn:
    """The calls, errors and text of one reply, read in order."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self.attempts = 0

    def read(self, body: str, closed: bool) -> str:
        """Read one call's body (the text after `<｜tool▁call▁begin｜>`); returns the text that
        follows its JSON when the call is not closed (it is the turn's text)."""
        index = self.attempts
        self.attempts += 1
        where = f"Tool call {index + 1}"
        sep = body.find(_SEP)
        if sep < 0:
            if not body.strip():
                self.errors.append(f"{where}: nothing follows {_CALL}. {self.how}")
            else:
                self.errors.append(f"{where} has no {_SEP} between the function name and its arguments. {self.how}")
            return ""
        head, tail = body[:sep].strip(), body[sep + len(_SEP) :]
        lead = tail.lstrip()
        if head == "function" and lead and not lead.startswith(_ARGS_START):  # V3: NAME, then the arguments
            cuts = [at for at in (lead.find("\n"), lead.find(_FENCE)) if at >= 0]
            name_end = min(cuts) if cuts else len(lead)
            name, args = lead[:name_end].strip(), lead[name_end:]
        else:  # V3.1: NAME<｜tool▁sep｜>ARGUMENTS
            name, args = head, tail
        if not name:
            self.errors.append(f"{where} has no function name. {self.how}")
            return ""
        where = f"{where} ({name[:80]})"
        json_text = _strip_fence(args)
        if not json_text:
            self.errors.append(f"{where}: no JSON arguments follow the name (write {{}} for none). {self.how}")
            return ""
        decoded = call_json(json_text, closed, where, _CALL_END, self.how)
        if isinstance(decoded, str):
            self.errors.append(decoded)
            return ""
        value, rest = decoded
        if rest:
            rest = rest.lstrip()
            rest = rest[len(_FENCE) :] if rest.startswith(_FENCE) else rest
        arguments = call_arguments(value, where)
        if isinstance(arguments, str):
            self.errors.append(arguments)
        else:
            self.calls.append(new_call(name, arguments, positional_id(index)))
        return rest

    def unclosed(self) -> None:
        """A call cut short by the next `<｜tool▁call▁begin｜>`."""
        self.attempts += 1
        self.errors.append(f"Tool call {self.attempts} is not closed with {_CALL_END}. {self.how}")


class DeepSeekParser(ActionParser):
    """DeepSeek-V3's and DeepSeek-V3.1's tool calls (vLLM's `deepseek_v3`/`deepseek_v31` parsers).

    Args:
        answer_tag: read `<answer>…</answer>` outside the calls as the final answer.
        version: the layout this parser writes (calls, tool outputs, instructions, error
            hints): `"v3"` (DeepSeek-V3, R1) or `"v3.1"`. Both layouts are read either way.
    """

    name = "deepseek_v3"
    stop = (_CALLS_END,)
    special_tokens = True
    tool_messages = True

    def __init__(self, answer_tag: bool = True, version: Literal["v3", "v3.1"] = "v3") -> None:
        if version not in ("v3", "v3.1"):
            raise ValueError(f"version must be 'v3' or 'v3.1', got {version!r}")
        self.answer_tag = answer_tag
        self.version = version
        self.name = "deepseek_v31" if version == "v3.1" else "deepseek_v3"
        self._how = _HOW_V31 if version == "v3.1" else _HOW_V3

    def parse(self, text: str) -> ParsedAction:
        if _BAR not in text and "think>" not in text:  # no marker, no reasoning: plain text or a bare answer
            return self._action([], [], [(text, False)], [])
        text = _restore_cut_marker(text)
        find = MarkerFinder(text)
        turn = _Turn(self._how)
        #: The turn's text in order, as (text, is_reasoning); reasoning is never read.
        pieces: list[tuple[str, bool]] = []
        pos = 0  # the scan goes on from pos; text[:pos] is in pieces or was a call
        opened = stray = False  # `<｜tool▁calls▁begin｜>` / `<｜tool▁sep｜>` outside calls and reasoning

        def plain(start: int, end: int) -> None:
            nonlocal opened, stray
            if start < end:
                opened = opened or text.find(_CALLS, start, end) >= 0
                stray = stray or text.find(_SEP, start, end) >= 0
                pieces.append((text[start:end], False))

        first_end = find(_THINK_END, 0)
        if first_end >= 0 and not 0 <= find(_THINK, 0) < first_end:
            pos = first_end + len(_THINK_END)  # the reply starts in reasoning the prompt opened
            pieces.append((text[:pos], True))
        while True:
            call, think = find(_CALL, pos), find(_THINK, pos)
            if call < 0 and think < 0:
                plain(pos, len(text))
                break
            if think >= 0 and (call < 0 or think < call):  # reasoning: kept as text, never read
                plain(pos, think)
                end = find(_THINK_END, think + len(_THINK))
                if end < 0:  # unclosed: reasoning to the end of the text
                    pieces.append((text[think:], True))
                    break
                pos = end + len(_THINK_END)
                pieces.append((text[think:pos], True))
                continue
            plain(pos, call)
            body = call + len(_CALL)
            close, nxt, outer = find(_CALL_END, body), find(_CALL, body), find(_CALLS_END, body)
            stop = min([at for at in (nxt, outer) if at >= 0], default=len(text))
            if 0 <= close < stop:
                turn.read(text[body:close], closed=True)
                pos = close + len(_CALL_END)
            elif stop == nxt:
                turn.unclosed()
                pos = nxt
            else:  # not closed before the calls end: generation stopped, read what is there
                after = turn.read(text[body:stop], closed=False)
                if after:
                    pieces.append((after, False))
                pos = stop
        orphans = []
        if stray:
            orphans.append(f"{_SEP} appears outside a tool call: start each call with {_CALL}. {self._how}")
        elif opened and not turn.attempts:
            orphans.append(f"{_CALLS} is not followed by a tool call: start each call with {_CALL}. {self._how}")
        return self._action(turn.calls, turn.errors, pieces, orphans)

    def _action(
        self, calls: list[ToolCall], errors: list[str], pieces: list[tuple[str, bool]], orphans: list[str]
    ) -> ParsedAction:
        """The turn's action from its pieces of text (as `(text, is_reasoning)`): the outer markers
        and the EOS leave the text, an `<answer>` counts only outside reasoning (a draft in the
        reasoning is never the answer); `orphans` are errors for call markers without a call,
        which a turn that gives the answer does not need to hear."""
        runs = reasoning_runs(pieces)
        answer: str | None = None
        out: list[str] = []
        for run, reasoning in runs:
            if _BAR in run:
                for marker in (_CALLS, _CALLS_END, _EOS):
                    run = run.replace(marker, "")
            if self.answer_tag and not reasoning and "<answer>" in run:
                found, run = self.find_answer(run)
                answer = found if found is not None else answer
            out.append(run)
        if orphans and answer is None:
            errors.extend(orphans)
        return new_parsed(calls, answer, "".join(out).strip(), errors)

    def instructions(self, tools: Sequence[Tool]) -> str:
        # The layout of DeepSeek-V3.1's model card (V3's template writes no tools), with V3's call for V3.
        lines: list[str] = []
        if tools:
            lines += ["## Tools", "You have access to the following tools:"]
            for tool in tools:
                fn = tool.schema()["function"]
                params = _escape(json.dumps(fn.get("parameters", {}), ensure_ascii=False))
                lines += [
                    "",
                    f"### {fn['name']}",
                    f"Description: {fn.get('description', '')}",
                    "",
                    f"Parameters: {params}",
                ]
            if self.version == "v3.1":
                call = f"{_CALL}tool_call_name{_SEP}tool_call_arguments{_CALL_END}"
                several = "- For multiple tool calls, chain them directly without separators or spaces"
            else:
                call = f"{_CALL}function{_SEP}tool_call_name\n```json\ntool_call_arguments\n```{_CALL_END}"
                several = f"- For multiple tool calls, start each on a new line with {_CALL}"
            lines += [
                "",
                "IMPORTANT: ALWAYS adhere to this exact format for tool use:",
                f"{_CALLS}{call}{{{{additional_tool_calls}}}}{_CALLS_END}",
                "",
                "Where:",
                "- `tool_call_name` must be an exact match to one of the available tools",
                "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema",
                several,
            ]
        if self.answer_tag:
            lines += ["", "When you know the final answer, write it as <answer>...</answer>."]
        return "\n".join(lines).strip()

    def format_results(self, results: Sequence[ToolResult]) -> str:
        outputs = "".join(f"{_OUTPUT}{r.text}{_OUTPUT_END}" for r in results)
        if self.version == "v3.1" or not outputs:
            return outputs
        return f"{_OUTPUTS}{outputs}{_OUTPUTS_END}"

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        if not _writable(name):
            return None
        text = encode_json(arguments)
        if text is None:
            return None
        args = _escape(text)
        if self.version == "v3" and _v3_name(name):
            call = f"function{_SEP}{name}\n```json\n{args}\n```"
        else:
            call = f"{name}{_SEP}{args}"
        return f"{_CALLS}{_CALL}{call}{_CALL_END}{_CALLS_END}"


register_parser("deepseek_v3", DeepSeekParser)
register_parser("deepseek_v31", functools.partial(DeepSeekParser, version="v3.1"))
