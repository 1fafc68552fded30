"""The process-wide sandbox pool: warm fork servers, limits, and typed results.

One pool serves every env and tool in a process (1,024 envs make one pool, not
1,024), started on first use and closed at exit. The pool is thread-based rather
than asyncio-based because envs each run their own event loop; async callers go
through `asyncio.to_thread`. A fork server that dies is replaced on the next call,
and the call that saw it die is retried once on the fresh server.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolenv_code._protocol import CANCEL_OP, ProtocolError, read_frame, write_frame

__all__ = [
    "ExecResult",
    "SandboxLimits",
    "SandboxPool",
    "arun_code",
    "get_pool",
    "preload_names",
    "run_code",
    "shutdown_pool",
]


class SandboxLimits(BaseModel):
    """Limits applied to every execution (each is enforced by the kernel, except `timeout`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float = Field(default=10.0, gt=0, description="Wall-clock seconds before the run is killed.")
    cpu_seconds: int = Field(default=10, ge=1, description="RLIMIT_CPU of a one-shot run.")
    session_cpu_seconds: int = Field(default=120, ge=1, description="RLIMIT_CPU of a whole stateful session.")
    memory_mb: int = Field(
        default=1024,
        ge=64,
        description=(
            "RLIMIT_AS (address space) in MiB, of each process: a run that forks may use up to "
            "memory_mb x max_processes in all (there is no cgroup)."
        ),
    )
    max_processes: int = Field(
        default=32,
        ge=1,
        description="RLIMIT_NPROC: processes of the sandbox's uid; also multiplies memory_mb (see there).",
    )
    file_size_mb: int = Field(default=16, ge=1, description="RLIMIT_FSIZE: largest file the code may write.")
    max_open_files: int = Field(default=64, ge=8, description="RLIMIT_NOFILE.")
    max_output_bytes: int = Field(default=65536, ge=256, description="Output kept per stream (head and tail).")


class ExecResult(BaseModel):
    """What one execution produced."""

    model_config = ConfigDict(extra="forbid")

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = Field(default=None, description="Exit status; None when killed by a signal.")
    signal: int | None = Field(default=None, description="The signal that killed the process, if any.")
    timed_out: bool = False
    truncated: bool = Field(default=False, description="Output exceeded `max_output_bytes` and was cut.")
    duration: float = Field(default=0.0, description="Seconds from handing the code over to its end.")
    error: str | None = Field(default=None, description="A sandbox failure (not the code's own error).")
    new_session: bool = Field(default=False, description="A stateful call that started a fresh session.")
    session_ended: bool = Field(
        default=False, description="A stateful call after which the session is gone (killed, or its process ended)."
    )

    @property
    def ok(self) -> bool:
        """True when the code ran to completion with exit status 0."""
        return self.error is None and not self.timed_out and self.exit_code == 0


class _Call:
    """One call's place in a session's line (`SandboxPool._line_up`); `gone` once its caller
    gave up on it (`SandboxPool.arun`); `server` while its request there is unanswered."""

    __slots__ = ("gone", "server")

    def __init__(self) -> None:
        self.gone = False
        self.server: _Server | None = None


_UIDS_PER_SERVER = 64  # one for one-shot runs, one per live session


@functools.lru_cache(maxsize=1)
def _plugin_data_dirs() -> tuple[str, ...]:
    """The other toolenv plugins' data folders, for each fork server to cover (found once per
    process, here rather than in the server: see `_confine.setup_isolation`)."""
    from toolenv_code._confine import plugin_data_dirs

    return tuple(plugin_data_dirs())


def _uid_base(slot: int) -> int:
    # A distinct uid range per (host process, server) keeps RLIMIT_NPROC per sandbox:
    # the kernel counts processes per uid, and root ignores the limit altogether.
    return 200_000 + ((os.getpid() % 4096) * 64 + slot % 64) * _UIDS_PER_SERVER


class _Server:
    """The client end of one fork server process."""

    def __init__(
        self, slot: int, tmpfs_mb: int, max_sessions: int, session_idle: float, preload: tuple[str, ...]
    ) -> None:
        self.slot = slot
        root = str(Path(__file__).resolve().parent.parent)
        boot = f"import sys; sys.path.insert(0, {root!r}); from toolenv_code._server import main; main()"
        args = [str(_uid_base(slot)), str(tmpfs_mb), str(max_sessions), str(session_idle), json.dumps(preload)]
        args.append(json.dumps(_plugin_data_dirs()))
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", boot, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,  # Ctrl-C in the host terminal must not kill the servers
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.req_fd = self.proc.stdin.fileno()
        self.resp_fd = self.proc.stdout.fileno()
        try:
            self.hello = read_frame(self.resp_fd)
        except (ProtocolError, OSError) as exc:  # it died at start: reap it, and say so in one line
            self.close()
            raise RuntimeError(
                f"the sandbox server did not start (exit status {self.proc.returncode}; "
                "its own error, if any, is on this process's stderr)"
            ) from exc
        if self.hello.get("ready") is False:  # it said why (a `preload` module failed to import)
            self.close()
            raise RuntimeError(f"the sandbox server did not start: {self.hello.get('error')}")
        self.busy = False
        self.sessions: set[str] = set()
        # Held to write a frame: a cancel (from the caller's thread) must not land inside a
        # request being written, nor be sent once its request has been answered.
        self.write_lock = threading.Lock()

    def request(self, obj: dict[str, Any], call: _Call | None = None) -> dict[str, Any]:
        """Send `obj` and wait for the answer; for `call`, `_ABANDONED_RESP` without sending
        when its caller has given up already, else a `cancel` may stop it while it runs."""
        with self.write_lock:
            if call is not None and call.gone:
                return dict(_ABANDONED_RESP)
            write_frame(self.req_fd, obj)
            if call is not None:
                call.server = self
        try:
            return read_frame(self.resp_fd)
        finally:
            if call is not None:
                with self.write_lock:
                    call.server = None

    @staticmethod
    def cancel(call: _Call) -> None:
        """Stop `call`'s run if its request is on a server now (as its timeout would: the
        server kills the run's processes, answers, and is free for the next call).

        Set `call.gone` first: a request not sent yet then never is (`request`).
        """
        server = call.server
        if server is None:
            return
        with server.write_lock:
            stdin = server.proc.stdin
            if call.server is server and stdin is not None and not stdin.closed:
                with contextlib.suppress(OSError):  # the server died: the run died with it
                    write_frame(server.req_fd, {"op": CANCEL_OP})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SandboxPool:
    """A fixed number of fork servers; each runs one execution at a time.

    Args:
        size: fork servers (parallel executions), at least 1; default: CPU count, at least 2.
        tmpfs_mb: size cap of each run's and each session's work directory, a tmpfs of its own
            (its /tmp, `HOME` and `TMPDIR`), so one that fills its own leaves the others room.
            It is memory, taken only as files are written: a server may hold this much for each
            live session and for its one-shot run at once (`max_sessions` + 1 times).
        max_sessions: live stateful sessions per server; the least recently used is evicted.
        session_idle: seconds after which an idle session is dropped.
        preload: modules every server imports once at start, so that a run's `import` of them
            costs nothing (`("sympy", "numpy")` for math code; a comma-separated string works
            too). They must be importable by this Python and start no thread at import.

    Raises:
        ValueError: a bad `size` or `max_sessions`, or a `preload` name that is not a module here.
    """

    def __init__(
        self,
        size: int | None = None,
        *,
        tmpfs_mb: int = 256,
        max_sessions: int = 16,
        session_idle: float = 900.0,
        preload: Sequence[str] | str = (),
    ) -> None:
        if not sys.platform.startswith("linux"):
            raise RuntimeError(
                f"the code sandbox needs Linux (namespaces, pidfds, rlimits); this is {sys.platform}. "
                "Run it in a Linux container or VM."
            )
        if size is not None and size < 1:  # no server at all: every call would wait forever
            raise ValueError(f"size must be at least 1 (or None for the CPU count), got {size}")
        if not 1 <= max_sessions <= _UIDS_PER_SERVER - 2:
            raise ValueError(f"max_sessions must be between 1 and {_UIDS_PER_SERVER - 2}, got {max_sessions}")
        self.size = size or max(2, os.cpu_count() or 2)
        self.preload = preload_names(preload)
        self._opts = (tmpfs_mb, max_sessions, session_idle, self.preload)
        self._servers: list[_Server | None] = [None] * self.size
        self._busy = [False] * self.size
        self._next = 0
        self._cond = threading.Condition()
        self._session_slot: dict[str, int] = {}
        self._pending_close: list[str] = []
        self._close_slots: set[int] = set()  # servers with a close to send (see `_closer_loop`)
        self._closer: threading.Thread | None = None
        self._lines: dict[str, list[_Call]] = {}  # per session: its calls waiting, in the order made
        self._closed = False
        self.restarts = 0

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy (pickle, `copy.deepcopy`) is the process-wide pool of the process it lands in
        when this is that pool, else a new pool with the same settings whose servers start on
        first use: pipes and threads cannot be copied, and a copy shares no server or session."""
        if _POOLS.get(self.preload) is self:
            return (get_pool, (self.preload,))
        return (_new_pool, (self.size, *self._opts))

    # -- slots
    def _acquire(self, slot: int | None, call: _Call | None = None, session: str | None = None) -> int:
        """A free server's slot (`slot` itself when given), taken by `call` only once the calls
        made before it in `session` have taken theirs (see `_line_up`); -1 once `call.gone`."""
        with self._cond:
            try:
                return self._wait_for_slot(slot, call, session)
            except BaseException:  # closed, or a Ctrl-C while it waits: the session's next calls go on
                if session is not None and call is not None:
                    self._leave_line(session, call)
                raise

    def _wait_for_slot(self, slot: int | None, call: _Call | None, session: str | None) -> int:
        """`_acquire`, with `_cond` held."""
        while True:
            if self._closed:
                raise RuntimeError("the sandbox pool is closed")
            if call is not None and call.gone:
                if session is not None:
                    self._leave_line(session, call)
                return -1
            if slot is not None:
                line = self._lines.get(session) if session is not None else None
                if not self._busy[slot] and (not line or line[0] is call):
                    self._busy[slot] = True
                    if line and call is not None and session is not None:
                        self._leave_line(session, call)  # the next in line waits for this slot now
                    return slot
            else:
                # Round robin: the least recently used server has had longest to fork its spare.
                for k in range(self.size):
                    i = (self._next + k) % self.size
                    if not self._busy[i]:
                        self._busy[i] = True
                        self._next = i + 1
                        return i
            self._cond.wait()

    def _line_up(self, session: str, call: _Call) -> None:
        """Put `call` in `session`'s line: a session runs its calls in the order they were made
        (a turn's tool calls run concurrently, and their worker threads start in any order)."""
        with self._cond:
            self._lines.setdefault(session, []).append(call)

    def _leave_line(self, session: str, call: _Call) -> None:
        """Take `call` out of `session`'s line (with `_cond` held); the next in line may go."""
        line = self._lines.get(session)
        if line is None:
            return
        with contextlib.suppress(ValueError):
            line.remove(call)  # by identity: a `_Call` equals only itself
        if not line:
            del self._lines[session]
        self._cond.notify_all()

    def _release(self, slot: int) -> None:
        with self._cond:
            self._busy[slot] = False
            self._cond.notify_all()

    def _server(self, slot: int) -> _Server:
        if self._closed:
            raise RuntimeError("the sandbox pool is closed")
        server = self._servers[slot]
        if server is None or not server.alive():
            if server is not None:
                self.restarts += 1
                server.close()
                with self._cond:  # its sessions died with it: nothing to close on the next one
                    for sid in server.sessions:
                        self._session_slot.pop(sid, None)
                    self._pending_close = [sid for sid in self._pending_close if sid not in server.sessions]
            server = _Server(slot, *self._opts)
            self._servers[slot] = server
        return server

    def _call(self, slot: int, obj: dict[str, Any], call: _Call | None = None) -> dict[str, Any]:
        """One request on `slot` (for `call`: see `_Server.request`), retried once on a fresh
        server if the server died."""
        for attempt in (0, 1):
            server = self._server(slot)
            self._flush_closes(slot, server)
            try:
                return server.request(obj, call)
            except (ProtocolError, OSError):
                server.close()
                if attempt or obj["op"] == "session_run":
                    return {"error": "the sandbox server died during the call; it has been restarted"}
        raise AssertionError("unreachable")

    def _flush_closes(self, slot: int, server: _Server) -> None:
        with self._cond:
            mine = [sid for sid in self._pending_close if sid in server.sessions]
            self._pending_close = [sid for sid in self._pending_close if sid not in server.sessions]
        if mine:
            with contextlib.suppress(ProtocolError, OSError):
                server.request({"op": "session_close", "sessions": mine})
            server.sessions.difference_update(mine)

    # -- public API
    def run(self, code: str, limits: SandboxLimits | None = None, *, session: str | None = None) -> ExecResult:
        """Run `code` in a fresh sandboxed process, or in stateful `session` (blocking, thread-safe)."""
        call = _Call()
        if session is None:
            return self._run(code, limits, None, call)
        self._line_up(session, call)
        try:
            return self._run(code, limits, session, call)
        except BaseException:  # (out of line already once it had its slot) the session's next calls go on
            with self._cond:
                self._leave_line(session, call)
            raise

    def _run(self, code: str, limits: SandboxLimits | None, session: str | None, call: _Call) -> ExecResult:
        """`run` for `call` (in `session`'s line already); `call.gone` set while it waits for a
        server: it returns without running the code."""
        lim = (limits or SandboxLimits()).model_dump()
        if session is None:
            slot = self._acquire(None, call)
            if slot < 0:
                return ExecResult(error=_ABANDONED)
            try:
                resp = self._call(slot, {"op": "run", "code": code, "limits": lim}, call)
            finally:
                self._release(slot)
            return _result(resp)
        with self._cond:
            pinned = self._session_slot.get(session)
            new_pin = pinned is None
            if pinned is None:
                load = [0] * self.size
                for used in self._session_slot.values():
                    load[used] += 1
                pinned = self._session_slot[session] = load.index(min(load))
        slot = self._acquire(pinned, call, session)
        if slot < 0:
            return self._abandoned(session, pinned, new_pin)
        try:
            server = self._server(slot)
            with self._cond:  # a restart of the server forgot the session's pin: it stays on this one
                self._session_slot[session] = slot
            known = session in server.sessions
            server.sessions.add(session)
            resp = self._call(slot, {"op": "session_run", "session": session, "code": code, "limits": lim}, call)
            if resp.get("abandoned"):  # never sent: the session is as it was
                if not known:
                    server.sessions.discard(session)
                return self._abandoned(session, slot, new_pin)
            if resp.get("error") or not resp.get("alive", False):
                server.sessions.discard(session)
                with self._cond:
                    self._session_slot.pop(session, None)
        finally:
            self._release(slot)
        result = _result(resp)
        result.session_ended = result.error is None and not resp.get("alive", False)
        return result

    def _abandoned(self, session: str, pinned: int, new_pin: bool) -> ExecResult:
        """The result of a session call given up on before it was sent."""
        with self._cond:  # a session it would have started: no pin left to skew the balance
            if new_pin and self._session_slot.get(session) == pinned:
                del self._session_slot[session]
        return ExecResult(error=_ABANDONED)

    async def arun(self, code: str, limits: SandboxLimits | None = None, *, session: str | None = None) -> ExecResult:
        """`run` from async code (in a worker thread, so any event loop may call it).

        Cancelled (a tool's timeout, say), the call stops at once and the cancellation goes
        on to the caller. Still waiting for a free server, it is dropped rather than run
        later: its caller was told it failed, a session's next call could otherwise run before
        it, and abandoned calls would keep a busy pool busier. Already running, its run is
        killed as its own timeout would kill it (a session's process too: the session's next
        call starts a fresh one and says so), so that its server is free for the next call
        rather than busy until the sandbox's timeout.
        """
        call = _Call()
        if session is not None:
            self._line_up(session, call)  # here, in the order the calls are made
        try:
            return await asyncio.to_thread(self._run, code, limits, session, call)
        except BaseException:  # cancelled, most often: out of line even if its job never starts
            call.gone = True
            _Server.cancel(call)  # blocks at most while its own request is being written
            with self._cond:  # and its thread, if it waits, wakes to give back its worker
                if session is not None:
                    self._leave_line(session, call)
                self._cond.notify_all()
            raise

    def close_session(self, session: str) -> None:
        """Forget `session` and have its processes killed (never blocks).

        The close goes to its server at once when that server is free, else as soon as the
        call running there ends (`_closer_loop`): between a rollout batch and the training
        step no call comes, and a closed episode's processes must not run through training.
        """
        with self._cond:
            slot = self._session_slot.pop(session, None)
            if slot is None:
                return
            self._pending_close.append(session)
            self._close_slots.add(slot)
            self._cond.notify_all()
            closer = self._closer
            if closer is not None and closer.is_alive():
                return
            closer = threading.Thread(target=self._closer_loop, name="toolenv-sandbox-closer", daemon=True)
            # Interpreter shutdown refuses new threads: the close then waits for the server's next request.
            with contextlib.suppress(RuntimeError):
                closer.start()
                self._closer = closer

    def _closer_loop(self) -> None:
        """Send queued session closes, one server at a time, each as soon as that server is free."""
        while True:
            with self._cond:
                while not self._closed and not self._close_slots:
                    self._cond.wait()
                if self._closed:
                    return
                slot = self._close_slots.pop()
            try:
                self._acquire(slot)
            except RuntimeError:  # the pool was closed: its servers took their sessions with them
                return
            try:
                server = self._servers[slot]
                if server is not None and server.alive():  # a dead one's sessions died with it
                    self._flush_closes(slot, server)
            finally:
                self._release(slot)

    def stats(self) -> list[dict[str, Any]]:
        """Each server's pid, live sessions and isolation setup (starts the servers)."""
        out = []
        for slot in range(self.size):
            self._acquire(slot)
            try:
                out.append(self._call(slot, {"op": "stats"}))
            finally:
                self._release(slot)
        return out

    def close(self) -> None:
        """Stop every server (their sessions die with them)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            servers, self._servers = self._servers, [None] * self.size
        for i, server in enumerate(servers):
            if server is None:
                continue
            try:
                server.close()
            except BaseException:  # a Ctrl-C while waiting: the servers left are killed, not waited for
                for rest in servers[i:]:
                    if rest is not None:
                        rest.proc.kill()
                raise


#: The result of a call given up on while it waited for a server (nobody reads it).
_ABANDONED = "the call was abandoned before a sandbox server was free"
#: `_Server.request`'s answer for such a call, which it never sent.
_ABANDONED_RESP = {"error": _ABANDONED, "abandoned": True}
#: The result of a call whose run was stopped because its caller gave up on it (nobody reads it).
_CANCELLED = "the call was cancelled by its caller and its run stopped"


def _result(resp: dict[str, Any]) -> ExecResult:
    if resp.get("error"):
        return ExecResult(error=str(resp["error"]))
    if resp.get("cancelled"):
        return ExecResult(error=_CANCELLED, duration=float(resp.get("duration", 0.0)))
    return ExecResult(
        stdout=resp.get("stdout", ""),
        stderr=resp.get("stderr", ""),
        exit_code=resp.get("exit_code"),
        signal=resp.get("signal"),
        timed_out=bool(resp.get("timed_out")),
        truncated=bool(resp.get("truncated")),
        duration=float(resp.get("duration", 0.0)),
        new_session=bool(resp.get("new_session")),
    )


#: The process-wide pools, one per `preload` (most processes have only the plain one, `()`).
_POOLS: dict[tuple[str, ...], SandboxPool] = {}
_POOL_LOCK = threading.Lock()
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def preload_names(preload: Sequence[str] | str) -> tuple[str, ...]:
    """`preload` as module names, each once, in order (`"sympy, numpy"` too).

    Raises:
        ValueError: a name that is not a module name, or whose top-level package this Python
            cannot find (the servers run this Python, so they could not import it either).
    """
    items = preload.split(",") if isinstance(preload, str) else list(preload)
    names: list[str] = []
    for item in items:
        name = str(item).strip()
        if not name or name in names:
            continue
        if not _MODULE_NAME.fullmatch(name):
            raise ValueError(f"preload: {name!r} is not a module name")
        top = name.partition(".")[0]  # (a submodule is only found by importing its package here)
        if importlib.util.find_spec(top) is None:
            raise ValueError(
                f"preload: no module named {top!r} in this Python ({sys.executable}); install it where the sandbox runs"
            )
        names.append(name)
    return tuple(names)


def get_pool(preload: Sequence[str] | str = ()) -> SandboxPool:
    """The process-wide pool (one per `preload`), created on first use and closed at interpreter exit."""
    found = _POOLS.get(preload) if isinstance(preload, tuple) else None
    if found is not None:  # (a tool's every call asks: its names were checked when the pool was made)
        return found
    key = preload_names(preload)
    with _POOL_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = SandboxPool(preload=key)
        return pool


def _new_pool(
    size: int, tmpfs_mb: int, max_sessions: int, session_idle: float, preload: tuple[str, ...] = ()
) -> SandboxPool:
    """A copied private pool (`SandboxPool.__reduce__`)."""
    return SandboxPool(size, tmpfs_mb=tmpfs_mb, max_sessions=max_sessions, session_idle=session_idle, preload=preload)


def shutdown_pool() -> None:
    """Close the process-wide pools (a later `get_pool` starts a new one)."""
    with _POOL_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    interrupted: BaseException | None = None
    for pool in pools:  # every pool, even after a Ctrl-C while one closes (it kills its servers left)
        try:
            pool.close()
        except BaseException as exc:  # noqa: BLE001 - raised once the other pools are closed
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def _forget_after_fork() -> None:
    # A forked host process must not share the parent's server pipes: it starts its own pools.
    global _POOLS, _POOL_LOCK
    _POOLS, _POOL_LOCK = {}, threading.Lock()


def _shutdown_at_exit() -> None:
    """`shutdown_pool` at interpreter exit. A second Ctrl-C while the servers stop has them
    killed at once, and says nothing: the interpreter would print it as an ignored traceback."""
    with contextlib.suppress(KeyboardInterrupt):
        shutdown_pool()


atexit.register(_shutdown_at_exit)
os.register_at_fork(after_in_child=_forget_after_fork)


def run_code(code: str, limits: SandboxLimits | None = None, *, session: str | None = None) -> ExecResult:
    """Run `code` in the shared pool (blocking)."""
    return get_pool().run(code, limits, session=session)


async def arun_code(code: str, limits: SandboxLimits | None = None, *, session: str | None = None) -> ExecResult:
    """Run `code` in the shared pool (async)."""
    return await get_pool().arun(code, limits, session=session)
