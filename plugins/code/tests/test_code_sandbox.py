"""The sandbox pool: results, limits, output handling, isolation report, restarts."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time

import pytest

from toolenv_code import isolation_report
from toolenv_code.sandbox import SandboxLimits, SandboxPool, get_pool, run_code
from toolenv_code.tool import format_result


def test_print_and_exit_status() -> None:
    r = run_code("print('hello'); import sys; print('warn', file=sys.stderr)")
    assert r.ok and r.stdout == "hello\n" and r.stderr == "warn\n" and r.exit_code == 0


def test_exception_gives_traceback_with_source_line() -> None:
    r = run_code("x = 1\ny = x / 0\n")
    assert not r.ok and r.exit_code == 1
    assert "ZeroDivisionError" in r.stderr and "y = x / 0" in r.stderr and 'File "<python>", line 2' in r.stderr
    assert "_server.py" not in r.stderr  # the sandbox's own frames are hidden


def test_syntax_error_and_sys_exit() -> None:
    assert "SyntaxError" in run_code("def (:").stderr
    assert run_code("import sys; sys.exit(3)").exit_code == 3
    assert run_code("raise SystemExit").exit_code == 0


def test_fresh_workdir_and_clean_state_per_call() -> None:
    first = run_code("import os; open('f.txt', 'w').write('x'); print(os.getcwd()); print(os.listdir('.'))")
    second = run_code("import os; print(os.getcwd()); print(os.listdir('.')); print('x' in globals())")
    assert first.stdout.splitlines()[1] == "['f.txt']"
    cwd2, listing, has_x = second.stdout.splitlines()
    assert cwd2 != first.stdout.splitlines()[0] and listing == "[]" and has_x == "False"


def test_random_differs_between_calls() -> None:
    code = "import random; print(random.random())"
    assert run_code(code).stdout != run_code(code).stdout


def test_output_truncated_head_and_tail_kept() -> None:
    limits = SandboxLimits(max_output_bytes=1000)
    r = run_code("print('START'); print('x' * 100000); print('END')", limits)
    assert r.truncated and r.stdout.startswith("START") and r.stdout.rstrip().endswith("END")
    assert "bytes truncated" in r.stdout and len(r.stdout) < 1200
    assert "(output was truncated)" in format_result(r, limits)


def test_wall_clock_timeout() -> None:
    limits = SandboxLimits(timeout=0.5)
    start = time.monotonic()
    r = run_code("print('before', flush=True)\nimport time\ntime.sleep(30)", limits)
    assert r.timed_out and not r.ok and time.monotonic() - start < 5
    assert r.stdout == "before\n"  # output written before the kill is kept
    assert "did not finish within 0.5 s" in format_result(r, limits)


def test_cpu_limit() -> None:
    r = run_code("while True: pass", SandboxLimits(timeout=10, cpu_seconds=1))
    assert r.signal == signal.SIGXCPU and not r.timed_out
    assert "CPU time limit" in format_result(r, SandboxLimits())


_SELF_SIGNALS = {
    "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)": signal.SIGTERM,
    "import signal, time\nsignal.alarm(1)\ntime.sleep(30)": signal.SIGALRM,
    "import signal\nsignal.raise_signal(signal.SIGUSR1)": signal.SIGUSR1,
    "import os, signal\nos.kill(os.getpid(), signal.SIGHUP)": signal.SIGHUP,
    "import os\nos.abort()": signal.SIGABRT,
}


def test_signals_a_one_shot_run_sends_itself_end_it_as_they_would_a_script() -> None:
    """A one-shot run's code is PID 1 of its PID namespace, for which the kernel drops a
    signal whose action is the default: `os.kill(os.getpid(), SIGTERM)` and a bare
    `signal.alarm` must still end it, reported as killed by that signal."""
    pool = SandboxPool(size=1)
    try:
        for code, sig in _SELF_SIGNALS.items():
            r = pool.run(code + "\nprint('still running')", SandboxLimits(timeout=10))
            assert (r.signal, r.exit_code, r.stdout, r.timed_out) == (sig, None, "", False), code
            assert f"killed by {sig.name}" in format_result(r, SandboxLimits())
    finally:
        pool.close()


def test_a_self_killed_run_is_reported_alike_in_one_shot_runs_and_sessions() -> None:
    """A session's code runs under an init (PID 2), a one-shot run's as PID 1: same report."""
    code = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\nprint('after')"
    pool = SandboxPool(size=1)
    try:
        one_shot = pool.run(code)
        pool.run("x = 1", session="s")
        session = pool.run(code, session="s")
        for r in (one_shot, session):
            assert (r.signal, r.exit_code, r.stdout, r.stderr) == (signal.SIGTERM, None, "before\n", ""), r
        assert session.session_ended
        r = pool.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nprint('after')", session="k")
        assert (r.signal, r.stdout) == (signal.SIGKILL, "")  # in a session, even SIGKILL (not so in one-shot runs)
    finally:
        pool.close()


def test_code_s_own_signal_handlers_and_forked_processes_behave_as_in_a_script() -> None:
    """A handler the code installs replaces the stand-in; a process it forks is no init and
    dies of SIGUSR1 at once (the stand-in handlers are not inherited across `fork`)."""
    code = (
        "import os, signal\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('handled'))\n"
        "signal.raise_signal(signal.SIGTERM)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.pause()\n"
        "    os._exit(3)\n"
        "os.kill(pid, signal.SIGUSR1)\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    pool = SandboxPool(size=1)
    try:
        for session in (None, "s"):
            r = pool.run(code, SandboxLimits(timeout=10), session=session)
            assert r.ok and r.stdout == f"handled\n{-signal.SIGUSR1}\n", r.stdout + r.stderr
    finally:
        pool.close()


def test_orphans_are_reaped_so_they_do_not_use_up_a_session_s_process_limit() -> None:
    """Processes orphaned in a session (a shell's `cmd &`) are reaped as they end.

    Unreaped, each stays a zombie counted in RLIMIT_NPROC until the session ends, and a
    session soon cannot start a process at all. (A one-shot run's zombies go with its
    PID namespace when it ends.)
    """
    code = "import subprocess\nfor _ in range(30):\n    subprocess.run(['sh', '-c', 'true &'], check=True)\n"
    code += "print('done')"
    limits = SandboxLimits(max_processes=16, timeout=30)
    pool = SandboxPool(size=1)
    try:
        for _ in range(2):
            r = pool.run(code, limits, session="s")
            assert r.ok and r.stdout == "done\n", r.stderr[-500:]
    finally:
        pool.close()


def test_stdlib_outside_preload_imports() -> None:
    r = run_code("import sqlite3, csv, socket, subprocess; print(sqlite3.sqlite_version_info >= (3,))")
    assert r.ok, r.stderr
    assert r.stdout == "True\n"


def test_numeric_libraries_fit_a_process_limit_smaller_than_the_host_s_cores() -> None:
    """OpenBLAS starts a thread per core at `import numpy`; where the cores outnumber the
    sandbox's process limit (a 64-core training node, the default limit of 32) the import
    failed. Here the limit is 1, below this host's cores, to show the same thing."""
    pytest.importorskip("numpy")
    code = "import os, numpy\nprint(numpy.ones(3).sum(), len(os.listdir('/proc/self/task')))"
    result = run_code(code, SandboxLimits(max_processes=1))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "3.0 1\n" and "pthread_create failed" not in result.stderr


def test_isolation_report_is_measured() -> None:
    report = isolation_report()
    assert set(report.rlimits) == {"RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE"}
    assert report.limits["RLIMIT_NOFILE"] == SandboxLimits().max_open_files
    if os.geteuid() == 0:  # CI machines for this project run as root, where unshare always works
        assert report.network == "namespace" and report.filesystem == "readonly-root"
        assert report.processes == "pid-namespace" and report.user == "unprivileged-uid"
    assert "network=" in report.summary()


def test_pool_is_shared_process_wide() -> None:
    assert get_pool() is get_pool()


async def test_concurrent_runs_from_async_code() -> None:
    pool = get_pool()
    results = await asyncio.gather(*(pool.arun(f"print({i} * 2)") for i in range(12)))
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(12)]


