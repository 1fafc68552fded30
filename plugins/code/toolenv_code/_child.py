"""The sandboxed child's side: stdio onto pipes, rlimits, a lower uid, then the code.

Runs in a process just forked from the fork server and never returns to the
server's code. Where the kernel allows it, that process is PID 1 of its own PID
namespace. A session's forks once more and stays behind as the namespace's init,
while the code runs in its child (see `_fork_init`); a one-shot run's code runs as
PID 1 itself, with stand-ins for the signal actions the kernel denies an init (see
`_stand_in_for_default_actions`).
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
import ctypes
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
from toolenv_code._confine import PRIVATE_SHM, PRIVATE_TMP, SHM_OPTIONS, bind_back, open_hidden
from toolenv_code._protocol import GO_LIMITS, ProtocolError, decode_go, encode_go, read_frame, write_frame

__all__ = [
    "CHILD_ENV",
    "CODE_KILLED",
    "CPU_EXIT",
    "SPARE_DONE",
    "SPARE_WAITING",
    "confine_children",
    "enter_child",
    "exec_user",
    "main_namespace",
    "premake_stdio",
    "prepare_spare",
    "session_loop",
    "spare_main",
    "spare_namespaces",
    "warm_interpreter",
]

SESSION_REQ_FD, SESSION_STATUS_FD = 3, 4
SPARE_GO_FD = 3
#: Exit status of a child stopped by RLIMIT_CPU (128 + SIGXCPU, as a shell would show it).
CPU_EXIT = 128 + signal.SIGXCPU
#: First byte of a spare's shared status page once its code has finished (the second is the status).
SPARE_DONE = 1
#: Third byte of a spare's status page once it is prepared and waits for its code (`Child.waiting`).
SPARE_WAITING = 1
#: First byte of a child's status page once its code was killed by a signal (the second is the signal):
#: as a session's init saw it (`_fork_init`), or as a one-shot run's stand-in handler reports it (`_die_of`).
CODE_KILLED = 2
#: The file name of one-shot code in tracebacks; a session's calls are `<cell 1>`, `<cell 2>`...
_SOURCE_NAME = "<python>"
#: The whole environment of sandboxed code (plus HOME and TMPDIR = its work dir). The fork
#: server adopts it at start, so a child only sets the two per-run variables. Numeric libraries
#: run one thread: OpenBLAS and OpenMP otherwise start one per core at import, and on a host with
#: more cores than the sandbox's process limit `import numpy` fails (many sandboxes share the cores anyway).
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    **dict.fromkeys(
        ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"),
        "1",
    ),
}
_MAX_FD = 1 << 20
#: Set once by the fork server (`confine_children`): namespaces each child enters first.
_NEW_IPC_NS = False
_USER_NS_FD: int | None = None
_OWN_MOUNTS = False
#: The size of each child's own work tmpfs, as a mount option (`_own_mounts`); set by `confine_children`.
_WORK_SIZE = b"size=256m"
#: The interpreter's paths under /tmp or /dev/shm that each child binds back over its own (`_own_mounts`).
_EXPOSED: list[str] = []
#: True in a session's process under `_fork_init`'s init: PID 2 of a PID namespace of its own.
_UNDER_INIT = False
#: A one-shot run's status page, once `_stand_in_for_default_actions` has taken over the signals.
_KILLED_PAGE: mmap.mmap | None = None
#: Signals that end a process by default and that code may send itself (`os.kill`, `alarm`,
#: timers, `raise_signal`). The kernel drops them for PID 1 (of a PID namespace) while their
#: action is the default, so a one-shot run's code gets `_die_of` as their handler instead.
#: Not SIGINT (KeyboardInterrupt, as in Python), SIGXCPU (`_cpu_exceeded`), SIGXFSZ (ignored,
#: as in Python), SIGKILL and SIGSTOP (no handler possible), nor the faults (SIGSEGV, SIGBUS,
#: SIGFPE, SIGILL, SIGTRAP, SIGSYS): the kernel forces a real fault on PID 1 anyway, and a
#: Python handler would return into the faulting instruction forever.
_SELF_SIGNALS = (
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGABRT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
    signal.SIGALRM,
    signal.SIGTERM,
    signal.SIGIO,
    signal.SIGPWR,
    signal.SIGVTALRM,
    signal.SIGPROF,
)
_SOCKET_SCOPE = False
_WARM_GO = encode_go(dict.fromkeys(GO_LIMITS, 1), "pass")


def _print_exception(exc: BaseException, source_name: str) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != source_name:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _flush_stdio() -> None:
    # try/except rather than `contextlib.suppress`: no objects made (see `_own_mounts`).
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:  # noqa: SIM105
            stream.flush()  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001, S110 - a stream the code closed or replaced: as Python, say nothing
            pass


def exec_user(code: str, namespace: dict[str, Any], source_name: str = _SOURCE_NAME) -> int:
    """Run `code` like `python -c` would: traceback on stderr, exit status returned.

    `source_name` is the code's file name in tracebacks; its lines stay in `linecache`
    under that name, so a later traceback through a function defined here shows them.
    """
    linecache.cache[source_name] = (len(code), None, code.splitlines(True), source_name)
    try:
        # dont_inherit: not this module's `from __future__ import annotations`, which `python -c` code lacks.
        exec(compile(code, source_name, "exec", dont_inherit=True), namespace)  # noqa: S102 - running code is the point
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            with contextlib.suppress(Exception):  # stderr closed or replaced by the code: as Python, say nothing
                print(exc.code, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - report any failure like the interpreter would
        with contextlib.suppress(Exception):
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
    """HOME and TMPDIR: the rest of the environment is `CHILD_ENV`, adopted by the fork server at start.

    (Not checked here: comparing the whole environment touches, so copies, some 60 pages per child.)
    """
    os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    tempfile = sys.modules.get("tempfile")  # not imported in the server: it would read TMPDIR itself
    if tempfile is not None:
        vars(tempfile)["tempdir"] = workdir


#: The zygote's `HOME=...` and `TMPDIR=...` strings, which the C environment points at (`_set_env_in_place`).
_ENV_BUFFERS: dict[str, ctypes.Array[ctypes.c_char]] = {}


def _set_env_in_place(workdir: str) -> None:
    """`_set_env` for the zygote, which does it once per spare: the C environment's strings are
    rewritten in place (see `_linux.putenv_buffer`), as `os.environ`'s `setenv` would keep every
    work dir's path in the zygote for good."""
    data = vars(os.environ).get("_data")  # what `os.environ` maps (bytes on POSIX)
    if not isinstance(data, dict):  # not CPython's `os._Environ`
        _set_env(workdir)
        return
    path = workdir.encode()  # an ASCII path the server made
    for name in ("HOME", "TMPDIR"):
        entry = b"%s=%s" % (name.encode(), path)
        buffer = _ENV_BUFFERS.get(name)
        if buffer is None or len(buffer) <= len(entry):
            buffer = ctypes.create_string_buffer(entry, max(len(entry) + 1, 256))
            _linux.putenv_buffer(buffer)  # the previous buffer, if any, is no longer referred to
            _ENV_BUFFERS[name] = buffer
        else:
            buffer.value = entry
        data[name.encode()] = path
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        vars(tempfile)["tempdir"] = workdir


