"""A server with `preload` keeps two warm spares, so a call coming back to back finds one waiting.

Its larger process takes a few ms to clone and to tear down: with one spare, the next call
came before that spare was ready and waited for it. A plain server keeps one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _procs import alive as _alive
from _procs import as_nobody, skip_unless_nobody_can_run_us
from _procs import gone as _gone
from _procs import parent as _parent

from toolenv_code.sandbox import SandboxPool

#: What a run sees of its own process: work dir, HOME, TMPDIR and a draw of `random`.
_PROBE = "import os, random\nprint(os.getcwd(), os.environ['HOME'], os.environ['TMPDIR'], random.random())"


def _stats(pool: SandboxPool) -> dict[str, Any]:
    (stats,) = pool.stats()
    return dict(stats)


def _all_spares_waiting(pool: SandboxPool, within: float = 30.0) -> dict[str, Any]:
    """The server's stats once every spare it keeps is prepared and waits for its code."""
    deadline = time.monotonic() + within
    stats = _stats(pool)
    while stats["spares_waiting"] < len(stats["spare_pids"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = _stats(pool)
    assert stats["spares_waiting"] == len(stats["spare_pids"]), f"spares still preparing after {within:g} s: {stats}"
    return stats


@pytest.fixture
def preloaded() -> Iterator[SandboxPool]:
    pool = SandboxPool(size=1, preload="csv")
    yield pool
    pool.close()


def test_a_preloaded_server_keeps_two_spares_and_a_run_takes_the_oldest(preloaded: SandboxPool) -> None:
    stats = _stats(preloaded)
    first, second = stats["spare_pids"]
    assert stats["spare_pid"] == first != second
    assert all(_alive(p) and _parent(p) == stats["pid"] for p in (first, second)), stats
    assert preloaded.run("print(1)").stdout == "1\n"
    assert _gone([first]), "the spare that ran the code must be gone after the call"
    after = _stats(preloaded)["spare_pids"]
    assert after[0] == second and len(after) == 2 and after[1] not in (first, second) and _alive(after[1])


def test_a_plain_server_keeps_one_spare() -> None:
    pool = SandboxPool(size=1)
    try:
        assert len(_stats(pool)["spare_pids"]) == 1
        assert pool.run("print(1)").ok
        assert len(_stats(pool)["spare_pids"]) == 1
    finally:
        pool.close()


def test_back_to_back_runs_on_a_preloaded_server_find_their_spare_waiting(preloaded: SandboxPool) -> None:
    """Both spares ready, two calls back to back: the second's spare waited for it, ready (with
    one spare, that call's spare was forked only after the first call's answer)."""
    before = _all_spares_waiting(preloaded)["spare_runs"]
    for i in range(2):
        assert preloaded.run(f"print({i})").stdout == f"{i}\n"
    after = _stats(preloaded)["spare_runs"]
    assert after["ready"] == before["ready"] + 2, (before, after)
    assert after["late"] == before["late"]


def test_back_to_back_runs_each_get_a_fresh_process_of_their_own(preloaded: SandboxPool) -> None:
    """Spares made one after the other keep their own work dir, environment and `random` seed."""
    seen = []
    for _ in range(5):
        r = preloaded.run(_PROBE)
        assert r.ok, r
        cwd, home, tmpdir, draw = r.stdout.split()
        assert cwd == home == tmpdir, r.stdout
        seen.append((cwd, draw))
    assert len({cwd for cwd, _ in seen}) == 5 and len({draw for _, draw in seen}) == 5, seen
    r = preloaded.run("import os\nprint(os.listdir('.'))\nopen('left', 'w').write('x')")
    assert r.stdout == "[]\n"
    assert preloaded.run("import os\nprint(os.listdir('.'))").stdout == "[]\n"


def test_runs_and_sessions_keep_working_when_the_zygote_dies(preloaded: SandboxPool) -> None:
    """Spares the zygote will never fork are dropped; the server forks its own from then on."""
    stats = _stats(preloaded)
    if stats["zygote_pid"] is None:
        pytest.skip("no zygote on this kernel: spares are forked by the server itself")
    os.kill(stats["zygote_pid"], signal.SIGKILL)
    for i in range(4):
        r = preloaded.run(f"print({i})")
        assert r.ok and r.stdout == f"{i}\n", r
    assert preloaded.run("x = 41", session="s").ok
    assert preloaded.run("print(x + 1)", session="s").stdout == "42\n"
    stats = _stats(preloaded)
    assert stats["zygote_pid"] is None and len(stats["spare_pids"]) == 2, stats
    assert all(_alive(p) and _parent(p) == stats["pid"] for p in stats["spare_pids"]), stats


def test_close_leaves_neither_spare() -> None:
    pool = SandboxPool(size=1, preload="csv")
    stats = _stats(pool)
    pids = [stats["pid"], *stats["spare_pids"], *([stats["zygote_pid"]] if stats["zygote_pid"] else [])]
    assert len(stats["spare_pids"]) == 2
    pool.close()
    assert _gone(pids), [p for p in pids if _alive(p)]


_NOBODY_SCRIPT = """
import json
from toolenv_code.sandbox import SandboxPool

pool = SandboxPool(size=1, preload="csv")
out = {"runs": [], "session": []}
for i in range(3):  # the zygote clones sessions here too: its replies must be read in the order asked
    out["runs"].append(pool.run(f"print({i})").stdout)
    out["session"].append(pool.run(f"x = {i}\\nprint(x)", session=f"s{i % 2}").stdout)
out["session"].append(pool.run("print(x)", session="s0").stdout)
stats = pool.stats()[0]
out["spares"] = len(stats["spare_pids"])
out["zygote"] = stats["zygote_pid"] is not None
pool.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="starting the pool as another user needs root (CI runs as root)",
)
def test_two_spares_and_sessions_from_the_zygote_for_an_unprivileged_user(tmp_path: Path) -> None:
    """For a non-root user the zygote clones sessions as well as spares, answering in order."""
    skip_unless_nobody_can_run_us(tmp_path)
    done = as_nobody([sys.executable, "-c", _NOBODY_SCRIPT], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["runs"] == ["0\n", "1\n", "2\n"]
    assert out["session"] == ["0\n", "1\n", "2\n", "2\n"]
    assert out["spares"] == 2
