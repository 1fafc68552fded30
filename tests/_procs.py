"""Process probes the sandbox tests share: is a pid alive, its parent, wait for pids to go."""

from __future__ import annotations

import os
import subprocess
import sys
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


#: The unprivileged uid (and gid) the sandbox tests start a pool as.
NOBODY = 65534


def as_nobody(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`args` run as uid/gid `NOBODY` in `cwd` (needs root), with a minimal environment."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "TMPDIR": str(cwd)}
    return subprocess.run(
        args, cwd=cwd, env=env, user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True, timeout=120
    )


def skip_unless_nobody_can_run_us(tmp_path: Path) -> None:
    """Skip, saying why, where uid `NOBODY` cannot run this Python on this checkout (one made in
    a 0700 `mktemp -d`, a venv linking into /root, an interpreter whose shared libpython it cannot
    load); `tmp_path` is opened to it."""
    import pytest

    tmp_path.chmod(0o777)
    try:
        reachable = as_nobody([sys.executable, "-c", "import toolenv_code"], tmp_path)
        problem = reachable.stderr.strip()[-200:] if reachable.returncode else ""
    except PermissionError as exc:  # the interpreter itself cannot be executed by it
        problem = str(exc)
    if problem:
        pytest.skip(f"this Python or checkout is not usable by uid {NOBODY}: {problem}")
