"""The sandboxed child's side: stdio onto pipes, rlimits, a lower uid, then the code.

Runs in a process just forked from the fork server (PID 1 of its own PID
namespace when the kernel allows it) and never returns to the server's code.
One-shot runs use a *warm spare* (`spare_main`): a child forked ahead of time that
has done every request-independent step (stdio, cwd, environment, signals, the
page faults of a first `exec`) and blocks on its "go" pipe; the request then only
costs the rlimits, the uid drop and the code itself. Sessions use `enter_child`.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module under `signal`; no stubs
import atexit
import builtins
import contextlib
import io
import linecache
import mmap
import os
import random
import resource
import signal
import sys
import traceback
import types
from typing import Any, NoReturn

from toolenv_code import _linux
from toolenv_code._protocol import GO_LIMITS, ProtocolError, decode_go, encode_go, read_frame, write_frame

__all__ = [
    "CHILD_ENV",
    "CPU_EXIT",
    "SPARE_DONE",
    "confine_children",
    "enter_child",
    "exec_user",
    "main_namespace",
    "premake_stdio",
    "session_loop",
    "spare_main",
    "warm_interpreter",
]

SESSION_REQ_FD, SESSION_STATUS_FD = 3, 4
SPARE_GO_FD = 3
#: Exit status of a child stopped by RLIMIT_CPU (128 + SIGXCPU, as a shell would show it).
CPU_EXIT = 128 + signal.SIGXCPU
#: First byte of a spare's shared status page once its code has finished (the second is the status).
SPARE_DONE = 1
#: The file name of one-shot code in tracebacks; a session's calls are `<cell 1>`, `<cell 2>`...
_SOURCE_NAME = "<python>"
#: The whole environment of sandboxed code (plus HOME and TMPDIR = its work dir). The fork
#: server adopts it at start, so a child only sets the two per-run variables.
CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
_MAX_FD = 1 << 20
#: Set once by the fork server (`confine_children`): namespaces each child enters first.
_NEW_IPC_NS = False
_USER_NS_FD: int | None = None
_WARM_GO = encode_go(dict.fromkeys(GO_LIMITS, 1), "pass")


def _print_exception(exc: BaseException, source_name: str) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != source_name:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()  # type: ignore[union-attr]


def exec_user(code: str, namespace: dict[str, Any], source_name: str = _SOURCE_NAME) -> int:
    """Run `code` like `python -c` would: traceback on stderr, exit status returned.

    `source_name` is the code's file name in tracebacks; its lines stay in `linecache`
    under that name, so a later traceback through a function defined here shows them.
    """
    linecache.cache[source_name] = (len(code), None, code.splitlines(True), source_name)
    try:
        exec(compile(code, source_name, "exec"), namespace)  # noqa: S102 - running code is the point
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - report any failure like the interpreter would
        _print_exception(exc, source_name)
        status = 1
    _flush_stdio()
    return status


def main_namespace() -> dict[str, Any]:
    """A fresh `__main__` module, installed as `sys.modules["__main__"]`; its namespace.

    The code runs in it as `python -c` code does, so whatever looks names up in
    `__main__` finds the code's own: `unittest.main()`, `doctest.testmod()`, `pickle`
    of the code's classes and functions, `multiprocessing` workers.
    """
    module = types.ModuleType("__main__")
    namespace = vars(module)
    namespace.update(__builtins__=builtins, __annotations__={}, __loader__=sys.__loader__)
    sys.modules["__main__"] = module
    return namespace


def _exit_like_python() -> None:
    """What the interpreter does after `python -c` code: wait for threads, run `atexit` handlers."""
    threading = sys.modules.get("threading")
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(BaseException):
            shutdown()  # joins non-daemon threads (and stops thread pools, as at exit)
    if atexit._ncallbacks():
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # prints errors like the interpreter
    _flush_stdio()


def _join_threads() -> None:
    """After a session call: wait for the non-daemon threads the code started, as at exit.

    Thread-pool workers are left alone: they idle until their executor is shut down,
    which a session (unlike an exiting interpreter) does not do between calls.
    """
    threading = sys.modules.get("threading")
    if threading is None:
        return
    pools = sys.modules.get("concurrent.futures.thread")
    workers = set(getattr(pools, "_threads_queues", None) or ())
    current = threading.current_thread()
    with contextlib.suppress(BaseException):
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon and thread not in workers:
                thread.join()
    _flush_stdio()


def warm_interpreter() -> None:
    """Run a printing and a failing snippet once, output discarded, in the fork server.

    Lazy one-time work (code paths, caches, imports inside `traceback`) then happens
    once before any fork instead of in every child.
    """
    saved = sys.stdout, sys.stderr
    with open(os.devnull, "w", encoding="utf-8") as null:
        sys.stdout = sys.stderr = null
        try:
            exec_user("print(1)", {"__name__": "__main__"})
            exec_user("def f():\n    return 1 / 0\nf()\n", {"__name__": "__main__"})
        finally:
            sys.stdout, sys.stderr = saved
    linecache.cache.pop(_SOURCE_NAME, None)


def _set_limits(limits: dict[str, Any]) -> None:
    cpu = int(limits["cpu_seconds"])
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb, limits["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb, limits["file_size_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"], limits["max_open_files"]))


def _drop_privileges(limits: dict[str, Any], uid: int) -> None:
    """The last steps before user code: kernel limits, then the unprivileged uid."""
    _set_limits(limits)
    if uid > 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _set_env(workdir: str) -> None:
    if os.environ.keys() - {"HOME", "TMPDIR"} != CHILD_ENV.keys():  # the server normally did this once
        os.environ.clear()
        os.environ.update(CHILD_ENV)
    os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    tempfile = sys.modules.get("tempfile")  # not imported in the server: it would read TMPDIR itself
    if tempfile is not None:
        vars(tempfile)["tempdir"] = workdir


def confine_children(new_ipc_ns: bool, user_ns_fd: int | None) -> None:
    """What every child forked from now on enters before anything else (see `_enter_namespaces`)."""
    global _NEW_IPC_NS, _USER_NS_FD
    _NEW_IPC_NS, _USER_NS_FD = new_ipc_ns, user_ns_fd


def _enter_namespaces() -> None:
    """A System V IPC namespace of the child's own, then the server's nested user namespace.

    IPC objects (shared memory, message queues, semaphores) would otherwise live in the
    host's namespace, outliving the run and visible to later runs. The nested user
    namespace (where the server runs in one) leaves the code no capability over the
    server's mount and network namespaces. A failure here stops the child: it must not
    run code less confined than the server says.
    """
    if _NEW_IPC_NS:
        _linux.unshare(_linux.CLONE_NEWIPC)
    if _USER_NS_FD is not None:
        _linux.setns(_USER_NS_FD, _linux.CLONE_NEWUSER)


def _prepare(workdir: str, fds: list[int]) -> None:
    """Everything that does not depend on the request: namespaces, session, stdio, cwd, env, signals.

    `fds` become descriptors 1, 2, 3... in order; everything else above 2 is closed.
    """
    _enter_namespaces()
    os.setsid()
    high = [os.dup(fd) for fd in fds]  # move out of the way before dup2 into place
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for target, fd in enumerate(high, start=1):
        os.dup2(fd, target)
    os.closerange(len(fds) + 1, _MAX_FD)
    os.chdir(workdir)
    _set_env(workdir)
    # `random` reseeds itself after `os.fork` (its at-fork hook); `spare_main` reseeds explicitly.
    sys.argv = [""]
    sys.stdin, sys.stdout, sys.stderr = _STDIO or _make_stdio()
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    # `_signal` rather than `signal`: the latter's enum conversions touch (so copy) many more pages.
    _signal.signal(signal.SIGINT, _signal.default_int_handler)
    _signal.signal(signal.SIGPIPE, _signal.SIG_DFL)
    # PID 1 of a namespace ignores the kernel's SIGXCPU unless it has a handler.
    _signal.signal(signal.SIGXCPU, _cpu_exceeded)


def _make_stdio() -> tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]:
    """Text streams on descriptors 0, 1 and 2 as `python -c` would have them, but unbuffered.

    Unbuffered, so output printed before a kill (timeout, CPU limit) is not lost.
    """
    stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    out, err = (
        io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                         write_through=True)
        for fd in (1, 2)
    )  # fmt: skip
    return stdin, out, err


_STDIO: tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper] | None = None


def premake_stdio() -> None:
    """Build the children's stdio objects once, in the fork server, on stand-in pipes.

    The objects only hold descriptor numbers: in a child, 1 and 2 are its output pipes.
    Built here (with pipes in place, so they know they are not seekable), every child
    inherits them instead of constructing three streams itself.
    """
    global _STDIO
    saved = os.dup(1), os.dup(2)
    r, w = os.pipe()
    try:
        os.dup2(w, 1)
        os.dup2(w, 2)
        _STDIO = _make_stdio()
        for stream in _STDIO:
            stream.seekable()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, r, w):
            os.close(fd)


def enter_child(workdir: str, limits: dict[str, Any], uid: int, fds: list[int]) -> None:
    """In a forked session child: `_prepare`, then limits and the lower uid right away."""
    _prepare(workdir, fds)
    _drop_privileges(limits, uid)


def _read_to_eof(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def spare_main(workdir: str, uid: int, fds: list[int], status_fd: int) -> NoReturn:
    """A warm spare: prepare, wait for the go message, drop privileges, run it, report, exit.

    `fds` are the stdout and stderr pipes and the read end of the go pipe (→ 1, 2, 3);
    `status_fd` is a memfd shared with the server (mapped here, then closed).
    The go pipe is closed before the code runs, so the code sees only 0, 1 and 2.
    When the code is done (its non-daemon threads and `atexit` handlers too, as at
    interpreter exit), the status goes to the page shared with the server, then
    every descriptor is closed: the server answers on that EOF instead of waiting
    for the whole interpreter to be torn down (it still reaps the process after).
    """
    try:
        status = mmap.mmap(status_fd, mmap.PAGESIZE)
        _prepare(workdir, fds)  # closes status_fd with every other stray descriptor
        random.seed()  # a spare cloned by the zygote ran no at-fork hooks
        namespace = main_namespace()
        # Take the page faults of a first exec and of decoding a request before the request.
        exec_user("pass", namespace)
        decode_go(_WARM_GO)
        message = _read_to_eof(SPARE_GO_FD)
        os.close(SPARE_GO_FD)
        if not message:  # the server closed us unused
            os._exit(0)
        limits, code = decode_go(message)
        _drop_privileges(limits, uid)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the server
        with contextlib.suppress(BaseException):
            traceback.print_exc()
        os._exit(120)
    code_status = exec_user(code, namespace) & 0xFF
    _exit_like_python()
    status[1] = code_status
    status[0] = SPARE_DONE
    os.closerange(0, _MAX_FD)
    os._exit(code_status)


def _cpu_exceeded(signum: int, frame: object) -> None:
    os.write(2, b"\nCPU time limit exceeded\n")
    os._exit(CPU_EXIT)


def session_loop() -> None:
    """Run each request's code in one `__main__`, as cells `<cell 1>`, `<cell 2>`..."""
    namespace = main_namespace()
    cell = 0
    while True:
        try:
            req = read_frame(SESSION_REQ_FD)
        except (ProtocolError, OSError):
            os._exit(0)
        cell += 1
        status = exec_user(req["code"], namespace, f"<cell {cell}>")
        _join_threads()
        write_frame(SESSION_STATUS_FD, {"exit_code": status})
