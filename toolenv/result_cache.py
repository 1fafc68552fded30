"""`ResultCache`: answer repeated calls of a deterministic tool from memory, and run identical
calls that are in flight at the same time only once.

GRPO samples a group of completions per prompt, and they often start with the same call (the
same search query, the same SQL probe), at the same moment. A tool given a cache runs such a
call once: the first caller runs it, callers that arrive while it runs wait for its result,
and callers that come later get the stored result without running anything.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

import cachetools
import pydantic_core
from pydantic import BaseModel

if TYPE_CHECKING:
    from toolenv._tool import Tool, ToolContext
    from toolenv.types import Task, ToolResult

__all__ = ["CacheSpec", "CacheStats", "ResultCache", "shared_cache"]

Scope = Literal["task", "episode", "shared"]
_SCOPES: tuple[Scope, ...] = ("task", "episode", "shared")


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counts since the cache was made (or cleared).

    Attributes:
        hits: calls answered from a stored result.
        joined: calls that waited for an identical call already running, and took its result.
        misses: calls that ran the tool.
        size: results stored now.
        maxsize: results kept at most (the least recently used go first).
    """

    hits: int
    joined: int
    misses: int
    size: int
    maxsize: int

    @property
    def saved(self) -> float:
        """The share of calls that did not run the tool (0.0 with no calls)."""
        total = self.hits + self.joined + self.misses
        return (self.hits + self.joined) / total if total else 0.0


RunFn = Callable[["Tool", Any, "ToolContext"], Awaitable[tuple["ToolResult", int]]]


