"""Helpers shared by the parsers that read marker-delimited formats: a linear marker search,
positional call ids, and values written as bare text, read (and written) by their schema type."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from typing_extensions import Self

from toolenv._ast import literal_eval
from toolenv.parsers._json import decode_json, encode_json, same_json

if TYPE_CHECKING:
    from toolenv._tool import Tool

__all__ = [
    "MarkerFinder",
    "SchemaBound",
    "param_kind",
    "positional_id",
    "python_literal",
    "schema_kinds",
    "typed_value",
    "write_typed",
]

_IDS = tuple(f"call_{i}" for i in range(16))


class MarkerFinder:
    """`str.find` that remembers where each marker was found, so that a scan is linear: a
    marker is searched again only once the scan has passed where it was found (re-searching
    from every position would be quadratic on a reply full of unclosed markers)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._at: dict[str, int] = {}

    def __call__(self, marker: str, pos: int) -> int:
        at = self._at.get(marker, -2)
        if at != -1 and at < pos:
            at = self._at[marker] = self.text.find(marker, pos)
        return at


def positional_id(index: int) -> str:
    """`call_0`, `call_1`, …: the id of a turn's call by its position, for formats without ids."""
    return _IDS[index] if index < len(_IDS) else f"call_{index}"


def schema_kinds(schema: Mapping[str, Any]) -> set[str]:
    """The JSON types a parameter's schema allows (`type`, a list of types, or `anyOf`/`oneOf`):
    the formats that write values as bare text read them back by these."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list):
        return {k for o in options if isinstance(o, Mapping) for k in schema_kinds(o)}
    return set()


def param_kind(schema: Any) -> str | None:
    """The one JSON type a property schema names besides null (`string?` for a string that may
    be null), or None (no type, or several)."""
    if not isinstance(schema, Mapping):
        return None
    kinds = schema_kinds(schema)
    real = kinds - {"null"}
    if len(real) == 1:
        (only,) = real
        return "string?" if only == "string" and "null" in kinds else only
    return "null" if kinds == {"null"} else None


def typed_value(raw: str, kind: str | None, literals: bool = False) -> Any:
    """A value written as bare text (GLM's `<arg_value>`, Muse Glimmer's `<atem:parameter>`),
    read by its parameter's type (`kind`, from `param_kind`; None when unknown): a string stays
    exactly as written (None for `null` when it may be null), any other type is decoded as JSON
    (`True`/`False` are accepted for booleans; with `literals`, Python's list and dict literals
    for arrays and objects, see `python_literal`); what does not decode, and an unknown type's
    text that is not JSON, stays text."""
    if kind == "string":
        return raw
    if kind == "string?":  # the templates write None as null, and a string as it is
        return None if raw == "null" else raw
    text = raw.strip()
    if kind == "null" and text in ("", "None"):
        return None
    if not text or (kind is None and text[0] not in '{["-0123456789tfn'):
        return raw  # not JSON: skip the decoder
    try:
        return decode_json(text)
    except (ValueError, RecursionError):  # ValueError: also ints past Python's 4300-digit limit
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if literals and kind in ("array", "object"):
            return python_literal(text, raw)
        return raw


def python_literal(text: str, default: Any) -> Any:
    """A Python list or dict literal (`['a', 'b']`, `{'k': None}`) as the JSON value it stands
    for, or `default`: for an array or object parameter whose text is not JSON, vLLM's
    `glm45` and `qwen3_coder` parsers fall back to `ast.literal_eval` (never `eval`), so a
    model writing Python's spelling makes the same call here as there (vLLM's `muse_glimmer`
    parser has no such fallback, nor has that one here). Tuples read as lists;
    what JSON cannot hold (sets, bytes, complex numbers) is not a literal."""
    if not text.startswith(("[", "{")):
        return default
    try:
        with warnings.catch_warnings():  # `'\d'` is valid Python that warns: not to the trainer's stderr
            warnings.simplefilter("ignore")
            value = literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, OverflowError):
        return default
    encoded = encode_json(value) if isinstance(value, (list, dict)) else None
    return default if encoded is None else decode_json(encoded)


def write_typed(
    value: Any, kind: str | None, breaks: Sequence[str], escape: Callable[[str], str], literals: bool = False
) -> str | None:
    """`value` as bare text that `typed_value(…, kind)` reads back as `value`: a string as it is
    (the templates write it so) unless it holds one of `breaks` or would read back as something
    else, then JSON (`escape` writing the `<` of the format's markers as `\\u003c`); None when
    nothing does (a string parameter is read as written, so a JSON text would stay text)."""
    if (
        isinstance(value, str)
        and not any(b in value for b in breaks)
        and same_json(typed_value(value, kind, literals), value)
    ):
        return value
    if kind == "string":
        return None
    try:
        text = escape(json.dumps(value, ensure_ascii=False, allow_nan=False))
        return text if same_json(typed_value(text, kind, literals), value) else None
    except (TypeError, ValueError, RecursionError):  # not JSON, NaN, ints past 4300 digits, too deep
        return None


class SchemaBound:
    """Mixin of the parsers whose formats write argument values as bare text (GLM, Muse Glimmer,
    Qwen3-Coder): bound to an env's tools (`ToolEnv` calls `bind`), they know each parameter's
    JSON schema and read its value by type; unbound, they know none."""

    _types: Mapping[str, Mapping[str, Any]] = MappingProxyType({})

    def bind(self, tools: Sequence[Tool]) -> Self:
        bound = copy.copy(self)
        bound._types = {t.name: t.flat_schema()["function"]["parameters"].get("properties") or {} for t in tools}
        return bound

    def _kind(self, name: str, key: str) -> str | None:
        """The JSON type of parameter `key` of tool `name`, or None when the parser does not know it."""
        props = self._types.get(name)
        return param_kind(props.get(key)) if props is not None else None
