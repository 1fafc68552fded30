"""The compact text table a model sees for a query result."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["format_table", "format_value", "jsonable"]


def format_value(value: Any, max_chars: int) -> str:
    """One cell: NULL for None, blobs by size, floats with up to 10 significant digits, one line."""
    if value is None:
        text = "NULL"
    elif isinstance(value, (bytes, bytearray, memoryview)):
        text = f"<blob {len(bytes(value))} bytes>"
    elif isinstance(value, float):
        text = f"{value:.10g}"
    else:
        text = str(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")
    return text if len(text) <= max_chars else text[: max(1, max_chars - 1)] + "…"


def jsonable(value: Any) -> Any:
    """A value as JSON can hold it (for `ToolResult.metadata`): blobs and other types become text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<blob {len(bytes(value))} bytes>"
    return str(value)


#: Narrowest cells a too-wide table is cut to before whole columns are left out.
_MIN_CELL_CHARS = 8
#: Rows a too-wide table is narrowed to show (when the result has them), if cells stay this readable.
_NARROW_ROWS = 3
_READABLE_CELL_CHARS = 16


def _clip_cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def _block_size(widths: Sequence[int], lines: int) -> int:
    """Characters (newlines included) of `lines` lines of a table with these column widths, at most."""
    return lines * (sum(widths) + 3 * max(0, len(widths) - 1) + 1)


def format_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    row_count: int,
    *,
    max_chars: int = 4000,
    max_cell_chars: int = 80,
    exact_count: bool = True,
) -> str:
    """Rows as an aligned `a | b` table with a footer giving the total row count (with
    `exact_count` False, `row_count` is a lower bound: "more than `row_count - 1` rows").

    The whole text, footer included, stays within `max_chars`, so a wide or huge result
    never floods the model's context: rows past the budget are left out (the footer says
    how many were shown). When not even one row fits beside the header, the cells are cut
    narrower, and past a point the last columns are left out, so that a few rows still
    show; the footer then says so and suggests selecting fewer columns.
    """
    header = [format_value(c, max_cell_chars) for c in columns]
    cells = [[format_value(v, max_cell_chars) for v in row] for row in rows]
    full = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    room = max_chars - min(200, max_chars // 4)  # the rest is the footer's
    cap, kept = max_cell_chars, len(header)
    if _block_size(full, 2 + min(1, len(cells))) > room:
        # Not even one row fits: cut every cell to the widest width at which a few rows show
        # (one, if a few would need unreadably narrow cells); if the narrowest cells are still
        # too wide, keep only the first columns.
        choices = range(2 + min(len(cells), _NARROW_ROWS), 1 + min(1, len(cells)), -1)
        for count in choices:
            cap = max_cell_chars
            while cap > _MIN_CELL_CHARS and _block_size([min(w, cap) for w in full], count) > room:
                cap -= 1
            if count == choices[-1] or (
                cap >= _READABLE_CELL_CHARS and _block_size([min(w, cap) for w in full], count) <= room
            ):
                break
        while kept > 1 and _block_size([min(w, cap) for w in full[:kept]], 2 + min(1, len(cells))) > room:
            kept -= 1
        header = [_clip_cell(h, cap) for h in header[:kept]]
        cells = [[_clip_cell(v, cap) for v in row[:kept]] for row in cells]
    widths = [min(w, cap) for w in full[:kept]]

    def line(values: Sequence[str]) -> str:
        return " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    lines = [line(header), "-+-".join("-" * w for w in widths)]
    size = sum(len(s) + 1 for s in lines)
    for row in cells:
        text = line(row)
        if size + len(text) + 1 > room:
            break
        lines.append(text)
        size += len(text) + 1

    noun = "row" if row_count == 1 else "rows"
    total = f"{row_count} {noun} in total" if exact_count else f"more than {row_count - 1} rows"

    def footer(shown: int) -> str:
        if kept == len(columns) and cap >= max_cell_chars:
            if shown == row_count and exact_count:
                return f"({row_count} {noun})"
            reason = "" if shown == len(rows) else f" (output capped at {max_chars} characters)"
            return f"({total}; showing the first {shown}{reason}. Add LIMIT or WHERE to see others.)"
        count = f"{row_count} {noun}" if shown == row_count and exact_count else f"{total}; showing the first {shown}"
        cut = [f"cells cut to {cap} characters"] if cap < max_cell_chars else []
        if kept < len(columns):
            cut.append(f"only the first {kept} of {len(columns)} columns shown")
        return f"({count}; {' and '.join(cut)} to fit {max_chars} characters. Select fewer columns to see more.)"

    text = "\n".join([*lines, footer(len(lines) - 2)])
    while len(text) > max_chars and len(lines) > 2:  # only when max_chars is tiny
        lines.pop()
        text = "\n".join([*lines, footer(len(lines) - 2)])
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
