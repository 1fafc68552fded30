"""One MCP session per distinct server per process, shared and refcounted; or one per episode.

Every tool object naming a server holds one reference to its `Connection`; the session
(and, for stdio, the server process) is closed when the last reference is released, and
at interpreter exit. The session lives on the background loop (`toolenv_mcp.loop`);
every coroutine method here runs there.

Servers with `scope="episode"` are called through a second registry, keyed by server and
episode id: the episode's first call opens its connection (`acquire_episode`), every
tool of the server that calls in the episode holds it, and it closes when the last of
them lets go (`release_episode`, from `Tool.release` at the episode's end; `drop_holder`
when a tool closes). The process-wide connection then only serves the tool listing.

Faults: a server whose connection ends while idle is restarted by the next call; one
that dies during a call fails that call with `MCPConnectionLost` (its outcome is
unknown) and is restarted by the next. So is one that does not answer a ping after a
call was cancelled (it is stuck) or after a -32000 error (the SDK's code for a closed
connection, and a server's own for its errors). An episode's own server that died
between calls fails the next call too (its state is gone, which the model should hear),
and the call after that starts a new one. An HTTP server that answers 404 to the session
(it restarted) gets a new session, the request sent again (it was not run); for an
episode's connection that is reported instead, as its state is gone. A server that
cannot start fails with `MCPServerError`, and is not tried again for a second (for
episode connections: by any episode), so a vector env of a thousand episodes does not
spawn a thousand doomed processes at once.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import inspect
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TextIO

import anyio

from toolenv_mcp import loop
from toolenv_mcp.config import MCPServer
from toolenv_mcp.errors import MCPConnectionLost, MCPHTTPError, MCPServerError

__all__ = ["Connection", "acquire", "acquire_episode", "drop_holder", "new_holder", "release", "release_episode"]

_log = logging.getLogger("toolenv.mcp")

#: JSON-RPC error code the MCP SDK gives calls whose connection closed.
CONNECTION_CLOSED = -32000
#: Seconds a failed start is reported again before the next attempt.
RESTART_COOLDOWN = 1.0
#: Seconds a session has to answer a ping, after a -32000 error or a cancelled call, to count as alive.
PING_TIMEOUT = 10.0
#: Seconds to wait for sessions (and their processes) to end on close and at exit.
CLOSE_TIMEOUT = 10.0
_MAX_PAGES = 1000
_SESSION_HEADER = "mcp-session-id"
#: What an HTTP status refusing the MCP handshake most likely means.
_HINTS = {"401": ", check its headers (a token?)", "403": ", check its headers (a token?)", "404": ", check its url"}
#: Idle HTTP connections kept open per session (httpx's default).
_HTTP_KEEPALIVE = 20


class _StartFailure:
    """The last failed start of a server, repeated instead of retried for `RESTART_COOLDOWN` seconds."""

    __slots__ = ("at", "message")

    def __init__(self) -> None:
        self.message: str | None = None
        self.at = 0.0

    def recent(self) -> str | None:
        """The failure's message while it is within the cool-down, else None."""
        if self.message is not None and time.monotonic() - self.at < RESTART_COOLDOWN:
            return self.message
        return None


class _Refusals:
    """The HTTP error statuses a session's requests were answered with: how many, and the last one."""

    __slots__ = ("code", "count", "status")

    def __init__(self) -> None:
        self.count = 0
        self.code = 0
        self.status = ""  # e.g. "401 Unauthorized"

    def add(self, code: int, status: str) -> None:
        self.count, self.code, self.status = self.count + 1, code, status

    def hint(self) -> str:
        """The last status, and what it most likely means."""
        return f"it answered HTTP {self.status}{_HINTS.get(str(self.code), '')}"