class ResultCache:
    """Results of a tool, keyed by its name, the validated arguments and the scope.

    Give it to a tool (`tool.cache = ResultCache()`, `Tool(cache=...)`, `@tool(cache=...)`,
    or as a class attribute, which every instance of the class then shares). Only tools
    whose result depends on nothing but their arguments (and, with `scope="task"`, the task)
    should have one. Only results that are not errors are stored; identical calls in flight
    together share one run whatever it returns.

    Args:
        maxsize: results kept at most; the least recently used are dropped first.
        ttl: seconds a stored result stays valid (None: until it is dropped for room).
        scope: what else a result depends on. `"task"` (the default) keys results by the
            task as well (its whole content, so tasks that share an id but not their data
            never share results), for tools that read the task (its database, its files);
            `"episode"` by the episode, for tools with per-episode state; `"shared"` by the
            arguments alone, for tools over fixed data (a search index, a calculator).
        timer: the clock `ttl` is measured with (a test may pass its own).

    A copy of a cache (pickled into a worker process, deep-copied) starts empty, with the
    same settings: its results stay in the process that made them.
    """

    def __init__(
        self,
        maxsize: int = 4096,
        *,
        ttl: float | None = None,
        scope: Scope = "task",
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        if ttl is not None and not ttl > 0:
            raise ValueError(f"ttl must be positive seconds or None, got {ttl!r}")
        if scope not in _SCOPES:
            raise ValueError(f"scope must be one of {', '.join(map(repr, _SCOPES))}, got {scope!r}")
        self.maxsize, self.ttl, self.scope, self.timer = maxsize, ttl, scope, timer
        self._store: cachetools.Cache[Hashable, ToolResult] = (
            cachetools.LRUCache(maxsize) if ttl is None else cachetools.TTLCache(maxsize, ttl, timer=timer)
        )
        self._lock = threading.Lock()  # cachetools' caches are not thread-safe; a tool may serve several loops
        self._inflight: dict[Hashable, asyncio.Future[ToolResult | None]] = {}
        self._hits = self._joined = self._misses = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (_empty_copy, (self.maxsize, self.ttl, self.scope, self.timer))

    def __repr__(self) -> str:
        return f"ResultCache(maxsize={self.maxsize}, ttl={self.ttl}, scope={self.scope!r})"

    # ------------------------------------------------------------------ keys and storage
    def key(self, tool: Tool, args: Any, ctx: ToolContext) -> Hashable | None:
        """The key of a call, or None when its arguments (or, scoped by task, its task) cannot be
        serialised: it then runs uncached."""
        try:
            # Dumped to Python first: a model's own JSON writes inf, -inf and NaN alike as `null`
            # (one key for `x=1e400`, `x=-1e400` and `x=None`); plain values keep them apart.
            data = type(args).__pydantic_serializer__.to_python(args) if isinstance(args, BaseModel) else args
            encoded = pydantic_core.to_json(data, inf_nan_mode="constants")
        except (pydantic_core.PydanticSerializationError, TypeError, ValueError):
            return None
        if self.scope == "task":
            digest = task_key(ctx.task)
            return None if digest is None else (tool.name, digest, encoded)
        if self.scope == "episode":
            return (tool.name, ctx.episode_id, encoded)
        return (tool.name, encoded)

    def get(self, key: Hashable) -> ToolResult | None:
        """The stored result for `key`, if any (a lookup; counts nothing)."""
        with self._lock:
            return self._store.get(key)

    def put(self, key: Hashable, result: ToolResult) -> None:
        """Store `result` under `key` (errors are not stored)."""
        if result.is_error:
            return
        with self._lock:
            self._store[key] = result

    def clear(self) -> None:
        """Drop every stored result and reset the counts."""
        with self._lock:
            self._store.clear()
            self._hits = self._joined = self._misses = 0

    def stats(self) -> CacheStats:
        """Hits, joins, misses and size so far."""
        with self._lock:
            return CacheStats(self._hits, self._joined, self._misses, len(self._store), self.maxsize)

    # ------------------------------------------------------------------ calls
    async def call(self, tool: Tool, args: Any, ctx: ToolContext, run: RunFn) -> tuple[ToolResult, int, bool]:
        """`run(tool, args, ctx)` unless a stored or in-flight result answers it.

        Returns the result, the attempts this call made (0 when it ran nothing) and whether
        the result came from the cache.
        """
        key = self.key(tool, args, ctx)
        if key is None:
            result, attempts = await run(tool, args, ctx)
            return result, attempts, False
        loop = asyncio.get_running_loop()
        while True:
            found = self.get(key)
            if found is not None:
                self._hits += 1
                return found, 0, True
            flight = self._inflight.get(key)
            if flight is None or flight.get_loop() is not loop:
                break
            shared = await asyncio.shield(flight)  # our own cancellation must not cancel the run we share
            if shared is not None:
                self._joined += 1
                return shared, 0, True
            # The run we waited for was cancelled with its episode: take what another waiter's run
            # stored meanwhile (one that never waited is over already), join its run, or run it.
        self._misses += 1
        mine: asyncio.Future[ToolResult | None] = loop.create_future()
        self._inflight[key] = mine
        outcome: ToolResult | None = None
        try:
            outcome, attempts = await run(tool, args, ctx)
            self.put(key, outcome)
        finally:
            if self._inflight.get(key) is mine:
                del self._inflight[key]
            mine.set_result(outcome)  # None (we were cancelled) tells the waiters to run it themselves
        return outcome, attempts, False


# Task -> digest of its content, by object: a task's JSON is made once, not on every call.
# Tasks are not hashable (Pydantic models), so the map is keyed by id() and each entry is
# dropped by a finalizer when its task dies, before the id can be reused.
_TASK_KEYS: dict[int, bytes] = {}


def task_key(task: Task) -> bytes | None:
    """A digest of `task`'s whole content (id, question, answer, context, metadata): equal for
    equal tasks, so a GRPO group's copies of one task share results, and tasks that merely share
    an id (ad-hoc tasks all default to id "0") do not. Computed once per task object.

    None when the task cannot be serialised (a context value JSON cannot hold): its content
    cannot be compared, so its calls run uncached.
    """
    found = _TASK_KEYS.get(id(task))
    if found is None:
        try:
            found = hashlib.blake2b(task.model_dump_json().encode(), digest_size=16).digest()
        except (pydantic_core.PydanticSerializationError, TypeError, ValueError):
            found = b""  # remembered as "cannot be keyed"
        _TASK_KEYS[id(task)] = found
        weakref.finalize(task, _TASK_KEYS.pop, id(task), None)
    return found or None


def _empty_copy(maxsize: int, ttl: float | None, scope: Scope, timer: Callable[[], float]) -> ResultCache:
    return ResultCache(maxsize, ttl=ttl, scope=scope, timer=timer)


CacheSpec = Union["ResultCache", bool, Mapping[str, Any], None]
_SHARED: dict[Hashable, ResultCache] = {}
_SHARED_LOCK = threading.Lock()


def shared_cache(namespace: Hashable, spec: CacheSpec) -> ResultCache | None:
    """The cache an env factory gives its tool for `spec`, which may come from a config file.

    A `ResultCache` is used as given; `True` or a mapping of `ResultCache` keywords
    (`{"maxsize": 100000, "scope": "shared"}`) gives the one cache of this process for
    `namespace` and those settings, so every env a worker makes with the same config (a GRPO
    group's) shares it; `None`/`False` gives no cache. `namespace` must name everything the
    tool's answers depend on besides its arguments and scope (the plugin, its data, its options).
    """
    if spec is None or spec is False:
        return None
    if isinstance(spec, ResultCache):
        return spec
    settings: dict[str, Any] = {} if spec is True else dict(spec)
    unknown = set(settings) - {"maxsize", "ttl", "scope"}
    if unknown:
        raise ValueError(f"unknown cache setting(s) {', '.join(sorted(unknown))}: expected maxsize, ttl, scope")
    key = (namespace, tuple(sorted(settings.items())))
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is None:
            found = _SHARED[key] = ResultCache(**settings)
        return found