def test_killed_server_is_replaced_transparently() -> None:
    pool = SandboxPool(size=1)
    try:
        first_pid = pool.stats()[0]["pid"]
        os.kill(first_pid, signal.SIGKILL)
        r = pool.run("print(6 * 7)")
        assert r.ok and r.stdout == "42\n"
        assert pool.stats()[0]["pid"] != first_pid and pool.restarts == 1
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.run("print(1)")


def test_forked_host_process_gets_its_own_pool() -> None:
    parent_pool = get_pool()
    parent_pool.run("pass")
    pid = os.fork()
    if pid == 0:  # the child must not talk over the parent's server pipes
        code = 0
        try:
            child_pool = get_pool()
            ok = child_pool is not parent_pool and child_pool.run("print(7)").stdout == "7\n"
            code = 0 if ok else 1
            child_pool.close()
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert parent_pool.run("print(8)").stdout == "8\n"


def test_tool_timeout_covers_sandbox_timeout() -> None:
    from toolenv_code.tool import PythonTool

    tool = PythonTool(sandbox=SandboxLimits(timeout=120))
    assert tool.limits.timeout is not None and tool.limits.timeout > 120
    assert PythonTool(timeout=5).limits.timeout == 5


def test_other_platforms_get_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(RuntimeError, match=r"needs Linux .* this is darwin"):
        SandboxPool(size=1)


def test_a_ctrl_c_while_closing_kills_the_servers_left(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolenv_code import sandbox

    pool = SandboxPool(size=2)
    pool.stats()  # both servers started
    procs = [s.proc for s in pool._servers if s is not None]
    assert len(procs) == 2 and all(p.poll() is None for p in procs)

    def interrupted(self: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(type(pool._servers[0]), "close", interrupted)
    monkeypatch.setattr(sandbox, "_POOLS", {(): pool})
    sandbox._shutdown_at_exit()  # what atexit runs: the second Ctrl-C is not raised from it
    for proc in procs:
        assert proc.wait(timeout=10) is not None  # killed, not left running
    assert sandbox._POOLS == {}


def test_a_server_that_dies_at_start_is_a_runtime_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not an EOFError from deep inside the pipe protocol: the reward and the tool handle
    RuntimeError (no score, an error observation)."""
    false = shutil.which("false")
    if false is None:
        pytest.skip("no `false` program")
    pool = SandboxPool(size=1)
    try:
        monkeypatch.setattr(sys, "executable", false)  # a "server" that exits at once
        with pytest.raises(RuntimeError, match="the sandbox server did not start"):
            pool.run("print(1)")
    finally:
        monkeypatch.undo()
        pool.close()


@pytest.mark.parametrize("size", [0, -1])
def test_a_pool_without_servers_is_refused_rather_than_waited_on_forever(size: int) -> None:
    with pytest.raises(ValueError, match="size must be at least 1"):
        SandboxPool(size=size)
