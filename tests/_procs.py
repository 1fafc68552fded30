"""Process probes the sandbox tests share: is a pid alive, its parent, wait for pids to go."""

from __future__ import annotations

import time
from pathlib import Path


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def parent(pid: int) -> int:
    """The parent pid of `pid` (from /proc)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def gone(pids: list[int], within: float = 10.0) -> bool:
    """Whether every pid of `pids` has exited (or is a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not any(alive(p) for p in pids)
