"""JSON for the parsers: pydantic-core's fast reader, with `json`'s verdict on what it refuses."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

__all__ = ["decode_json", "json_problem"]


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
