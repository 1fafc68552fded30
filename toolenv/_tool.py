"""Tools: a Pydantic `Args` model plus an async `run`, and `@tool` for plain functions."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import functools
import importlib
import inspect
import json
import math
import types
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Union, get_args, get_origin, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic_core import PydanticUndefined

from toolenv._schema import flatten_schema, openai_schema
from toolenv._threads import WORKERS
from toolenv.types import Task, ToolResult

if TYPE_CHECKING:
    from toolenv.result_cache import CacheSpec, ResultCache

__all__ = ["Tool", "ToolContext", "ToolLimits", "tool"]


class ToolLimits(BaseModel):
    """How the caller guards one tool. `None` means no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float | None = Field(default=30.0, gt=0, description="Seconds before a call is abandoned.")
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Calls in flight at once (per event loop), across the episodes of every tool with the same "
        "breaker_key (one backend) and cap.",
    )
    rate_limit: float | None = Field(
        default=None,
        gt=0,
        description="Calls per second (started 1/rate s apart), across the episodes and event loops of every tool "
        "with the same breaker_key (one backend) and rate.",
    )
    retries: int = Field(
        default=0, ge=0, description="Extra attempts after a timeout or a result marked retryable (not an exception)."
    )
    backoff: float = Field(default=0.1, ge=0, description="First retry delay in seconds; doubles each attempt.")
    max_backoff: float = Field(default=5.0, ge=0, description="Upper bound on one retry delay.")
    max_output_chars: int | None = Field(default=8192, ge=16, description="Text longer than this is cut in the middle.")
    breaker_threshold: int | None = Field(
        default=None,
        ge=1,
        description="Consecutive failed calls (timeouts, crashes, retryable errors) after which calls "
        "are refused at once for `breaker_cooldown` seconds (a circuit breaker).",
    )
    breaker_cooldown: float = Field(
        default=30.0, gt=0, description="Seconds an open circuit refuses calls before one is let through to probe."
    )

    @field_validator("timeout")
    @classmethod
    def _infinite_is_none(cls, value: float | None) -> float | None:
        """An infinite timeout (`.inf` in a YAML config) is no timeout: no deadline to arm."""
        return None if value == math.inf else value


def with_limits(tools: Iterable[Tool], overrides: Mapping[str, Mapping[str, Any]] | None) -> list[Tool]:
    """`tools`, with the `ToolLimits` fields in `overrides` (by tool name, `"*"` for every tool)
    changed on shallow copies, so a config file can set a plugin env's timeouts, rate limits,
    retries and breakers without touching tool objects another env may share."""
    tools = list(tools)
    if not overrides:
        return tools
    if not isinstance(overrides, Mapping):
        raise ValueError(f"tool_limits must map tool names (or '*') to their limits, got {overrides!r}")
    for key, value in overrides.items():
        if not isinstance(value, Mapping):
            raise ValueError(f"tool_limits for {key!r} must map limit names to values (timeout: 5, ...), got {value!r}")
    names = [t.name for t in tools]
    unknown = sorted(set(overrides) - {*names, "*"})
    if unknown:
        raise ValueError(
            f"tool_limits names no tool of this env: {', '.join(map(repr, unknown))} "
            f"(its tools: {', '.join(names) or 'none'}; '*' means all)"
        )
    out = []
    for t in tools:
        update = {**overrides.get("*", {}), **overrides.get(t.name, {})}
        if not update:
            out.append(t)
            continue
        try:
            limits = ToolLimits.model_validate({**t.limits.model_dump(), **update})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
            raise ValueError(f"tool_limits for {t.name!r}: {problems}") from None
        changed = copy.copy(t)
        changed.limits = limits
        out.append(changed)
    return out


def _override(owner: str, base: ToolLimits, update: Mapping[str, Any]) -> ToolLimits:
    """`base` with the fields in `update` changed, validated (`model_copy(update=...)` is not)."""
    known = list(ToolLimits.model_fields)
    unknown = [k for k in update if k not in ToolLimits.model_fields]
    if unknown:
        raise TypeError(
            f"{owner} got unknown tool limit{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"known limits: {', '.join(known)}"
        )
    try:
        return ToolLimits.model_validate({**base.model_dump(), **update})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
        raise ValueError(f"{owner} limits: {problems}") from None


