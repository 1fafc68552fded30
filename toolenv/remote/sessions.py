"""Server-side sessions: one env instance per client, bounded in number, reaped when idle.

Each session owns an env from the factory and an `asyncio.Lock`: every call into the env
runs under it, so one session takes one step at a time however its client behaves, while
different sessions step concurrently in the server's event loop. A session unused for
`ttl` seconds is closed (its tools released) by a background task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from toolenv.env import ToolEnv

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_TTL",
    "Session",
    "SessionLimitError",
    "SessionStore",
    "UnknownSessionError",
    "as_tool_env",
]

log = logging.getLogger("toolenv.remote")

DEFAULT_MAX_SESSIONS = 128
#: Seconds a session may sit unused: longer than a model's slowest turn, short enough to end a leak.
DEFAULT_SESSION_TTL = 600.0


class SessionLimitError(Exception):
    """Every session slot is taken (HTTP 429)."""


class UnknownSessionError(KeyError):
    """No session has this id: never created, deleted, or reaped (HTTP 404)."""


def as_tool_env(made: Any) -> ToolEnv:
    """The bare ToolEnv of what a factory built (a `gym.make` result is unwrapped)."""
    bare = getattr(made, "unwrapped", made)
    if not isinstance(bare, ToolEnv):
        raise TypeError(f"the env factory built {type(bare).__name__}, not a toolenv.ToolEnv")
    return bare


@dataclass(eq=False)
class Session:
    """One client's env and the lock its calls run under."""

    id: str
    env: ToolEnv
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class SessionStore:
    """The live sessions of one server.

    Args:
        factory: builds one env per session (called in a worker thread: it may load data).
        max_sessions: sessions alive at once; one more is refused with `SessionLimitError`.
        ttl: seconds a session may sit unused before it is closed.
        spare: an env already built (the one the server described itself with): the first
            session gets it instead of building another.
    """

    def __init__(
        self, factory: Callable[[], Any], *, max_sessions: int, ttl: float, spare: ToolEnv | None = None
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        if not ttl > 0:
            raise ValueError(f"session_ttl must be a positive number of seconds, got {ttl!r}")
        self.factory = factory
        self.max_sessions = max_sessions
        self.ttl = ttl
        self._spare = spare
        self._sessions: dict[str, Session] = {}
        self._pending = 0  # sessions whose env is being built: they hold a slot already
        self._reaper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    async def create(self) -> Session:
        """A new session with its own env.

        Raises:
            SessionLimitError: `max_sessions` are alive (or being built).
        """
        if len(self._sessions) + self._pending >= self.max_sessions:
            raise SessionLimitError(
                f"the server is at its limit of {self.max_sessions} sessions; close unused envs "
                "(env.close()), or start the server with a larger --max-sessions"
            )
        self._ensure_reaper()
        self._pending += 1
        try:
            env, self._spare = self._spare, None
            if env is None:
                env = as_tool_env(await asyncio.to_thread(self.factory))
        finally:
            self._pending -= 1
        session = Session(secrets.token_urlsafe(16), env)
        self._sessions[session.id] = session
        return session

    @contextlib.asynccontextmanager
    async def use(self, session_id: str) -> AsyncIterator[Session]:
        """Hold the session's lock for one call into its env, and mark it used.

        Raises:
            UnknownSessionError: no such session (also when it was closed while waiting).
        """
        session = self._get(session_id)
        async with session.lock:
            if self._sessions.get(session_id) is not session:  # deleted or reaped while we waited
                raise UnknownSessionError(session_id)
            session.last_used = time.monotonic()
            try:
                yield session
            finally:
                session.last_used = time.monotonic()

    async def delete(self, session_id: str) -> None:
        """Close a session's env once its call in flight, if any, is done."""
        session = self._get(session_id)
        async with session.lock:
            if self._sessions.pop(session_id, None) is session:
                await _close(session)

    async def aclose(self) -> None:
        """Close every session (server shutdown)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            await _close(s)
        if self._spare is not None:
            spare, self._spare = self._spare, None
            await _close(Session("spare", spare))

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
        """Close the sessions idle longer than `ttl` (a session mid-call is never idle); returns how many."""
        cutoff = time.monotonic() - self.ttl
        closed = 0
        for s in list(self._sessions.values()):
            # Checked again for each: while an earlier one closed, this one's client may be back.
            if self._sessions.get(s.id) is s and s.last_used < cutoff and not s.lock.locked():
                del self._sessions[s.id]
                log.info("closing session %s: idle for more than %g s", s.id, self.ttl)
                await _close(s)
                closed += 1
        return closed


async def _close(session: Session) -> None:
    """Close the env's tools; a failure is logged, never raised (the session is gone either way)."""
    try:
        await session.env.aclose()
    except Exception:
        log.exception("closing the env of session %s failed", session.id)
