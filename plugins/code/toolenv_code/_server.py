"""The fork server: one long-lived interpreter that forks a sandboxed child per execution.

Run as `python -I -c "...main()"` by the client pool, talking frames over its stdin/stdout.
At start it moves itself into fresh mount and network namespaces (no network at all,
a read-only view of the host filesystem, a private tmpfs on /tmp) and pre-imports
common modules, so that a run costs one `fork` rather than an interpreter start. Each
child becomes PID 1 of its own PID namespace (killing it kills everything it spawned),
drops to a per-server uid, applies rlimits, chdirs into a fresh directory and runs the
code. Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from toolenv_code import _linux
from toolenv_code._child import CPU_EXIT, enter_child, exec_user, fresh_namespace, session_loop
from toolenv_code._confine import Isolation, setup_isolation
from toolenv_code._protocol import ProtocolError, read_frame, write_frame

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
    "re",
    "statistics",
    "string",
    "textwrap",
    "typing",
    "unicodedata",
)


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
        omitted = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", "replace")
        if omitted <= 0:
            return head + self.tail.decode("utf-8", "replace")
        return f"{head}\n...[{omitted} bytes truncated]...\n{self.tail.decode('utf-8', 'replace')}"


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

    def close_fds(self) -> None:
        for fd in (self.pidfd, self.out_r, self.err_r, self.req_w, self.status_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


class Server:
    """Serves frames: `run`, `session_run`, `session_close`, `stats`."""

    def __init__(self, iso: Isolation, uid_base: int, max_sessions: int, session_idle: float) -> None:
        self.iso = iso
        self.uid_base = uid_base if iso.uid_drop else 0
        self.max_sessions = max_sessions
        self.session_idle = session_idle
        self.sessions: dict[str, Child] = {}
        self.counter = 0
        self.own_pidns = -1
        try:
            self.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
            _linux.unshare(_linux.CLONE_NEWPID)
            _linux.setns(self.own_pidns, _linux.CLONE_NEWPID)
            iso.pid_ns = True
        except OSError:
            iso.pid_ns = False
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

    def _fork(self, limits: dict[str, Any], uid_index: int, session: bool) -> Child:
        uid = self.uid_base + uid_index if self.uid_base else 0
        workdir = self._workdir(uid)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds = [out_w, err_w]
        req_r = req_w = status_r = status_w = -1
        if session:
            req_r, req_w = os.pipe()
            status_r, status_w = os.pipe()
            fds += [req_r, status_w]
        if self.iso.pid_ns:
            _linux.unshare(_linux.CLONE_NEWPID)  # the next child is PID 1 of a fresh PID namespace
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid != 0 and self.iso.pid_ns:
            _linux.setns(self.own_pidns, _linux.CLONE_NEWPID)  # back to ours for the next unshare
        if pid < 0:
            for fd in (out_r, out_w, err_r, err_w, req_r, req_w, status_r, status_w):
                if fd >= 0:
                    os.close(fd)
            shutil.rmtree(workdir, ignore_errors=True)
            raise OSError("fork failed")
        if pid == 0:  # the child: never returns
            try:
                enter_child(workdir, limits, uid, fds)
                if session:
                    session_loop()
                os._exit(exec_user(limits["code"], fresh_namespace()))
            except BaseException:  # noqa: BLE001 - a forked child must never return into the server
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
                os._exit(120)
        for fd in (out_w, err_w, req_r, status_w):
            if fd >= 0:
                os.close(fd)
        return Child(pid, os.pidfd_open(pid), out_r, err_r, workdir, req_w, status_r, uid_index)

    def _kill(self, child: Child) -> None:
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGKILL)
        if not self.iso.pid_ns:
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)

    def _reap(self, child: Child) -> None:
        if child.exit_status is None:
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(child.pid, 0)
                child.exit_status = status
        child.close_fds()
        shutil.rmtree(child.workdir, ignore_errors=True)

    # -- watching
    def _collect(self, child: Child, timeout: float, cap: int, session: bool) -> dict[str, Any]:
        out, err = Capture(cap), Capture(cap)
        sel = selectors.DefaultSelector()
        sel.register(child.out_r, selectors.EVENT_READ, out)
        sel.register(child.err_r, selectors.EVENT_READ, err)
        sel.register(child.pidfd, selectors.EVENT_READ, "exit")
        if session:
            sel.register(child.status_r, selectors.EVENT_READ, "status")
        start = time.monotonic()
        deadline = start + timeout
        exited = timed_out = False
        session_status: int | None = None
        finish_by: float | None = None
        while True:
            now = time.monotonic()
            limit = deadline if finish_by is None else min(deadline, finish_by)
            if now >= limit:
                if finish_by is None:
                    timed_out = True
                break
            events = sel.select(limit - now)
            for key, _ in events:
                if key.data == "exit":
                    exited = True
                    sel.unregister(child.pidfd)
                elif key.data == "status":
                    with contextlib.suppress(ProtocolError, OSError, ValueError):
                        session_status = int(read_frame(child.status_r)["exit_code"])
                    sel.unregister(child.status_r)
                else:
                    data = os.read(key.fd, 65536)
                    if data:
                        key.data.add(data)
                    else:
                        sel.unregister(key.fd)
            outputs_open = child.out_r in sel.get_map() or child.err_r in sel.get_map()
            if (exited or session_status is not None) and finish_by is None:
                # Output written before exit/status is already in the pipes; give stragglers a moment.
                finish_by = time.monotonic() + (0.0 if session and not exited else 0.25)
            if exited and not outputs_open:
                break
            if session and session_status is not None and not exited:
                self._drain(sel)
                break
        sel.close()
        duration = time.monotonic() - start
        result: dict[str, Any] = {"timed_out": timed_out, "duration": duration}
        if timed_out or (exited and not session):
            self._kill(child)
            self._drain_nonblocking(child, out, err)
            self._reap(child)
            status = child.exit_status or 0
            if os.WIFSIGNALED(status):
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

    @staticmethod
    def _drain(sel: selectors.BaseSelector) -> None:
        while True:
            events = sel.select(0)
            got = False
            for key, _ in events:
                if isinstance(key.data, Capture):
                    data = os.read(key.fd, 65536)
                    if data:
                        key.data.add(data)
                        got = True
                    else:
                        sel.unregister(key.fd)
            if not got:
                return

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
        limits = dict(req["limits"], code=req["code"])
        child = self._fork(limits, 0, session=False)
        return self._collect(child, float(req["limits"]["timeout"]), int(req["limits"]["max_output_bytes"]), False)

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
        if child is None:
            self._evict_sessions()
            used = {c.uid_index for c in self.sessions.values()}
            index = next(i for i in range(1, self.max_sessions + 2) if i not in used)
            session_limits = dict(limits, cpu_seconds=limits["session_cpu_seconds"])
            child = self._fork(session_limits, index, session=True)
            self.sessions[sid] = child
        child.last_used = time.monotonic()
        try:
            write_frame(child.req_w, {"code": req["code"]})
        except OSError:
            self._close_session(sid)
            return {"error": "the session process has died; its state is gone"}
        result = self._collect(child, float(limits["timeout"]), int(limits["max_output_bytes"]), True)
        if not result["alive"]:
            self.sessions.pop(sid, None)
        result["new_session"] = created
        return result

    def op_session_close(self, req: dict[str, Any]) -> dict[str, Any]:
        closed = [sid for sid in req["sessions"] if self._close_session(str(sid))]
        return {"closed": closed}

    def op_stats(self, req: dict[str, Any]) -> dict[str, Any]:
        iso = self.iso
        return {
            "pid": os.getpid(),
            "sessions": sorted(self.sessions),
            "isolation": {
                "mount_ns": iso.mount_ns,
                "net_ns": iso.net_ns,
                "user_ns": iso.user_ns,
                "pid_ns": iso.pid_ns,
                "uid_drop": iso.uid_drop,
                "readonly_mounts": iso.readonly_mounts,
                "readonly_failures": iso.readonly_failures,
                "workroot_tmpfs": iso.private_tmp,
            },
        }

    def serve(self, req_fd: int, resp_fd: int) -> None:
        handlers = {
            "run": self.op_run,
            "session_run": self.op_session_run,
            "session_close": self.op_session_close,
            "stats": self.op_stats,
        }
        while True:
            try:
                req = read_frame(req_fd)
            except (ProtocolError, OSError):
                break
            handler = handlers.get(str(req.get("op")))
            try:
                resp = handler(req) if handler else {"error": f"unknown op {req.get('op')!r}"}
            except Exception as exc:  # noqa: BLE001 - every request gets an answer
                resp = {"error": f"sandbox server error: {type(exc).__name__}: {exc}"}
            write_frame(resp_fd, resp)
            self._reap_orphans()
        for sid in list(self.sessions):
            self._close_session(sid)
        if not self.iso.private_tmp:
            shutil.rmtree(self.iso.workroot, ignore_errors=True)

    def _reap_orphans(self) -> None:
        """Collect zombies reparented to us (we are a subreaper); note dead sessions."""
        by_pid = {c.pid: c for c in self.sessions.values()}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in by_pid:
                by_pid[pid].exit_status = status


def main(argv: list[str] | None = None) -> None:
    """Entry point: `main([uid_base, tmpfs_mb, max_sessions, session_idle_seconds])`."""
    args = sys.argv[1:] if argv is None else argv
    uid_base, tmpfs_mb, max_sessions, session_idle = int(args[0]), int(args[1]), int(args[2]), float(args[3])
    req_fd, resp_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    for name in PRELOAD:
        __import__(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client closes us, not Ctrl-C
    iso = setup_isolation(tmpfs_mb, uid_base)
    server = Server(iso, uid_base, max_sessions, session_idle)
    write_frame(resp_fd, {"ready": True, **server.op_stats({})})
    server.serve(req_fd, resp_fd)
