"""The special tokens and tags of every registered model format, read off each parser's own
writing of a call, so fuzzers splice in the markers of formats added after they were written."""

from __future__ import annotations

import functools
import re

from toolenv.parsers import get_parser, parser_names

# `<tool_call>`, `<|call|>`, `<｜tool▁sep｜>`, `<atem:invoke name="f">`, `[TOOL_CALLS]`, ...
_MARKER = re.compile(r"<[^<>\n]{1,60}>|\[[A-Z_]{2,}\]")


@functools.cache
def parser_markers() -> tuple[str, ...]:
    """Every marker some parser writes around a call, sorted (so a seeded fuzzer stays repeatable)."""
    found: set[str] = set()
    for name in parser_names():
        written = get_parser(name).format_call("f", {"x": 1, "s": "a"}, "call_1")
        if written:
            found.update(_MARKER.findall(written))
    return tuple(sorted(found))
