"""`RemoteToolEnv`: a ToolEnv whose episodes run on a `toolenv serve` server.

It is a `ToolEnv` subclass, so the rollout runner, the vector env and verl's agent loop
take it for a local one: `env.parser` is the server's parser rebuilt here (its stop
strings, `format_call` and `format_results` serve the agent), `tool_schemas()` are the
server's, and `env.episode` mirrors the server's episode turn by turn from the step
responses. The tools themselves run on the server only: `env.tools` is empty, and an
episode's tool `state` stays on the server.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import copy
import html
import json
import logging
import os
import random
import re
import secrets
import threading
import time
import warnings
import weakref
from collections.abc import Coroutine, Mapping
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, SupportsFloat, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from toolenv._text import fix_text
from toolenv._tls import tls_context
from toolenv.env import ToolEnv, _in_flight, _not_text
from toolenv.episode import Episode, Turn
from toolenv.parsers.base import get_parser
from toolenv.remote.wire import (
    ENV_CHANGED,
    ENV_HEADER,
    FEATURES,
    FEATURES_HEADER,
    IDEMPOTENCY_KEY,
    PARSED,
    PROTOCOL_VERSION,
    REPLAY,
    EnvMetadata,
    ErrorResponse,
    ResetOptions,
    ResetRequest,
    ResetResponse,
    SessionCreated,
    StepRequest,
    StepResponse,
    TaskList,
    TruncateRequest,
    TruncateResponse,
    dump_json,
    feature_set,
)
from toolenv.rewards.base import Reward, WeightedSum
from toolenv.types import ParsedAction, Task, load_tasks

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_SESSION_WAIT",
    "DEFAULT_TIMEOUT",
    "RemoteEnvError",
    "RemoteToolEnv",
    "SessionGoneError",
]

log = logging.getLogger("toolenv.remote")

#: Seconds one request may take; a step runs all of its tool calls.
DEFAULT_TIMEOUT = 300.0
#: Times a request whose answer was lost is sent again (to a server that replays answers).
DEFAULT_RETRIES = 2
#: Seconds before the first of those retries; doubled for each next one.
RETRY_BACKOFF = 0.2
#: Seconds opening a session keeps trying while the server is at its session limit (429). A client
#: killed outright (OOM, a lost node) holds its slots until the server's `--session-ttl` (600 s) runs
#: out, then up to ~90 s more to be reaped and closed; a run started again must outwait that.
DEFAULT_SESSION_WAIT = 900.0
#: Seconds before the first new try of a create refused as busy; doubled for each next one, up to the cap.
BUSY_BACKOFF = 0.5
BUSY_BACKOFF_CAP = 15.0
#: Seconds between the log lines of a client waiting for a slot.
BUSY_NOTE_EVERY = 60.0
#: Seconds a connection to the server may take to be made (or `timeout`, if shorter): a host that is
#: down is said soon, not after the request timeout, which tools that run long make long.
CONNECT_TIMEOUT = 30.0
#: Seconds the release of a session whose env was dropped unclosed may take, and exit waits for those.
RELEASE_TIMEOUT = 2.0
_JSON = {"content-type": "application/json"}
#: Exceptions the server reports for reset options the env rejected; raised here as locally.
_REBUILT: dict[str, type[Exception]] = {e.__name__: e for e in (ValueError, KeyError, IndexError, TypeError)}

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class RemoteEnvError(RuntimeError):
    """The server could not be reached, did not answer in time, lost the session, or failed.

    Raised by `reset`/`step` (the rollout runner records it as the episode's error and goes
    on). `status` is the HTTP status when the server answered, None when it did not.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SessionGoneError(RemoteEnvError):
    """404: the server no longer has the session (deleted, idle too long, restarted); the
    episode cannot go on, and the next `reset` opens a new session by itself."""


class _BusyError(RemoteEnvError):
    """429: the server (or a proxy in front) is busy; `detail` is what it said, `retry_after` the
    seconds its `Retry-After` header asks to wait (None without one)."""

    def __init__(self, message: str, *, detail: str, retry_after: float | None) -> None:
        super().__init__(message, status=429)
        self.detail, self.retry_after = detail, retry_after


def _retry_after(value: str | None) -> float | None:
    """The seconds a `Retry-After` header asks to wait (delta-seconds or an HTTP date); None if unreadable."""
    text = (value or "").strip()
    if text.isascii() and text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


