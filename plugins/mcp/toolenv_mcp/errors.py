"""The ways an MCP server fails us, each carrying one readable line."""

from __future__ import annotations

__all__ = ["MCPConnectionLost", "MCPHTTPError", "MCPServerError"]


class MCPServerError(RuntimeError):
    """The server could not be started or reached (e.g. `MCP server 'calc' could not start: ...`)."""


class MCPConnectionLost(MCPServerError):
    """The connection ended during a call (the server process died, the endpoint went away).

    The call's outcome is unknown; the next call starts a new connection.
    """


class MCPHTTPError(MCPServerError):
    """An HTTP server answered a request with an error status (`401 Unauthorized`, `503 Service Unavailable`).

    The MCP SDK reports every such status as "Server returned an error response"; this
    names it. `retryable` for statuses that say "try again later" (408, 429, 502, 503, 504).
    """

    RETRYABLE = frozenset({408, 429, 502, 503, 504})

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.status in self.RETRYABLE