class Connection:
    """The live session to one server, restarted on demand.

    Use `acquire`/`release` for the process-wide one, `acquire_episode`/`release_episode`
    for an episode's own (`episode` is then its id, and `failures` shared by the server's
    episode connections).
    """

    def __init__(self, server: MCPServer, *, episode: str | None = None, failures: _StartFailure | None = None) -> None:
        self.server = server
        self.key = server.key
        self.episode = episode
        self.refs = 0
        self.epoch = _epoch
        self.starts = 0
        self.closed = False
        # Below: touched on the background loop only.
        self._session: Any = None
        self._refusals = _Refusals()  # the HTTP statuses refusing the session's requests
        self._lost = True
        self._expired = 0  # the start whose HTTP session the server no longer knows (404), else 0
        self._listed = 0  # the start whose session listed every tool (all pages), else 0
        self._changes = 0  # `notifications/tools/list_changed` received: a listing older than one is stale
        self._listing: asyncio.Task[Any] | None = None  # that listing, shared by the calls waiting for it
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[Any] | None = None
        self._checking: asyncio.Task[None] | None = None  # the ping after a cancelled request
        self._failures = failures if failures is not None else _StartFailure()
        self._ending: set[asyncio.Task[None]] = set()

    @property
    def label(self) -> str:
        return self.server.label

    def __repr__(self) -> str:
        owner = f" episode={self.episode!r}" if self.episode is not None else f" refs={self.refs}"
        return f"<Connection {self.label!r}{owner} starts={self.starts}>"

    # ------------------------------------------------------------------ requests
    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool the server lists (all pages), in the wire format (`inputSchema`, ...).

        Bounded by the server's `startup_timeout`, as the handshake is: `mcp_tools` (and
        `gym.make`) would otherwise block for ever on a server that never answers.

        Raises:
            MCPServerError: the server could not be started, or did not list its tools in time.
        """
        await self._live()
        try:
            return await asyncio.wait_for(self._list_pages(), self.server.startup_timeout)
        except asyncio.TimeoutError:
            raise MCPServerError(
                f"MCP server {self.label!r} did not list its tools within {self.server.startup_timeout:g} s "
                "(is it stuck? see its stderr)"
            ) from None

    async def _list_pages(self) -> list[dict[str, Any]]:
        from mcp import types

        generation, changes = self.starts, self._changes
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
            result = await self._send(functools.partial(_list_page, params=params), "listing its tools")
            page = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            tools.extend(page.get("tools") or [])
            cursor = page.get("nextCursor")
            if not cursor:
                break
        if generation == self.starts and changes == self._changes:  # else the tools changed meanwhile
            self._listed = generation
        return tools

    def _tools_changed(self, generation: int) -> None:
        """The server's tools changed (`notifications/tools/list_changed`): the session lists
        them again before its next call, as MCP asks, so that the SDK checks results against
        the tools' output schemas as they are now (a changed one refused every result)."""
        if generation == self.starts:
            self._changes += 1
            self._listed = 0

    async def _list_first(self) -> None:
        """List the session's tools (every page) before its first call, once per session.

        The MCP SDK checks a result against its tool's `outputSchema`, and a session that
        never listed looks the schema up with a listing of its own: after the call (whose
        result is lost if that listing fails or times out, though the call ran), and only
        of the first page, so a tool on a later page was listed again, with a warning, at
        every call. A session of an episode, or one restarted, had not listed; one whose
        server said its tools changed lists again.
        """
        for _ in range(2):  # a session replaced during the listing (HTTP 404) lists once more
            if self._listed == self.starts and self._session is not None and not self._lost:
                return
            listing = self._listing
            if listing is None or listing.done():
                listing = self._listing = asyncio.get_running_loop().create_task(self.list_tools())
                listing.add_done_callback(_retrieve)
            try:
                await asyncio.shield(listing)  # shared: one caller's timeout must not end it for the others
            except MCPHTTPError:  # a refused listing: the call goes ahead (and says why if refused too)
                return
            except MCPServerError:
                raise
            except Exception:  # noqa: BLE001 - a refused listing: the call goes ahead, as before
                return

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call one tool; the `CallToolResult` in the wire format (`content`, `isError`, ...).

        Raises:
            MCPServerError: the server could not be started.
            MCPConnectionLost: the connection ended during the call.
            Exception: the server answered with a protocol error (e.g. an unknown tool).
        """
        during = f"the call to '{name}'"
        await self._live(during)  # an episode's session that died while idle fails this call, saying so
        await self._list_first()
        result = await self._send(lambda session: session.call_tool(name, arguments), during)
        dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return dumped

    async def _send(self, request: Callable[[Any], Awaitable[Any]], during: str) -> Any:
        """`request(session)` on the live session; errors classified by `_failed`.

        An HTTP server that no longer knows the session (it restarted, or expired it)
        answers 404, and MCP says to start a new session. The request was not run, so
        for a process-wide connection it is sent once more on a new session; an
        episode's connection reports it instead, as the episode's state is gone.
        """
        for attempt in range(2):
            session = await self._live()
            generation, refusals = self.starts, self._refusals
            refused = refusals.count
            try:
                return await request(session)
            except asyncio.CancelledError:  # the caller gave up (its timeout): is the server stuck?
                self._suspect(session, generation)
                raise
            except Exception as exc:  # classified and reworded below
                if attempt == 0 and self.episode is None and self._expired == generation:
                    continue
                gone = await self._gone(exc, session, generation)
                if not gone and refusals.count > refused:  # the SDK's "Server returned an error response"
                    raise MCPHTTPError(
                        f"MCP server {self.label!r} refused {during}: {refusals.hint()} ({describe(exc)})",
                        refusals.code,
                    ) from exc
                raise self._failed(exc, generation, during, gone=gone) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _gone(self, exc: Exception, session: Any, generation: int) -> bool:
        """Whether `exc` means the session is gone, rather than the server refusing the request.

        JSON-RPC leaves -32000 to servers for errors of their own, and the MCP SDK gives the
        same code to requests whose connection closed (or, over HTTP, whose response stream
        broke). So that code alone proves nothing: a session that still answers a ping is alive.
        """
        if generation != self.starts or self._lost:
            return True
        if not is_connection_error(exc):
            return False
        if error_code(exc) != CONNECTION_CLOSED:
            return True  # the transport itself failed (end of stream, refused connection, ...)
        try:
            await asyncio.wait_for(session.send_ping(), PING_TIMEOUT)
        except Exception:  # noqa: BLE001 - no answer, whatever the reason: the session is gone
            return True
        return generation != self.starts or self._lost

    def _suspect(self, session: Any, generation: int) -> None:
        """Ping the session after a request was cancelled, unless a ping is on its way already.

        A server whose event loop is stuck (a busy loop, a blocking call) answers nothing,
        not even the cancellation: every later call of every episode would time out too.
        One that does not answer the ping within `PING_TIMEOUT` is given up: calls in flight
        on it fail as after a crash, and the next call starts a new one.
        """
        checking = self._checking
        if self.closed or self._lost or generation != self.starts or (checking is not None and not checking.done()):
            return
        self._checking = asyncio.get_running_loop().create_task(self._check(session, generation))
        self._checking.add_done_callback(_retrieve)

    async def _check(self, session: Any, generation: int) -> None:
        try:
            await asyncio.wait_for(session.send_ping(), PING_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - no answer, whatever the reason
            if generation != self.starts or self._lost or self.closed:
                return
            _log.warning(
                "MCP server %r did not answer a ping within %g s after a call was cancelled (%s): "
                "it is stuck, and replaced on the next call",
                self.label,
                PING_TIMEOUT,
                describe(exc),
            )
            self._lost = True
            if self.episode is None:  # an episode's is retired by its next call, which reports the loss
                self._retire()

    def _failed(self, exc: Exception, generation: int, during: str, *, gone: bool) -> Exception:
        """The error to raise for `exc`: connection loss (`gone`) is marked for a restart, the rest passes."""
        current = generation == self.starts  # else a newer session replaced this one meanwhile
        if gone:
            if current:
                self._lost = True
                if self.episode is not None:  # reported now: the next call starts a new one
                    self._retire()
            if self._expired == generation:
                return self._expired_error(during)
            return MCPConnectionLost(f"MCP server {self.label!r} closed the connection during {during} {self._next()}")
        return exc

    def _expired_error(self, during: str) -> MCPConnectionLost:
        return MCPConnectionLost(
            f"MCP server {self.label!r} no longer knows the session (HTTP 404: did it restart?), "
            f"so {during} was not run; {self._next(expired=True)}"
        )

    def _next(self, *, expired: bool = False) -> str:
        """What happens after a lost connection, as the end of the message saying so."""
        if expired:
            if self.episode is None:
                return "a new session starts on the next call"
            return "the next call of this episode starts a new session, without the episode's state so far"
        if self.episode is None:
            return "(did it crash?); it is restarted on the next call"
        return "(did it crash?); the next call of this episode starts a new one, without the episode's state so far"

    # ------------------------------------------------------------------ lifecycle
    async def _live(self, during: str = "this call") -> Any:
        """The open session, starting (or restarting) it when there is none.

        An episode's session found dead fails `during` (the request about to be sent) instead:
        the episode's state is gone, which the model should hear.
        """
        if self.closed:
            raise MCPServerError(f"MCP server {self.label!r}: its connection was closed")
        checking = self._checking
        if checking is not None and not checking.done():  # the session is suspected of being stuck
            await asyncio.shield(checking)
        if self._session is not None and not self._lost:
            return self._session
        if self.episode is not None and self._session is not None:  # the episode's server died while idle
            expired = self._expired == self.starts  # its HTTP session, found gone (404) by the SDK's GET stream
            self._retire()
            if expired:
                raise self._expired_error(during)
            raise MCPConnectionLost(
                f"MCP server {self.label!r} of this episode closed the connection between calls, "
                f"so this call was not sent {self._next()}"
            )
        starting = self._starting
        if starting is None:
            starting = self._starting = asyncio.get_running_loop().create_task(self._start())
            starting.add_done_callback(_retrieve)
        # Shielded: a caller's timeout must not abort a start other callers are waiting for.
        return await asyncio.shield(starting)

    async def _start(self) -> Any:
        """A new session; a start that failed within the cool-down is reported again, not retried."""
        try:
            self._retire()
            recent = self._failures.recent()
            if recent is not None:
                raise MCPServerError(recent)
            try:
                session = await self._open()
            except MCPServerError as exc:  # timed from the attempt, not from later reports
                self._failures.message, self._failures.at = str(exc), time.monotonic()
                raise
            self._failures.message = None
            return session
        finally:
            self._starting = None

    async def _open(self) -> Any:
        """Start the owner task of a new session and wait for its handshake."""
        self.starts += 1
        running = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = running.create_future()
        ready.add_done_callback(_retrieve)
        stop = asyncio.Event()
        refusals = _Refusals()
        owner = running.create_task(self._own(self.starts, ready, stop, refusals))
        try:
            session = await asyncio.wait_for(asyncio.shield(ready), self.server.startup_timeout)
        except BaseException as exc:  # a failed start, the handshake timing out, or close()
            ready.cancel()
            stop.set()
            owner.cancel()
            self._track(owner)
            if isinstance(exc, asyncio.TimeoutError):
                raise MCPServerError(
                    f"MCP server {self.label!r} could not start: no answer to the MCP handshake "
                    f"within {self.server.startup_timeout:g} s"
                ) from None
            raise
        self._session, self._stop, self._owner, self._lost = session, stop, owner, False
        self._refusals = refusals
        return session

    async def _own(self, generation: int, ready: asyncio.Future[Any], stop: asyncio.Event, refusals: _Refusals) -> None:
        """Open the transport and session, hand the session over, and hold both open until `stop`.

        The transport's context managers must be entered and left in one task: this one.
        """
        from mcp import ClientSession

        def lost() -> None:
            if generation == self.starts:
                self._lost = True

        def expired() -> None:
            if generation == self.starts:
                self._lost, self._expired = True, generation

        async def on_message(message: Any) -> None:
            if _tools_changed_notice(message):
                self._tools_changed(generation)

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await _open_transport(stack, self.server, expired, refusals)
                session = await stack.enter_async_context(
                    ClientSession(_Watched(read, lost), write, message_handler=on_message)
                )
                await session.initialize()
                if ready.done():  # the start timed out or was abandoned meanwhile
                    return
                ready.set_result(session)
                await stop.wait()
        except Exception as exc:  # noqa: BLE001 - reported through `ready`, or logged
            if not ready.done():
                problem = _start_problem(exc)
                if refusals.count:  # the SDK's message ("Server returned an error response") does not say which
                    problem = f"{refusals.hint()} ({problem})"
                ready.set_exception(MCPServerError(f"MCP server {self.label!r} could not start: {problem}"))
            else:
                _log.debug("MCP server %r: session ended with %s", self.label, describe(exc))
        finally:
            lost()

    def _retire(self) -> None:
        """Let the current (dead or unwanted) session wind down in the background."""
        if self._stop is not None:
            self._stop.set()
        if self._owner is not None:
            self._track(self._owner)
        self._session, self._stop, self._owner, self._lost = None, None, None, True

    def _track(self, task: asyncio.Task[None]) -> None:
        if not task.done():
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    async def aclose(self) -> None:
        """Close the session for good; for stdio, the process is gone when this returns."""
        self.closed = True
        for task in (self._checking, self._listing):
            if task is not None:
                task.cancel()
        starting = self._starting
        if starting is not None:
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
        self._retire()
        if self._ending:
            _, pending = await asyncio.wait(set(self._ending), timeout=CLOSE_TIMEOUT)
            for task in pending:  # a session that will not end politely
                task.cancel()


class _Watched:
    """A transport's read stream that says when it ends: the server died or hung up.

    That is how a server that died between calls is noticed before the next call is
    sent to it. Everything else is delegated to the wrapped stream.
    """

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _open_transport(
    stack: contextlib.AsyncExitStack, server: MCPServer, on_expired: Callable[[], None], refusals: _Refusals
) -> tuple[Any, Any]:
    """The (read, write) streams of the server's transport, entered on `stack`.

    Over HTTP, `on_expired` is called when the server answers 404 to a request carrying
    the session id: it no longer knows the session (the MCP SDK reports that as an
    ordinary JSON-RPC error, indistinguishable from a refusal). The status of every
    request the server refuses (`401 Unauthorized`) is counted in `refusals`.
    """
    streams: Any
    if server.command is not None:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        # Decoded leniently: with the SDK's strict default, one byte that is not UTF-8 on the
        # server's stdout (a progress bar, raw bytes in a result) stopped its reader for good,
        # and every later call hung. A junk line is then skipped like any line that is not JSON.
        params = StdioServerParameters(
            command=server.command,
            args=list(server.args),
            env=dict(server.env) or None,
            cwd=server.cwd,
            encoding_error_handler="replace",
        )
        streams = await stack.enter_async_context(stdio_client(params, errlog=_errlog()))
    else:
        from mcp.client.streamable_http import streamable_http_client

        async def watch(response: Any) -> None:
            if response.status_code == 404 and _SESSION_HEADER in response.request.headers:
                on_expired()
            if response.status_code >= 400 and response.request.method == "POST":  # not the optional GET stream
                refusals.add(response.status_code, f"{response.status_code} {response.reason_phrase}".strip())

        client = _http_client(server.headers)
        client.event_hooks["response"].append(watch)
        client = await stack.enter_async_context(client)
        options: dict[str, Any] = {}
        if "max_sse_event_size" in inspect.signature(streamable_http_client).parameters:
            # mcp 2.x caps one SSE event at 1 MiB and fails a larger result as a lost
            # connection; stdio and JSON responses have no cap (`max_output_chars` bounds
            # what the model reads), so neither does a result streamed as SSE.
            options["max_sse_event_size"] = None
        streams = await stack.enter_async_context(
            streamable_http_client(str(server.url), http_client=client, **options)
        )
    return streams[0], streams[1]  # mcp 1.x adds a third item (a session-id getter)


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: ours, as in other MCP clients, if it is a file.

    The child inherits a file descriptor. The MCP SDK passes the `sys.stderr` it saw when
    imported, and one without a descriptor (a notebook's, ipykernel's; a `StringIO` that
    captures it) failed every start with `UnsupportedOperation: fileno`: the process's own
    stderr (`sys.__stderr__`) takes its place then, else the null device.
    """
    global _devnull
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            continue
    if _devnull is None:
        _devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - kept for the process
    return _devnull


