"""Model text UTF-8 cannot hold: lone UTF-16 surrogates (half an emoji a server cut; JSON's
`"\\ud83d"` decodes to one) become U+FFFD, so that no tool, agent or file fails to encode it.

A light module (no pydantic models built here) that the env, the trajectory writer and the
agents share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolenv.parsers.base import ActionParser
    from toolenv.types import ParsedAction

__all__ = ["clean_parse", "encodable_parse", "encodable_value", "fix_text", "unencodable", "unencodable_parse"]


def fix_text(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (a pair kept as two halves is joined)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def unencodable(value: Any) -> bool:
    """True when a string of `value` (JSON-like data, keys included) holds a lone surrogate: ASCII
    text at once, other text by one encode attempt (a C loop, no per-character Python)."""
    if isinstance(value, str):
        if value.isascii():
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        for k, v in value.items():
            if unencodable(k) or unencodable(v):
                return True
    elif isinstance(value, (list, tuple)):
        for v in value:
            if unencodable(v):
                return True
    return False


def encodable_value(value: Any) -> Any:
    """`value` (JSON-like data) with its strings, keys included, passed through `fix_text`."""
    if isinstance(value, str):
        return fix_text(value)
    if isinstance(value, dict):
        return {encodable_value(k): encodable_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable_value(v) for v in value]
    return value


def unencodable_parse(parsed: ParsedAction) -> bool:
    """True when a string of `parsed` (its calls' names, ids and arguments too) holds a lone surrogate:
    cheap for the usual turn, whose strings are few and ASCII or valid."""
    if unencodable(parsed.answer) or unencodable(parsed.text) or unencodable(parsed.errors):
        return True
    return any(unencodable(c.name) or unencodable(c.id) or unencodable(c.arguments) for c in parsed.tool_calls)


def encodable_parse(parsed: ParsedAction) -> ParsedAction:
    """A copy of `parsed` whose strings are all passed through `fix_text`, so no tool gets one it cannot send on."""
    calls = [
        c.model_copy(update={"name": fix_text(c.name), "id": fix_text(c.id), "arguments": encodable_value(c.arguments)})
        for c in parsed.tool_calls
    ]
    return parsed.model_copy(
        update={
            "tool_calls": calls,
            "answer": None if parsed.answer is None else fix_text(parsed.answer),
            "text": fix_text(parsed.text),
            "errors": [fix_text(e) for e in parsed.errors],
        }
    )


def clean_parse(parser: ActionParser, action: str) -> tuple[str, ParsedAction]:
    """`action` without lone surrogates, and what `parser` reads in it, every string encodable
    (a JSON escape a parser decodes, `"\\ud83d"`, makes one even in clean text)."""
    if not action.isascii():
        action = fix_text(action)
    parsed = parser.parse(action)
    if "\\" in action and unencodable_parse(parsed):
        parsed = encodable_parse(parsed)
    return action, parsed