def prepare_spare(workdir: str) -> dict[str, Any]:
    """In the zygote, just before it clones a spare: the spare's environment (`_set_env`), a
    fresh `random` seed and a fresh `__main__` (`main_namespace`, whose namespace is returned).

    The clone inherits them, so the spare does not make them itself: there, every page that
    work writes would be a copy of one it shares with the zygote, while here (the last spare
    gone: see `Server.after_request`) the pages are the zygote's alone.
    """
    _set_env_in_place(workdir)
    random.seed()  # the clone runs no at-fork hooks: each spare gets its own sequence this way
    return main_namespace()


def confine_children(
    new_ipc_ns: bool,
    user_ns_fd: int | None,
    own_mounts: bool,
    socket_scope: bool,
    exposed: list[str],
    work_mb: int = 256,
) -> None:
    """What every child forked from now on enters before anything else (see `_enter_namespaces`);
    `work_mb` caps each child's own work tmpfs (see `_own_mounts`)."""
    global _NEW_IPC_NS, _USER_NS_FD, _OWN_MOUNTS, _SOCKET_SCOPE, _EXPOSED, _WORK_SIZE
    _NEW_IPC_NS, _USER_NS_FD, _OWN_MOUNTS, _SOCKET_SCOPE = new_ipc_ns, user_ns_fd, own_mounts, socket_scope
    _EXPOSED = list(exposed)
    _WORK_SIZE = b"size=%dm" % max(1, int(work_mb))


_SHM_OPTIONS = SHM_OPTIONS.encode()
#: `_own_mounts`'s constant arguments: /dev/shm, /tmp, /tmp's options, "tmpfs", flags.
_MOUNT_ARGS = (
    PRIVATE_SHM.encode(),
    PRIVATE_TMP.encode(),
    b"size=64k,mode=0711",
    b"tmpfs",
    _linux.MS_NOSUID | _linux.MS_NODEV,
)