class _ServerReward(Reward):
    """A reward component computed on the server; only its name (and weight) is known here."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def final(self, episode: Episode) -> float:
        """Refused: the reward runs on the server, in its steps and truncates. Scored here, every
        part would be 0.0 whatever the answer (verl's `compute_score` on `toolenv/Remote-v0` rows)."""
        raise RuntimeError(
            f"reward {self.name!r} of a RemoteToolEnv is computed on the server, by its steps and truncate: "
            "it cannot score an episode on the client (to score a response, use the served env's id and "
            "arguments, or let ToolEnvAgentLoop step the remote env)"
        )


def _connect_limit(timeout: float | None) -> float:
    """Seconds to make a connection in: `CONNECT_TIMEOUT` (read when an env is built), or `timeout` if shorter."""
    return CONNECT_TIMEOUT if timeout is None else min(timeout, CONNECT_TIMEOUT)


def _blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` from sync code, also when this thread runs an event loop (the rollout
    runner builds envs inside one): on a short-lived loop in a worker thread."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="toolenv-remote") as pool:
        return pool.submit(asyncio.run, coro).result()


#: What a proxy or load balancer in front answers when the server's answer did not come through it.
_GATEWAY_STATUSES = frozenset({502, 503, 504})
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def _from_gateway(resp: httpx.Response) -> bool:
    """Whether `resp` is a proxy's 502/503/504 rather than the server's (whose errors are an `ErrorResponse`)."""
    if resp.status_code not in _GATEWAY_STATUSES:
        return False
    try:
        ErrorResponse.model_validate_json(resp.content)
    except ValidationError:
        return True
    return False


def _one_line(resp: httpx.Response) -> str:
    """The gist of an error body that is not the server's JSON, in one line: an HTML page's title
    (a proxy's or another web server's error page), else the text with its white space collapsed."""
    text = resp.text
    if "html" in resp.headers.get("content-type", "") or text.lstrip().startswith("<"):
        found = _TITLE.search(text)
        title = " ".join(html.unescape(found.group(1)).split()) if found else ""
        return title[:200] or resp.reason_phrase
    return " ".join(text.split())[:200] or resp.reason_phrase


class _Lease:
    """The server session a `RemoteToolEnv` holds, deleted when the env is dropped without `close()`.

    Apart from the env, so that its `weakref.finalize` does not keep the env alive. Without it,
    a dropped env (a notebook cell run again) holds a slot of the server until the session TTL.
    The release is best effort: a short DELETE on a thread of its own (never blocking the thread
    that dropped the env, which may run an event loop), never raising. At interpreter exit the
    sessions of envs still open are released too, for `RELEASE_TIMEOUT` seconds at most.
    """

    def __init__(self, url: str, headers: dict[str, str], reachable: bool) -> None:
        self.url, self.headers, self.reachable = url, headers, reachable
        self.session: str | None = None
        self.pid = os.getpid()  # a forked child's copy must not delete its parent's session
        _LEASES.add(self)

    def dropped(self) -> None:
        """The env was garbage-collected: say it was not closed, and release its session."""
        if self.session is not None and self.pid == os.getpid():
            warnings.warn(
                f"unclosed RemoteToolEnv holding session {self.session!r} of the server at {self.url}; "
                "releasing it now: call env.close() when done with an env",
                ResourceWarning,
                stacklevel=2,
            )
        self.release()

    def release(self) -> threading.Thread | None:
        """Delete the session from a thread of its own (returned); None when there is nothing to send."""
        session, self.session = self.session, None
        if session is None or not self.reachable or self.pid != os.getpid():
            return None  # a given transport is not usable from here (another loop's, or no real address)
        thread = threading.Thread(target=self._delete, args=(session,), name="toolenv-remote-release", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # the interpreter is shutting down: no thread can start now
            return None
        return thread

    def _delete(self, session: str) -> None:
        try:
            with httpx.Client(headers=self.headers, timeout=RELEASE_TIMEOUT, verify=tls_context()) as client:
                resp = client.delete(f"{self.url}/sessions/{session}")
            if resp.status_code not in (204, 404):
                log.debug("releasing session %s of %s: answered %d", session, self.url, resp.status_code)
        except Exception as exc:  # noqa: BLE001 - best effort: the session expires at its TTL anyway
            log.debug("releasing session %s of %s failed: %r", session, self.url, exc)


#: The leases of envs alive, released at interpreter exit.
_LEASES: weakref.WeakSet[_Lease] = weakref.WeakSet()


@atexit.register
def _release_at_exit() -> None:
    """Release the sessions of envs still open at exit, all at once, for `RELEASE_TIMEOUT` seconds at most."""
    threads = [t for t in (lease.release() for lease in list(_LEASES)) if t is not None]
    deadline = time.monotonic() + RELEASE_TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


class RemoteToolEnv(ToolEnv):
    """A drop-in for a local env, stepped over HTTP on a `toolenv serve` server.

    Construction reads the server's metadata (parser, tool schemas, `max_turns`, reward
    weights); the first `reset` opens a session, i.e. one env instance on the server for
    this object, and `close`/`aclose` deletes it (an env dropped unclosed, or still open at
    interpreter exit, has it deleted too, best effort; dropped, with a `ResourceWarning`).
    `tasks` lists the server's tasks on first use. A server that restarted with another env
    (other tools, parser, prompt, limits or tasks) refuses its requests: a `RemoteEnvError`
    (409) says to build a new `RemoteToolEnv`; one restarted with the same env is picked up
    by the next `reset`.

    Args:
        url: the server's base URL, e.g. `http://127.0.0.1:8000`.
        headers: sent with every request (e.g. the `Authorization` a proxy in front expects).
        timeout: seconds one request may take (a step runs all of its tool calls); None: no limit.
            Its connection must be made within `CONNECT_TIMEOUT` seconds (or `timeout`, if shorter).
        transport: an `httpx.AsyncBaseTransport` to send requests through (retries, a Unix
            socket, a proxy); used as is and closed with the env. It belongs to one event
            loop, as an httpx client: use the env's sync API or its async API, not both.
        retries: times a step, truncate, end, session create or reset whose answer was lost
            (a dropped connection, a timeout, a proxy's 502/503/504 page) is sent again, after a
            short backoff. Each step names its episode and turn, so the server answers a repeat
            with the answer of the run it repeats rather than running the tools again; a reset is
            sent again only when it names its task or seeds the env. A server too old to replay
            answers gets no retries. A cancelled call is never sent again.
        session_wait: seconds opening a session (the first `reset`, or one after the session was
            lost) keeps trying while the server is at its `--max-sessions` limit (a 429), with
            backoff, as long as a `Retry-After` header asks if it sends one; then `RemoteEnvError`
            (429) says what to do. The default outwaits the slots a killed client holds until
            the server's default `--session-ttl`; 0 fails at once, None waits without end.
        render_mode: None or `"ansi"` (the mirrored episode's messages).

    Raises:
        ValueError: `url` is not a URL, or `timeout`, `retries` or `session_wait` is out of range.
        RemoteEnvError: the server cannot be reached or is not a compatible toolenv server.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        retries: int = DEFAULT_RETRIES,
        session_wait: float | None = DEFAULT_SESSION_WAIT,
        render_mode: str | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be 0 or more, got {retries}")
        if session_wait is not None and not (
            isinstance(session_wait, int | float) and not isinstance(session_wait, bool) and session_wait >= 0
        ):
            raise ValueError(f"session_wait must be 0 or more seconds, or None (no limit), got {session_wait!r}")
        if timeout is not None and not (
            isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0
        ):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        try:
            httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"url {url!r} is not a valid URL: {exc}") from None
        self.url = url.rstrip("/")
        self._retries = retries
        self._session_wait = session_wait
        self._headers = dict(headers or {})
        self._timeout = httpx.Timeout(timeout, connect=_connect_limit(timeout))
        self._transport = transport
        self._fingerprint: str | None = None  # the server's env, as it said at construction
        self._takes_parsed = False  # the server runs a step's `parsed` (feature PARSED)
        self._lease = self._new_lease()
        # One keep-alive client per event loop: an httpx client (its connections) belongs to one loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._session: str | None = None
        # The idempotency key of the session being opened: kept until a create succeeds, so a
        # create sent again after its answer was lost gets the session the server made then.
        self._create_key: str | None = None
        self._lost: str | None = None  # why the current episode cannot take another step
        # The server may still be running a call of the session whose answer never came (it
        # was cancelled, or timed out): the next reset moves to a new session, not behind it.
        self._busy = False
        meta, tasks, self._replays = _blocking(self._describe())
        self._lease.headers = self._request_headers()  # with the fingerprint, known now
        try:
            parser = get_parser(meta.parser, **meta.parser_kwargs)
        except (ValueError, TypeError) as exc:
            raise RemoteEnvError(f"the server's parser {meta.parser!r} cannot be built here: {exc}") from None
        reward = WeightedSum({k: (_ServerReward(k), w) for k, w in meta.reward_weights.items()})
        super().__init__(
            parser=parser,
            reward=reward,
            max_turns=meta.max_turns,
            render_mode=render_mode,
            # The server's prompt texts (absent from an older server: None and none, as before then).
            system_prompt=meta.system_prompt,
            answer_tool_rewrites=meta.answer_tool_rewrites,
        )
        #: The server's description of its env.
        self.remote = meta
        self._tasks: list[Task] | None = tasks  # after ToolEnv.__init__, which sets `tasks` to []

    @property
    def _session(self) -> str | None:
        """The id of the server session this env holds (kept in its lease, released if the env is dropped)."""
        return self._lease.session

    @_session.setter
    def _session(self, value: str | None) -> None:
        self._lease.session = value

    def _new_lease(self) -> _Lease:
        lease = _Lease(self.url, self._request_headers(), reachable=self._transport is None)
        weakref.finalize(self, lease.dropped).atexit = False  # exit releases by `_release_at_exit`
        return lease

    # ------------------------------------------------------------------ what stands in for the env
    @property
    def tasks(self) -> list[Task]:
        """The server's tasks, fetched on first use (with a `transport`: at construction); assign to use others."""
        if self._tasks is None:
            found = _blocking(self._get_once("/tasks", TaskList, "list the server's tasks"))[0].tasks
            self._tasks = found
        return self._tasks

    @tasks.setter
    def tasks(self, value: list[Task]) -> None:
        self._tasks = list(value)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The server's tool schemas (OpenAI function format)."""
        return copy.deepcopy(self.remote.tool_schemas)

    # ------------------------------------------------------------------ async API
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on the server. Options as for a local env: `task`, `task_id` or `task_index`."""
        if self._in_step:  # its answer would come for the new episode
            raise _in_flight("reset")
        self._seed_lazily(seed)  # the local generator reads as a local env's would
        opts = dict(options or {})
        given = opts.get("task")
        if given is not None and not isinstance(given, Task):
            opts["task"] = given = load_tasks([given])[0]  # ids default as locally
        request = ResetRequest(seed=seed, options=ResetOptions.model_validate(opts))
        if self._episode is not None:
            self._episode.released = True  # the server's reset releases it
        self._episode, self._lost = None, None
        if self._busy:
            await self._abandon_session()
        if self._session is None:
            await self._open_session()
        assert self._session is not None
        # Sent again, a reset starts another episode, of the same task only when the request
        # names it or seeds the env; a reset in the env's own order would move that order on.
        again = seed is not None or any(opts.get(k) is not None for k in ("task", "task_id", "task_index"))
        try:
            try:
                reply = await self._reset(request, again)
            except SessionGoneError:  # reaped while idle, or the server restarted: a new session will do
                await self._open_session()
                reply = await self._reset(request, again)
        except BaseException as exc:
            self._failed(exc)  # no answer: the server may still be in it, the next reset goes elsewhere
            raise
        task = given if isinstance(given, Task) else reply.task
        if task is None:
            raise RemoteEnvError(f"reset: the server at {self.url} did not say which task it chose")
        self._episode = Episode(
            task=task, episode_id=reply.episode_id, caller=self.caller, messages=list(reply.messages)
        )
        return reply.observation, {"task_id": reply.task_id, "turn": 0, "messages": reply.messages}

    async def _reset(self, request: ResetRequest, again: bool) -> ResetResponse:
        path = f"/sessions/{self._session}/reset"
        return await self._call("POST", path, request, ResetResponse, "reset", retry=again)

    async def astep(
        self, action: str, *, parsed: ParsedAction | None = None
    ) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take one model turn on the server; `info` holds what a local env's does.

        With `parsed` (native tool calls), a server of this version runs it as given, `action`
        as its text, as a local env does; an older server gets the text alone and parses it, so
        `action` should then be the turn written out (`toolenv.env.written_turn`).
        """
        ep = self._episode_to_step()
        if self._lost is not None:
            raise RemoteEnvError(self._lost)
        if not isinstance(action, str):  # as a local env refuses it: bytes, token ids, None
            raise _not_text(action)
        action = fix_text(action)  # as a local env records it (the wire would send U+FFFD anyway)
        sent = parsed if self._takes_parsed else None
        request = StepRequest(action=action, parsed=sent)
        if self._replays:  # which turn of which episode: sent again, it is answered, not run again
            request = StepRequest(action=action, episode_id=ep.episode_id, turn=len(ep.turns) + 1, parsed=sent)
        self._begin_step()  # two at once would name one turn: the second would get the first's answer
        try:
            reply = await self._call(
                "POST", f"/sessions/{self._session}/step", request, StepResponse, "step", retry=True
            )
        except BaseException as exc:  # the server may or may not have taken the step
            self._failed(exc, "last step")
            raise
        finally:
            self._end_step()
        info = reply.info
        turn = Turn(action, info.action, info.tool_results, info.tool_calls, reply.observation)
        turn.reward, turn.reward_components = reply.reward, info.reward_components
        ep.turns.append(turn)
        if info.action.answer is not None:
            ep.answer = info.action.answer
        ep.terminated, ep.truncated = reply.terminated, reply.truncated
        ep.messages.extend(info.messages)
        out: dict[str, Any] = {
            "task_id": info.task_id,
            "turn": info.turn,
            "action": info.action,
            "tool_results": info.tool_results,
            "tool_calls": info.tool_calls,
            "messages": info.messages,
            "reward_components": dict(info.reward_components),
        }
        if ep.terminated or ep.truncated:
            ep.released = True  # the server's env released it
            ep.reward_info = info.reward_info or {}
            out["answer"] = ep.answer
            out["reward_info"] = {k: dict(v) for k, v in ep.reward_info.items()}
            out["episode_stats"] = dict(info.episode or {})
        return reply.observation, reply.reward, ep.terminated, ep.truncated, out

    async def atruncate(self) -> float:
        """End the open episode on the server, unanswered, and mirror its final reward here."""
        ep = self._episode
        if ep is None or ep.terminated or ep.truncated:
            return 0.0
        if self._lost is not None:
            raise RemoteEnvError(self._lost)
        request = TruncateRequest(episode_id=ep.episode_id) if self._replays else None
        try:
            reply = await self._call(
                "POST", f"/sessions/{self._session}/truncate", request, TruncateResponse, "truncate", retry=True
            )
        except BaseException as exc:  # the server may have scored and ended it: sent again, it would score 0.0
            self._failed(exc, "truncate")
            raise
        ep.truncated = ep.released = True  # the server released it
        if ep.turns:
            ep.turns[-1].reward += reply.reward
            ep.turns[-1].reward_components = dict(reply.last_turn_components)
        return reply.reward

    async def aend_episode(self) -> None:
        """Let the server's tools free what they hold for the current episode (idempotent).

        Best effort, as a local env's: a failure is logged, not raised.
        """
        ep = self._episode
        if ep is None or ep.released:
            return
        ep.released = True
        if self._session is not None and self._lost is None:
            try:
                await self._do("POST", f"/sessions/{self._session}/end", "end_episode", retry=True)
            except BaseException as exc:
                self._failed(exc)
                if not isinstance(exc, RemoteEnvError):
                    raise
                if not isinstance(exc, SessionGoneError):  # gone: its env was closed, and the episode with it
                    # Logged, not raised, as a local env's failing release: the next reset or close
                    # releases the episode on the server anyway.
                    log.warning("%s", exc)

    async def aclose(self) -> None:
        """Delete the session (closing its env on the server), then the HTTP client.

        Best effort: a server that is gone is logged, not raised.
        """
        if self._episode is not None:
            self._episode.released = True
        try:
            if self._session is None and self._create_key is not None:
                # A create whose answer was lost may have made a session: get it by its key, to delete it.
                # Not waiting for a slot: a 429 says it made none, and a close must not wait for one.
                await self._open_session(wait=False)
        except RemoteEnvError as exc:
            log.warning("could not delete the session of a create whose answer was lost: %s", exc)
        self._create_key = None
        try:
            await self._abandon_session("close")
        finally:
            client = self._clients.pop(asyncio.get_running_loop(), None)
            if client is not None and not client.is_closed:
                await client.aclose()

    def close(self) -> None:
        """Delete the session and close the HTTP client (from sync code)."""
        if self._loop is not None and not self._loop.is_closed():
            super().close()  # aclose on the private loop of reset/step, then that loop
        elif self._session is not None or self._create_key is not None:
            _blocking(self.aclose())

    # ------------------------------------------------------------------ copies
    def __getstate__(self) -> dict[str, Any]:
        """The env without its HTTP clients and its session: a copy (pickled to a worker, or
        deep-copied) opens a session of its own at its first reset. Sharing the original's,
        its steps would interleave with the original's and its close would end them. The
        mirrored episode comes along, but the server's is not copied: the copy cannot step it.
        A given `transport` is copied as far as it can be (an httpx one cannot)."""
        state = super().__getstate__()
        state["_clients"] = state["_lease"] = None
        state["_create_key"] = None
        state["_busy"] = False
        ep = self._episode
        if ep is not None and not (ep.terminated or ep.truncated):
            state["_lost"] = (
                "this env is a copy, and the episode it was copied in lives on the server with the "
                "original's session; call reset() to start one of its own"
            )
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a copy; its HTTP clients are made on first use."""
        self.__dict__.update(state)
        self._clients = weakref.WeakKeyDictionary()
        self._lease = self._new_lease()

    # ------------------------------------------------------------------ HTTP
    def _request_headers(self) -> dict[str, str]:
        """What every request sends: the features this client reads (the server then sends their
        fields), the server's env it was built for once known (a server restarted with another env
        refuses it, 409, rather than serve it silently with this client's stale mirror), the user's."""
        env = {} if self._fingerprint is None else {ENV_HEADER: self._fingerprint}
        return {FEATURES_HEADER: ", ".join(FEATURES), **env, **self._headers}

    def _new_client(self, **extra_headers: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={**self._request_headers(), **extra_headers},
            timeout=self._timeout,
            transport=self._transport,
            verify=tls_context(),
        )

    def _http(self) -> httpx.AsyncClient:
        """The keep-alive client of the running loop."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = self._clients[loop] = self._new_client()
        return client

    async def _open_session(self, *, wait: bool = True) -> None:
        """Open the session the next calls go to; with `wait`, wait for a slot while the server is full."""
        if self._create_key is None:
            self._create_key = secrets.token_urlsafe(16)
        headers = {IDEMPOTENCY_KEY: self._create_key}
        try:
            created = await (self._create_when_free(headers) if wait else self._create(headers))
        except RemoteEnvError as exc:
            if exc.status is not None:  # the server answered: it made no session with this key
                self._create_key = None
            raise
        self._session, self._create_key = created.session_id, None

    async def _create(self, headers: Mapping[str, str]) -> SessionCreated:
        """One `POST /sessions` (sent again when its answer was lost: the key makes that safe)."""
        return await self._call(
            "POST", "/sessions", None, SessionCreated, "open a session", headers=headers, retry=True
        )

    async def _create_when_free(self, headers: Mapping[str, str]) -> SessionCreated:
        """Create a session, trying again while the server answers 429 (at its session limit), for
        `session_wait` seconds at most: a busy server's slots free as its other clients close or
        are reaped (a killed client's at the server's session TTL), so the run goes on then rather
        than fail every episode now. A 429 made no session, so trying again with the key is safe."""
        started = time.monotonic()
        deadline = None if self._session_wait is None else started + self._session_wait
        note, attempt = started, 0
        while True:
            try:
                return await self._create(headers)
            except _BusyError as exc:
                busy = exc
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise self._still_busy(busy, now - started)
            if now >= note:
                log.warning(
                    "open a session: the toolenv server at %s is at its session limit (429: %s); %s",
                    self.url,
                    busy.detail,
                    "waiting for a slot"
                    if deadline is None
                    else f"waiting up to {deadline - now:.0f} s more for a slot",
                )
                note = now + BUSY_NOTE_EVERY
            await asyncio.sleep(self._busy_delay(busy, attempt, None if deadline is None else deadline - now))
            attempt += 1

    @staticmethod
    def _busy_delay(busy: _BusyError, attempt: int, left: float | None) -> float:
        """Seconds before trying again: the server's `Retry-After` if it sent one (not under
        `RETRY_BACKOFF`: a "0" must not make a tight loop), else a jittered exponential backoff
        (clients turned away at once do not all come back at once); never past `left`."""
        if busy.retry_after is not None:
            delay = max(busy.retry_after, RETRY_BACKOFF)
        else:
            delay = min(BUSY_BACKOFF * 2**attempt, BUSY_BACKOFF_CAP) * random.uniform(0.5, 1.0)
        return delay if left is None else min(delay, left)

    def _still_busy(self, busy: _BusyError, waited: float) -> RemoteEnvError:
        """The 429 that outlasted `session_wait`, in one line that says what to do."""
        waiting = f" after waiting {waited:.1f} s for a slot" if self._session_wait else ""
        return RemoteEnvError(
            f"open a session: the toolenv server at {self.url} is at its session limit{waiting} "
            f"(429: {busy.detail}); sessions of a client that died hold their slots until the server's "
            "--session-ttl: wait and run again, start the server with a larger --max-sessions or a shorter "
            "--session-ttl, or let the client wait longer (session_wait, --env-arg session_wait=SECONDS)",
            status=429,
        )

    def _failed(self, exc: BaseException, call: str | None = None) -> None:
        """What a call into the session that did not succeed leaves behind (the one rule for it).

        With no answer (a cancel, a timeout, a dropped connection) the server may still be in
        that call: the next reset moves to a new session rather than queue behind it. A 404
        means the session is gone, and its env with it. A failed `call` of the episode (a step,
        a truncate) may or may not have happened there: the episode cannot go on.
        """
        # A cancel or an interrupt is not an Exception; what is, and no RemoteEnvError, is one
        # the server answered (reset options it rejected, raised here as locally).
        unanswered = not isinstance(exc, Exception) or (isinstance(exc, RemoteEnvError) and exc.status is None)
        if isinstance(exc, SessionGoneError):
            self._session = None
        elif unanswered:
            self._busy = True
        if call is not None:
            why = str(exc) if isinstance(exc, RemoteEnvError) else f"its {call} was cancelled"
            self._lost = f"this episode was lost ({why}); call reset() to start another"

    async def _abandon_session(self, what: str = "close the previous session") -> None:
        """Delete the session, which may still run a call whose answer was lost, without
        waiting for that call (the server cancels it, then closes the env); the next reset
        opens a new one. A server that is gone is logged, not raised."""
        session, self._session, self._busy = self._session, None, False
        if session is None:
            return
        try:
            await self._do("DELETE", f"/sessions/{session}", what, retry=True)
        except SessionGoneError:
            pass
        except RemoteEnvError as exc:
            log.warning("could not delete session %s: %s", session, exc)

    async def _describe(self) -> tuple[EnvMetadata, list[Task] | None, bool]:
        """The server's metadata, with a given transport its tasks too, and whether it replays answers.

        A transport, as an httpx client, belongs to the event loop whose connections it
        keeps; read later, from a short-lived loop (`tasks` is a property), the tasks would
        reach for a connection of another loop. Without one, they are fetched on first use.
        """
        what = "read the server's metadata"
        resp = await self._get_raw("/metadata", what)
        self._check_protocol(resp)
        meta = self._parse(resp, EnvMetadata, what)
        features = feature_set(resp.headers.get(FEATURES_HEADER))
        replays = REPLAY in features
        self._takes_parsed = PARSED in features
        self._fingerprint = resp.headers.get(ENV_HEADER)  # absent from a server before it: no check
        if self._transport is None:
            return meta, None, replays
        return meta, (await self._get_once("/tasks", TaskList, "list the server's tasks"))[0].tasks, replays

    def _check_protocol(self, resp: httpx.Response) -> None:
        """Refuse a server of another protocol, read before the metadata is validated: a newer
        one's has fields this client does not know, and that error would not say why."""
        try:
            found = json.loads(resp.content)
        except ValueError:
            return  # not JSON: validating it says what it is
        if not isinstance(found, dict):
            return
        protocol, version = found.get("protocol", PROTOCOL_VERSION), found.get("toolenv_version", "unknown")
        if protocol != PROTOCOL_VERSION:
            raise RemoteEnvError(
                f"the server at {self.url} speaks toolenv protocol {protocol} (toolenv {version}), "
                f"this client protocol {PROTOCOL_VERSION}; install the same toolenv version on both sides"
            )

    async def _get_once(self, path: str, model: type[M], what: str) -> tuple[M, httpx.Response]:
        """One GET on a client of its own, its answer validated as `model`."""
        resp = await self._get_raw(path, what)
        return self._parse(resp, model, what), resp

    async def _get_raw(self, path: str, what: str) -> httpx.Response:
        """One GET on a client of its own, for the blocking calls (their loop is short-lived)."""
        client = self._new_client(connection="close")
        try:
            return await self._send(client, "GET", path, None, what)
        finally:
            if self._transport is None:  # a given transport lives on with the env
                await client.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | None,
        model: type[M],
        what: str,
        *,
        headers: Mapping[str, str] | None = None,
        retry: bool = False,
    ) -> M:
        """A request on the loop's keep-alive client, its answer validated as `model`."""
        resp = await self._send(self._http(), method, path, body, what, headers=headers, retry=retry)
        return self._parse(resp, model, what)

    async def _do(self, method: str, path: str, what: str, *, retry: bool = False) -> None:
        """A request whose answer has no body (204)."""
        await self._send(self._http(), method, path, None, what, retry=retry)

    async def _send(
        self,
        client: httpx.AsyncClient,
        method: str,
        path: str,
        body: BaseModel | None,
        what: str,
        *,
        headers: Mapping[str, str] | None = None,
        retry: bool = False,
    ) -> httpx.Response:
        """Send one request; with `retry`, to a server that replays answers, send it again while
        no answer comes (up to `retries` more times): the request itself says what it repeats.

        A proxy's 502/503/504 error page (not the server's JSON error) counts as no answer: the
        proxy lost the server's answer or gave up waiting for it, and the server may still run it.
        """
        content = None if body is None else dump_json(body)
        sent = {**(headers or {}), **({} if body is None else _JSON)}
        attempts = 1 + (self._retries if retry and self._replays else 0)
        for attempt in range(attempts):
            try:
                resp = await client.request(method, path, content=content, headers=sent or None)
            except httpx.TransportError as exc:
                if attempt + 1 == attempts:
                    raise self._no_answer(exc, what, attempts) from exc
                log.warning("%s: no answer from %s (%s); sending it again", what, self.url, type(exc).__name__)
            except httpx.HTTPError as exc:  # an answer httpx could not read (its encoding)
                raise RemoteEnvError(f"{what}: bad answer from the toolenv server at {self.url} ({exc!r})") from exc
            else:
                if not _from_gateway(resp):
                    break
                # A proxy in front answered for the server (its upstream connection broke, or its
                # read timeout passed): the server may or may not have run it, as with no answer.
                if attempt + 1 == attempts:
                    raise self._gateway_failure(resp, what, attempts)
                log.warning(
                    "%s: a proxy in front of %s answered %d; sending it again", what, self.url, resp.status_code
                )
            await asyncio.sleep(RETRY_BACKOFF * 2**attempt)
        if resp.status_code >= 400:
            raise self._failure(resp, what)
        if resp.is_redirect:  # not followed: a POST's body would be dropped, or sent to another host
            raise RemoteEnvError(
                f"{what}: the server at {self.url} redirects to {resp.headers['location']} ({resp.status_code}); "
                "build the RemoteToolEnv with the URL it redirects to (an https:// one, another path)",
                status=resp.status_code,
            )
        return resp

    def _no_answer(self, exc: httpx.TransportError, what: str, attempts: int = 1) -> RemoteEnvError:
        """No answer came (a dropped connection, a timeout): the server may or may not have run the request.

        One line that names the limit waited for (httpx's own message for a timeout is empty).
        """
        name, detail = type(exc).__name__, str(exc).strip()
        cause = f"{name}: {detail}" if detail else name
        if attempts > 1:
            cause += f"; sent {attempts} times"
        if isinstance(exc, httpx.TimeoutException):
            kind = {httpx.ConnectTimeout: "connect", httpx.WriteTimeout: "write", httpx.PoolTimeout: "pool"}
            limit = getattr(self._timeout, kind.get(type(exc), "read"))
            within = f" within {limit:g} s" if limit is not None else " in time"
            if isinstance(exc, httpx.ConnectTimeout):
                return RemoteEnvError(
                    f"{what}: cannot reach the toolenv server at {self.url}: no connection{within} ({cause})"
                )
            return RemoteEnvError(f"{what}: no answer from the toolenv server at {self.url}{within} ({cause})")
        return RemoteEnvError(f"{what}: cannot reach the toolenv server at {self.url} ({cause})")

    def _parse(self, resp: httpx.Response, model: type[M], what: str) -> M:
        try:
            return model.model_validate_json(resp.content)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(map(str, first["loc"])) or "body"
            raise RemoteEnvError(
                f"{what}: the answer from {resp.url} is not a toolenv {model.__name__} ({where}: {first['msg']}); "
                "is it a toolenv server of the same version?"
            ) from None

    def _gateway_failure(self, resp: httpx.Response, what: str, attempts: int) -> RemoteEnvError:
        """A proxy's error page instead of the server's answer: no answer (`status` None), in one line."""
        sent = f"; sent {attempts} times" if attempts > 1 else ""
        return RemoteEnvError(
            f"{what}: no answer from the toolenv server at {self.url}: a proxy or gateway in front answered "
            f"{resp.status_code} ({_one_line(resp)}){sent}"
        )

    def _failure(self, resp: httpx.Response, what: str) -> Exception:
        try:
            body = ErrorResponse.model_validate_json(resp.content)
            message, kind = body.error, body.type
        except ValidationError:
            message, kind = _one_line(resp), None
        status = resp.status_code
        if status == 409 and kind == ENV_CHANGED:
            return RemoteEnvError(
                f"{what}: the server at {self.url} now serves another env than when this RemoteToolEnv was built "
                "(it restarted with other tools, parser, prompt, limits or tasks); build a new RemoteToolEnv for it",
                status=status,
            )
        if status == 400 and kind in _REBUILT:
            return _REBUILT[kind](message)
        if status == 404 and "/sessions/" in resp.request.url.path:
            return SessionGoneError(f"{what}: {message}", status=status)
        if status == 429:  # the session limit on a create; from something in front on any request
            return _BusyError(
                f"{what}: the toolenv server at {self.url} answered 429: {message}",
                detail=message,
                retry_after=_retry_after(resp.headers.get("retry-after")),
            )
        return RemoteEnvError(f"{what}: the toolenv server at {self.url} answered {status}: {message}", status=status)
