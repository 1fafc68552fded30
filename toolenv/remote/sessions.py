"""Server-side sessions: one env instance per client, bounded in number, reaped when idle.

Each session owns an env from the factory and an `asyncio.Lock`: every call into the env
runs under it, so one session takes one step at a time however its client behaves, while
different sessions step concurrently in the server's event loop. A session whose client
sent no request for `ttl` seconds is closed (its tools released) by a background task.

A session that ends with a call in flight (deleted, or expired: its client gave up on that
call or died) has that call cancelled, since nobody is left to read its answer; its slot is
free once the call has unwound. A call stuck for ever (a tool with no timeout on a dead
backend) therefore holds its slot for the TTL at most, not for the life of the server.

A tool object may be shared by the envs of several sessions (a `tools` reference to a Tool
instance, an `@toolenv.tool` function: every env the factory builds gets that object, as a
vector env's envs share theirs). Ending a session releases its episode from such a tool but
leaves it open for the others: as for any env (`ToolEnv.aclose`), the last env holding it
closes it.

Closing an env (its tools' `release` and `close`) is bounded by `close_timeout`: a close
still running then is cancelled and left behind, logged with its session's id, so a tool
whose teardown hangs holds neither a DELETE, nor a slot, nor the server's stop. The tools
that env still held are then let go of, and those no other env holds closed, within another
`close_timeout` (a shared tool is still closed by its last holder); at a stop, so are those
of a deleted session whose call in flight swallowed its cancellation.

A create may carry a key (the client's `Idempotency-Key`, one per session it wants): a
create sent again with the same key, because its answer was lost, gets the same session
instead of a second one that would hold a slot until reaped. A key is kept as long as its
session lives, so the keys held are bounded by `max_sessions`.

A session also keeps the answer of the last step (or truncate) its env ran, under which
turn of which episode it was: the same request sent again, because its answer was lost,
gets that answer rather than a second run. One answer per session, dropped at the next reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from toolenv.env import ToolEnv

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_TTL",
    "MAX_KEY_LENGTH",
    "Answer",
    "Session",
    "SessionLimitError",
    "SessionStore",
    "UnknownSessionError",
    "as_tool_env",
]

log = logging.getLogger("toolenv.remote")

T = TypeVar("T")

DEFAULT_MAX_SESSIONS = 128
#: Seconds a session may sit unused: longer than a model's slowest turn, short enough to end a leak.
DEFAULT_SESSION_TTL = 600.0
#: Seconds closing one env may take (and a stop, closing all of them at once) before it is left behind.
DEFAULT_CLOSE_TIMEOUT = 30.0
#: Characters an idempotency key may have (a client sends 22: 128 random bits).
MAX_KEY_LENGTH = 255


class SessionLimitError(Exception):
    """Every session slot is taken (HTTP 429)."""


class UnknownSessionError(KeyError):
    """No session has this id: never created, deleted, or reaped (HTTP 404).

    `why` says what ended it, for a call the session's end cancelled.
    """

    def __init__(self, session_id: str, why: str | None = None) -> None:
        super().__init__(session_id)
        self.why = why


def as_tool_env(made: Any) -> ToolEnv:
    """The bare ToolEnv of what a factory built (a `gym.make` result is unwrapped)."""
    bare = getattr(made, "unwrapped", made)
    if not isinstance(bare, ToolEnv):
        raise TypeError(f"the env factory built {type(bare).__name__}, not a toolenv.ToolEnv")
    return bare


@dataclass(frozen=True)
class Answer:
    """The answer to one call into a session's env, kept to be sent again instead of a second run."""

    call: tuple[str, str, int]  # ("step", episode id, turn) or ("truncate", episode id, 0)
    status: int
    body: bytes