def _own_mounts(workdir: str, entered: int) -> None:
    """A mount namespace of the child's own: /tmp holds only `workdir`, itself a tmpfs of the
    child's own, /dev/shm is a tmpfs of its own, and /proc shows its own PID namespace.

    In the server's mounts, /dev/shm is shared by all its children and /proc is the host's.
    So a live session and a concurrent run (other episodes) could pass files through
    /dev/shm; /proc would list every host process with its command line (which can carry
    secrets), and `/proc/<os.getpid()>` would be some host process, not the code's. In a
    user namespace, where all children run as one uid, the shared /tmp would also let a
    run read or change a live session's work dir or leave files for later runs. Here /tmp
    is a read-only tmpfs holding the work dir (and the interpreter's own paths there,
    read-only, if it lives under /tmp: see `_confine.bind_back`), and the work dir, /dev/shm
    and /proc die with the child. The work dir is a tmpfs capped at the pool's `tmpfs_mb`
    (`_WORK_SIZE`) rather than a folder of the server's shared /tmp: a session that filled
    that one left every other run and session of the server unable to write a file for as
    long as it lived. It keeps the owner and mode the server gave the folder it covers. Made
    before the code joins the nested user namespace, so it cannot change them. (~0.25 ms
    per child, in the spare's preparation.)
    """
    # The arguments are bytes made once (`_MOUNT_ARGS`): every object made or touched here
    # costs this process a page copy (memory it shares with the zygote).
    mount = _linux.mount_bytes
    shm, tmp, tmp_options, tmpfs, flags = _MOUNT_ARGS
    if not entered & _linux.CLONE_NEWNS:
        _linux.unshare(_linux.CLONE_NEWNS)
    exposed = open_hidden(_EXPOSED) if _EXPOSED else None  # the server's read-only binds, before we cover them
    mount(tmpfs, shm, tmpfs, flags, _SHM_OPTIONS)
    path = workdir.encode()  # an ASCII path the server made: no `os.fsencode` (Python code) needed
    owner = os.stat(path)  # the server's folder: its uid (the run's) and mode, before /tmp is covered
    mount(tmpfs, tmp, tmpfs, flags, tmp_options)
    os.mkdir(path, 0o700)
    options = b"%s,mode=%o,uid=%d,gid=%d" % (_WORK_SIZE, owner.st_mode & 0o7777, owner.st_uid, owner.st_gid)
    mount(tmpfs, path, tmpfs, flags, options)
    if exposed:
        bind_back(exposed)  # one that fails stays hidden, as it would be without this
    mount(None, tmp, None, _linux.MS_REMOUNT | _linux.MS_RDONLY | flags, None)
    if _UNDER_INIT or os.getpid() == 1:  # in a PID namespace of its own
        # The kernel may refuse (a user namespace where parts of the host's /proc are masked):
        # the host's /proc then stays, as it was before this mount.
        try:  # noqa: SIM105 - no `suppress` object to make (see above)
            mount(b"proc", b"/proc", b"proc", flags | _linux.MS_NOEXEC, None)
        except OSError:
            pass


def spare_namespaces() -> int:
    """The namespaces (`CLONE_NEW*` flags) a spare may be cloned into rather than enter itself:
    see `_enter_namespaces`, given them as `entered`."""
    return (_linux.CLONE_NEWIPC if _NEW_IPC_NS else 0) | (_linux.CLONE_NEWNS if _OWN_MOUNTS else 0)


def _enter_namespaces(workdir: str, entered: int) -> None:
    """A System V IPC namespace of the child's own, its own mounts, the server's nested user
    namespace, then a Landlock domain of its own.

    IPC objects (shared memory, message queues, semaphores) would otherwise live in the
    host's namespace, outliving the run and visible to later runs. The nested user
    namespace (where the server runs in one) leaves the code no capability over the
    server's mount and network namespaces, nor over the child's own mount namespace
    (`_own_mounts`), made before it joins. The children share the server's network
    namespace (one of their own costs ~0.45 ms each), so abstract unix sockets, which
    live there, would let a session and a concurrent run (other episodes) talk: the
    Landlock scope keeps each child to its own. A failure here stops the child: it must
    not run code less confined than the server says. `entered`: the `CLONE_NEW*` namespaces
    the process was cloned into (see `spare_namespaces`), so already has.
    """
    if _NEW_IPC_NS and not entered & _linux.CLONE_NEWIPC:
        _linux.unshare(_linux.CLONE_NEWIPC)
    if _OWN_MOUNTS:
        _own_mounts(workdir, entered)
    if _USER_NS_FD is not None:
        _linux.setns(_USER_NS_FD, _linux.CLONE_NEWUSER)
    if _SOCKET_SCOPE:
        _linux.landlock_scope_abstract_sockets()


