"""Pythonic tool calls (Llama 3.2, Llama 3.3, Llama 4, Liquid LFM2): a Python list of calls with keyword arguments.

```text
[get_weather(city="San Francisco", metric="celsius"), get_time()]
```

Llama 4 may wrap the list in `<|python_start|>` ... `<|python_end|>`, Liquid's LFM2 and LFM2.5
in `<|tool_call_start|>` ... `<|tool_call_end|>`. vLLM reads the same
text with its `pythonic` and `llama4_pythonic` tool parsers, SGLang with `pythonic`.

How the text is read, and why:

- **The call list ends the reply.** Llama's prompt format asks for the list alone; models
  still put prose before it, so prose may come first but nothing may follow the list except
  white space and the end markers `<|python_end|>`, `<|eot|>`, `<|eom|>`, `<|eot_id|>`,
  `<|eom_id|>`. Several lists separated by white space are all read, in order (an agent that
  writes one native call per line gives that). The list starts at a `[` followed by a name
  and `(`; a `[` in prose (`[1]`, `[see above]`, a Markdown link) is therefore never a call,
  and a `[name(...)]` inside a sentence, followed by more text, is prose too. LFM2's
  `<|tool_call_start|>…<|tool_call_end|>` closes its list, so text may follow that block
  (as its model cards show and vLLM's `lfm2` parser reads), and a line break written raw
  inside a quoted string there is read as one (LFM2.5's template writes strings unescaped,
  and vLLM's `lfm2` parser escapes such line breaks). A block that is still not valid Python
  is read as vLLM's `lfm2` parser reads it: zero-padded integers (`month=07`) unpadded, and a
  string broken by a quote inside it (`'It's here'`) closed at the one later quote that makes
  the list valid (none or several: the error stays), or else parameters named after Python
  keywords (`from='USD'`) read under their names. A reply that
  starts with `[name(` but does not end with its list (text after it, not closed, too long)
  is an error that says so, unless it gives an `<answer>`; when a later list does end the
  reply, that list runs and the error for the first is reported beside it.
- **`ast`, never `eval`.** The list is found with a scanner that knows Python's strings and
  comments and matches brackets, then handed to `ast.parse(mode="eval")`. Only a list of
  calls of plain names with keyword arguments is accepted, and each value must be a literal:
  strings, numbers, `True`/`False`/`None`, and lists, tuples (read as lists) and dicts with
  string keys of these, as `ast.literal_eval` would take them, minus what JSON cannot hold
  (bytes, complex numbers, sets). `true`/`false`/`null` are accepted as well, as vLLM does:
  the tool list is JSON and small models write JSON's spellings. Everything else is an error
  worded for the model: positional arguments, a variable or call as a value, `os.system(...)`,
  a list element that is not a call, an argument given twice, invalid syntax. A bad call
  does not stop the good ones beside it; invalid syntax fails the whole list.
- **Bounded.** A list longer than `max_chars` (100,000 by default) is refused before `ast`
  sees it; nesting past Python's 200 levels stops the scanner; `RecursionError`,
  `MemoryError`, `ValueError` and `SyntaxError` from `ast` (deep expressions, null bytes,
  integers past 4,300 digits) become errors. The scan is linear; at most eight candidate
  lists that do not close are scanned before the parser gives up.
- **Ids.** The format has none: calls are `call_0`, `call_1`, ... by position.
- **Markers.** `<|python_start|>`, `<|python_end|>`, `<|python_tag|>`, LFM2's
  `<|tool_call_start|>`/`<|tool_call_end|>` and the end-of-turn tokens are optional and
  removed from the turn's text. They are special tokens of Llama's
  tokenizers, but the parser needs none of them to read a list that ends the reply, so
  `special_tokens` is False. LFM2's pair, special in its tokenizers, lets text follow the
  list, so it is the parser's `markers`: `reply_text` keeps special tokens for LFM2.
- **`stop` is empty.** The list has no closing marker of its own (a `]` also occurs inside
  arguments); the model ends its turn with its end-of-turn token, an EOS id in Llama's
  generation config, where servers stop anyway.
- **Results.** Llama's chat templates send each result as a tool (`ipython`) message, so
  `tool_messages` is True. As text, each result is a block headed by its tool's name.
- **`format_call`** writes `[name(key=value, ...)]` with Python literals; it returns None for
  what the format cannot carry: a tool or argument name that is not a Python identifier (or
  is a keyword such as `from`), NaN, integers past 4,300 digits, non-string dict keys, and
  values nested more than 100 levels deep. Infinity is written `1e999`.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
import unicodedata
import warnings
from collections.abc import Sequence
from typing import Any

from toolenv._ast import parse
from toolenv._tool import Tool
from toolenv.parsers.base import ActionParser, register_parser
from toolenv.types import ParsedAction, ToolCall, ToolResult, new_call, new_parsed

__all__ = ["PythonicParser"]

_START, _END, _TAG = "<|python_start|>", "<|python_end|>", "<|python_tag|>"
#: Liquid's LFM2 / LFM2.5 wrap the same list in these (and end the turn with `<|im_end|>`).
_LFM_START, _LFM_END = "<|tool_call_start|>", "<|tool_call_end|>"
_TURN_ENDS = ("<|eot|>", "<|eom|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>")
#: Markers that may follow the list (the reply still "ends" with it).
_TRAILING = (_END, _LFM_END, *_TURN_ENDS)
#: Every marker the turn's text loses.
_MARKERS = (_START, _LFM_START, _TAG, *_TRAILING)

#: Where a call list may start: `[`, a (possibly dotted, to diagnose `os.system(`) name, `(`.
_CANDIDATE = re.compile(r"\[\s*[^\W\d][\w.]*\s*\(")
#: A name that a call list can carry and `_CANDIDATE` finds.
_NAME = re.compile(r"[^\W\d]\w*")
#: What the bracket scanner must see: strings (so brackets and `#` inside them do not count),
#: comments, brackets. An unterminated string runs to its line's end (single quotes) or to
#: the end (triple quotes); every alternative always matches once started, so no backtracking.
_TOKEN = re.compile(
    r"'''(?:[^'\\]+|\\.?|'(?!''))*(?:'''|\Z)"
    r'|"""(?:[^"\\]+|\\.?|"(?!""))*(?:"""|\Z)'
    r"|'(?:[^'\\\n]+|\\.?)*(?:'|\n|\Z)"
    r'|"(?:[^"\\\n]+|\\.?)*(?:"|\n|\Z)'
    r"|#[^\n]*"
    r"|[][(){}]",
    re.DOTALL,
)
_CLOSER = {"[": "]", "(": ")", "{": "}"}
_MAX_NESTING = 200  # Python's parser refuses deeper bracket nesting
_MAX_FAILED_SCANS = 8
_MAX_VALUE_DEPTH = 100  # format_call: deeper values are refused
_MAX_REQUOTES = 32  # closing quotes tried for a broken string (`_requote`), each one a parse
_VALUE_ENDS = ",)]}:"  # what may follow a string's closing quote in a call list
#: `_unpad_ints`'s tokens: a string (to the end, if open), a name (digits in it are no number), a digit run.
_NUMBER_OR_SKIPPED = re.compile(r"""'(?:[^'\\]|\\.)*(?:'|\Z)|"(?:[^"\\]|\\.)*(?:"|\Z)|[^\W\d]\w*|\d[\d_]*""", re.DOTALL)
#: `_keywords_renamed`'s tokens: a string (skipped) or a parameter name followed by `=`.
_KEYWORD_ARG_OR_STRING = re.compile(
    r"""'(?:[^'\\]|\\.)*(?:'|\Z)|"(?:[^"\\]|\\.)*(?:"|\Z)|(?<=[(,])\s*[^\W\d]\w*(?=\s*=(?!=))""", re.DOTALL
)
_KEYWORD_SUFFIX = "_pyreservedkw_"  # vLLM's: a name no tool has
_NOT_INT = frozenset(".eEjJ")  # after a digit run: a float, exponent or imaginary number
_JSON_NAMES: dict[str, Any] = {"true": True, "false": False, "null": None}
_KINDS = {bytes: "bytes (write a string)", complex: "a complex number"}
_HINT = "Write [func_name(param=value, ...)] with keyword arguments."

# Scan outcomes.
_CLOSED, _UNCLOSED, _UNBALANCED, _TOO_DEEP, _TOO_LONG = range(5)


class _NotLiteral(Exception):
    """A value that is not a literal; the message says what it is instead."""


def _parse(source: str) -> ast.Expression:
    """`ast.parse` in eval mode, quietly: a string such as `"\\d"` is valid Python that makes the
    compiler warn (an invalid escape), and a model's text must not print to the trainer's stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse(source, mode="eval")


class PythonicParser(ActionParser):
    """The pythonic tool-call format of Llama 3.2/3.3/4 (vLLM's `pythonic`/`llama4_pythonic`)."""

    name = "pythonic"
    stop = ()
    calls_end_turn = True
    #: LFM2's tokenizers make these special; text may follow the block they close, and without
    #: them `[f()]Some text` is a list followed by text (see `ActionParser.markers`).
    markers = (_LFM_START, _LFM_END)
    tool_messages = True

    def __init__(self, answer_tag: bool = True, max_chars: int = 100_000) -> None:
        self.answer_tag = answer_tag
        self.max_chars = max_chars

    # ------------------------------------------------------------------ parse
    def parse(self, text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        problems: list[str] = []
        if _LFM_START in text and _LFM_END in text:
            rest = self._read_wrapped(text, calls, errors, problems)
        else:
            rest, _ = self._read_reply(text, 0, calls, errors, problems)
        answer: str | None = None
        if self.answer_tag and "<answer>" in rest:
            answer, rest = self.find_answer(rest)
        if answer is None:
            errors += problems
        if "<|" in rest:
            rest = _unmark(rest)
        return new_parsed(calls, answer, rest.strip(), errors)

    def _read_wrapped(self, text: str, calls: list[ToolCall], errors: list[str], problems: list[str]) -> str:
        """LFM2's turn: each `<|tool_call_start|>…<|tool_call_end|>` holds a call list, and the
        model may go on writing after it (its model cards show a sentence there), as vLLM's
        `lfm2` parser reads it. The text outside the blocks is returned. A line break written
        raw inside a quoted string is read as one (`_escape_line_breaks`), and so is a quote
        (`_requote`)."""
        pieces: list[str] = []
        pos = index = 0
        while (start := text.find(_LFM_START, pos)) >= 0 and (stop := text.find(_LFM_END, start)) >= 0:
            pieces.append(text[pos:start])
            block = _repaired(_escape_line_breaks(text[start + len(_LFM_START) : stop]), self.max_chars)
            inner, index = self._read_reply(block, index, calls, errors, problems)
            pieces.append(inner)
            pos = stop + len(_LFM_END)
        pieces.append(text[pos:])
        return "".join(pieces)

    def _read_reply(
        self, text: str, index: int, calls: list[ToolCall], errors: list[str], problems: list[str]
    ) -> tuple[str, int]:
        """Read the call lists that end `text` into `calls`/`errors` (their first number is
        `index`); the text around them and the next call's number. The error for a list that
        does not end `text` goes to `problems` (dropped when the turn gives an answer)."""
        end = _content_end(text)
        spans: list[tuple[int, int]] = []
        failed: tuple[int, int] | None = None
        if "(" in text:  # skip the scan for plain text and bare answers
            spans, failed = self._find(text, end)
        pieces: list[str] = []
        pos = 0
        for start, stop in spans:
            pieces.append(text[pos:start])
            pos = stop
            index = self._read(text[start:stop], index, calls, errors)
        pieces.append(text[pos:])
        if failed is not None:
            lost = "The call list at the start of the reply did not run. " if spans else ""
            problems.append(lost + self._diagnose(text, end, *failed))
        return "".join(pieces), index

    def _find(self, text: str, end: int) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
        """The spans of the call lists that end the reply, or none and the `(start, status)` of
        a list the model evidently meant that did not work out (None when there is none)."""
        first = _CANDIDATE.search(text, 0, end)
        if first is None:
            return [], None
        at_start = _blank(text[: first.start()])
        if text[end - 1] != "]":  # no list can end this reply: only diagnose one that starts it
            if not at_start:
                return [], None
            start = first.start()
            return [], (start, _scan(text, start, min(end, start + self.max_chars), end)[0])
        chain: list[tuple[int, int]] = []
        failure: tuple[int, int] | None = None
        pos, fails = 0, 0
        m: re.Match[str] | None = first
        while m is not None:
            start = m.start()
            status, stop = _scan(text, start, min(end, start + self.max_chars), end)
            if status == _CLOSED:
                if chain and not _blank(text[chain[-1][1] : start]):
                    chain = []
                chain.append((start, stop))
                if stop == end:
                    # A list that started the reply but is not in this chain (text followed it)
                    # is still an error: the lists that end the reply run, and that one is said.
                    lost = failure is not None and at_start and failure[0] == first.start() != chain[0][0]
                    return chain, failure if lost else None
                if start == first.start() and at_start:
                    failure = (start, _CLOSED)
                pos = stop
            else:
                chain = []
                if failure is None and ((at_start and start == first.start()) or status in (_TOO_LONG, _TOO_DEEP)):
                    failure = (start, status)
                fails += 1
                if fails >= _MAX_FAILED_SCANS:
                    break
                pos = start + 1
            m = _CANDIDATE.search(text, pos, end)
        return [], failure

    def _diagnose(self, text: str, end: int, start: int, status: int) -> str:
        """The error for a call list that does not end the reply as it should."""
        if status == _CLOSED:
            return f"Text follows the call list: end your reply with the list (write any text before it). {_HINT}"
        if status == _TOO_LONG:
            return f"The call list is longer than {self.max_chars} characters; shorten the arguments."
        if status == _TOO_DEEP:
            return f"The call list is nested more than {_MAX_NESTING} levels deep. {_HINT}"
        try:  # unclosed or unbalanced: Python says where (the problem lies within max_chars)
            _parse(text[start : min(end, start + self.max_chars)])
        except SyntaxError as exc:
            return f"The call list is not valid Python ({_syntax(exc)}). {_HINT}"
        except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
            return f"The call list could not be read ({_reason(exc)}). {_HINT}"
        return f"The call list is not closed with ]. {_HINT}"

    def _read(self, segment: str, index: int, calls: list[ToolCall], errors: list[str]) -> int:
        """Append the calls of one list (or its errors); return the next call's index."""
        try:
            tree = _parse(segment)
        except SyntaxError as exc:
            errors.append(f"The call list is not valid Python ({_syntax(exc)}). {_HINT}")
            return index
        except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
            errors.append(f"The call list could not be read ({_reason(exc)}). {_HINT}")
            return index
        if not isinstance(tree.body, ast.List):
            errors.append(f"Write the calls as a plain list, not a comprehension. {_HINT}")
            return index
        for node in tree.body.elts:
            try:
                call, err = _call(node, index)
            except (RecursionError, MemoryError):
                call, err = None, f"Call {index + 1}: an argument is nested too deeply to read."
            if err is not None:
                errors.append(err)
            elif call is not None:
                calls.append(call)
            index += 1
        return index

    # ------------------------------------------------------------------ prompt and results
    def instructions(self, tools: Sequence[Tool]) -> str:
        functions = json.dumps([t.schema()["function"] for t in tools], indent=4, ensure_ascii=False)
        answer = "\n\nWhen you know the final answer, write it as <answer>...</answer>." if self.answer_tag else ""
        return (
            "You are an expert in composing functions. You are given a question and a set of possible "
            "functions. Based on the question, you will need to make one or more function/tool calls to "
            "achieve the purpose.\n"
            "If you decide to invoke any of the function(s), you MUST put it in the format of "
            "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n"
            "Write every argument as name=value, each value a Python literal: a quoted string, a number, "
            "True/False/None, or a list or dict of these. Put nothing after the list; the results come "
            "back in the next message.\n"
            f"Here is a list of functions in JSON format that you can invoke.\n\n{functions}{answer}"
        )

    def format_results(self, results: Sequence[ToolResult]) -> str:
        blocks = []
        for r in results:
            if r.name and r.name != "parser":
                blocks.append(f"{r.name} {'failed' if r.is_error else 'returned'}:\n{r.text}")
            else:  # not a tool's answer: the env speaks
                blocks.append(r.text)
        return "\n\n".join(blocks)

    def format_call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> str | None:
        if not _is_name(name):
            return None
        parts = []
        for key, value in arguments.items():
            literal = _literal(value, 0)
            if not isinstance(key, str) or not _is_name(key) or literal is None:
                return None
            parts.append(f"{key}={literal}")
        text = f"[{name}({', '.join(parts)})]"
        return text if len(text) <= self.max_chars else None


# ---------------------------------------------------------------------- finding the list
def _content_end(text: str) -> int:
    """Where the reply's content ends: before trailing white space and end markers."""
    end = len(text.rstrip())
    while end and text[end - 1] == ">":
        for marker in _TRAILING:
            if text.endswith(marker, 0, end):
                end -= len(marker)
                break
        else:
            break
        while end and text[end - 1].isspace():
            end -= 1
    return end


def _escape_line_breaks(text: str) -> str:
    """`text` with each line break written raw inside a one-quote string literal written as its
    escape (`\\n`, `\\r`), so the string reads as the value the model meant.

    LFM2.5's chat template writes a string argument as `'` + value + `'` without escaping, so
    the model learns to write a multi-line value (code, SQL) with raw line breaks inside the
    quotes, which Python refuses ("unterminated string literal"); vLLM's `lfm2` parser escapes
    them before `ast` reads the list. Nothing Python reads changes: a raw line break cannot be
    inside such a string, and triple-quoted strings, raw strings (`r'...'`, where an escape would
    change the value), comments, escaped characters and text outside strings are kept as they are.
    """
    if "\n" not in text and "\r" not in text:
        return text
    out: list[str] = []
    pos, n = 0, len(text)
    while pos < n:
        c = text[pos]
        if c == "#":  # a comment: an apostrophe in it opens no string
            end = text.find("\n", pos)
            end = n if end < 0 else end
            out.append(text[pos:end])
            pos = end
            continue
        if c not in "'\"":
            out.append(c)
            pos += 1
            continue
        raw = pos > 0 and text[pos - 1] in "rR"
        if text.startswith(c * 3, pos):  # triple-quoted: raw line breaks are valid in it
            close = pos + 3
            while close < n and not text.startswith(c * 3, close):
                close += 2 if text[close] == "\\" else 1
            end = min(close + 3, n)
            out.append(text[pos:end])
            pos = end
            continue
        out.append(c)
        pos += 1
        while pos < n and text[pos] != c:
            ch = text[pos]
            if ch == "\\" and pos + 1 < n:
                out.append(text[pos : pos + 2])
                pos += 2
                continue
            out.append(ch if raw or ch not in "\r\n" else ("\\n" if ch == "\n" else "\\r"))
            pos += 1
        if pos < n:
            out.append(c)
            pos += 1
    return "".join(out)


def _repaired(block: str, max_chars: int) -> str:
    """`block`, or, when it is not valid Python, what vLLM's `lfm2` parser reads instead: its
    integers unpadded (`_unpad_ints`), then a broken string closed (`_requote`) or else its
    keyword-named parameters renamed (`_keywords_renamed`)."""
    if len(block) > max_chars or _parses(block):
        return block
    unpadded = _unpad_ints(block)
    if unpadded != block and _parses(unpadded):
        return unpadded
    requoted = _requote(unpadded)
    if requoted is not None:
        return requoted
    renamed = _keywords_renamed(unpadded)
    return renamed if renamed != unpadded and _parses(renamed) else unpadded


def _keywords_renamed(text: str) -> str:
    """`text` with each parameter named after a Python keyword (`from=`, `class=`) renamed so
    that Python reads the list; `_call` restores the name (`_keyword_restored`). LFM2 models
    call tools whose schemas have such names (`convert(from=..., to=...)`), and vLLM's `lfm2`
    parser renames them so. A name counts when it follows `(` or `,` and `=` (not `==`) follows it."""
    return _KEYWORD_ARG_OR_STRING.sub(lambda m: _renamed(m.group()), text)


def _renamed(token: str) -> str:
    return token + _KEYWORD_SUFFIX if token[0] not in "'\"" and keyword.iskeyword(token.strip()) else token


def _keyword_restored(name: str) -> str:
    """A parameter's name as the model wrote it (undoes `_keywords_renamed`)."""
    if name.endswith(_KEYWORD_SUFFIX) and keyword.iskeyword(stem := name[: -len(_KEYWORD_SUFFIX)]):
        return stem
    return name


def _unpad_ints(text: str) -> str:
    """`text` with the leading zeros of its decimal integers outside strings removed (`07` → `7`).

    Python refuses `month=07`, which LFM2 models write for dates; vLLM's `lfm2` parser strips
    the zeros. What Python reads already is kept: `0`, `00`, floats (`07.5`, `1.07`), exponents
    (`1e07`), `0x07`, and digits inside names and strings."""
    if "0" not in text:
        return text
    return _NUMBER_OR_SKIPPED.sub(lambda m: _unpadded(text, m), text)


def _unpadded(text: str, m: re.Match[str]) -> str:
    token = m.group()
    if not token[0].isdigit():
        return token  # a string or a name
    digits = token.replace("_", "")
    after = text[m.end() : m.end() + 1]
    if digits[0] != "0" or not digits.strip("0") or text[m.start() - 1 : m.start()] == "." or after in _NOT_INT:
        return token
    return str(int(digits))


def _parses(source: str) -> bool:
    try:
        _parse(source.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def _requote(text: str) -> str | None:
    """`text` with its first broken string closed at the one later quote that makes the text
    valid Python (the quotes inside escaped), or None when no quote or several do.

    A string is broken when the quote Python would close it with is followed by none of
    `,)]}:` (`'It's here'`, `'sed -n '1,9p' f.py'`): LFM2.5's template writes string values
    unescaped, so the model writes apostrophes and quoted words raw. vLLM's `lfm2` parser
    repairs such a string by this rule, and leaves it an error when several closing quotes
    work (`a='It's', b='ok'` also reads as `a='It\\'s\\', b=\\'ok'`): the env reads what the
    server reads. Past `_MAX_REQUOTES` candidate quotes the string is left broken.
    """
    pos, n = 0, len(text)
    while pos < n:
        quote = text[pos]
        if quote not in "'\"":
            pos += 1
            continue
        quotes = _unescaped(text, pos + 1, quote)
        if not quotes:
            return None
        if _closes(text, quotes[0]):
            pos = quotes[0] + 1  # this string closes where Python closes it
            continue
        winners: list[str] = []
        for close in [q for q in quotes if _closes(text, q)][:_MAX_REQUOTES]:
            inner = text[pos + 1 : close]
            inside = set(_unescaped(inner, 0, quote))
            escaped = "".join("\\" + c if i in inside else c for i, c in enumerate(inner))
            candidate = _escape_line_breaks(f"{text[:pos]}{quote}{escaped}{quote}{text[close + 1 :]}")
            if _parses(candidate):
                winners.append(candidate)
        return winners[0] if len(winners) == 1 else None
    return None


def _unescaped(text: str, start: int, quote: str) -> list[int]:
    """The positions of `quote` in `text` from `start` on that no backslash escapes."""
    found: list[int] = []
    pos, n = start, len(text)
    while pos < n:
        c = text[pos]
        if c == "\\":
            pos += 2
            continue
        if c == quote:
            found.append(pos)
        pos += 1
    return found


def _closes(text: str, at: int) -> bool:
    """Whether the quote at `at` can end a string: what follows it (past white space) ends a value."""
    rest = text[at + 1 :].lstrip()[:1]
    return rest != "" and rest in _VALUE_ENDS


def _unmark(text: str) -> str:
    for marker in _MARKERS:
        text = text.replace(marker, "")
    return text


def _blank(text: str) -> bool:
    """Only white space and markers."""
    return not (_unmark(text) if "<|" in text else text).strip()


def _scan(text: str, start: int, limit: int, end: int) -> tuple[int, int]:
    """`(status, position)` of the list opening at `text[start]`: `_CLOSED` with the position
    after its `]`, or why it does not close before `limit`."""
    stack: list[str] = []
    pos = start
    while (m := _TOKEN.search(text, pos, limit)) is not None:
        pos = m.end()
        c = text[m.start()]
        if c in _CLOSER:
            stack.append(_CLOSER[c])
            if len(stack) > _MAX_NESTING:
                return _TOO_DEEP, pos
        elif c in ")]}":
            if not stack or stack.pop() != c:
                return _UNBALANCED, pos
            if not stack:
                return (_CLOSED if c == "]" else _UNBALANCED), pos
    return (_TOO_LONG if limit < end else _UNCLOSED), limit


# ---------------------------------------------------------------------- reading the list
def _call(node: ast.expr, index: int) -> tuple[ToolCall | None, str | None]:
    where = f"Call {index + 1}"
    if not isinstance(node, ast.Call):
        return None, f"{where} is not a function call. {_HINT}"
    if isinstance(node.func, ast.Attribute):
        return None, f"{where} ({_dotted(node.func)}): call a tool by its plain name, as func_name(...)."
    if not isinstance(node.func, ast.Name):
        return None, f"{where}: call a tool by its name, as func_name(...)."
    name = node.func.id
    if node.args:
        return None, f"{where} ({name}): write every argument as param=value; positional arguments are not accepted."
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None, f"{where} ({name}): write every argument as param=value, without **."
        key = _keyword_restored(kw.arg)
        if key in args:
            return None, f"{where} ({name}): argument {key} is given twice."
        try:
            args[key] = _value(kw.value)
        except _NotLiteral as exc:
            return None, (
                f"{where} ({name}): the value of {key} is {exc}, not a literal. Write values as Python "
                "literals: quoted strings, numbers, True/False/None, and lists and dicts of these."
            )
    return new_call(name, args, f"call_{index}"), None


def _value(node: ast.expr) -> Any:
    """The JSON value of a literal node (the parser caps nesting at 200 levels)."""
    if isinstance(node, ast.Constant):
        const = node.value
        if const is None or isinstance(const, (str, bool, int, float)):
            return const
        raise _NotLiteral(_KINDS.get(type(const), "an expression"))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        number = node.operand.value if isinstance(node.operand, ast.Constant) else None
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            return -number if isinstance(node.op, ast.USub) else number
        raise _NotLiteral("an expression")
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:
                raise _NotLiteral("a dict with ** unpacking")
            key = _value(k)
            if not isinstance(key, str):
                raise _NotLiteral("a dict with a key that is not a string")
            out[key] = _value(v)
        return out
    if isinstance(node, ast.Name):
        if node.id in _JSON_NAMES:
            return _JSON_NAMES[node.id]
        raise _NotLiteral(f"the name {node.id[:40]} (quote it if it is text)")
    if isinstance(node, ast.Set):
        raise _NotLiteral("a set (write a list)")
    if isinstance(node, ast.Call):
        raise _NotLiteral("a function call")
    raise _NotLiteral("an expression")


def _dotted(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute) and len(parts) < 8:
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "...")
    return ".".join(reversed(parts))[:80]


def _syntax(exc: SyntaxError) -> str:
    where = f" at line {exc.lineno}, column {exc.offset}" if exc.lineno and exc.offset else ""
    msg = (exc.msg or "invalid syntax").split("; use sys.set_int_max_str_digits", 1)[0]
    return f"{msg[:200]}{where}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, (RecursionError, MemoryError)):
        return "nested too deeply"
    return str(exc)[:200] or type(exc).__name__


# ---------------------------------------------------------------------- writing calls
def _is_name(name: str) -> bool:
    """A name the format can write and read back: an identifier, not a keyword, already in
    the NFKC form Python's parser turns identifiers into."""
    return (
        bool(_NAME.fullmatch(name))
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and unicodedata.normalize("NFKC", name) == name
    )


def _literal(value: Any, depth: int) -> str | None:
    """`value` as a Python literal that `_value` reads back, or None."""
    if value is None or isinstance(value, bool):
        return repr(value)
    # The base types' own repr: a subclass may override __repr__.
    if isinstance(value, int):
        try:
            return int.__repr__(value)
        except ValueError:  # past the 4,300-digit conversion limit, which parsing has too
            return None
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "1e999" if value > 0 else "-1e999"
        return float.__repr__(value)
    if isinstance(value, str):
        return str.__repr__(value)
    if depth >= _MAX_VALUE_DEPTH:
        return None
    items: list[str] = []
    if isinstance(value, (list, tuple)):
        for v in value:
            literal = _literal(v, depth + 1)
            if literal is None:
                return None
            items.append(literal)
        return f"[{', '.join(items)}]"
    if isinstance(value, dict):
        for k, v in value.items():
            literal = _literal(v, depth + 1)
            if not isinstance(k, str) or literal is None:
                return None
            items.append(f"{str.__repr__(k)}: {literal}")
        return "{" + ", ".join(items) + "}"
    return None


register_parser("pythonic", PythonicParser)