@dataclass(slots=True)
class ToolContext:
    """What a tool knows about the episode calling it.

    `state` is per-episode scratch space (e.g. a stateful code session) that the env
    clears on reset; `task.context` holds per-task data such as a database path.
    """

    task: Task
    episode_id: str = ""
    call_id: str = ""
    turn: int = 0
    state: dict[str, Any] = field(default_factory=dict)


class Tool:
    """Base class for tools.

    Subclasses set `name`, an inner `Args` Pydantic model, and implement `run`.
    The docstring is the description the model sees unless `description` is set.
    `cache` (a `ResultCache`, off by default) answers repeated calls without running them;
    set it as a class attribute to share it between every instance of the class. The
    constructor also takes what a config can hold: `True` or a mapping of `ResultCache`
    settings gives the process's one cache for this tool and those settings (`shared_cache`).
    `timeout_hint` is what the model is told to do when a call times out (see below).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Args: ClassVar[type[BaseModel]]
    limits: ToolLimits = ToolLimits()
    cache: ResultCache | None = None
    #: The advice after "Tool 'x' timed out after N s." in the model's error observation. The
    #: default fits work that grows with the request (code, SQL); a tool that waits on a remote
    #: service sets its own (the request was not too big, the service did not answer), as a
    #: class attribute or on an instance (a `@tool` function's too). Kept to one line.
    timeout_hint: str = "Try a simpler or smaller request."

    def __init__(self, *, limits: ToolLimits | None = None, cache: CacheSpec = None, **limit_overrides: Any) -> None:
        if cache is not None and cache is not False:
            self.cache = _cache_of(self, cache)
        base = limits if limits is not None else type(self).limits
        if limit_overrides:
            owner = f"tool {self.name!r} ({type(self).__name__})" if self.name else type(self).__name__
            self.limits = _override(owner, base, limit_overrides)
        else:
            self.limits = base

    #: Whether `description` came from a docstring (a subclass's own docstring replaces it).
    _described_by_doc: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "description" in cls.__dict__:  # set in so many words
            cls._described_by_doc = False
        elif cls.__doc__ and (not cls.description or cls._described_by_doc):
            cls.description = inspect.cleandoc(cls.__doc__)
            cls._described_by_doc = True

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Execute one call with validated `args`."""
        raise NotImplementedError

    async def release(self, ctx: ToolContext) -> None:
        """Free what this tool holds for the episode of `ctx` (a session, a browser page).

        Called once per episode and tool when the episode ends: after its last step's
        rewards, when `reset` abandons it, or when the env closes. `ctx.state` is the
        episode's state. Errors are logged, never raised into the step.
        """

    async def close(self) -> None:
        """Release resources (processes, connections). Called by `ToolEnv.close`."""

    def _cache_namespace(self) -> tuple[Hashable, ...]:
        """What names this tool's answers for a cache built from settings (`shared_cache`):
        its class and name, so every instance a config builds shares one cache."""
        return ("toolenv.Tool", type(self).__module__, type(self).__qualname__, self.name)

    def breaker_key(self) -> Hashable:
        """What fails together: tools with the same key share one circuit breaker.

        By default the tool's class and name; a tool over a configurable backend adds the
        backend (its URL, its server), so two backends do not open each other's circuit.
        """
        return (type(self).__module__, type(self).__qualname__, self.name)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema (`{"type": "function", "function": {...}}`)."""
        return openai_schema(self.name, self.description, self.Args)

    def flat_schema(self) -> dict[str, Any]:
        """The schema with `$ref`/`anyOf` flattened, as verl's `OpenAIFunctionToolSchema` accepts."""
        return flatten_schema(self.schema())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class FunctionTool(Tool):
    """A tool made from a function by `@tool`; sync functions run in a worker thread."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        limits: ToolLimits | None = None,
        cache: CacheSpec = None,
        **limit_overrides: Any,
    ) -> None:
        self.name = name or fn.__name__  # type: ignore[misc]
        self._fn = fn  # before the cache: its namespace names the function
        super().__init__(limits=limits, cache=cache, **limit_overrides)
        self._is_async = inspect.iscoroutinefunction(fn)
        self.description = description or inspect.cleandoc(fn.__doc__ or "")  # type: ignore[misc]
        self.Args, self._ctx_param, self._positional = _args_model(fn)  # type: ignore[misc]
        functools.update_wrapper(self, fn)

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        kwargs = {k: getattr(args, k) for k in type(args).model_fields}
        if self._ctx_param:
            kwargs[self._ctx_param] = ctx
        positional = [kwargs.pop(p) for p in self._positional]  # positional-only parameters
        if self._is_async:
            out = await self._fn(*positional, **kwargs)
        else:
            out = await _in_thread(self._fn, positional, kwargs)
            if inspect.isawaitable(out):  # a sync wrapper around an async function
                out = await out
        return out if isinstance(out, ToolResult) else ToolResult(text=out if isinstance(out, str) else _as_text(out))

    def __copy__(self) -> FunctionTool:
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> FunctionTool:
        out = memo[id(self)] = object.__new__(type(self))
        out.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle the function by its module and name, and the settings; the copy rebuilds the rest.

        `@tool` leaves the tool where the function was, so pickle, which sends a function by
        its module and name, found the tool there and refused the function (TRL's async
        trainer pickles `env_kwargs`, tools included, into its rollout process).
        """
        fn: Any = self._fn
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
        # A script's functions (`__main__`) are another module in the process that loads them:
        # pickled as they are, cloudpickle (Ray) sends them by value, as it always has.
        if isinstance(module, str) and isinstance(qualname, str) and module != "__main__":
            with contextlib.suppress(Exception):  # not importable there: pickle the function itself, or say why not
                found = _lookup(module, qualname)
                if isinstance(found, FunctionTool) and found._fn is fn:
                    fn = _FunctionRef(module, qualname)
        derived = _DERIVED.union(getattr(self._fn, "__dict__", ()))
        extra = {k: v for k, v in self.__dict__.items() if k not in derived}
        own_cache = self.__dict__.get("cache")
        settings = (self.name, self.description, self.limits, own_cache, extra)
        return (_rebuild_function_tool, (type(self), fn, *settings))

    def _cache_namespace(self) -> tuple[Hashable, ...]:
        """The class, name and function: two functions of one name answer differently."""
        fn = self._fn
        return (*super()._cache_namespace(), getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn)))

    def breaker_key(self) -> Hashable:
        """The class and name, and the function: two functions that share a name are two backends."""
        fn = self._fn
        code = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None) or repr(fn))
        return (type(self).__module__, type(self).__qualname__, self.name, *code)

    async def __call__(self, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in tests)."""
        result = self._fn(**kwargs)
        return await result if inspect.isawaitable(result) else result


# What `FunctionTool.__init__` derives from the function (rebuilt, not pickled).
_DERIVED = frozenset(
    {"_fn", "_is_async", "Args", "_ctx_param", "_positional", "name", "description", "limits", "cache"}
    | {*functools.WRAPPER_ASSIGNMENTS, "__wrapped__", "__type_params__"}
)


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _FunctionRef:
    """Pickles as "the function of the `@tool` at module.qualname"."""

    __slots__ = ("module", "qualname")

    def __init__(self, module: str, qualname: str) -> None:
        self.module, self.qualname = module, qualname

    def __reduce__(self) -> tuple[Any, ...]:
        return (_function_of, (self.module, self.qualname))


def _function_of(module: str, qualname: str) -> Callable[..., Any]:
    found = _lookup(module, qualname)
    return found._fn if isinstance(found, FunctionTool) else found


def _rebuild_function_tool(
    cls: type[FunctionTool],
    fn: Callable[..., Any],
    name: str,
    description: str,
    limits: ToolLimits,
    cache: ResultCache | None,
    extra: dict[str, Any],
) -> FunctionTool:
    out = object.__new__(cls)  # a subclass's own __init__ may take other arguments; its attributes are in `extra`
    FunctionTool.__init__(out, fn, name=name, description=description, limits=limits, cache=cache)
    out.__dict__.update(extra)
    return out


def _as_text(out: object) -> str:
    """A function tool's result as the model reads it: a dict or list as JSON text (not Python's
    repr, `True`/`None` and quotes the model may copy), anything else, or what JSON cannot
    encode, as `str`."""
    if isinstance(out, dict | list):
        try:
            return json.dumps(out, ensure_ascii=False)
        except (TypeError, ValueError):  # a set, an object, a circular reference
            pass
    return str(out)


def _cache_of(tool: Tool, spec: Any) -> ResultCache | None:
    """The cache `Tool(cache=spec)` gets: a `ResultCache` as given; `True` or a mapping of its
    settings (all a JSON or YAML config can hold) the process's one cache for the tool and them.

    Raises:
        TypeError: `spec` is none of those (it used to fail every call, not the build).
        ValueError: a mapping with settings `ResultCache` does not take.
    """
    from toolenv.result_cache import ResultCache, shared_cache

    if isinstance(spec, ResultCache):
        return spec
    if spec is not True and not isinstance(spec, Mapping):
        owner = f"tool {tool.name!r} ({type(tool).__name__})" if tool.name else type(tool).__name__
        raise TypeError(
            f"{owner}: cache must be a ResultCache, True or a mapping of its settings "
            f"(maxsize, ttl, scope), got {type(spec).__name__} {spec!r}"
        )
    return shared_cache(tool._cache_namespace(), spec)


def _in_thread(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
    """`fn(*args, **kwargs)` on a daemon worker thread (`toolenv._threads`), in a copy of the current context.

    Not `asyncio.to_thread`: the loop's default executor, whose threads `asyncio.run` and the
    interpreter join on the way out and which has min(32, cpus + 4) of them: one call stuck
    past its timeout (a thread cannot be stopped) kept the process from exiting, and that
    many stuck calls left every later sync call queued until it timed out too. A thread left
    behind by a timed-out call takes no new work.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def job() -> None:
        if future.cancelled():  # a call cancelled (timed out) before it started is not run
            return
        result: Any = None
        error: BaseException | None = None
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting call, as to_thread does
            error = exc
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
            loop.call_soon_threadsafe(_settle, future, result, error)
        del result, error  # no cycle through the error's traceback and this frame

    WORKERS.run(job, fn)
    return future


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the call timed out or was cancelled
        return
    if error is None:
        future.set_result(result)
    elif isinstance(error, StopIteration):  # a future refuses StopIteration
        future.set_exception(RuntimeError(f"the tool raised StopIteration: {error}"))
    else:
        future.set_exception(error)