def _prepare(workdir: str, fds: list[int], entered: int = 0, env: bool = True) -> None:
    """Everything that does not depend on the request: namespaces, session, stdio, cwd, env, signals.

    `fds` become descriptors 1, 2, 3... in order; everything else above 2 is closed.
    `entered`: the namespaces the process was cloned into (see `_enter_namespaces`).
    `env`: False when the environment is set already (see `prepare_spare`).
    """
    _enter_namespaces(workdir, entered)
    os.setsid()
    high = [os.dup(fd) for fd in fds]  # move out of the way before dup2 into place
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for target, fd in enumerate(high, start=1):
        os.dup2(fd, target)
    os.closerange(len(fds) + 1, _MAX_FD)
    os.chdir(workdir)
    if env:
        _set_env(workdir)
    # `random` reseeds itself after `os.fork` (its at-fork hook); `spare_main` reseeds explicitly.
    if _STDIO is None or sys.stdout is not _STDIO[1]:  # the fork server installs them once (`premake_stdio`)
        _install_stdio(_STDIO or _make_stdio())
    # `_signal` rather than `signal`: the latter's enum conversions touch (so copy) many more pages.
    _signal.signal(signal.SIGINT, _signal.default_int_handler)
    _signal.signal(signal.SIGPIPE, _signal.SIG_DFL)
    # The code dies with a message rather than silently when it reaches its CPU limit.
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


def _install_stdio(streams: tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]) -> None:
    """`streams` as `sys.stdin`/`stdout`/`stderr` (and their `__dunder__` twins); `sys.argv` as `python -c`'s."""
    sys.argv = [""]
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


