"""A closed session's processes stop at once, and each run or session has a /tmp work area of its own.

Before, `close_session` only queued the close for the server's next request: between a rollout
batch and the training step no request comes, so a closed episode's leftover processes kept
running (and burning CPU) through training. And every child's work dir was a folder of its
server's one shared tmpfs, so one session filling it left every other episode on that server
unable to write a file for as long as the session lived.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import pytest

import toolenv  # noqa: F401 - registers the env ids
from toolenv_code.sandbox import SandboxLimits, SandboxPool, get_pool

LIMITS = SandboxLimits(timeout=10)
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the code sandbox needs Linux")


def _isolation(pool: SandboxPool) -> dict[str, object]:
    iso: dict[str, object] = pool.stats()[0]["isolation"]
    return iso


def _processes_with(marker: str) -> list[int]:
    """Host pids whose command line holds `marker` (the host's /proc shows every PID namespace)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _wait_until(check: Callable[[], object], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def _spawner(marker: str) -> str:
    """Session code that leaves a process behind, escaped into a session of its own (`setsid`)."""
    loop = "import time\nwhile True: time.sleep(0.1)"
    return (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {loop!r}, {marker!r}], start_new_session=True)\n"
        "print('started')\n"
    )


def _needs_pid_ns(pool: SandboxPool) -> None:
    if not _isolation(pool).get("pid_ns"):
        pytest.skip("needs PID namespaces: without them a process that setsid()s away outlives its session")


def _needs_child_mounts(pool: SandboxPool) -> None:
    iso = _isolation(pool)
    if not iso.get("child_mounts", iso.get("workroot_tmpfs")):
        pytest.skip("needs mount namespaces of each child's own")


def test_closed_session_processes_stop_without_another_call() -> None:
    pool = SandboxPool(size=1)
    marker = f"toolenv-leftover-{uuid.uuid4().hex}"
    try:
        _needs_pid_ns(pool)
        r = pool.run(_spawner(marker), LIMITS, session="episode-A")
        assert r.ok and "started" in r.stdout, r
        assert _wait_until(lambda: _processes_with(marker), 5), "the session's process never started"
        pool.close_session("episode-A")  # what the env's reset/close does; no request follows
        assert _wait_until(lambda: not _processes_with(marker), 5), "the closed session's process still runs"
    finally:
        pool.close()
    assert not _processes_with(marker)


def test_env_close_stops_the_episode_session_processes() -> None:
    _needs_pid_ns(get_pool())
    marker = f"toolenv-leftover-{uuid.uuid4().hex}"
    env = gym.make("toolenv/MBPP-v0", stateful=True, limit=1)
    try:
        env.reset(seed=0)
        obs, *_ = env.step(f"```python\n{_spawner(marker)}```")
        assert "started" in obs, obs
        assert _wait_until(lambda: _processes_with(marker), 5)
    finally:
        env.close()
    assert _wait_until(lambda: not _processes_with(marker), 5), "the episode's process outlived env.close()"


def test_session_close_waits_for_a_busy_server_then_acts() -> None:
    """A close made while the server runs another call takes effect once that call is done."""
    pool = SandboxPool(size=1)
    marker = f"toolenv-leftover-{uuid.uuid4().hex}"
    try:
        _needs_pid_ns(pool)
        assert pool.run(_spawner(marker), LIMITS, session="episode-A").ok
        assert _wait_until(lambda: _processes_with(marker), 5)
        done: list[bool] = []
        busy = threading.Thread(target=lambda: done.append(pool.run("import time; time.sleep(1)", LIMITS).ok))
        busy.start()
        time.sleep(0.2)  # the sleep is on the server now
        pool.close_session("episode-A")
        busy.join()
        assert done == [True]
        assert _wait_until(lambda: not _processes_with(marker), 5)
        assert pool.run("print(2)", LIMITS, session="episode-A").new_session  # the old one is gone
    finally:
        pool.close()


_FILL = """
n = 0
try:
    for i in range(10_000):
        with open(f"f{i}", "wb") as f:
            f.write(b"x" * 2**20)
        n += 1
except OSError as e:
    print("stopped after", n, "MiB:", e.errno)
"""

_WRITE = """
import os
with open("out.bin", "wb") as f:
    f.write(b"y" * (4 * 2**20))
print("wrote", os.path.getsize("out.bin"))
"""


def test_a_session_filling_its_tmp_leaves_room_for_other_runs() -> None:
    pool = SandboxPool(size=1, tmpfs_mb=32)  # one server: every episode here shares it
    try:
        _needs_child_mounts(pool)
        filled = pool.run(_FILL, LIMITS, session="episode-A")
        assert filled.ok and "stopped after" in filled.stdout, filled
        assert int(filled.stdout.split()[2]) <= 32  # its own area is capped
        one_shot = pool.run(_WRITE, LIMITS)
        assert one_shot.ok and f"wrote {4 * 2**20}" in one_shot.stdout, one_shot
        other = pool.run(_WRITE, LIMITS, session="episode-C")
        assert other.ok and f"wrote {4 * 2**20}" in other.stdout, other
        again = pool.run("import os; print(len(os.listdir('.')))", LIMITS, session="episode-A")
        assert again.ok and int(again.stdout) >= int(filled.stdout.split()[2])  # A's files stay A's
    finally:
        pool.close()


def test_a_one_shot_run_is_capped_and_its_space_freed() -> None:
    pool = SandboxPool(size=1, tmpfs_mb=16)
    try:
        _needs_child_mounts(pool)
        for _ in range(3):  # each run gets the whole cap again: nothing is left from the last
            r = pool.run(_FILL, LIMITS)
            assert r.ok and "stopped after" in r.stdout, r
            assert 8 <= int(r.stdout.split()[2]) <= 16, r.stdout
    finally:
        pool.close()


def test_work_dir_is_private_and_tmpdir_points_at_it() -> None:
    pool = SandboxPool(size=1)
    try:
        r = pool.run(
            "import os, tempfile; d = os.getcwd(); print(d == os.environ['TMPDIR'] == tempfile.gettempdir(),"
            " os.access(d, os.W_OK), os.stat(d).st_mode & 0o777 == 0o700)",
            LIMITS,
        )
        assert r.ok and r.stdout.split() == ["True", "True", "True"], r
    finally:
        pool.close()