_devnull: TextIO | None = None


def _http_client(headers: Mapping[str, str]) -> Any:
    """The HTTP client of a streamable HTTP session: the MCP SDK's own (httpx for mcp 1.x,
    httpx2 for 2.x; its headers and redirect rule), with no cap on connections and no read timeout.

    Each request in flight holds a connection (its answer streams back on it), and httpx
    pools at most 100 per client: the 101st concurrent call waited for a free one, and a
    wait past the SDK's 30 s pool timeout, like a read past its 300 s read timeout, failed
    the whole session, with every call in flight. A call is bounded by its tool's
    `timeout`; bound the calls in flight with `max_concurrency`.
    """
    from mcp.shared._httpx_utils import create_mcp_http_client

    sdk = create_mcp_http_client(headers=dict(headers) or None)  # never opened: only its settings are used
    http = sys.modules[type(sdk).__module__.partition(".")[0]]
    timeout = http.Timeout(sdk.timeout.connect, read=None, write=sdk.timeout.write, pool=sdk.timeout.pool)
    limits = http.Limits(max_connections=None, max_keepalive_connections=_HTTP_KEEPALIVE)
    return type(sdk)(headers=sdk.headers, follow_redirects=sdk.follow_redirects, timeout=timeout, limits=limits)


# ---------------------------------------------------------------------- errors
def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of nested exception groups (anyio task groups wrap what went wrong)."""
    while True:
        inner = getattr(exc, "exceptions", None)
        if not isinstance(inner, (list, tuple)) or not inner:
            return exc
        exc = next((e for e in inner if not isinstance(e, asyncio.CancelledError)), inner[0])


def error_code(exc: BaseException) -> Any:
    """The JSON-RPC error code `exc` carries (an MCP SDK error), else None."""
    return getattr(getattr(root_cause(exc), "error", None), "code", None)


def is_connection_error(exc: BaseException) -> bool:
    """True when `exc` may say the connection is gone (-32000 may also be the server's own error)."""
    exc = root_cause(exc)
    if error_code(exc) == CONNECTION_CLOSED:
        return True
    broken = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, EOFError)
    return isinstance(exc, broken) or type(exc).__name__ in ("ConnectError", "RemoteProtocolError", "ReadError")