def premake_stdio() -> None:
    """Build the children's stdio objects once, in the fork server, on stand-in pipes, and install them.

    The objects only hold descriptor numbers: in a child, 1 and 2 are its output pipes
    (in the server, 0 and 1 are /dev/null and 2 is its stderr, as before). Built and
    installed here (with pipes in place, so they know they are not seekable), every child
    inherits them instead of constructing three streams itself, and no child frees the
    interpreter's own streams (which touches, so copies, some 40 pages of memory).
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
        _install_stdio(_STDIO)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, r, w):
            os.close(fd)


def _die_of(signum: int, frame: object) -> None:
    """What the default action of `signum` would do: end the process, reported as killed by it.

    The kernel does not apply it to PID 1, which a one-shot run's code is: so the signal
    goes to the status page (`CODE_KILLED`, as a session's init reports it) and the process
    exits at once, without cleanup, as the signal would have ended it.
    """
    page = _KILLED_PAGE
    if page is None or os.getpid() != 1:  # not an init: the kernel applies the default action
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    page[1] = signum
    page[0] = CODE_KILLED
    os._exit(128 + signum)


_os_abort = os.abort


def _abort() -> NoReturn:
    """`os.abort` for PID 1, where glibc's `abort` ends in SIGSEGV (its last resort) instead."""
    if os.getpid() == 1 and _KILLED_PAGE is not None:
        _die_of(signal.SIGABRT, None)
    _os_abort()


_mask_at_fork: set[int] = set()


def _block_before_fork() -> None:
    """Before the code forks: hold our signals back, so none reaches the new process before
    it has its default actions back (Python would forget one caught in between)."""
    global _mask_at_fork
    _mask_at_fork = _signal.pthread_sigmask(_signal.SIG_BLOCK, _SELF_SIGNALS)


def _unblock_after_fork() -> None:
    _signal.pthread_sigmask(_signal.SIG_SETMASK, _mask_at_fork)


def _default_actions_in_child() -> None:
    """After the code forks: its child is no init, so the kernel's default actions apply again."""
    for signum in _SELF_SIGNALS:
        if _signal.getsignal(signum) is _die_of:
            _signal.signal(signum, _signal.SIG_DFL)
    _unblock_after_fork()


def _stand_in_for_default_actions(page: mmap.mmap) -> None:
    """As PID 1, before the code runs: `_die_of` handles the signals of `_SELF_SIGNALS`.

    So `os.kill(os.getpid(), signal.SIGTERM)` or a bare `signal.alarm(1)` end the run as
    they end a script, and are reported as they are in a session (whose code is not
    PID 1, see `_fork_init`), which a one-shot run does without the cost of an init.
    A handler the code installs replaces ours, as usual; a process it forks gets the
    default actions back. Being Python handlers, they act once the main thread runs
    Python code again (not inside a long C call), and `signal.getsignal` shows them.
    """
    global _KILLED_PAGE
    _KILLED_PAGE = page
    for signum in _SELF_SIGNALS:
        _signal.signal(signum, _die_of)
    os.abort = _abort
    os.register_at_fork(
        before=_block_before_fork, after_in_parent=_unblock_after_fork, after_in_child=_default_actions_in_child
    )


def _fork_init(page: mmap.mmap) -> None:
    """As PID 1 of a session's PID namespace: fork the process that runs the code, and stay
    behind as its init.

    The kernel treats PID 1 as a namespace's init: a signal it sends itself whose action
    is the default is dropped (`os.kill(os.getpid(), SIGTERM)`, `signal.alarm` without a
    handler, even SIGKILL do nothing), and orphaned processes become its children, left
    as zombies (counted in RLIMIT_NPROC) unless it waits for them, which across a
    session's calls adds up until it cannot start a process at all. So, as tini and
    bubblewrap do, this process forks: the child returns and runs the code as PID 2, and
    this one only reaps. (A one-shot run's PID namespace dies with the run: its code
    stays PID 1, saving the fork and exit of a second interpreter; see
    `_stand_in_for_default_actions`.) When the code's process ends, the init exits with its status
    (the kernel then kills whatever else is left in the namespace); a signal that killed
    it, which an init cannot die of itself, goes to the status page (`CODE_KILLED`).
    Forked before `_prepare`, the init keeps the server's signal dispositions (ignore
    or default), so the code cannot kill it or make it raise.
    """
    if os.getpid() != 1:
        return
    # No at-fork hooks: `random` was reseeded by the fork that made us, or is after this one.
    code_pid = _linux.fork_bare()
    if code_pid == 0:
        global _UNDER_INIT
        _UNDER_INIT = True
        return
    try:
        os.closerange(0, _MAX_FD)  # the code's pipes reach EOF when the code's side closes them
        while True:
            pid, status = os.wait()
            if pid == code_pid:
                break
        if os.WIFSIGNALED(status):
            page[1] = os.WTERMSIG(status)
            page[0] = CODE_KILLED
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    finally:
        os._exit(120)  # never return into the code's path


def enter_child(workdir: str, limits: dict[str, Any], uid: int, fds: list[int], status_fd: int) -> None:
    """In a forked session child: its init (`_fork_init`), `_prepare`, then limits and the lower uid.

    `status_fd` is a memfd shared with the server (see `spare_main`); only the init uses it.
    """
    page = mmap.mmap(status_fd, mmap.PAGESIZE)
    _fork_init(page)
    page.close()
    _prepare(workdir, fds)  # closes status_fd with every other stray descriptor
    _drop_privileges(limits, uid)


def _read_to_eof(fd: int) -> bytes:
    # A pipe never returns more than its capacity (64 KiB by default) at once: asking for more
    # only makes a buffer big enough to be an mmap of its own (then an mremap), twice per run.
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def spare_main(
    workdir: str,
    uid: int,
    fds: list[int],
    status_fd: int,
    entered: int = 0,
    namespace: dict[str, Any] | None = None,
) -> NoReturn:
    """A warm spare: prepare, wait for the go message, drop privileges, run it, report, exit.

    `fds` are the stdout and stderr pipes and the read end of the go pipe (→ 1, 2, 3);
    `status_fd` is a memfd shared with the server (mapped here, then closed), for the
    status of the code (or the signal that killed it, see `_die_of`). `entered`: the
    namespaces it was cloned into (see `spare_namespaces`). `namespace`: the `__main__`
    namespace `prepare_spare` made before the clone (it set the environment and the seed
    too); None when the spare does all that itself.
    The go pipe is closed before the code runs, so the code sees only 0, 1 and 2.
    When the code is done (its non-daemon threads and `atexit` handlers too, as at
    interpreter exit), the status goes to the page shared with the server, then
    every descriptor is closed: the server answers on that EOF instead of waiting
    for the whole interpreter to be torn down (it still reaps the process after).
    """
    try:
        status = mmap.mmap(status_fd, mmap.PAGESIZE)
        prepared = namespace is not None
        if namespace is None:
            random.seed()  # the fork server forked us (`os.fork` reseeds), but as the zygote's clones do
            namespace = main_namespace()
        _prepare(workdir, fds, entered, env=not prepared)  # closes status_fd with every other stray descriptor
        if os.getpid() == 1:
            _stand_in_for_default_actions(status)
        # Take the page faults of a first exec and of decoding a request before the request.
        exec_user("pass", namespace)
        decode_go(_WARM_GO)
        status[2] = SPARE_WAITING  # (the page's first write: its fault is taken here, not after the code)
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
