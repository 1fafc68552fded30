"""Warm spares and the zygote: every run still gets a fresh, confined process, and nothing leaks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from _procs import alive as _alive
from _procs import gone as _gone
from _procs import parent as _parent

from toolenv_code.sandbox import SandboxLimits, SandboxPool

_PROBE = (
    "import json, os, resource\n"
    "print(json.dumps({'uid': os.getuid(), 'pid': os.getpid(), 'cwd': os.getcwd(),\n"
    "  'nofile': resource.getrlimit(resource.RLIMIT_NOFILE)[0],\n"
    "  'nproc': resource.getrlimit(resource.RLIMIT_NPROC)[0],\n"
    "  'fds': sorted(int(f) for f in os.listdir('/proc/self/fd'))}))\n"
)


@pytest.fixture
def pool() -> Iterator[SandboxPool]:
    p = SandboxPool(size=1)
    yield p
    p.close()


def test_spare_waits_as_a_child_of_the_server_and_is_replaced_per_run(pool: SandboxPool) -> None:
    stats = pool.stats()[0]
    server, spare = stats["pid"], stats["spare_pid"]
    assert spare is not None and _alive(spare) and _parent(spare) == server
    assert pool.run("print(1)").stdout == "1\n"
    assert _gone([spare]), "the spare that ran the code must be gone after the call"
    after = pool.stats()[0]["spare_pid"]
    assert after is not None and after != spare and _alive(after)


def test_each_run_has_ipc_and_mount_namespaces_of_its_own(pool: SandboxPool) -> None:
    """Spares are cloned straight into new IPC and mount namespaces (or enter them themselves):
    either way a run shares them neither with the host nor with the server. (Namespace ids
    are reused once freed, so runs one after another may show the same ones.)"""
    stats = pool.stats()[0]
    if not stats["isolation"]["mount_ns"]:
        pytest.skip("the kernel refused the server its namespaces")
    outside = {os.readlink(f"/proc/{pid}/ns/{kind}") for pid in (os.getpid(), stats["pid"]) for kind in ("ipc", "mnt")}
    probe = "import os\nprint(os.readlink('/proc/self/ns/ipc'), os.readlink('/proc/self/ns/mnt'))"
    for _ in range(3):
        run = pool.run(probe)
        ours = set(run.stdout.split())
        assert run.ok and len(ours) == 2 and not ours & outside, (run, outside)


def test_limits_are_applied_per_run_not_per_spare(pool: SandboxPool) -> None:
    tight = json.loads(pool.run(_PROBE, SandboxLimits(max_open_files=16, max_processes=4)).stdout)
    default = json.loads(pool.run(_PROBE).stdout)
    assert (tight["nofile"], tight["nproc"]) == (16, 4)
    assert (default["nofile"], default["nproc"]) == (SandboxLimits().max_open_files, SandboxLimits().max_processes)
    assert tight["cwd"] != default["cwd"]
    for seen in (tight, default):
        assert seen["fds"] in ([0, 1, 2], [0, 1, 2, 3])  # 3 = the listdir handle itself: no protocol pipes
        if os.geteuid() == 0:
            assert seen["uid"] != 0 and seen["pid"] == 1  # PID 1 of its own PID namespace


def test_output_is_complete_when_the_answer_comes_before_the_exit(pool: SandboxPool) -> None:
    code = "import sys\nfor i in range(2000):\n    print(i)\nsys.stderr.write('tail')\nraise SystemExit(7)\n"
    for _ in range(5):
        r = pool.run(code)
        assert r.exit_code == 7 and r.stderr == "tail"
        assert r.stdout.splitlines() == [str(i) for i in range(2000)]


def test_background_process_holding_stdout_does_not_hang_the_call(pool: SandboxPool) -> None:
    code = "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('done')\n"
    start = time.monotonic()
    r = pool.run(code, SandboxLimits(timeout=20))
    assert r.ok and r.stdout == "done\n" and not r.timed_out
    assert time.monotonic() - start < 10


def test_runs_keep_working_when_the_zygote_dies(pool: SandboxPool) -> None:
    zygote = pool.stats()[0]["zygote_pid"]
    if zygote is None:
        pytest.skip("no zygote on this kernel: spares are forked by the server itself")
    os.kill(zygote, signal.SIGKILL)
    for i in range(3):  # the spare already forked is used, then the server forks its own
        r = pool.run(f"print({i})")
        assert r.ok and r.stdout == f"{i}\n", r
    stats = pool.stats()[0]
    assert stats["zygote_pid"] is None and stats["spare_pid"] is not None
    # The spares the server forks itself set their environment and seed as the zygote's do.
    code = "import os, random\nprint(os.environ['HOME'] == os.environ['TMPDIR'] == os.getcwd(), random.random())"
    first, second = (pool.run(code).stdout.split() for _ in range(2))
    assert first[0] == second[0] == "True" and first[1] != second[1]


def test_close_and_server_death_leave_no_spare_or_zygote() -> None:
    pool = SandboxPool(size=1)
    stats = pool.stats()[0]
    first = [stats["pid"], stats["spare_pid"], *([stats["zygote_pid"]] if stats["zygote_pid"] else [])]
    os.kill(stats["pid"], signal.SIGKILL)  # the spare sees EOF on its go pipe, the zygote on its socket
    assert _gone(first), [p for p in first if _alive(p)]
    assert pool.run("print(2)").stdout == "2\n"  # a new server, with a new spare
    stats = pool.stats()[0]
    second = [stats["pid"], stats["spare_pid"], *([stats["zygote_pid"]] if stats["zygote_pid"] else [])]
    pool.close()
    assert _gone(second), [p for p in second if _alive(p)]


def test_interpreter_exit_leaves_no_spare_or_zygote() -> None:
    script = (
        "import json\n"
        "from toolenv_code import get_pool, run_code\n"
        "assert run_code('print(3)').stdout == '3\\n'\n"
        "print(json.dumps(get_pool().stats()))\n"
    )  # exits without closing the pool: the atexit hook must do it
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    pids = [p for s in json.loads(out.stdout) for p in (s["pid"], s["spare_pid"], s["zygote_pid"]) if p]
    assert len(pids) >= 2
    assert _gone(pids), [p for p in pids if _alive(p)]