def describe(exc: BaseException) -> str:
    """`Type: message` of the root cause, on one line."""
    exc = root_cause(exc)
    msg = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def _start_problem(exc: BaseException) -> str:
    if is_connection_error(exc) and type(root_cause(exc)).__name__ != "ConnectError":
        return "it closed the connection before the MCP handshake finished (did the process exit? see its stderr)"
    return describe(exc)


async def _list_page(session: Any, *, params: Any) -> Any:
    """One page of the server's tool listing."""
    return await session.list_tools(params=params)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (its awaiters may all have given up)."""
    if not future.cancelled():
        future.exception()


# ---------------------------------------------------------------------- the shared registry
_lock = threading.RLock()  # reentrant: a tool's finalizer may run (GC) while this thread holds it
_connections: dict[str, Connection] = {}
_closing: set[concurrent.futures.Future[None]] = set()  # released connections still winding down
_epoch = 0


def acquire(server: MCPServer) -> Connection:
    """The connection to `server`, shared with every other user of it; one reference taken.

    Nothing is started here: the session opens on first use.
    """
    with _lock:
        conn = _connections.get(server.key)
        if conn is None:
            conn = _connections[server.key] = Connection(server)
        conn.refs += 1
        return conn


def release(conn: Connection) -> concurrent.futures.Future[None] | None:
    """Drop one reference; the last one closes the connection (the returned future ends with it)."""
    with _lock:
        if conn.epoch != _epoch:  # made before a fork: the parent owns it
            return None
        conn.refs -= 1
        if conn.refs > 0 or _connections.get(conn.key) is not conn:
            return None
        del _connections[conn.key]
        return _close(conn)


def is_current(conn: Connection) -> bool:
    """False for a closed connection, or one made before this process was forked (the parent's)."""
    return conn.epoch == _epoch and not conn.closed


def _close(conn: Connection) -> concurrent.futures.Future[None]:
    """Close `conn` on the background loop, tracked until it has (so exit waits for it)."""
    closing = loop.submit(conn.aclose())
    _closing.add(closing)
    closing.add_done_callback(_closing.discard)
    return closing


# ---------------------------------------------------------------------- episode connections
class _EpisodeEntry:
    """An episode's own connection to one server, and the tools holding it (by holder token)."""

    __slots__ = ("conn", "holders")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.holders: set[int] = set()


_episodes: dict[tuple[str, str], _EpisodeEntry] = {}
_episode_failures: dict[str, _StartFailure] = {}  # per server: one cool-down for all its episodes
_holders = itertools.count(1)


def new_holder() -> int:
    """A token naming one holder (a tool) of episode connections; unlike `id()`, never reused."""
    return next(_holders)


def acquire_episode(server: MCPServer, episode_id: str, holder: int) -> Connection:
    """The connection of episode `episode_id` to `server`, made on the episode's first call; `holder` noted.

    Nothing is started here: the session opens on first use.
    """
    with _lock:
        entry = _episodes.get((server.key, episode_id))
        if entry is None:
            failures = _episode_failures.setdefault(server.key, _StartFailure())
            conn = Connection(server, episode=episode_id, failures=failures)
            entry = _episodes[server.key, episode_id] = _EpisodeEntry(conn)
        entry.holders.add(holder)
        return entry.conn


def release_episode(server: MCPServer, episode_id: str, holder: int) -> concurrent.futures.Future[None] | None:
    """`holder` is done with the episode's connection; the last holder closes it (the future ends with it)."""
    with _lock:
        return _let_go((server.key, episode_id), holder)


def _tools_changed_notice(message: Any) -> bool:
    """True for `notifications/tools/list_changed`, as `ClientSession`'s `message_handler` gets
    it: the notification itself (mcp 2.x), or wrapped in `ServerNotification`, a `RootModel`
    (mcp 1.x), whose `root` is the notification."""
    from mcp import types

    return isinstance(getattr(message, "root", message), types.ToolListChangedNotification)


def drop_holder(holder: int) -> list[concurrent.futures.Future[None]]:
    """`holder` lets go of every episode connection it holds (a tool closing); the closings it causes."""
    with _lock:
        held = [key for key, entry in tuple(_episodes.items()) if holder in entry.holders]  # GC may run here
        return [c for c in (_let_go(key, holder) for key in held) if c is not None]


def _let_go(key: tuple[str, str], holder: int) -> concurrent.futures.Future[None] | None:
    """Remove `holder` from the entry at `key` (under `_lock`); close the connection if none is left."""
    entry = _episodes.get(key)
    if entry is None or holder not in entry.holders:
        return None
    entry.holders.discard(holder)
    if entry.holders:
        return None
    del _episodes[key]
    return _close(entry.conn)


def _close_all() -> None:
    """At exit: close every connection (terminating stdio servers), then stop the loop."""
    with _lock:
        conns = [*_connections.values(), *(e.conn for e in _episodes.values())]
        _connections.clear()
        _episodes.clear()
        pending = list(_closing)
    if not loop.started():
        return
    futures = [*pending, *(loop.submit(c.aclose()) for c in conns)]
    concurrent.futures.wait(futures, timeout=CLOSE_TIMEOUT)
    loop.stop()


def _forget_after_fork() -> None:
    """A forked child does not own its parent's sessions or processes."""
    global _lock, _connections, _closing, _epoch, _episodes, _episode_failures
    _lock, _connections, _closing, _epoch = threading.RLock(), {}, set(), _epoch + 1
    _episodes, _episode_failures = {}, {}


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
