"""The two ways an MCP server fails us, each carrying one readable line."""

from __future__ import annotations

__all__ = ["MCPConnectionLost", "MCPServerError"]


class MCPServerError(RuntimeError):
    """The server could not be started or reached (e.g. `MCP server 'calc' could not start: ...`)."""


class MCPConnectionLost(MCPServerError):
    """The connection ended during a call (the server process died, the endpoint went away).

    The call's outcome is unknown; the next call starts a new connection.
    """
