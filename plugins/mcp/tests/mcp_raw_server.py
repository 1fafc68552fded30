"""A hand-written MCP server over stdio (newline-delimited JSON-RPC), without the MCP SDK:
for what the SDK's servers do not do, as other servers do.

It speaks protocol version `RAW_MCP_VERSION` (default 2024-11-05), lists its tools in
pages of one (`nextCursor`), and appends every request it receives to `RAW_MCP_LOG` as
one line `<pid> <method> <params as JSON>`. Tools:

* `first`: on the first page; returns its arguments as text.
* `files.read` and `b` (later pages): `b` declares an `outputSchema` and returns structured content.

With `RAW_MCP_CHANGES` set it declares `tools.listChanged` and lists `change` too: calling it
changes `b`'s output schema (and its results to match), removes `files.read`, adds `new`, and
sends `notifications/tools/list_changed`.

With `RAW_MCP_JUNK` set it writes bytes that are not UTF-8 to stdout before each call's
result, and inside it (`first`'s text), as a server printing binary data (a progress bar, a
file's raw bytes) does.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"name": "first", "description": "Echo the arguments.", "inputSchema": {"type": "object"}},
    {
        "name": "files.read",
        "description": "Read a file (a name with a dot, as MCP allows).",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "name": "b",
        "description": "Structured content, as its output schema says.",
        "inputSchema": {"type": "object"},
        "outputSchema": {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]},
    },
]


CHANGES = bool(os.environ.get("RAW_MCP_CHANGES"))
if CHANGES:
    TOOLS.append({"name": "change", "description": "Change the tool list.", "inputSchema": {"type": "object"}})
CHANGED: list[bool] = []  # set once `change` was called
B_CHANGED = {
    "name": "b",
    "description": "Structured content, as its (changed) output schema says.",
    "inputSchema": {"type": "object"},
    "outputSchema": {"type": "object", "properties": {"w": {"type": "string"}}, "required": ["w"]},
}


def change() -> None:
    """Change the tool list, then tell the client so."""
    CHANGED.append(True)
    TOOLS[:] = [t for t in TOOLS if t["name"] not in ("files.read", "b")] + [
        B_CHANGED,
        {"name": "new", "description": "A tool added later.", "inputSchema": {"type": "object"}},
    ]
    send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})


JUNK = bool(os.environ.get("RAW_MCP_JUNK"))


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def send_junk() -> None:
    """A line of bytes that are not UTF-8, then a result whose text holds one such byte."""
    sys.stdout.buffer.write(b"\xff\xfe progress \x80\x81\n")
    sys.stdout.buffer.flush()


def log(method: str, params: Any) -> None:
    path = os.environ.get("RAW_MCP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {method} {json.dumps(params)}\n")


def result(request_id: Any, value: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": value})


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method is None:  # a response (the server sends no requests): nothing to do
            continue
        log(method, params)
        if request_id is None:  # a notification
            continue
        if method == "initialize":
            version = os.environ.get("RAW_MCP_VERSION", "2024-11-05")
            info = {"name": "raw", "version": "0"}
            capabilities = {"tools": {"listChanged": True} if CHANGES else {}}
            result(request_id, {"protocolVersion": version, "capabilities": capabilities, "serverInfo": info})
        elif method == "tools/list":
            index = int(params.get("cursor") or 0)
            page: dict[str, Any] = {"tools": TOOLS[index : index + 1]}
            if index + 1 < len(TOOLS):
                page["nextCursor"] = str(index + 1)
            result(request_id, page)
        elif method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            listed = {t["name"] for t in TOOLS}
            if name == "b" and CHANGED:
                result(
                    request_id, {"content": [{"type": "text", "text": '{"w": "x"}'}], "structuredContent": {"w": "x"}}
                )
            elif name == "b":
                result(request_id, {"content": [{"type": "text", "text": '{"v": 1}'}], "structuredContent": {"v": 1}})
            elif name == "change" and CHANGES:
                change()
                result(request_id, {"content": [{"type": "text", "text": "changed"}]})
            elif name == "first" and JUNK:
                send_junk()
                line = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text"}]}})
                text = b'"text": "first \xff"'  # raw bytes inside the JSON string
                sys.stdout.buffer.write(line.encode().replace(b'"type": "text"', b'"type": "text", ' + text) + b"\n")
                sys.stdout.buffer.flush()
            elif name in ("first", "files.read", "new") and name in listed:
                result(request_id, {"content": [{"type": "text", "text": f"{name} {json.dumps(arguments)}"}]})
            else:
                send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": f"no tool {name}"}})
        elif method == "ping":
            result(request_id, {})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
