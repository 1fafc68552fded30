"""The fork server: one long-lived interpreter that forks a sandboxed child per execution.

Run as `python -I -c "...main()"` by the client pool, talking frames over its stdin/stdout.
At start it moves itself into fresh mount and network namespaces (no network at all,
a read-only view of the host filesystem, a private tmpfs on /tmp) and pre-imports
common modules, so that a run costs one `fork` rather than an interpreter start. Each
child becomes PID 1 of its own PID namespace (killing it kills everything it spawned;
a session's stays there as a tiny init while the code runs in a process it forks),
drops to a per-server uid, applies rlimits, chdirs into a fresh directory and runs the
code. One-shot runs go to a *warm spare*: the next child is forked and prepared while
the server waits for the next request, so a run only pays for handing over the code,
the uid drop and rlimits, and the code itself (a server with `preload` keeps two: see
`Server.after_request`). Spares are forked by a *zygote* (see
`Server.start_zygote`) so that the server's own memory stays private between runs.
Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import math
import mmap
import os
import random
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolenv_code import _linux
from toolenv_code._child import (
    CHILD_ENV,
    CODE_KILLED,
    CPU_EXIT,
    SPARE_DONE,
    SPARE_WAITING,
    confine_children,
    enter_child,
    premake_stdio,
    prepare_spare,
    session_loop,
    spare_main,
    spare_namespaces,
    warm_interpreter,
)
from toolenv_code._confine import PRIVATE_SHM, Isolation, setup_isolation
from toolenv_code._protocol import CANCEL_OP, ProtocolError, encode_go, read_frame, write_all, write_frame


def _rmtree(path: str) -> None:
    # Imported on first use: `shutil` pulls in zlib, bz2 and lzma, and every shared library
    # mapped here makes each fork (and each child's exit) a little slower.
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):  # a directory the code locked (chmod 0) where it runs as our own uid
        _unlock_tree(path)
        shutil.rmtree(path, ignore_errors=True)


def _unlock_tree(path: str, dir_fd: int | None = None, depth: int = 0) -> None:
    """Give the owner back every right on the directories under `path`, never through a symlink.

    Without namespaces the code runs as the server's own uid, so it can make a directory of its
    work dir unreadable or unwritable, and removing it fails: run after run, such work dirs
    would pile up in the host's /tmp. Each directory is opened `O_PATH | O_NOFOLLOW` (which
    needs no right on it) and changed through its descriptor, so a symlink the code left
    there (to the host user's files) is never followed. At most 64 levels deep: a descriptor each.
    """
    if depth > 64:
        return
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=dir_fd)
    except OSError:
        return
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
        listing = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = [e.name for e in os.scandir(listing) if e.is_dir(follow_symlinks=False)]
            for name in names:
                _unlock_tree(name, listing, depth + 1)
        finally:
            os.close(listing)
    except OSError:
        pass
    finally:
        os.close(fd)


# Imported once here so every forked child starts with them loaded.
PRELOAD = (
    "bisect",
    "collections",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "itertools",
    "json",
    "math",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "textwrap",
    "typing",
    "unicodedata",
)


#: Heads output that a session printed after its previous call had returned (a daemon thread's, say).
LATE_OUTPUT = b"(printed after the previous call had returned:)\n"


class Capture:
    """Keeps the head and the tail of a stream, counting what falls in between."""

    def __init__(self, cap: int) -> None:
        self.cap = max(cap, 64)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap * 3 // 4 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            excess = len(self.tail) - self.cap // 4
            if excess > 0:
                del self.tail[:excess]

    def text(self) -> str:
        """The output as text; when some was cut, both ends of the cut are on character boundaries."""
        omitted = self.total - len(self.head) - len(self.tail)
        if omitted <= 0:
            return (self.head + self.tail).decode("utf-8", "replace")
        head, tail = _utf8_prefix(self.head), _utf8_suffix(self.tail)
        omitted = self.total - len(head) - len(tail)
        return (
            f"{head.decode('utf-8', 'replace')}\n...[{omitted} bytes truncated]...\n{tail.decode('utf-8', 'replace')}"
        )


def _utf8_prefix(data: bytearray) -> bytearray:
    """`data` without a multibyte UTF-8 character cut off at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last character's first byte
            size = 2 if byte >= 0xC0 else 1
            size = 3 if byte >= 0xE0 else size
            size = 4 if byte >= 0xF0 else size
            return data[:-back] if size > back else data
    return data


def _utf8_suffix(data: bytearray) -> bytearray:
    """`data` without the continuation bytes of a character cut off at its start."""
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
        skip += 1
    return data[skip:]


@dataclass
class Child:
    """A forked child the server watches: its pid, pidfd and output pipes."""

    pid: int
    pidfd: int
    out_r: int
    err_r: int
    workdir: str
    req_w: int = -1
    status_r: int = -1
    uid_index: int = 0
    last_used: float = field(default_factory=time.monotonic)
    exit_status: int | None = None
    #: A page shared with the child: [SPARE_DONE, exit status] once a spare's code has finished,
    #: [CODE_KILLED, signal] once the code was killed by a signal (see `_child._die_of`, `_child._fork_init`).
    done_page: mmap.mmap | None = None

    def finished(self) -> int | None:
        """The exit status a spare reported through its shared page, if it did.

        The page is mapped in the sandboxed process too: code that forges it only ends
        its own run early (and could set its exit status with `os._exit` anyway).
        """
        page = self.done_page
        return page[1] if page is not None and page[0] == SPARE_DONE else None

    def waiting(self) -> bool:
        """Whether a spare has done all its preparation and waits for its code (`_child.spare_main`)."""
        page = self.done_page
        return page is not None and page[2] == SPARE_WAITING

    def killed_by(self) -> int | None:
        """The signal that killed the code, as reported on the page: by a session's init (which
        itself exits), or by a one-shot run's stand-in for the signal's default action."""
        page = self.done_page
        return page[1] if page is not None and page[0] == CODE_KILLED else None

    def close_fds(self) -> None:
        for fd in (self.pidfd, self.out_r, self.err_r, self.req_w, self.status_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.pidfd = self.out_r = self.err_r = self.req_w = self.status_r = -1
        if self.done_page is not None:
            self.done_page.close()
            self.done_page = None


class Server:
    """Serves frames: `run`, `session_run`, `session_close`, `stats`."""

    def __init__(
        self,
        iso: Isolation,
        uid_base: int,
        max_sessions: int,
        session_idle: float,
        preload: tuple[str, ...] = (),
        work_mb: int = 256,
    ) -> None:
        self.iso = iso
        self.preload = preload  # imported by `main` before this server was made (see `preload_modules`)
        self.uid_base = uid_base if iso.uid_drop else 0
        self.max_sessions = max_sessions
        self.session_idle = session_idle
        self.sessions: dict[str, Child] = {}
        # Spares kept: two on a server with `preload`, whose larger process takes longer to clone
        # and to tear down than a call coming back to back leaves it (see `after_request`).
        self.keep_spares = 2 if preload else 1
        self.spares: list[Child] = []  # the next one-shot runs' children, forked ahead, oldest first
        self.spare_runs = {"ready": 0, "late": 0}  # runs whose spare was waiting for them, or not yet
        self.dying: list[Child] = []  # finished one-shot children, reaped after the answer
        self.zygote: socket.socket | None = None  # see `start_zygote`
        self.zygote_pid = 0
        self.counter = 0
        self.own_pidns = -1
        self.req_fd = -1  # the client's requests (see `serve`); `_collect` watches it for a cancel
        # Each child gets a /tmp, /dev/shm and /proc of its own, and a work dir of `work_mb` (the
        # pool's `tmpfs_mb`) of its own (see `_child._own_mounts`).
        self.own_mounts = iso.private_tmp and iso.private_shm
        confine_children(
            iso.child_ipc_ns, iso.child_user_ns, self.own_mounts, iso.child_socket_scope, iso.exposed, work_mb
        )
        iso.pid_ns = _pid_ns_round_trip_works()
        if iso.pid_ns:
            self.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
        with contextlib.suppress(OSError):
            _linux.set_child_subreaper()

    # -- forking
    def _workdir(self, uid: int) -> str:
        self.counter += 1
        path = os.path.join(self.iso.workroot, f"run-{os.getpid()}-{self.counter}")
        os.mkdir(path, 0o700)
        if uid > 0:
            os.chown(path, uid, uid)
        return path

    def _spawn(self, workdir: str, fds: list[int], run: Callable[[], None]) -> int:
        """Fork a child that runs `run` (never returning); close `fds` (its pipe ends) here."""
        if self.iso.pid_ns:
            _linux.unshare(_linux.CLONE_NEWPID)  # the next child is PID 1 of a fresh PID namespace
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid != 0 and self.iso.pid_ns:
            _linux.setns(self.own_pidns, _linux.CLONE_NEWPID)  # back to ours for the next unshare
        if pid == 0:  # the child: never returns
            try:
                run()
            except BaseException:  # noqa: BLE001 - a forked child must never return into the server
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
            os._exit(120)
        for fd in fds:
            os.close(fd)
        if pid < 0:
            _rmtree(workdir)
            raise OSError("fork failed")
        return pid

    def _fork(self, limits: dict[str, Any], uid_index: int) -> Child:
        """A session child: prepared, limited and running its request loop right away."""
        uid = self.uid_base + uid_index if self.uid_base else 0
        workdir = self._workdir(uid)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        req_r, req_w = os.pipe()
        status_r, status_w = os.pipe()
        fds = [out_w, err_w, req_r, status_w]
        try:
            memfd, page = _status_page()  # the init's (see `_child._fork_init`)
        except OSError:
            for fd in (*fds, out_r, err_r, req_w, status_r):
                os.close(fd)
            raise
        fds.append(memfd)

        def run() -> None:
            enter_child(workdir, limits, uid, fds[:4], memfd)
            session_loop()

        # Here only the zygote can give the session a PID namespace (see `_zygote_loop`).
        pid = self._zygote_session(workdir, uid, limits, fds) if not self.iso.pid_ns else 0
        try:
            if pid > 0:
                for fd in fds:
                    os.close(fd)
            else:
                pid = self._spawn(workdir, fds, run)
        except OSError:
            page.close()
            for fd in (out_r, err_r, req_w, status_r):
                os.close(fd)
            raise
        return Child(pid, os.pidfd_open(pid), out_r, err_r, workdir, req_w, status_r, uid_index, done_page=page)

    def _zygote_session(self, workdir: str, uid: int, limits: dict[str, Any], fds: list[int]) -> int:
        """Have the zygote clone a session child; its pid, or 0 when there is no zygote to ask."""
        self._settle_spares()  # replies come in order: the spares' are first
        if self.zygote is None:
            return 0
        message = "\0".join(("session", workdir, str(uid), json.dumps(limits))).encode()
        try:
            socket.send_fds(self.zygote, [message], fds)
            return self._zygote_pid()
        except OSError:  # the zygote is gone or cannot clone: the server forks sessions itself
            self._stop_zygote()
            return 0

    def _fork_spare(self) -> Child:
        """A warm spare for the next one-shot run (uid index 0); `req_w` is its go pipe.

        Forked by the zygote when there is one (its pid then arrives later, see `_ready`),
        else here.
        """
        uid = self.uid_base if self.uid_base else 0
        workdir = self._workdir(uid)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        go_r, go_w = os.pipe()
        theirs = [out_w, err_w, go_r]
        child = Child(0, -1, out_r, err_r, workdir, req_w=go_w)
        try:
            memfd, child.done_page = _status_page()
            theirs.append(memfd)
            if self.zygote is not None:
                try:
                    socket.send_fds(self.zygote, [f"spare\0{workdir}\0{uid}\0".encode()], theirs)
                except OSError:  # the zygote died: fork spares here from now on
                    self._stop_zygote()
            if self.zygote is None:
                child.pid = self._spawn(workdir, [], lambda: spare_main(workdir, uid, theirs[:3], memfd))
                child.pidfd = os.pidfd_open(child.pid)
        except OSError:
            child.close_fds()
            _rmtree(workdir)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return child

    def _ready(self, child: Child) -> None:
        """Learn the pid of a spare the zygote forked (it is our child all the same)."""
        if child.pid > 0:
            return
        child.pid = self._zygote_pid()
        child.pidfd = os.pidfd_open(child.pid)

    def _settle_spares(self) -> None:
        """Learn the pids of the spares the zygote forked (its replies come in the order asked);
        drop those it could not fork, and those it never will once it is gone."""
        for spare in list(self.spares):
            if spare.pid > 0:
                continue
            try:
                self._ready(spare)
            except OSError:
                self.spares.remove(spare)
                self._kill(spare)
                self._reap(spare)

    def _zygote_pid(self) -> int:
        """The zygote's reply to the oldest request not yet answered: the pid it cloned."""
        data = self.zygote.recv(8) if self.zygote is not None else b""
        pid = int.from_bytes(data, "little", signed=True) if len(data) == 4 else 0
        if pid <= 0:  # the zygote is gone or cannot clone: fork children here from now on
            self._stop_zygote()
            raise OSError(-pid if pid < 0 else 0, "the zygote could not fork a child")
        return pid

    def start_zygote(self) -> None:
        """Fork the zygote: a pristine copy of this server whose only job is forking children.

        It forks them with `clone_sibling`, so they are children of the server all the
        same, while the server itself stops forking: its memory is no longer made
        copy-on-write again before every run, so the request path takes no page faults.
        """
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            return
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                _zygote_loop(theirs, self.iso.child_user_ns)
            finally:
                os._exit(0)
        theirs.close()
        self.zygote, self.zygote_pid = ours, pid

    def _stop_zygote(self) -> None:
        if self.zygote is None:
            return
        self.zygote.close()  # it exits on EOF
        self.zygote = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.zygote_pid, 0)

    def _kill(self, child: Child) -> None:
        if child.exit_status is not None or child.pid <= 0:
            return  # reaped (the pid may belong to someone else by now) or never started
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
        if not self.iso.pid_ns:
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)

    @staticmethod
    def _wait(child: Child) -> None:
        if child.exit_status is None and child.pid > 0:
            try:
                _, status = os.waitpid(child.pid, 0)
            except ChildProcessError:  # reaped by `_reap_orphans`
                status = 0
            child.exit_status = status

    def _reap(self, child: Child) -> None:
        self._wait(child)
        child.close_fds()
        try:
            os.rmdir(child.workdir)  # most runs leave it empty
        except OSError:
            _rmtree(child.workdir)
        self._clear_shm(child)

    def _clear_shm(self, child: Child) -> None:
        """Remove what `child` left in /dev/shm, when all children of this server share it.

        Files there outlive the process that made them: without this a run or session
        could hand data to a later one (another episode's) or fill it up for all of them.
        What a child made is owned by its uid (one-shot runs: index 0, sessions: their own).
        (Normally each child has a /dev/shm of its own: see `_child._own_mounts`.)
        """
        if self.own_mounts or not (self.uid_base and self.iso.private_shm):
            return
        uid = self.uid_base + child.uid_index
        try:
            entries = list(os.scandir(PRIVATE_SHM))
        except OSError:
            return
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    _rmtree(entry.path)
                else:
                    os.unlink(entry.path)

    # -- watching
    def _collect(
        self, child: Child, timeout: float, cap: int, session: bool, late: tuple[bytes, bytes] = (b"", b"")
    ) -> dict[str, Any]:
        """Wait for the run to end, capturing its output; `late` is what a session printed between calls."""
        # `select.poll` with plain ints rather than `selectors`: far fewer Python objects
        # touched per run, so fewer copy-on-write faults on the critical path.
        out, err = Capture(cap), Capture(cap)
        for capture, data in zip((out, err), late, strict=True):
            if data:
                capture.add(b"%s%s%s" % (LATE_OUTPUT, data.removesuffix(b"\n"), b"\n(this call's output:)\n"))
        outputs = {child.out_r: out, child.err_r: err}
        poller = select.poll()
        for fd in (child.out_r, child.err_r, child.pidfd, *([child.status_r] if session else [])):
            poller.register(fd, select.POLLIN)
        if self.req_fd >= 0:
            poller.register(self.req_fd, select.POLLIN)
        start = time.monotonic()
        deadline = start + timeout
        exited = timed_out = cancelled = False
        session_status: int | None = None
        finish_by: float | None = None
        while True:
            now = time.monotonic()
            limit = deadline if finish_by is None else min(deadline, finish_by)
            if now >= limit:
                if finish_by is None:
                    timed_out = True
                break
            for fd, _ in poller.poll(math.ceil((limit - now) * 1000)):
                if fd == self.req_fd:
                    cancelled = self._cancel_requested()
                    poller.unregister(fd)
                elif fd == child.pidfd:
                    exited = True
                    poller.unregister(fd)
                elif fd == child.status_r:
                    with contextlib.suppress(ProtocolError, OSError, ValueError):
                        session_status = int(read_frame(fd)["exit_code"])
                    poller.unregister(fd)
                elif not self._read_into(fd, outputs):
                    poller.unregister(fd)
            if (exited or session_status is not None) and finish_by is None:
                # Output written before exit/status is already in the pipes; give stragglers a moment.
                finish_by = time.monotonic() + (0.0 if session and not exited else 0.25)
            if cancelled:
                break
            if exited and not outputs:
                break
            if session and session_status is not None and not exited:
                while outputs and any(self._read_into(fd, outputs) for fd, _ in poller.poll(0) if fd in outputs):
                    pass
                break
            if not outputs and not exited and child.finished() is not None:
                break  # a spare reported its status and closed its pipes: all its output is in
        duration = time.monotonic() - start
        result: dict[str, Any] = {"timed_out": timed_out, "duration": duration, "cancelled": cancelled}
        reported = None if session or timed_out or cancelled else child.finished()
        if reported is not None:
            # Answer now; the kill takes down whatever the code left behind (PID namespace),
            # and the process is reaped and its work dir removed right after the answer.
            self._kill(child)
            self._drain_nonblocking(child, out, err)
            result.update(exit_code=reported, signal=None, alive=False)
            self.dying.append(child)
        elif timed_out or cancelled or (exited and (not session or session_status is None)):
            # Killed (timed out, or its caller gave up on it), or the process ended (for a
            # session: before its call did, so the session is over).
            self._kill(child)
            self._drain_nonblocking(child, out, err)
            killed = None if timed_out or cancelled else child.killed_by()  # read before `_reap` unmaps the page
            if session:
                self._reap(child)
            else:
                self._wait(child)
                self.dying.append(child)
            status = child.exit_status or 0
            if killed is not None:
                result.update(exit_code=None, signal=killed)
            elif os.WIFSIGNALED(status):
                result.update(exit_code=None, signal=os.WTERMSIG(status))
            elif os.WEXITSTATUS(status) == CPU_EXIT:
                result.update(exit_code=None, signal=int(signal.SIGXCPU))
            else:
                result.update(exit_code=os.WEXITSTATUS(status), signal=None)
            result["alive"] = False
        else:
            result.update(exit_code=session_status, signal=None, alive=not exited)
            if exited:
                self._reap(child)
                result["alive"] = False
        result.update(stdout=out.text(), stderr=err.text(), truncated=out.total > out.cap or err.total > err.cap)
        return result

    def _cancel_requested(self) -> bool:
        """Read what came on the request pipe during a run: a cancel (or the client gone) stops it.

        The client sends nothing else while a request of its own is unanswered.
        """
        try:
            return read_frame(self.req_fd).get("op") == CANCEL_OP
        except (ProtocolError, OSError, ValueError):  # EOF: nobody is left to read the answer
            return True

    @staticmethod
    def _read_into(fd: int, outputs: dict[int, Capture]) -> bool:
        """Read what `fd` has into its capture; at EOF forget it and return False."""
        data = os.read(fd, 65536)
        if data:
            outputs[fd].add(data)
            return True
        del outputs[fd]
        return False

    @staticmethod
    def _pending(fd: int, cap: int) -> bytes:
        """What is waiting in `fd` now (up to about `cap` bytes), without blocking."""
        data = b""
        while len(data) < cap and select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
        return data

    @staticmethod
    def _drain_nonblocking(child: Child, out: Capture, err: Capture) -> None:
        for fd, cap in ((child.out_r, out), (child.err_r, err)):
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError, OSError):
                for _ in range(64):
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    cap.add(data)

    # -- operations
    def op_run(self, req: dict[str, Any]) -> dict[str, Any]:
        self._reap_dying(block=True)  # the last run's processes are gone before the next starts
        limits = req["limits"]
        go = encode_go(limits, str(req["code"]))
        for attempt in (0, 1):
            child = self.spares.pop(0) if self.spares else None  # the oldest: the zygote answers in order
            try:
                if child is None:
                    child = self._fork_spare()
                if not attempt:
                    self.spare_runs["ready" if child.waiting() else "late"] += 1
                self._ready(child)
                write_all(child.req_w, go)
            except OSError:  # no spare, or it died before its go message: try a fresh one
                if child is not None:
                    self._kill(child)
                    self._reap(child)
                if attempt:
                    raise
                self._settle_spares()  # a zygote gone leaves spares it will never fork: drop them
                continue
            os.close(child.req_w)  # EOF ends the message
            child.req_w = -1
            return self._collect(child, float(limits["timeout"]), int(limits["max_output_bytes"]), False)
        raise AssertionError("unreachable")

    def after_request(self) -> None:
        """Work kept off the critical path: reap finished runs, then fork the next spares.

        In that order: while the last run's process lives, the zygote shares its memory with
        it, and the zygote's work for the next spare (`_child.prepare_spare`) would copy every
        page it writes (the kill that ended the run has it gone within a fraction of a ms).
        A server with `preload` keeps two spares: its larger process takes a few ms to tear
        down and to clone, longer than a call coming back to back leaves it, so with one
        spare such a call waited for it; with two, it finds the older one ready. (Asking for
        the next spare before the reap, to overlap the clone with the exit, made calls 10 ms
        apart slower: 2.5 → 4.0 ms for `print(1)` with sympy, 2 CPUs.)
        """
        self._reap_dying(block=True)
        while len(self.spares) < self.keep_spares:
            try:
                self.spares.append(self._fork_spare())
            except OSError:
                return

    def _reap_dying(self, block: bool) -> None:
        """Reap finished one-shot children (all of them, waiting if need be, when `block`)."""
        still = []
        for child in self.dying:
            if not block and child.exit_status is None:
                try:
                    pid, status = os.waitpid(child.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = child.pid, 0
                if pid == 0:
                    still.append(child)
                    continue
                child.exit_status = status
            self._reap(child)
        self.dying = still

    def _evict_sessions(self) -> None:
        now = time.monotonic()
        for sid, child in list(self.sessions.items()):
            if now - child.last_used > self.session_idle:
                self._close_session(sid)
        while len(self.sessions) >= self.max_sessions:
            oldest = min(self.sessions, key=lambda s: self.sessions[s].last_used)
            self._close_session(oldest)

    def _close_session(self, sid: str) -> bool:
        child = self.sessions.pop(sid, None)
        if child is None:
            return False
        self._kill(child)
        self._reap(child)
        return True

    def op_session_run(self, req: dict[str, Any]) -> dict[str, Any]:
        sid = str(req["session"])
        limits = req["limits"]
        child = self.sessions.get(sid)
        created = child is None
        self._reap_dying(block=True)
        if child is None:
            self._evict_sessions()
            used = {c.uid_index for c in self.sessions.values()}
            index = next(i for i in range(1, self.max_sessions + 2) if i not in used)
            session_limits = dict(limits, cpu_seconds=limits["session_cpu_seconds"])
            child = self._fork(session_limits, index)
            self.sessions[sid] = child
        child.last_used = time.monotonic()
        cap = int(limits["max_output_bytes"])
        late = (b"", b"") if created else (self._pending(child.out_r, cap), self._pending(child.err_r, cap))
        try:
            write_frame(child.req_w, {"code": req["code"]})
        except OSError:
            self._close_session(sid)
            return {"error": "the session process has died; its state is gone"}
        result = self._collect(child, float(limits["timeout"]), cap, True, late)
        if not result["alive"]:
            self.sessions.pop(sid, None)
        result["new_session"] = created
        return result

    def op_session_close(self, req: dict[str, Any]) -> dict[str, Any]:
        closed = [sid for sid in req["sessions"] if self._close_session(str(sid))]
        return {"closed": closed}

    def op_stats(self, req: dict[str, Any]) -> dict[str, Any]:
        iso = self.iso
        self._settle_spares()
        spares = [spare.pid for spare in self.spares if spare.pid > 0]
        return {
            "pid": os.getpid(),
            "sessions": sorted(self.sessions),
            "spare_pid": spares[0] if spares else None,  # the next one-shot run's
            "spare_pids": spares,  # oldest (the next run's) first
            "spares_waiting": sum(spare.waiting() for spare in self.spares),
            "spare_runs": dict(self.spare_runs),
            "zygote_pid": self.zygote_pid if self.zygote else None,
            "preload": list(self.preload),
            "isolation": {
                "mount_ns": iso.mount_ns,
                "net_ns": iso.net_ns,
                "user_ns": iso.user_ns,
                "pid_ns": iso.pid_ns,
                "uid_drop": iso.uid_drop,
                "no_new_privs": iso.no_new_privs,
                "child_socket_scope": iso.child_socket_scope,
                "unix_socket_filter": iso.unix_socket_filter,
                "hidden_data": iso.hidden_data,
                "readonly_mounts": iso.readonly_mounts,
                "readonly_failures": iso.readonly_failures,
                "workroot_tmpfs": iso.private_tmp,
                "child_mounts": self.own_mounts,  # each child's own /tmp work tmpfs, /dev/shm and /proc
                "exposed": iso.exposed,
            },
        }

    def serve(self, req_fd: int, resp_fd: int) -> None:
        handlers = {
            "run": self.op_run,
            "session_run": self.op_session_run,
            "session_close": self.op_session_close,
            "stats": self.op_stats,
        }
        self.req_fd = req_fd
        while True:
            self._idle(req_fd)
            try:
                req = read_frame(req_fd)
            except (ProtocolError, OSError):
                break
            if req.get("op") == CANCEL_OP:
                continue  # for a run that had ended before it came: nothing to stop, nothing to answer
            handler = handlers.get(str(req.get("op")))
            try:
                resp = handler(req) if handler else {"error": f"unknown op {req.get('op')!r}"}
            except Exception as exc:  # noqa: BLE001 - every request gets an answer
                resp = {"error": f"sandbox server error: {type(exc).__name__}: {exc}"}
            write_frame(resp_fd, resp)
            self.after_request()
            self._reap_orphans()
        self.close()

    def close(self) -> None:
        """Kill the spares, the dying and every session, and remove their work dirs."""
        spares, self.spares = self.spares, []
        for spare in spares:  # in the order asked: the zygote's replies come in that order
            with contextlib.suppress(OSError):
                self._ready(spare)
            self.dying.append(spare)
        for child in self.dying:
            self._kill(child)
        while self.dying:
            self._reap(self.dying.pop())
        for sid in list(self.sessions):
            self._close_session(sid)
        self._stop_zygote()
        if not self.iso.private_tmp:
            _rmtree(self.iso.workroot)

    def _idle(self, req_fd: int) -> None:
        """Until the next request arrives, reap one-shot children as they finish."""
        while self.dying:
            ready = select.select([req_fd, *(c.pidfd for c in self.dying)], [], [])[0]
            self._reap_dying(block=False)
            if req_fd in ready:
                return

    def _reap_orphans(self) -> None:
        """Collect zombies reparented to us (we are a subreaper); note dead children of ours."""
        children = [*self.sessions.values(), *self.dying, *self.spares]
        by_pid = {c.pid: c for c in children}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in by_pid:
                by_pid[pid].exit_status = status


def _status_page() -> tuple[int, mmap.mmap]:
    """A child's status page: a memfd (for the child, which maps it and closes its descriptor
    at once) and our mapping of it (see `Child.done_page`)."""
    memfd = os.memfd_create("toolenv-status", os.MFD_CLOEXEC)
    try:
        os.ftruncate(memfd, mmap.PAGESIZE)
        return memfd, mmap.mmap(memfd, mmap.PAGESIZE)
    except OSError:
        os.close(memfd)
        raise


def _pid_ns_round_trip_works() -> bool:
    """Whether this process may `unshare(CLONE_NEWPID)` and `setns` back, as `_spawn` does per child.

    Tried in a throwaway child: in a user namespace the `unshare` succeeds but the way back
    is refused, and a process left with a pending PID namespace can fork only until the
    first child in it (its init) exits; every later fork then fails.
    """
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:
        try:
            own = os.open("/proc/self/ns/pid", os.O_RDONLY)
            _linux.unshare(_linux.CLONE_NEWPID)
            _linux.setns(own, _linux.CLONE_NEWPID)
        except BaseException:  # noqa: BLE001 - a forked child must never return into the server
            os._exit(1)
        os._exit(0)
    return os.waitpid(pid, 0)[1] == 0


def _zygote_loop(sock: socket.socket, user_ns_fd: int | None) -> None:
    """The zygote: for each (kind, work dir, uid, extra, descriptors) message, clone a spare or
    (where the server cannot give one a PID namespace) a session child; reply with its pid.

    Each child gets a PID namespace of its own wherever `clone3(CLONE_NEWPID)` is allowed,
    which includes a user namespace, where the server's own unshare-and-back (`_spawn`) is
    refused; where it is not allowed, children are cloned without one from then on.
    Spares are cloned into their other new namespaces too (`spare_namespaces`), which
    saves them the calls that enter them; where that is refused, they enter them themselves.
    """
    pid_ns = True
    spare_ns = spare_namespaces()
    # None of the server's descriptors (the client's pipes above all), but the socket and
    # the user namespace the children join.
    keep = sorted({sock.fileno(), *([user_ns_fd] if user_ns_fd is not None and user_ns_fd >= 0 else [])})
    for low, high in zip([2, *keep], [*keep, 1 << 20], strict=True):
        os.closerange(low + 1, high)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 5)
        except OSError:
            return
        if not msg or len(fds) not in (4, 5):
            return
        kind, workdir, uid, extra = msg.decode().split("\0", 3)
        namespaces = spare_ns if kind == "spare" else 0
        namespace = None
        while True:
            try:
                if kind == "spare" and namespace is None:
                    namespace = prepare_spare(workdir)
                pid = _linux.clone_sibling(pid_ns, namespaces)
                break
            except OSError as exc:
                pid = -(exc.errno or 1)
                if exc.errno not in (errno.EPERM, errno.EINVAL, errno.ENOSPC, errno.EUSERS):
                    break
                if namespaces:  # from now on spares enter them themselves, as sessions do
                    spare_ns = namespaces = 0
                elif pid_ns:
                    pid_ns = False
                else:
                    break
        if pid == 0:
            try:
                if kind == "session":
                    enter_child(workdir, json.loads(extra), int(uid), fds[:4], fds[4])
                    random.seed()  # a clone ran no at-fork hooks: not the zygote's sequence
                    session_loop()
                else:
                    spare_main(workdir, int(uid), fds[:3], fds[3], namespaces, namespace)
            finally:
                os._exit(120)
        for fd in fds:
            os.close(fd)
        sock.send(pid.to_bytes(4, "little", signed=True))


