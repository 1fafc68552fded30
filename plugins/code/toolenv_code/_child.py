"""The sandboxed child's side: stdio onto pipes, rlimits, a lower uid, then the code.

Runs in a process just forked from the fork server (PID 1 of its own PID
namespace when the kernel allows it) and never returns to the server's code.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import linecache
import os
import random
import resource
import signal
import sys
import tempfile
import traceback
from typing import Any

from toolenv_code._protocol import ProtocolError, read_frame, write_frame

__all__ = ["CPU_EXIT", "enter_child", "exec_user", "fresh_namespace", "session_loop"]

SESSION_REQ_FD, SESSION_STATUS_FD = 3, 4
#: Exit status of a child stopped by RLIMIT_CPU (128 + SIGXCPU, as a shell would show it).
CPU_EXIT = 128 + signal.SIGXCPU
_SOURCE_NAME = "<python>"
_CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}


def _print_exception(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != _SOURCE_NAME:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def exec_user(code: str, namespace: dict[str, Any]) -> int:
    """Run `code` like `python -c` would: traceback on stderr, exit status returned."""
    linecache.cache[_SOURCE_NAME] = (len(code), None, code.splitlines(True), _SOURCE_NAME)
    try:
        exec(compile(code, _SOURCE_NAME, "exec"), namespace)  # noqa: S102 - running code is the point
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - report any failure like the interpreter would
        _print_exception(exc)
        status = 1
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()  # type: ignore[union-attr]
    return status


def _set_limits(limits: dict[str, Any]) -> None:
    cpu = int(limits["cpu_seconds"])
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb, limits["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb, limits["file_size_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"], limits["max_open_files"]))


def enter_child(workdir: str, limits: dict[str, Any], uid: int, fds: list[int]) -> None:
    """In the forked child: new session, stdio onto pipes, limits, lower uid, fresh stdio objects.

    `fds` become descriptors 1, 2, 3... in order; everything else above 2 is closed.
    """
    os.setsid()
    high = [os.dup(fd) for fd in fds]  # move out of the way before dup2 into place
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for target, fd in enumerate(high, start=1):
        os.dup2(fd, target)
    os.closerange(len(fds) + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(_CHILD_ENV, HOME=workdir, TMPDIR=workdir)
    tempfile.tempdir = workdir
    _set_limits(limits)
    if uid > 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    random.seed()
    sys.argv = [""]
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    # Unbuffered text streams: output printed before a kill (timeout, CPU limit) is not lost.
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr  # type: ignore[misc]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # PID 1 of a namespace ignores the kernel's SIGXCPU unless it has a handler.
    signal.signal(signal.SIGXCPU, _cpu_exceeded)


def _cpu_exceeded(signum: int, frame: object) -> None:
    os.write(2, b"\nCPU time limit exceeded\n")
    os._exit(CPU_EXIT)


def fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins}


def session_loop() -> None:
    namespace = fresh_namespace()
    while True:
        try:
            req = read_frame(SESSION_REQ_FD)
        except (ProtocolError, OSError):
            os._exit(0)
        status = exec_user(req["code"], namespace)
        write_frame(SESSION_STATUS_FD, {"exit_code": status})