def _is_context(ann: Any) -> bool:
    """Whether a parameter takes the `ToolContext`: `ToolContext`, `ToolContext | None`,
    `Optional[ToolContext]` or any of them in `Annotated[...]`."""
    if get_origin(ann) is Annotated:
        return _is_context(get_args(ann)[0])
    if get_origin(ann) in (Union, types.UnionType):
        rest = [a for a in get_args(ann) if a is not type(None)]
        return len(rest) == 1 and _is_context(rest[0])
    return ann is ToolContext


def _args_model(fn: Callable[..., Any]) -> tuple[type[BaseModel], str | None, list[str]]:
    """Build the Args model from a function signature; a `ToolContext` parameter is injected,
    not exposed. Also returns the names of the positional-only parameters, in order."""
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    ctx_param: str | None = None
    positional: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"@tool {fn.__name__}: *args/**kwargs cannot be described to a model")
        if param.kind is param.POSITIONAL_ONLY:
            positional.append(pname)
        ann = hints.get(pname, Any)
        if _is_context(ann):
            ctx_param = pname
            continue
        # No default in the signature: the annotation's own `Field(default=...)` may give one
        # (`...` would make the field required whatever the annotation says).
        default = PydanticUndefined if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (ann, default)
    model = create_model(f"{fn.__name__}_args", __config__=ConfigDict(extra="forbid"), **fields)
    return model, ctx_param, positional


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, **limits: Any
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None, **limits: Any
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed function (sync or async) into a `Tool`.

    Parameters become the Args model (use `Annotated[int, Field(description=...)]`
    for descriptions); a parameter annotated `ToolContext` receives the context.
    `cache` takes a `ResultCache`, `True` or a mapping of its settings (see `Tool`); the other
    keyword arguments are `ToolLimits` fields.
    """

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, **limits)

    return wrap(fn) if fn is not None else wrap