def preload_modules(names: list[str]) -> str | None:
    """Import the pool's `preload` modules here, once, for every child: None, or why it failed.

    A module that starts a thread at import is refused: a fork copies only the forking thread,
    so each child would hold the module's state without the thread that serves it (and any
    lock that thread held, for ever).
    """
    for name in names:
        try:
            __import__(name)
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the client must hear why
            return f"could not pre-import {name!r}: {type(exc).__name__}: {exc}"
    try:
        threads = len(os.listdir("/proc/self/task")) - 1
    except OSError:  # no /proc to ask: trust the modules
        threads = 0
    if threads > 0:
        return (
            f"pre-importing {', '.join(names)} started {threads} thread(s) in the fork server, which must stay "
            "single-threaded to fork: pre-import only modules that start no thread at import"
        )
    return None


def main(argv: list[str] | None = None) -> None:
    """Entry point: `main([uid_base, tmpfs_mb, max_sessions, session_idle_seconds, preload_json,
    other_data_json])` (the last: the other plugins' data folders to cover, `plugin_data_dirs`)."""
    args = sys.argv[1:] if argv is None else argv
    uid_base, tmpfs_mb, max_sessions, session_idle = int(args[0]), int(args[1]), int(args[2]), float(args[3])
    preload = [str(name) for name in json.loads(args[4])] if len(args) > 4 else []
    other_data = [str(path) for path in json.loads(args[5])] if len(args) > 5 else []
    req_fd, resp_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.environ.clear()  # children inherit this environment, not the host's
    os.environ.update(CHILD_ENV)
    for name in PRELOAD:
        __import__(name)
    failed = preload_modules(preload)
    if failed is not None:
        write_frame(resp_fd, {"ready": False, "error": failed})
        sys.exit(1)
    warm_interpreter()
    premake_stdio()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client closes us, not Ctrl-C
    iso = setup_isolation(tmpfs_mb, uid_base, other_data)
    server = Server(iso, uid_base, max_sessions, session_idle, tuple(preload), work_mb=tmpfs_mb)
    # Objects alive now are never collected: a GC pass in a child would otherwise write to
    # (and so copy) every page of the heap shared with the server.
    gc.collect()
    gc.freeze()
    server.start_zygote()
    server.after_request()  # the first spares
    write_frame(resp_fd, {"ready": True, **server.op_stats({})})
    server.serve(req_fd, resp_fd)
