"""JSON for the parsers: pydantic-core's fast reader, with `json`'s verdict on what it refuses."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

__all__ = ["call_arguments", "decode_json", "json_problem", "same_json"]


def decode_json(text: str) -> Any:
    """JSON via pydantic-core's parser (4x faster than `json`), with `json` deciding every
    case it refuses: the error message, lone surrogates, integers past its range."""
    try:
        return from_json(text)
    except (ValueError, TypeError):
        return json.loads(text)


def json_problem(exc: Exception) -> str:
    """The short reason a decode failed, for an error the model reads."""
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "too deeply nested"
    return str(exc).split(":", 1)[0]  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"


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
