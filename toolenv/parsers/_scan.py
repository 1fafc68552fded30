"""Scanning helpers shared by the parsers that read marker-delimited formats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MarkerFinder", "schema_kinds"]


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
