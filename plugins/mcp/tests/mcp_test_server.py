"""A small MCP server for the tests, run as a subprocess: over stdio by default, or
`--http PORT` for streamable HTTP on 127.0.0.1 (`--http PORT --when-free READY_FILE`: once the port is free).

`MCP_TEST_REFUSE_IF=<path>`: exit at start while that file exists (a server that cannot restart).
`remember` / `recall` keep state per MCP session (over stdio: per process), as a stateful
server (a notebook, a browser) would.
Written for the MCP SDK 1.x (`FastMCP`) and 2.x (`MCPServer`, its new name).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
import time
import weakref
import zlib
from typing import Any

import mcp.types as types

try:  # mcp 2.x
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.shared.exceptions import MCPError

    def protocol_error(code: int, message: str) -> Exception:
        return MCPError(code, message)
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import Context, FastMCP  # type: ignore[no-redef, attr-defined, unused-ignore]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef, import-not-found, unused-ignore]
    from mcp.shared.exceptions import McpError  # type: ignore[attr-defined, unused-ignore]

    def protocol_error(code: int, message: str) -> Exception:
        return McpError(types.ErrorData(code=code, message=message))  # type: ignore[no-any-return, unused-ignore]


refuse = os.environ.get("MCP_TEST_REFUSE_IF")
if refuse and os.path.exists(refuse):
    print("mcp_test_server: refusing to start", file=sys.stderr)
    sys.exit(2)

app = FastMCP("toolenv-test", log_level="WARNING")
CALLS = 0  # tool calls served, so tests can show invalid arguments never arrived
MEMORY: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()  # per MCP session


def _count() -> None:
    global CALLS
    CALLS += 1


def _png(width: int, height: int) -> bytes:
    """A red RGB PNG, built by hand (the server needs no Pillow)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _count()
    return a + b


@app.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    _count()
    return text


@app.tool()
def fail(message: str = "it broke") -> str:
    """Always raise an error."""
    _count()
    raise ToolError(f"fail: {message}")


@app.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then say so."""
    _count()
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@app.tool()
def image(width: int = 2, height: int = 3) -> types.CallToolResult:
    """A PNG image of the given size."""
    _count()
    import base64

    data = base64.b64encode(_png(width, height)).decode()
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": "an image:"}, {"type": "image", "data": data, "mimeType": "image/png"}]}
    )


@app.tool()
def structured() -> types.CallToolResult:
    """Structured content and no text."""
    _count()
    return types.CallToolResult.model_validate({"content": [], "structuredContent": {"answer": 42, "unit": "m"}})


@app.tool()
def resources() -> types.CallToolResult:
    """An embedded text resource and a resource link."""
    _count()
    return types.CallToolResult.model_validate(
        {
            "content": [
                {"type": "resource", "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": "hi"}},
                {"type": "resource_link", "uri": "file:///big.csv", "name": "big.csv"},
            ]
        }
    )


@app.tool()
def die() -> str:
    """Kill this server process."""
    os._exit(3)


@app.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@app.tool()
def calls() -> int:
    """How many calls of the other tools this process has served."""
    return CALLS


def _memory(ctx: Any) -> list[str]:
    """The memory of the caller's MCP session (2.x builds a session object per request, over its connection)."""
    session = ctx.session
    return MEMORY.setdefault(getattr(session, "_connection", session), [])


@app.tool()
def remember(value: str, ctx: Context) -> str:  # type: ignore[type-arg, unused-ignore]
    """Add a value to this session's memory."""
    _count()
    _memory(ctx).append(value)
    return "ok"


@app.tool()
def recall(ctx: Context) -> str:  # type: ignore[type-arg, unused-ignore]
    """The values this session remembered, as a JSON list."""
    _count()
    return json.dumps(_memory(ctx))


BARRIERS: dict[str, tuple[list[int], asyncio.Event]] = {}


@app.tool()
async def barrier(key: str, n: int) -> str:
    """Return once `n` calls with this `key` are in flight at once (how many a client runs concurrently)."""
    arrived, all_in = BARRIERS.setdefault(key, ([0], asyncio.Event()))
    arrived[0] += 1
    if arrived[0] >= n:
        all_in.set()
    await all_in.wait()
    return f"{n} in"


@app.tool()
def refuse(code: int, message: str) -> str:
    """Answer with a JSON-RPC error of this code (mcp 2.x sends it as such; 1.x as an isError result)."""
    _count()
    raise protocol_error(code, message)


@app.tool()
async def hog(seconds: float) -> str:
    """Block the server's event loop (a busy loop, a blocking call): it answers nothing meanwhile."""
    _count()
    time.sleep(seconds)
    return f"hogged {seconds}"


def _wait_until_free(port: int) -> None:
    """Block until 127.0.0.1:`port` can be bound (another server still holds it)."""
    while True:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError:
                pass
        time.sleep(0.02)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--http"] and len(argv) in (2, 4):
        port = int(argv[1])
        if argv[2:3] == ["--when-free"]:  # a quick restart: imports done (says so in a file), then the port once free
            with open(argv[3], "w"):
                pass
            _wait_until_free(port)
        run: Any = app.run
        settings: Any = app.settings
        if hasattr(settings, "port"):  # mcp 1.x: host and port are settings
            settings.host, settings.port = "127.0.0.1", port
            run("streamable-http")
        else:
            run("streamable-http", host="127.0.0.1", port=port)
    else:
        app.run()


if __name__ == "__main__":
    main(sys.argv[1:])
