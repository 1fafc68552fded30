"""Length-prefixed JSON frames over raw file descriptors (client ⇄ fork server ⇄ session child)."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

__all__ = ["MAX_FRAME", "ProtocolError", "read_frame", "write_frame"]

_HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024


class ProtocolError(EOFError):
    """The peer closed the pipe or sent a malformed frame."""


def _read_exact(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise ProtocolError("peer closed the pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any]:
    """Block until one frame arrives on `fd` and decode it."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes is too large")
    obj = json.loads(_read_exact(fd, size))
    if not isinstance(obj, dict):
        raise ProtocolError("frame is not a JSON object")
    return obj


def write_frame(fd: int, obj: dict[str, Any]) -> None:
    """Encode `obj` and write it fully to `fd`."""
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    view = memoryview(_HEADER.pack(len(body)) + body)
    while view:
        n = os.write(fd, view)
        view = view[n:]