@dataclass(eq=False)
class Session:
    """One client's env and the lock its calls run under."""

    id: str
    env: ToolEnv
    key: str | None = None  # the idempotency key it was created with
    last: Answer | None = None  # the answer of the last step or truncate its env ran
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)  # its client's last request, or its last call's end
    call: asyncio.Task[Any] | None = None  # the call into its env in flight
    ended: str | None = None  # why it ended while a call was in flight (which was cancelled)

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run one call into the env (under `SessionStore.use`) as a task of its own, which the
        session's end cancels.

        Raises:
            UnknownSessionError: the session ended (deleted, expired) while the call ran.
        """
        if self.ended is not None:
            call.close()
            raise UnknownSessionError(self.id, self.ended)
        task = asyncio.ensure_future(call)
        self.call = task
        try:
            return await task  # cancelling this request (a server stop) cancels the call too
        except asyncio.CancelledError:
            me = asyncio.current_task()
            cancelling = getattr(me, "cancelling", None)  # Python 3.11+
            if self.ended is None or not task.cancelled() or (cancelling is not None and cancelling() > 0):
                raise  # not the session's end: this request itself is being cancelled
            raise UnknownSessionError(self.id, self.ended) from None
        finally:
            self.call = None

    def cancel(self, why: str) -> None:
        """End the session while a call may be in flight: cancel that call, which says `why`."""
        self.ended = why
        if self.call is not None:
            self.call.cancel()


class SessionStore:
    """The live sessions of one server.

    Args:
        factory: builds one env per session (called in a worker thread: it may load data).
        max_sessions: sessions alive at once; one more is refused with `SessionLimitError`.
        ttl: seconds a session's client may go without a request before the session is
            closed, with its call in flight, if any, cancelled.
        spare: an env already built (the one the server described itself with): the first
            session gets it instead of building another.
        close_timeout: seconds closing one env may take; a close still running then is
            cancelled and left behind (logged), and its slot freed.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        max_sessions: int,
        ttl: float,
        spare: ToolEnv | None = None,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        if not ttl > 0:
            raise ValueError(f"session_ttl must be a positive number of seconds, got {ttl!r}")
        if not close_timeout >= 0:
            raise ValueError(f"close_timeout must be a number of seconds >= 0, got {close_timeout!r}")
        self.factory = factory
        self.max_sessions = max_sessions
        self.ttl = ttl
        self.close_timeout = close_timeout
        self._spare = spare
        self._sessions: dict[str, Session] = {}
        self._keyed: dict[str, Session] = {}  # live sessions by idempotency key
        self._building: dict[str, asyncio.Future[None]] = {}  # keys whose env is being built: done when built or failed
        self._pending = 0  # sessions whose env is being built: they hold a slot already
        self._closing = 0  # ended (deleted, reaped) sessions whose env is not closed yet: they still hold a slot
        self._closers: dict[asyncio.Task[None], Session] = {}  # ended, closing (once their call in flight ends)
        self._reaper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        """Sessions holding a slot: alive, or deleted with their env not closed yet."""
        return len(self._sessions) + self._closing

    async def create(self, key: str | None = None) -> Session:
        """A new session with its own env; with `key`, the session already created with it, if alive.

        A create with the key of one still being built waits for it (a client that timed out
        and sent its create again) rather than building a second env.

        Raises:
            SessionLimitError: `max_sessions` are alive (or being built).
            ValueError: `key` is empty or longer than `MAX_KEY_LENGTH`.
        """
        if key is not None and not 0 < len(key) <= MAX_KEY_LENGTH:
            raise ValueError(f"an idempotency key has 1 to {MAX_KEY_LENGTH} characters, got {len(key)}")
        while key is not None:
            known = self._keyed.get(key)
            if known is not None:
                known.last_used = time.monotonic()
                return known
            building = self._building.get(key)
            if building is None:
                break
            await asyncio.shield(building)  # then its session, or a build of our own if that one failed
        if len(self) + self._pending >= self.max_sessions:
            raise SessionLimitError(
                f"the server is at its limit of {self.max_sessions} sessions; close unused envs "
                "(env.close()), or start the server with a larger --max-sessions"
            )
        self._ensure_reaper()
        built: asyncio.Future[None] | None = None
        if key is not None:
            built = self._building[key] = asyncio.get_running_loop().create_future()
        self._pending += 1
        try:
            env, self._spare = self._spare, None
            if env is None:
                env = as_tool_env(await asyncio.to_thread(self.factory))
            session = Session(secrets.token_urlsafe(16), env, key)
            self._sessions[session.id] = session
            if key is not None:
                self._keyed[key] = session
            return session
        finally:
            self._pending -= 1
            if key is not None and built is not None:
                del self._building[key]
                built.set_result(None)

    @contextlib.asynccontextmanager
    async def use(self, session_id: str) -> AsyncIterator[Session]:
        """Hold the session's lock for one call into its env, and mark it used.

        Raises:
            UnknownSessionError: no such session (also when it was closed while waiting).
        """
        session = self._get(session_id)
        session.last_used = time.monotonic()  # a request of its client: it is alive, if waiting
        async with session.lock:
            if self._sessions.get(session_id) is not session:  # deleted or reaped while we waited
                raise UnknownSessionError(session_id, session.ended)
            session.last_used = time.monotonic()
            try:
                yield session
            finally:
                session.last_used = time.monotonic()

    async def delete(self, session_id: str) -> None:
        """End a session now: close its env now, or cancel its call in flight and close it
        once that call has unwound.

        Not waiting for that call is what lets a client whose step was cancelled (an episode
        timeout) drop the session and go on with a new one at once; cancelling it is what
        keeps a call stuck for ever from holding the slot: nobody can read its answer now.
        Until its env is closed, the session still takes its slot.
        """
        await self._end(self._get(session_id), "was deleted while this call ran")

    async def _end(self, session: Session, why: str, *, wait: bool = True) -> None:
        """Drop a session, cancel its call in flight (saying `why`), and close its env: with
        `wait`, now when it is free; else in a task of its own (once the call has unwound)."""
        self._forget(session)  # calls waiting for its lock find it gone
        self._closing += 1
        if wait and not session.lock.locked():
            await self._close_when_free(session)
            return
        session.cancel(why)
        closer = asyncio.get_running_loop().create_task(self._close_when_free(session))
        self._closers[closer] = session
        closer.add_done_callback(self._forget_closer)

    def _forget_closer(self, closer: asyncio.Task[None]) -> None:
        self._closers.pop(closer, None)

    async def _close_when_free(self, session: Session) -> None:
        """Close a deleted session's env once no call holds its lock, then free its slot."""
        try:
            async with session.lock:
                await _close(session, self.close_timeout)
        finally:
            self._closing -= 1

    async def aclose(self) -> None:
        """Close every session (server shutdown): all at once, within `close_timeout`.

        An env whose close is still running then, or a deleted session whose call in flight
        has not unwound by then, is left behind, logged with its session's id, and the tools
        it still holds are let go of (closed unless another env holds them) within another
        `close_timeout`: a stop ends however a tool's teardown behaves, and leaves no shared
        tool open.
        """
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        sessions, self._sessions, self._keyed = list(self._sessions.values()), {}, {}
        if self._spare is not None:
            spare, self._spare = self._spare, None
            sessions.append(Session("spare", spare))
        await asyncio.gather(*(_close(s, self.close_timeout) for s in sessions), self._wait_closers())

    async def _wait_closers(self) -> None:
        """Wait up to `close_timeout` for the deleted sessions still closing; give up on the rest,
        letting go of the tools their envs still hold (within another `close_timeout`)."""
        closers = dict(self._closers)
        if not closers:
            return
        _, late = await asyncio.wait(set(closers), timeout=self.close_timeout)
        for closer in late:
            log.error(
                "session %s did not close within %g s of the stop (its call in flight or its env's close "
                "did not end): left behind; closing the tools it still holds",
                closers[closer].id,
                self.close_timeout,
            )
            closer.cancel()
        await asyncio.gather(*(_let_go(closers[closer], self.close_timeout) for closer in late))

    def _forget(self, session: Session) -> None:
        """Drop a session (and its key) from the store; closing its env is the caller's part."""
        del self._sessions[session.id]
        if session.key is not None and self._keyed.get(session.key) is session:
            del self._keyed[session.key]

    def _get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(session_id)
        return session

    # ------------------------------------------------------------------ idle reaping
    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        interval = min(max(self.ttl / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval)
            await self.reap()

    async def reap(self) -> int:
        """Close the sessions whose client sent no request for `ttl` seconds; returns how many.

        A session mid-call counts too: its client waited longer than the TTL for one call
        without sending it again, or is gone (a crash leaves a stuck call running for ever).
        That call is cancelled; its answer, if the client still waits, says why. Their envs
        close in tasks of their own: one teardown that hangs does not stop the reaping.
        """
        cutoff = time.monotonic() - self.ttl
        closed = 0
        for s in list(self._sessions.values()):
            if s.last_used < cutoff:  # no await in this loop: no client comes back half-way
                busy = " (cancelling its call in flight)" if s.lock.locked() else ""
                log.info("closing session %s: no request for more than %g s%s", s.id, self.ttl, busy)
                await self._end(
                    s,
                    f"was closed while this call ran: no request came from its client for {self.ttl:g} s "
                    "(the session TTL); a call that takes longer needs a larger --session-ttl",
                    wait=False,
                )
                closed += 1
        return closed


async def _close(session: Session, timeout: float) -> None:
    """Close the env (its tools but those another open env holds: their episode is released
    only) within `timeout` seconds; a failure is logged, never raised (the session is gone
    either way). A close still running then is cancelled and left behind, logged: one stuck
    teardown must not hold a DELETE, a slot, or the server's stop. What it had not let go of
    yet is then let go of (`_let_go`)."""
    finished, exc = await _bounded(session.env.aclose(), timeout)
    if not finished:
        log.error(
            "the env of session %s did not close within %g s (the close timeout): left behind, its close cancelled",
            session.id,
            timeout,
        )
        await _let_go(session, timeout)
    elif exc is not None:
        log.error("closing the env of session %s failed", session.id, exc_info=exc)


async def _let_go(session: Session, timeout: float) -> None:
    """Let go of the tools the env of a session left behind still holds (its close was stuck
    before it got to them, or never started: a call in flight that swallows its cancellation
    holds the env), and close those no other open env holds, within `timeout` seconds.

    Without it, a tool object shared with other sessions is never closed (the last holder
    closes it, and this one never lets go): its processes and connections stay until the
    server's process exits. Its calls left running past their timeout are cancelled as it
    closes (`ToolCaller.aclose`); a call in flight that swallows cancellation runs on with
    its tools closed, which is what ends most (a killed subprocess, a closed connection).
    """
    caller = session.env.caller
    if not caller.holds:  # its close let go already, and closes what it picked
        return
    finished, exc = await _bounded(caller.aclose(), timeout)
    if not finished:
        log.error(
            "the tools of session %s did not close within %g s (the close timeout) either: left behind",
            session.id,
            timeout,
        )
    elif exc is not None:
        log.error("closing the tools of session %s failed", session.id, exc_info=exc)


async def _bounded(closing: Coroutine[Any, Any, None], timeout: float) -> tuple[bool, BaseException | None]:
    """Run `closing` for at most `timeout` seconds: whether it finished, and its failure. One
    still running then is cancelled, not awaited (it may ignore the cancellation too), and left
    behind; a cancelled wait cancels it as well."""
    task = asyncio.ensure_future(closing)
    task.add_done_callback(_retrieve)
    try:
        await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        return False, None
    return True, None if task.cancelled() else task.exception()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a left-behind close's outcome as seen (asyncio would log it as never retrieved)."""
    if not task.cancelled():
        task.exception()
