"""Serve any toolenv env over HTTP: `create_app(factory)` is an ASGI app (Starlette; run it with uvicorn).

Rollout workers on GPU nodes then step envs whose tools (sandboxes, databases, search
indexes) run on CPU machines, scaled on their own. Each client holds a session, i.e. one
env instance of its own; `RemoteToolEnv` is the client. Endpoints:

- `POST /sessions` → `SessionCreated`; with an `Idempotency-Key` header, a create sent
  again with the same key (its answer was lost) gets the same session while it lives
- `DELETE /sessions/{id}` ends the session; its env is closed then, or its call in flight
  is cancelled (its client gave up on it) and the env closed once that call has unwound
- `POST /sessions/{id}/reset` (`ResetRequest`) → `ResetResponse`
- `POST /sessions/{id}/step` (`StepRequest`) → `StepResponse`
- `POST /sessions/{id}/end`: release the episode's tool resources (`aend_episode`)
- `POST /sessions/{id}/truncate` (optional `TruncateRequest`) → `TruncateResponse`: end the
  open episode unanswered and score it
- `GET /health`, `GET /metadata` (its `Toolenv-Features` header lists `replay` and `prompt`), `GET /tasks`,
  `GET /schema`

Every answer names the served env in its `Toolenv-Env` header (a fingerprint of its metadata and
tasks). A request whose `Toolenv-Env` header names another env (its client was built before the
server restarted with other tools, parser, prompt, limits or tasks) is refused with a 409 of type
`EnvChanged`, but for the reads a client rebuilds itself from and a `DELETE`.

The metadata (of `GET /metadata` and `POST /sessions`) holds the env's `system_prompt` and
`answer_tool_rewrites` only for a client whose `Toolenv-Features` request header lists `prompt`:
an older client refuses fields it does not know.

A step may name its episode and turn (`StepRequest.episode_id`, `turn`), a truncate its
episode: the same request sent again (its answer was lost) gets the answer of the run it
repeats, which the session keeps (one per session), instead of a second run.

Every error is JSON, `{"error": "..."}`: 404 unknown session (or one that ended, deleted or
expired, while the call ran), 409 step out of order, 422
invalid body, 429 session limit, 400 the env rejected the reset options, 500 the env
raised (its exception type and message; the traceback goes to the server's log only).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolenv._text import fix_text
from toolenv.env import ToolEnv
from toolenv.episode import Episode
from toolenv.parsers.base import ActionParser
from toolenv.parsers.reasoning import ReasoningParser
from toolenv.remote.sessions import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_TTL,
    MAX_KEY_LENGTH,
    Answer,
    SessionLimitError,
    SessionStore,
    UnknownSessionError,
    as_tool_env,
)
from toolenv.remote.wire import (
    ENV_CHANGED,
    ENV_HEADER,
    FEATURES,
    FEATURES_HEADER,
    IDEMPOTENCY_KEY,
    EnvMetadata,
    ErrorResponse,
    Health,
    ResetRequest,
    ResetResponse,
    SessionCreated,
    StepInfo,
    StepRequest,
    StepResponse,
    TaskList,
    TruncateRequest,
    TruncateResponse,
    dump_json,
    feature_set,
    schemas,
)

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_TTL",
    "create_app",
    "describe_env",
    "env_fingerprint",
    "parser_spec",
]

log = logging.getLogger("toolenv.remote")

#: Exceptions of `reset` that mean "these options do not fit this env" (a 400, re-raised as such by the client).
_BAD_OPTIONS = (ValueError, KeyError, IndexError, TypeError)

M = TypeVar("M", bound=BaseModel)
Endpoint = Callable[[Request], Awaitable[Response]]


class _Failure(Exception):
    """An error response on its way out of a handler."""

    def __init__(self, status: int, message: str, type_: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_


def parser_spec(parser: ActionParser) -> tuple[str, dict[str, Any]]:
    """The registered name of `parser` and the constructor arguments that differ from their defaults.

    Read back from the attributes of the same names, which every built-in parser keeps;
    a value that is not JSON is left out (with a warning): the client then builds that
    argument's default. A `ReasoningParser` is its inner parser's spec plus `reasoning` (its tags).
    """
    if isinstance(parser, ReasoningParser):
        name, inner = parser_spec(parser.inner)
        return name, {**inner, "reasoning": list(parser.tags)}
    kwargs: dict[str, Any] = {}
    try:
        params = list(inspect.signature(type(parser)).parameters.values())
    except (TypeError, ValueError):
        params = []
    for p in params:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or not hasattr(parser, p.name):
            continue
        value = getattr(parser, p.name)
        if p.default is not p.empty and value == p.default:
            continue
        try:
            kwargs[p.name] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            log.warning("parser %r: argument %r is not JSON; clients will use its default", parser.name, p.name)
    return parser.name, kwargs


def describe_env(env: ToolEnv, env_id: str = "") -> EnvMetadata:
    """The metadata a client stands in for `env` with (its prompt fields go to clients that read them)."""
    from toolenv import __version__

    name, kwargs = parser_spec(env.parser)
    return EnvMetadata(
        toolenv_version=__version__,
        env_id=env_id,
        parser=name,
        parser_kwargs=kwargs,
        tool_schemas=env.tool_schemas(),
        max_turns=env.max_turns,
        reward_weights=env.reward_fn.weights,
        num_tasks=len(env.tasks),
        system_prompt=env.system_prompt,
        answer_tool_rewrites=dict(env.answer_tool_rewrites),
    )


def _json(model: BaseModel, status: int = 200, request: Request | None = None) -> Response:
    # Responses are built unvalidated from the env's own objects (an int reward where the
    # model says float is still right, numpy values and lone surrogates are converted).
    # With `request`, written for what its client reads (the features its header lists).
    readers = None if request is None else feature_set(request.headers.get(FEATURES_HEADER))
    return Response(dump_json(model, readers), status_code=status, media_type="application/json")


def _error(status: int, message: str, type_: str | None = None) -> Response:
    return Response(
        ErrorResponse(error=fix_text(message), type=type_).model_dump_json(exclude_none=True),
        status_code=status,
        media_type="application/json",
    )


async def _body(request: Request, model: type[M], *, empty_ok: bool = False) -> M:
    raw = await request.body()
    if empty_ok and not raw.strip():
        raw = b"{}"
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors(include_url=False)[:5]
        )
        raise _Failure(422, f"invalid {model.__name__}: {detail}") from None


def _message(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc).strip() or type(exc).__name__


def create_app(
    env_factory: Callable[[], Any],
    *,
    env_id: str | None = None,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_ttl: float = DEFAULT_SESSION_TTL,
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
) -> Starlette:
    """An ASGI app serving envs built by `env_factory`, one per session.

    The factory is called once right away, to describe the env (`GET /metadata`) and to fail
    before serving when it cannot build one; that env serves the first session. It must
    build a fresh env on every call: a session's env is closed when the session ends, with
    its tools, but for tool objects that another session's env holds too (the last closes them).

    Args:
        env_factory: a zero-argument callable returning a ToolEnv (or a `gym.make` result).
        env_id: the id reported in the metadata (default: the env's `spec.id`, if any).
        max_sessions: sessions alive at once; `POST /sessions` beyond it gets 429.
        session_ttl: seconds a session's client may go without a request before the session
            is closed, with its call in flight, if any, cancelled (its client is gone).
        close_timeout: seconds closing one env (a DELETE, an expiry) may take, and the server's
            stop closing all of them at once; a close still running then is cancelled and left
            behind, logged with its session's id, and the tools that env still holds are let go
            of (closed unless another session's env holds them) within another `close_timeout`.
    """
    first = as_tool_env(env_factory())
    if env_id is None:
        spec = getattr(first, "spec", None)
        env_id = getattr(spec, "id", "") or ""
    metadata = describe_env(first, env_id)
    task_list = TaskList.model_construct(tasks=list(first.tasks))
    fingerprint = env_fingerprint(metadata, task_list)
    store = SessionStore(
        env_factory, max_sessions=max_sessions, ttl=session_ttl, spare=first, close_timeout=close_timeout
    )

    async def create_session(request: Request) -> Response:
        key = request.headers.get(IDEMPOTENCY_KEY)
        if key is not None and not 0 < len(key) <= MAX_KEY_LENGTH:
            raise _Failure(422, f"invalid {IDEMPOTENCY_KEY} header: 1 to {MAX_KEY_LENGTH} characters, got {len(key)}")
        try:
            session = await store.create(key)
        except SessionLimitError as exc:
            raise _Failure(429, str(exc)) from None
        except Exception as exc:
            log.exception("building an env for a new session failed")
            raise _Failure(500, f"could not build an env: {type(exc).__name__}: {_message(exc)}") from None
        return _json(SessionCreated(session_id=session.id, metadata=metadata), 201, request)

    async def delete_session(request: Request) -> Response:
        await store.delete(request.path_params["session_id"])
        return Response(status_code=204)

    async def reset(request: Request) -> Response:
        req = await _body(request, ResetRequest, empty_ok=True)
        options = req.options.to_env()
        async with store.use(request.path_params["session_id"]) as session:
            env = session.env
            session.last = None  # the answers kept are of the episode this reset ends
            try:
                obs, info = await session.run(env.areset(seed=req.seed, options=options))
            except UnknownSessionError:  # the session ended while the call ran: a 404 that says why
                raise
            except _BAD_OPTIONS as exc:
                raise _Failure(400, _message(exc), type(exc).__name__) from None
            except Exception as exc:
                log.exception("reset of session %s failed", session.id)
                raise _Failure(
                    500, f"env reset failed: {type(exc).__name__}: {_message(exc)}", type(exc).__name__
                ) from None
            ep = env.episode
            assert ep is not None
            out = ResetResponse.model_construct(
                observation=obs,
                episode_id=ep.episode_id,
                task_id=ep.task.id,
                task=None if "task" in options else ep.task,
                messages=list(info.get("messages", [])),
            )
        return _json(out)

    async def step(request: Request) -> Response:
        req = await _body(request, StepRequest)
        async with store.use(request.path_params["session_id"]) as session:
            env = session.env
            ep = env.episode
            if req.episode_id is not None and req.turn is not None:
                last = session.last
                if last is not None and last.call == ("step", req.episode_id, req.turn):
                    return _replay(last)  # its answer was lost: the same answer, not a second run
                _check_turn(ep, req.episode_id, req.turn)
            if ep is None:
                raise _Failure(409, "call reset() before step()")
            if ep.terminated or ep.truncated:
                raise _Failure(409, "this episode has ended; call reset() to start another")
            call = ("step", ep.episode_id, len(ep.turns) + 1)
            try:
                stepped = env.astep(req.action) if req.parsed is None else env.astep(req.action, parsed=req.parsed)
                obs, reward, terminated, truncated, info = await session.run(stepped)
            except UnknownSessionError:  # the session ended while the call ran: a 404 that says why
                raise
            except Exception as exc:
                log.exception("step of session %s failed", session.id)
                resp = _error(500, f"env step failed: {type(exc).__name__}: {_message(exc)}", type(exc).__name__)
            else:
                out = StepResponse.model_construct(
                    observation=obs,
                    reward=float(reward),
                    terminated=bool(terminated),
                    truncated=bool(truncated),
                    info=_step_info(info),
                )
                resp = _json(out)
            session.last = Answer(call, resp.status_code, bytes(resp.body))
        return resp

    async def end_episode(request: Request) -> Response:
        async with store.use(request.path_params["session_id"]) as session:
            try:
                await session.run(session.env.aend_episode())
            except UnknownSessionError:  # the session ended while the call ran: a 404 that says why
                raise
            except Exception as exc:
                log.exception("ending the episode of session %s failed", session.id)
                raise _Failure(500, f"env end_episode failed: {type(exc).__name__}: {_message(exc)}") from None
        return Response(status_code=204)

    async def truncate(request: Request) -> Response:
        req = await _body(request, TruncateRequest, empty_ok=True)
        async with store.use(request.path_params["session_id"]) as session:
            env = session.env
            ep = env.episode
            if req.episode_id is not None:
                last = session.last
                if last is not None and last.call == ("truncate", req.episode_id, 0):
                    return _replay(last)  # sent again, it would score nothing (0.0): the first answer
                if ep is None or ep.episode_id != req.episode_id:
                    raise _Failure(409, _other_episode("truncate", req.episode_id, ep))
            was_open = ep is not None and not (ep.terminated or ep.truncated)
            try:
                reward = await session.run(env.atruncate())
            except UnknownSessionError:  # the session ended while the call ran: a 404 that says why
                raise
            except Exception as exc:
                log.exception("truncating the episode of session %s failed", session.id)
                raise _Failure(500, f"env truncate failed: {type(exc).__name__}: {_message(exc)}") from None
            ep = env.episode
            last_turn = dict(ep.turns[-1].reward_components) if ep is not None and ep.turns else {}
            resp = _json(TruncateResponse(reward=reward, last_turn_components=last_turn))
            if ep is not None and was_open:  # what a repeat must get (a repeat run would score 0.0)
                session.last = Answer(("truncate", ep.episode_id, 0), resp.status_code, bytes(resp.body))
        return resp

    async def health(request: Request) -> Response:
        return _json(Health(sessions=len(store), max_sessions=store.max_sessions))

    async def get_metadata(request: Request) -> Response:
        resp = _json(metadata, request=request)
        resp.headers[FEATURES_HEADER] = ", ".join(FEATURES)  # a header: old clients refuse unknown fields
        return resp

    async def tasks(request: Request) -> Response:
        return _json(task_list)

    async def schema(request: Request) -> Response:
        return JSONResponse(schemas())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await store.aclose()

    app = Starlette(
        routes=[
            Route("/sessions", _guarded(create_session), methods=["POST"]),
            Route("/sessions/{session_id}", _guarded(delete_session), methods=["DELETE"]),
            Route("/sessions/{session_id}/reset", _guarded(reset), methods=["POST"]),
            Route("/sessions/{session_id}/step", _guarded(step), methods=["POST"]),
            Route("/sessions/{session_id}/end", _guarded(end_episode), methods=["POST"]),
            Route("/sessions/{session_id}/truncate", _guarded(truncate), methods=["POST"]),
            Route("/health", _guarded(health), methods=["GET"]),
            Route("/metadata", _guarded(get_metadata), methods=["GET"]),
            Route("/tasks", _guarded(tasks), methods=["GET"]),
            Route("/schema", _guarded(schema), methods=["GET"]),
        ],
        middleware=[Middleware(_SameEnv, fingerprint=fingerprint)],
        exception_handlers={
            _Failure: _on_failure,
            UnknownSessionError: _on_unknown_session,
            HTTPException: _on_http_error,
            Exception: _on_crash,
        },
        lifespan=lifespan,
    )
    app.state.sessions = store
    app.state.metadata = metadata
    app.state.fingerprint = fingerprint
    return app


def env_fingerprint(metadata: EnvMetadata, tasks: TaskList) -> str:
    """What names the served env across restarts: a hash of everything a client mirrors of it."""
    digest = hashlib.sha256()
    for part in (dump_json(metadata), dump_json(tasks)):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\n")
    return digest.hexdigest()[:32]


#: What a client built for another env may still ask for: what it is rebuilt from, and deleting a session.
_ANY_ENV_PATHS = frozenset({"/metadata", "/health", "/schema"})


class _SameEnv:
    """ASGI middleware: name the served env on every answer (`ENV_HEADER`), and refuse (409) a
    request built for another one: its client's parser, tools and tasks are those of an env this
    server no longer serves (it restarted with another), and it would go on with them silently."""

    def __init__(self, app: ASGIApp, fingerprint: str) -> None:
        self.app = app
        self.fingerprint = fingerprint.encode("ascii")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._refused(scope):
            response = _error(
                409,
                "this client was built for another env than this server serves (the server restarted with other "
                "tools, parser, prompt, limits or tasks); build the client again",
                ENV_CHANGED,
            )
            response.headers[ENV_HEADER] = self.fingerprint.decode("ascii")
            await response(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (ENV_HEADER.lower().encode("ascii"), self.fingerprint)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, named)

    def _refused(self, scope: Scope) -> bool:
        if scope["method"] == "DELETE" or scope["path"] in _ANY_ENV_PATHS:
            return False
        wanted = ENV_HEADER.lower().encode("ascii")
        said = [value for name, value in scope["headers"] if name == wanted]
        return bool(said) and said[-1] != self.fingerprint


def _guarded(endpoint: Endpoint) -> Endpoint:
    """`endpoint`, with an unexpected exception answered as a 500 that names it.

    Left to Starlette, the exception would be re-raised to uvicorn after the 500, and
    uvicorn then drops the keep-alive connection: the client's next request on it fails.
    """

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except (_Failure, UnknownSessionError, HTTPException):
            raise
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.url.path)
            return _error(500, f"internal server error: {type(exc).__name__}: {_message(exc)}", type(exc).__name__)

    return guarded


def _replay(answer: Answer) -> Response:
    return Response(answer.body, status_code=answer.status, media_type="application/json")


def _other_episode(what: str, episode_id: str, ep: Episode | None) -> str:
    now = "none is open (call reset() first)" if ep is None else f"it is at {ep.episode_id!r} now"
    return f"a {what} of episode {episode_id!r}, which is not this session's episode: {now}"


def _check_turn(ep: Episode | None, episode_id: str, turn: int) -> None:
    """Refuse (409) a step that is not the next turn of the session's episode; it is not its
    last step either (that one was answered again): running it would take a turn twice."""
    if ep is None or ep.episode_id != episode_id:
        raise _Failure(409, _other_episode("step", episode_id, ep))
    taken = len(ep.turns)
    if turn <= taken:
        raise _Failure(
            409,
            f"turn {turn} of episode {episode_id!r} was taken already and is not its last step "
            f"(it has taken {taken}): a step is never run twice",
        )
    if turn > taken + 1:
        raise _Failure(409, f"turn {turn} of episode {episode_id!r} is ahead of it: it has taken {taken} turns")


def _step_info(info: Mapping[str, Any]) -> StepInfo:
    """A step's `info` dict as the wire model (not validated again: the env built it)."""
    return StepInfo.model_construct(
        task_id=info["task_id"],
        turn=info["turn"],
        action=info["action"],
        tool_results=info["tool_results"],
        tool_calls=info["tool_calls"],
        messages=info["messages"],
        reward_components=info["reward_components"],
        answer=info.get("answer"),
        reward_info=info.get("reward_info"),
        episode=info.get("episode_stats"),
    )


async def _on_failure(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, _Failure)
    return _error(exc.status, exc.message, exc.type)


async def _on_unknown_session(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, UnknownSessionError)
    session_id = request.path_params.get("session_id", "")
    if exc.why is not None:
        return _error(404, f"session {session_id!r} {exc.why}")
    return _error(404, f"no session {session_id!r}: it was deleted, idle too long, or the server restarted")


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")


async def _on_crash(request: Request, exc: Exception) -> Response:
    # Starlette logs the traceback (re-raised to the server) after this response is sent.
    return _error(500, "internal server error (see the server's log)")
