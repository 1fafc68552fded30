"""Wire formats: length-prefixed JSON frames (client ⇄ fork server ⇄ session child) and
the compact binary "go" message a fork server hands to a warm spare child."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

__all__ = [
    "CANCEL_OP",
    "GO_LIMITS",
    "MAX_FRAME",
    "ProtocolError",
    "decode_go",
    "encode_go",
    "read_frame",
    "write_all",
    "write_frame",
]

_HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024
#: The limits a spare applies just before running the code, in wire order.
GO_LIMITS = ("cpu_seconds", "memory_mb", "max_processes", "file_size_mb", "max_open_files")
_GO = struct.Struct(f"!{len(GO_LIMITS)}q")
#: The one frame a client may send while its request is unanswered: stop that request's run
#: now, as its timeout would (its caller gave up on it). It gets no answer of its own, and a
#: fork server that reads it between requests (the run had ended) ignores it.
CANCEL_OP = "cancel"


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


def write_all(fd: int, data: bytes) -> None:
    """Write `data` fully to `fd` (a pipe may take it in pieces)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_frame(fd: int, obj: dict[str, Any]) -> None:
    """Encode `obj` and write it fully to `fd`."""
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    write_all(fd, _HEADER.pack(len(body)) + body)


def encode_go(limits: dict[str, Any], code: str) -> bytes:
    """The spare's whole request: fixed-size limits, then the code (read to EOF, no JSON)."""
    return _GO.pack(*(int(limits[name]) for name in GO_LIMITS)) + code.encode("utf-8", "surrogatepass")


def decode_go(data: bytes) -> tuple[dict[str, int], str]:
    """Inverse of `encode_go`."""
    if len(data) < _GO.size:
        raise ProtocolError("truncated go message")
    limits = dict(zip(GO_LIMITS, _GO.unpack_from(data), strict=True))
    return limits, data[_GO.size :].decode("utf-8", "surrogatepass")
