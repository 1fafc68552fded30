"""JSON for the parsers: pydantic-core's fast reader, with `json`'s verdict on what it refuses."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

__all__ = ["call_arguments", "call_json", "decode_json", "encode_json", "json_problem", "same_json"]

_DECODER = json.JSONDecoder()


def decode_json(text: str) -> Any:
    """JSON via pydantic-core's parser (4x faster than `json`), with `json` deciding every
    case it refuses: the error message, lone surrogates, integers past its range."""
    try:
        return from_json(text)
    except (ValueError, TypeError):
        return json.loads(text)


def encode_json(value: Any) -> str | None:
    """`value` as JSON text (non-ASCII kept; NaN and infinities as `json` writes them, which the
    parsers read back), or None when JSON cannot hold it (a set, an int past Python's 4300-digit
    limit, nesting too deep): a `format_call` then declines the call."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None


def json_problem(exc: Exception) -> str:
    """The short reason a decode failed, for an error the model reads."""
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "too deeply nested"
    return str(exc).split(":", 1)[0]  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"


def call_json(json_text: str, closed: bool, where: str, end_marker: str, how: str) -> tuple[Any, str] | str:
    """A call's JSON arguments and the text after them, or the error worded for the model.

    A closed call's text must be JSON as a whole. A call that was not closed (generation
    stopped) may have text after its JSON, which comes back as the rest.
    """
    try:
        return decode_json(json_text), ""
    except (ValueError, RecursionError) as exc:  # ValueError: also ints past Python's 4300-digit limit
        if closed:
            return f"{where}: the arguments are not valid JSON ({json_problem(exc)}). {how}"
    try:  # not closed: the JSON may be followed by text the model went on to write
        value, end = _DECODER.raw_decode(json_text)
    except (ValueError, RecursionError) as again:
        return (
            f"{where}: the arguments are not valid JSON ({json_problem(again)}), and the call is not "
            f"closed with {end_marker}. {how}"
        )
    return value, json_text[end:]


def call_arguments(value: Any, where: str) -> dict[str, Any] | str:
    """A call's arguments from decoded JSON, or the error worded for the model: an object, or a
    string holding one (some models double-encode them; an empty string is no arguments)."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = decode_json(value)
        except (ValueError, RecursionError):
            return f"{where}: the arguments are a string that is not JSON; write a JSON object."
    if not isinstance(value, dict):
        return f"{where}: the arguments must be a JSON object."
    return value


def same_json(a: Any, b: Any) -> bool:
    """Equal and of the same JSON types all the way down (`1 == 1.0 == True` in Python)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
