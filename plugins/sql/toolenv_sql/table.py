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


def format_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    row_count: int,
    *,
    max_chars: int = 4000,
    max_cell_chars: int = 80,
) -> str:
    """Rows as an aligned `a | b` table with a footer giving the total row count.

    Output stops before `max_chars` (the footer says how many rows were shown), so
    a wide or huge result never floods the model's context.
    """
    header = [format_value(c, max_cell_chars) for c in columns]
    cells = [[format_value(v, max_cell_chars) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        return " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    lines = [line(header), "-+-".join("-" * w for w in widths)]
    size = sum(len(s) + 1 for s in lines)
    shown = 0
    budget = max_chars - 120  # room for the footer
    for row in cells:
        text = line(row)
        if size + len(text) + 1 > budget:
            break
        lines.append(text)
        size += len(text) + 1
        shown += 1
    noun = "row" if row_count == 1 else "rows"
    if shown == row_count:
        footer = f"({row_count} {noun})"
    else:
        reason = "" if shown == len(rows) else f" (output capped at {max_chars} characters)"
        footer = f"({row_count} {noun} in total; showing the first {shown}{reason}. Add LIMIT or WHERE to see others.)"
    lines.append(footer)
    return "\n".join(lines)
