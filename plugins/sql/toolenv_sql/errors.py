"""The one exception the SQL plugin raises internally; its message is written for the model."""

from __future__ import annotations

__all__ = ["QueryTimeout", "SQLError"]


class SQLError(Exception):
    """A query that cannot run: rejected, malformed, failed or too slow.

    The tool turns it into `ToolResult.error(str(exc))`; the reward scores it 0.
    """


class QueryTimeout(SQLError):
    """The query ran past its deadline and was interrupted."""
