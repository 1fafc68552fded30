"""The async tool caller: run a turn's calls concurrently, each guarded by its tool's limits.

Every failure (unknown tool, bad arguments, exception, timeout) becomes a
`ToolResult(is_error=True)` with a message the model can act on; nothing raises.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import functools
import inspect
import logging
import random
import sys
import threading
import time
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import AliasChoices, AliasPath, BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from toolenv import _aio
from toolenv._text import fix_text
from toolenv._tool import Tool, ToolContext, ToolLimits
from toolenv.breaker import CircuitBreaker, breaker_for
from toolenv.deadlines import Deadline
from toolenv.types import Task, ToolCall, ToolImage, ToolResult

__all__ = ["RateLimit", "ToolCallRecord", "ToolCaller", "truncate_middle"]

_NO_TOOL_LIMITS = ToolLimits()
_COROUTINE = types.CoroutineType
_log = logging.getLogger("toolenv")
#: The retry jitter's own generator: drawing from the `random` module's would shift the
#: sampling of a trainer that seeded it. The OS's, so that forked workers (which would share
#: a `random.Random`'s state) do not retry in step.
_JITTER = random.SystemRandom()

#: Python 3.11+ keeps a call's deadline with `Deadline` (it needs `Task.uncancel`); 3.10 runs
#: the whole call in a child task under a timer (`_run_in_task`).
_DEADLINES = sys.version_info >= (3, 11)


@dataclass(slots=True)
class ToolCallRecord:
    """How one call went. Wall-clock fields are left out of equality so that two
    runs that behaved the same compare equal (Gymnasium's determinism check)."""

    name: str
    call_id: str
    attempts: int
    error: str | None
    truncated: bool
    latency_s: float = field(compare=False)
    cached: bool = False  # answered by the tool's ResultCache (a stored or shared in-flight result)


class RateLimit:
    """Spaces calls at least `1/rate` seconds apart, across every event loop and thread (a tool's
    `rate_limit`; the openai agent's requests too).

    A waiting call sleeps until its estimated slot (one interval after the latest call, per
    call waiting ahead of it), then takes the slot only if a full interval has passed since
    the latest call went through; else it sleeps until its turn behind the calls still
    waiting ahead of it (not to the next slot, which every overdue call would wake for:
    n²/2 timers after the loop stalls). asyncio-throttle polls every 10 ms instead, which
    held any rate near 100 calls/s. A call cancelled while it waits leaves the queue, so
    later calls are not spaced behind it.
    """

    __slots__ = ("interval", "last", "lock", "queue", "tickets")

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.last = -self.interval  # when the latest call was let through
        self.tickets = 0  # handed out in arrival order
        self.queue: list[int] = []  # tickets of the calls waiting (booked, not yet through), in order
        self.lock = threading.Lock()

    async def wait(self) -> None:
        """Return when this call may start."""
        with self.lock:
            now = time.monotonic()
            at = max(now, self.last + self.interval * (len(self.queue) + 1))
            ticket = self.tickets
            self.tickets += 1
            self.queue.append(ticket)
        try:
            while True:
                if at > now:
                    await asyncio.sleep(at - now)
                with self.lock:
                    now = time.monotonic()
                    due = self.last + self.interval
                    if now >= due:
                        self.last = now
                        return
                    at = due + self.interval * bisect.bisect_left(self.queue, ticket)
        finally:
            with self.lock:
                del self.queue[bisect.bisect_left(self.queue, ticket)]


class _Cap:
    """One event loop's share of a concurrency cap: `asyncio.Semaphore`'s rule (first come,
    first served), holding the loop only while calls wait for it. A Semaphore keeps the loop
    it first waited on, and the caps live as long as the process: every sync env's private
    loop that once waited for one would have stayed in memory."""

    __slots__ = ("free", "waiters")

    def __init__(self, cap: int) -> None:
        self.free = cap
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def __aenter__(self) -> None:
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # handed the slot as it was cancelled
                self._release()
            else:
                with contextlib.suppress(ValueError):  # a release already dropped it from the queue
                    self.waiters.remove(waiter)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        """Hand the slot to the first call still waiting, else free it."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


class _Limiter:
    """Concurrency cap and rate limit of one backend: the rate is shared by every event loop,
    the cap is kept per loop (an asyncio future belongs to one loop, and the same tool object
    may serve a sync env's private loop and a vector env's loop)."""

    __slots__ = ("cap", "caps", "rate")

    def __init__(self, cap: int | None, rate: float | None) -> None:
        self.cap = cap
        self.rate = RateLimit(rate) if rate else None
        self.caps: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Cap] = weakref.WeakKeyDictionary()

    def semaphore(self) -> _Cap | None:
        """The running loop's share of the cap, or None without one."""
        cap = self.cap
        if cap is None:
            return None
        loop = asyncio.get_running_loop()
        found = self.caps.get(loop)
        if found is None:
            found = self.caps[loop] = _Cap(cap)
        return found


# Limiters by what fails together (`Tool.breaker_key`, as circuit breakers are shared) and the
# cap and rate: every env of a plugin makes its own tool object over one server (`gym.make`
# per env, `tool_limits` on copies), and a limit per object let each env send its own rate
# and cap. `_LIMITERS` finds a tool object's limiter at once; each entry is dropped when its
# tool dies (before its id can be reused by a new tool), and looked up again if its limits change.
_SHARED_LIMITERS: dict[Hashable, _Limiter] = {}
_LIMITERS: dict[int, tuple[ToolLimits, _Limiter]] = {}
_LIMITERS_LOCK = threading.Lock()


def _limiter(tool: Tool) -> _Limiter | None:
    lim = tool.limits
    if not (lim.max_concurrency or lim.rate_limit):
        return None
    found = _LIMITERS.get(id(tool))
    if found is not None and found[0] is lim:
        return found[1]
    with _LIMITERS_LOCK:
        limiter: _Limiter | None = None
        try:
            key: Hashable = (tool.breaker_key(), lim.max_concurrency, lim.rate_limit)
            limiter = _SHARED_LIMITERS.get(key)
            if limiter is None:
                limiter = _SHARED_LIMITERS[key] = _Limiter(lim.max_concurrency, lim.rate_limit)
        except Exception:  # noqa: BLE001 - a broken or unhashable breaker_key: limits of its own
            limiter = _Limiter(lim.max_concurrency, lim.rate_limit)
        if id(tool) not in _LIMITERS:
            weakref.finalize(tool, _LIMITERS.pop, id(tool), None)
        _LIMITERS[id(tool)] = (lim, limiter)
    return limiter


# How many open callers (envs) hold each tool object, by id: one tool object may be given to
# several envs (a vector env's, a factory's sharing one instance, a throwaway env built to read
# a prompt), and closing one env must not close it under the others: the last caller closed
# closes it. Counted by identity (a tool may define `__eq__` or be unhashable, and a copy is
# another object); an entry is dropped at 0. A caller collected unclosed lets go through a
# `weakref.finalize`: it queues its ids (it may run in a collection anywhere, even inside the
# lock), and every change drains the queue first, so a dead tool's count is gone before any
# new object that reuses its id can be counted.
_HOLDERS: dict[int, int] = {}
_HOLDERS_LOCK = threading.Lock()
_LET_GO: collections.deque[tuple[int, ...]] = collections.deque()  # ids of callers collected unclosed


def _drop(ids: tuple[int, ...]) -> None:
    for i in ids:
        left = _HOLDERS.get(i, 0) - 1
        if left > 0:
            _HOLDERS[i] = left
        else:
            _HOLDERS.pop(i, None)


def _drain() -> None:
    """Apply the let-gos of the callers collected unclosed (with the lock held)."""
    while _LET_GO:
        _drop(_LET_GO.popleft())


def _hold(ids: tuple[int, ...]) -> None:
    with _HOLDERS_LOCK:
        _drain()
        for i in ids:
            _HOLDERS[i] = _HOLDERS.get(i, 0) + 1


def _let_go_and_pick(held: weakref.finalize | None, tools: Iterable[Tool]) -> list[Tool]:  # type: ignore[type-arg]
    """Let go of what `held` holds (unless let go already), then pick the `tools` no open
    caller holds: those are this caller's to close. One step under the lock, so that of two
    callers closing at once exactly one sees a shared tool's count reach 0."""
    with _HOLDERS_LOCK:
        _drain()
        detached = held.detach() if held is not None else None
        if detached is not None:
            _drop(detached[2][0])
        return [t for t in tools if id(t) not in _HOLDERS]


def truncate_middle(text: str, limit: int | None) -> tuple[str, bool]:
    """Cut `text` to at most `limit` characters, keeping head and tail, and say how much went.

    The marker counts against the limit and names exactly how many characters it replaced;
    a limit too small for that marker gets a bare `...` instead.
    """
    if limit is None or len(text) <= limit:
        return text, False
    gone = len(text) - limit
    while True:  # the marker's length depends on the count it names: settles in a step or two
        marker = f"\n...[{gone} characters truncated]...\n"
        keep = limit - len(marker)
        if keep < 2:
            marker, keep = "\n...\n", max(limit - 5, 0)
            break
        if len(text) - keep == gone:
            break
        gone = len(text) - keep
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head) :], True


def _validation_message(tool: Tool, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{loc}: {err['msg']}")
    return f"Invalid arguments for tool '{tool.name}': " + "; ".join(parts) + f". {_expected(tool)}"


def _being_cancelled() -> bool:
    """True when the running task was asked to stop (as opposed to a tool's inner cancellation)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    # Python 3.10 has no cancelling(): there `_run_in_task` turns the tool's own cancellation
    # into `_SelfCancelled`, so a CancelledError that gets this far is the step's.
    return task is None or cancelling is None or cancelling() > 0


def _cancelled(tool: Tool) -> ToolResult:
    return _Failure.error(f"Tool '{tool.name}' failed: its work was cancelled.", retryable=True)


def _describe(exc: BaseException, limit: int = 2000) -> str:
    """`Type: message`, even for exceptions whose `__str__` itself fails, cut to `limit`."""
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not escape
        msg = "<the exception's message could not be rendered>"
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return truncate_middle(text, limit)[0]


def _clip(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else name[:limit] + "..."


def _field_names(name: str, info: FieldInfo, config: ConfigDict) -> list[str]:
    """The argument names validation takes for one field, the one its schema gives first.

    That is its validation alias (each of `AliasChoices`, the first key of an `AliasPath`) or
    its alias, and its Python name only when it has none or the model validates by name:
    otherwise Pydantic ignores the Python name, and the value sent under it would be dropped.
    """
    names: list[str] = []
    if config.get("validate_by_alias", True) is not False:
        alias = info.validation_alias if info.validation_alias is not None else info.alias
        for choice in alias.choices if isinstance(alias, AliasChoices) else [alias]:
            key = choice.path[0] if isinstance(choice, AliasPath) else choice
            if isinstance(key, str) and key not in names:
                names.append(key)
    if not names or config.get("validate_by_name") or config.get("populate_by_name"):
        names.append(name)
    return names


@functools.cache
def _argument_names(model: type[BaseModel]) -> frozenset[str] | None:
    """Names an Args model accepts, or None when it accepts anything (extra="allow")."""
    if model.model_config.get("extra") == "allow":
        return None
    config = model.model_config
    return frozenset(n for name, f in model.model_fields.items() for n in _field_names(name, f, config))


def _validator(model: type[BaseModel]) -> Callable[[Any], Any]:
    """`model.model_validate`, or the core validator it wraps when the model does not override
    it: the same validation at half the cost (`model_validate` adds ~0.4 µs of wrapper per call)."""
    if getattr(model.model_validate, "__func__", None) is BaseModel.model_validate.__func__:  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):  # a model not built yet (forward refs): each call reports it
            return model.__pydantic_validator__.validate_python
    return model.model_validate


def _unknown_arguments(tool: Tool, arguments: dict[str, Any]) -> list[str]:
    # Pydantic models ignore unknown keys by default; a model that invents an argument
    # should hear about it rather than have it silently dropped.
    allowed = _argument_names(tool.Args)
    if allowed is None:
        return []
    return [k for k in arguments if k not in allowed]


def _not_an_object(tool: Tool, arguments: object) -> str:
    """The error of a call whose arguments are no mapping of names to values."""
    kinds = {type(None): "null", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    kind = kinds.get(type(arguments), "an array" if isinstance(arguments, list | tuple) else type(arguments).__name__)
    return (
        f"Invalid arguments for tool '{tool.name}': the arguments must be a JSON object of named values, "
        f"got {kind}. {_expected(tool)}"
    )


def _unknown_message(tool: Tool, unknown: list[str]) -> str:
    names = ", ".join(repr(u) for u in unknown)
    return f"Invalid arguments for tool '{tool.name}': unknown argument(s) {names}. {_expected(tool)}"


def _expected(tool: Tool) -> str:
    """The argument names to send (as the schema gives them), or that the tool takes none."""
    config = tool.Args.model_config
    names = ", ".join(_field_names(n, f, config)[0] for n, f in tool.Args.model_fields.items())
    return f"Expected arguments: {names}." if names else "This tool takes no arguments."


class _Resumed(Generator[Any, Any, Any]):
    """Awaitable that continues a coroutine already stepped once (it yielded `first`).

    It is its own iterator (no generator frame per call): `await` forwards `send`, `throw`
    and `close` to it as it would to a coroutine, and the coroutine's StopIteration ends it.

    Under a `deadline` that has fired alone (not the step's own cancellation), a coroutine
    that suspends again as the cancellation is thrown in, instead of ending, is past its
    deadline: the object turns into `_ResumedPastDeadline`, which gives it the deadline's
    grace to end and raises `_Detach` if it is still running after it. Only `throw` checks:
    a `send` costs no more than it did without a deadline.
    """

    # The last three are `_ResumedPastDeadline`'s (one layout, so that `__class__` can change).
    __slots__ = ("coro", "deadline", "first", "pending", "timer", "until")
    pending: Any
    timer: asyncio.TimerHandle | None
    until: float

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any, deadline: Deadline | None = None) -> None:
        self.coro = coro
        self.first = first
        self.deadline = deadline

    def __await__(self) -> Generator[Any, Any, Any]:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        first = self.first
        if first is not _SENT:
            self.first = _SENT
            return first
        return self.coro.send(value)

    def throw(self, *exc: Any) -> Any:
        self.first = _SENT
        pending = self.coro.throw(*exc)
        deadline = self.deadline
        if deadline is not None and deadline.alone():  # it took its deadline's cancellation in and waits on
            # A change of class, not a flag: `send` stays as cheap as it was before the deadline.
            self.__class__ = _ResumedPastDeadline  # same layout
            self.timer = None
            self.until = asyncio.get_running_loop().time() + deadline.grace()
            return self._wait(pending)  # type: ignore[attr-defined]
        return pending

    def close(self) -> None:
        self.coro.close()


class _ResumedPastDeadline(_Resumed):
    """A `_Resumed` whose deadline fired while the coroutine went on (it cleans up, or it
    swallowed the cancellation): until `until` (the deadline's grace) it runs as before, then
    `_Detach` is raised with what it waits on, and the step stops waiting for it.

    The task is not given the future the coroutine waits on (`pending`) but one of our own
    that completes when `pending` does or the grace runs out, whichever is first.
    """

    __slots__ = ()

    def send(self, value: Any) -> Any:
        pending = self.pending
        self._disarm()
        if pending is not None and not pending.done():  # the grace ran out first: leave it there
            raise _Detach(pending)
        return self._wait(self.coro.send(value))

    def throw(self, *exc: Any) -> Any:
        """The step's own cancellation (Ctrl-C, a shutdown: nothing else cancels our future):
        today's behaviour, as if the task had waited on `pending` all along."""
        pending = self.pending
        self._disarm()
        self.__class__ = _Resumed  # type: ignore[assignment]  # same layout
        if pending is not None and not pending.done():
            pending.cancel()  # what the task's cancel does to the future it waits on
            return pending  # the task takes it up and throws its cancellation in, as usual
        return self.coro.throw(*exc)

    def close(self) -> None:
        self._disarm()
        self.coro.close()

    def _disarm(self) -> None:
        timer = self.timer
        if timer is not None:
            self.timer = None
            timer.cancel()

    def _wait(self, pending: Any) -> Any:
        """What to give the task while the coroutine waits on `pending` past its deadline."""
        loop = asyncio.get_running_loop()
        if loop.time() >= self.until:
            raise _Detach(pending)
        self.pending = pending
        if pending is None:  # a bare yield (`sleep(0)`): the grace is checked on the next send
            return None
        if getattr(pending, "_asyncio_future_blocking", None) is None:  # not a future: the task's to refuse
            self.__class__ = _Resumed  # type: ignore[assignment]  # same layout
            return pending
        proxy = loop.create_future()
        wake = functools.partial(_wake, proxy)
        pending.add_done_callback(wake)
        self.timer = loop.call_at(self.until, wake, None)
        proxy._asyncio_future_blocking = True  # as `Future.__await__` yields it, or the task refuses it
        return proxy


def _wake(proxy: asyncio.Future[None], _: object) -> None:
    if not proxy.done():
        proxy.set_result(None)


class _Detach(Exception):
    """The tool's deadline fired and, its grace over, the tool is still running, suspended on
    `pending` (a future, or None after a bare yield)."""

    def __init__(self, pending: Any) -> None:
        super().__init__()
        self.pending = pending


#: Tools left running past their deadline and its grace (`_detach`), each task with its tool:
#: a task the loop holds only weakly would be collected mid-run. Each leaves as it ends, when
#: its tool is closed, or when a sync env closes the loop it runs on (`end_detached`). Sync envs
#: on several threads share it: it is read through `list(...)`, one step under the GIL.
_DETACHED: dict[asyncio.Task[Any], Tool] = {}

#: How long closing a sync env's loop waits, at most, for its detached calls to take their
#: cancellation in (`end_detached`).
_END_DETACHED_S = 1.0


def _forget(task: asyncio.Task[Any]) -> None:
    _DETACHED.pop(task, None)


def _detach(tool: Tool, coro: Coroutine[Any, Any, Any], pending: Any, grace: float) -> None:
    """Leave `coro`, suspended on `pending` past its deadline, to finish in a task of its own."""
    for stale in [t for t in list(_DETACHED) if t.get_loop().is_closed()]:  # a loop closed by others: never ends
        _DETACHED.pop(stale, None)
    name = tool.name
    task = asyncio.get_running_loop().create_task(_run_detached(name, coro, pending), name=f"toolenv:{name}:detached")
    _DETACHED[task] = tool
    task.add_done_callback(_forget)
    _log.warning(
        "tool %r was still running %g s after its %g s timeout cancelled it: the step goes on without it, "
        "and it is left to finish in the background",
        name,
        grace,
        tool.limits.timeout,
    )


async def _run_detached(name: str, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
    """Drive a detached tool to its end; its outcome is only logged (no one awaits it)."""
    try:
        await _Resumed(coro, pending)
    except asyncio.CancelledError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - nobody is left to give it to
        _log.debug("tool %r ended past its timeout with %s", name, _describe(exc), exc_info=exc)


async def _cancel_detached(tools: list[Tool]) -> None:
    """Cancel the calls of `tools` still running past their timeout on this loop, as the tools
    close, and let them take the cancellation in."""
    loop = asyncio.get_running_loop()
    ids = {id(t) for t in tools}
    mine = [task for task, t in list(_DETACHED.items()) if id(t) in ids and task.get_loop() is loop]
    for task in mine:
        task.cancel()
    if mine:
        await asyncio.sleep(0)  # each cancelled task's wake-up is queued ahead of this one


def end_detached(loop: asyncio.AbstractEventLoop) -> None:
    """Before `loop` closes (a sync env's own): cancel the tool calls left running on it past
    their timeout and run it until they end, for `_END_DETACHED_S` at most; one still running
    then is given up, with a WARNING. Left pending on a closed loop, their coroutines would be
    closed by the garbage collector, outside any loop (errors printed as "Exception ignored")."""
    if loop.is_closed() or loop.is_running():
        return
    on_loop = [task for task in list(_DETACHED) if task.get_loop() is loop]
    for task in on_loop:
        if task.done():  # ended, its `_forget` callback still queued on the loop about to close
            _DETACHED.pop(task, None)
    mine = [task for task in on_loop if not task.done()]
    if not mine:
        return
    for task in mine:
        if sys.version_info < (3, 11) or not task.cancelling():  # closing its tool cancelled it: let it clean up
            task.cancel()
    _aio.call_off_loop(_aio.complete, loop, asyncio.wait(mine, timeout=_END_DETACHED_S))
    for task in mine:
        if not task.done():
            tool = _DETACHED.pop(task, None)
            _log.warning(
                "tool %r, left running past its timeout, did not end within %g s of its cancellation "
                "as its env's event loop closes: given up",
                tool.name if tool is not None else task.get_name(),
                _END_DETACHED_S,
            )


_SENT = object()


class _DeadlineExpired(TimeoutError):
    """The call's own deadline (its tool's `timeout`) fired, as opposed to a TimeoutError the
    tool raised itself (its HTTP client's, a socket's)."""


class _SelfCancelled(Exception):
    """The tool cancelled its own work (told apart from the step's cancellation on 3.10)."""


@dataclass(slots=True)
class _Exited:
    """A tool's SystemExit, carried out of its task (a task re-raises it out of the event loop)."""

    exc: SystemExit


async def _catch_exit(coro: Coroutine[Any, Any, Any]) -> Any:  # pragma: no cover - Python 3.10
    try:
        return await coro
    except SystemExit as exc:
        return _Exited(exc)


async def _run_in_task(coro: Coroutine[Any, Any, Any], timeout: float | None) -> Any:  # pragma: no cover - 3.10
    """Python 3.10's deadline (it has no `asyncio.timeout`): the whole tool in one child task.

    The whole call runs in that task, so libraries that pin state to the current task
    (anyio's cancel scopes inside httpx) see one task throughout. Shielding the task tells
    apart the three ways it can end cancelled, which 3.10's `Task` cannot (no
    `cancelling()`): our deadline, the step's own cancellation, and the tool cancelling itself.
    """
    loop = asyncio.get_running_loop()
    task = loop.create_task(_catch_exit(coro))
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    handle = loop.call_later(timeout, expire) if timeout is not None else None
    try:
        result = await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():  # the step is being cancelled: take the tool down with it, and wait
            await _aio.cancel_and_wait(task)  # until it is down, as on 3.11+ (the step's own task)
            raise
        if expired:
            raise _DeadlineExpired from None
        raise _SelfCancelled from None
    finally:
        if handle is not None:
            handle.cancel()
    if isinstance(result, _Exited):
        raise result.exc
    return result


_NOT_STARTED = object()


def _start(tool: Tool, args: Any, ctx: ToolContext) -> ToolResult | tuple[Coroutine[Any, Any, Any], Any]:
    """Run the tool up to its first wait: its checked result if it got there without waiting,
    else the coroutine and what it yielded, for `_resume`.

    Most in-process tools finish without ever suspending, and arming a timer costs more than
    such a call, so the first step runs bare and the deadline is set only if the tool waits.
    No library offers this lazy deadline.
    """
    try:
        coro: Coroutine[Any, Any, Any] = tool.run(args, ctx)
        if type(coro) is not _COROUTINE:  # a `run` that is not an `async def`
            made = _coroutine(tool, coro)
            if isinstance(made, ToolResult):
                return made
            coro = made
        if not _DEADLINES:  # pragma: no cover - Python 3.10 runs the whole call in one task
            return coro, _NOT_STARTED
        return coro, coro.send(None)
    except StopIteration as stop:
        return _checked(tool, stop.value)
    except (asyncio.CancelledError, Exception, SystemExit) as exc:  # noqa: BLE001 - see _failure
        return _failure(tool, exc)


def _coroutine(tool: Tool, out: Any) -> Coroutine[Any, Any, Any] | ToolResult:
    """What a `run` that is not an `async def` returned, as a coroutine: an awaitable (a task,
    a future) is awaited in one; anything else is the error result naming the tool's bug."""
    if isinstance(out, Coroutine):  # a coroutine of another kind (Cython's)
        return out
    if inspect.isawaitable(out):
        return _awaited(out)
    return ToolResult.error(
        f"Tool '{tool.name}' is broken: its run returned {type(out).__name__}, not a coroutine "
        "(define it with `async def run`).",
        infra_error=True,
    )


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _resume(tool: Tool, coro: Coroutine[Any, Any, Any], first: Any, spent: float) -> ToolResult:
    """The rest of a tool's run, after its first wait, under its deadline: what is left of its
    timeout after the `spent` seconds of its first step (a blocking call before its first await
    counts, as under `asyncio.timeout`: past its timeout, it is cancelled at that await)."""
    timeout = tool.limits.timeout
    try:
        if first is _NOT_STARTED:  # pragma: no cover - Python 3.10
            result = await _run_in_task(coro, timeout)
        elif timeout is None:
            result = await _Resumed(coro, first)
        else:  # `asyncio.timeout`'s rule, at a fraction of its cost per call (toolenv.deadlines)
            deadline = Deadline(timeout, spent)
            try:
                result = await _Resumed(coro, first, deadline)
            except _Detach as detach:  # still running past its deadline's grace: the step goes on
                deadline.close(None)  # takes its cancel back from the step's task
                _detach(tool, coro, detach.pending, deadline.grace())
                raise _DeadlineExpired from None
            except BaseException as exc:
                if deadline.close(exc):
                    raise _DeadlineExpired from exc
                raise
            deadline.close(None)
    except (asyncio.CancelledError, _SelfCancelled, Exception, SystemExit) as exc:  # noqa: BLE001 - see _failure
        return _failure(tool, exc)
    return _checked(tool, result)


class _Admitted:
    """A call its circuit breaker let through, waiting for its tool's concurrency cap or rate
    limit: if the circuit opens meanwhile (the calls ahead of it failed), it is refused when
    its turn comes rather than sent to the server that just failed, unless the cooldown is
    over by then and it goes as the probe."""

    __slots__ = ("breaker", "probe", "refused")

    def __init__(self, breaker: CircuitBreaker, probe: bool) -> None:
        self.breaker, self.probe, self.refused = breaker, probe, False

    def again(self, tool: Tool) -> ToolResult | None:
        """None to run the call now, else its refusal."""
        if self.probe or not self.breaker.is_open:
            return None
        retry_in = self.breaker.admit()
        if retry_in is None:
            self.probe = True
            return None
        self.refused = True
        return ToolResult.error(self.breaker.refusal(tool.name, retry_in), circuit_open=True)


class _Failure(ToolResult):
    """An error result the caller made for a run that crashed, timed out or was cancelled:
    what a circuit breaker counts besides the results a tool marks retryable."""

    __slots__ = ()


def _failed(result: ToolResult) -> bool:
    """Whether `result` counts against the tool's circuit breaker (not the model's own mistakes)."""
    return result.is_error and (result.retryable or isinstance(result, _Failure))


def _failure(tool: Tool, exc: BaseException) -> ToolResult:
    """The error result for a failed run; the step's own cancellation is raised again."""
    if isinstance(exc, asyncio.CancelledError):
        if _being_cancelled():
            raise exc  # the step itself is cancelled (Ctrl-C, a shutdown): not the tool's failure
        return _cancelled(tool)
    if isinstance(exc, _SelfCancelled):  # pragma: no cover - Python 3.10
        return _cancelled(tool)
    if isinstance(exc, _DeadlineExpired):
        after = f" after {tool.limits.timeout:g} s"
        return _Failure.error(f"Tool '{tool.name}' timed out{after}. {_timeout_hint(tool)}", retryable=True)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):  # the tool's own timeout fired
        return _Failure.error(f"Tool '{tool.name}' timed out. {_timeout_hint(tool)}", retryable=True)
    return _Failure.error(f"Tool '{tool.name}' failed: {_describe(exc)}")


def _timeout_hint(tool: Tool) -> str:
    """The tool's `timeout_hint` on one line (the record keeps an error's first line), or the
    default when it is not a non-empty string: a failure's message must not fail itself."""
    hint: object = None
    with contextlib.suppress(Exception):  # a broken property: the default
        hint = tool.timeout_hint
    return " ".join(hint.split()) if isinstance(hint, str) and hint.strip() else Tool.timeout_hint


def _checked(tool: Tool, result: Any) -> ToolResult:
    """`result` if it is a well-formed ToolResult, else the error result naming the bug
    (`infra_error`: the tool's fault, which no penalty charges to the model)."""
    if not isinstance(result, ToolResult):
        return ToolResult.error(
            f"Tool '{tool.name}' returned {type(result).__name__}, not a ToolResult (a bug in the tool).",
            infra_error=True,
        )
    if not isinstance(result.text, str):  # a dataclass does not check its fields' types
        return ToolResult.error(
            f"Tool '{tool.name}' returned a ToolResult whose text is {type(result.text).__name__}, "
            "not str (a bug in the tool).",
            infra_error=True,
        )
    images = result.images
    if images and (not isinstance(images, list) or not all(isinstance(im, ToolImage) for im in images)):
        found = (
            type(images).__name__
            if not isinstance(images, list)
            else ", ".join(sorted({type(im).__name__ for im in images if not isinstance(im, ToolImage)}))
        )
        return ToolResult.error(
            f"Tool '{tool.name}' returned a ToolResult whose images are not a list of ToolImage ({found}); "
            "use ToolImage.from_pil or ToolImage(data=...) (a bug in the tool).",
            infra_error=True,
        )
    if not isinstance(result.metadata, dict):
        return ToolResult.error(
            f"Tool '{tool.name}' returned a ToolResult whose metadata is {type(result.metadata).__name__}, "
            "not dict (a bug in the tool).",
            infra_error=True,
        )
    return result


async def _release(tool: Tool, ctx: ToolContext) -> None:
    """`tool.release(ctx)`, a failure logged: one tool's cleanup must not stop the others or the step."""
    try:
        await tool.release(ctx)
    except Exception:  # noqa: BLE001 - logged; the episode ends either way
        _log.warning("tool %r failed to release episode %s", tool.name, ctx.episode_id, exc_info=True)


def _not_a_tool(obj: object) -> str:
    """Why `obj` cannot be one of a caller's tools, and what to give instead."""
    if isinstance(obj, type) and issubclass(obj, Tool):
        return f"{obj.__name__} is a Tool class, not a tool: pass an instance ({obj.__name__}())"
    if callable(obj) and not isinstance(obj, type):
        name = getattr(obj, "__name__", None) or type(obj).__name__
        return f"{name} ({type(obj).__name__}) is not a toolenv.Tool: decorate the function with @toolenv.tool"
    return f"{_clip(repr(obj))} is not a toolenv.Tool (a Tool instance, or a function decorated with @toolenv.tool)"


def _check_args(tool: Tool) -> None:
    """Refuse a tool class that has no Pydantic `Args` model (its calls could not be checked)."""
    args = getattr(tool, "Args", None)
    if not (isinstance(args, type) and issubclass(args, BaseModel)):
        got = "has no Args" if args is None else f"has Args {args!r}, not a pydantic BaseModel class"
        raise TypeError(
            f"tool {tool.name!r} ({type(tool).__name__}) {got}: give its class an inner `class Args(BaseModel)` "
            "(with no fields for a tool without arguments)"
        )


def _check_cache(tool: Tool) -> None:
    """Refuse a `cache` that is no `ResultCache` (a class attribute set to a config's mapping):
    every call would fail on it, not the build."""
    cache = tool.cache
    if cache is not None and not callable(getattr(cache, "call", None)):
        raise TypeError(
            f"tool {tool.name!r} ({type(tool).__name__}): cache must be a ResultCache or None, got "
            f"{type(cache).__name__} {_clip(repr(cache))} (settings go through Tool(cache=...) or shared_cache)"
        )


class ToolCaller:
    """Invokes tool calls by name against a fixed set of tools.

    A caller holds its tools from when it is built until `aclose`: a tool object several
    callers (envs) hold is closed by the last of them to close, and only then.
    """

    def __init__(self, tools: Iterable[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(_not_a_tool(t))
            if not t.name:
                raise ValueError(f"{t!r} has no name: set `name = ...` on its class (or pass name= to @tool)")
            _check_args(t)
            _check_cache(t)
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        self._allowed = {name: _argument_names(t.Args) for name, t in self.tools.items()}
        self._validate = {name: _validator(t.Args) for name, t in self.tools.items()}
        # Only tools that override `release` are called at episode end (the common case is none).
        self._releasing = [t for t in self.tools.values() if type(t).release is not Tool.release]
        self._held: weakref.finalize | None = None  # type: ignore[type-arg]  # lets go if collected unclosed
        self.hold()

    def hold(self) -> None:
        """Hold the tools again after `aclose` (an env reset after its close does this), so that
        another holder's close leaves them open; does nothing while they are held."""
        if self._held is not None:
            return
        ids = tuple({id(t): None for t in self.tools.values()})
        _hold(ids)
        held = weakref.finalize(self, _LET_GO.append, ids)
        held.atexit = False
        self._held = held

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy (pickle, `copy.deepcopy`) is built again from its tools: the validators it keeps
        are bound methods of each tool's `Args`, which pickle finds by name, and an `Args` built at
        run time (an MCP tool's, from the server's schema) has no importable name."""
        return (type(self), (list(self.tools.values()),))

    async def invoke(
        self, calls: Sequence[ToolCall], ctx: ToolContext
    ) -> tuple[list[ToolResult], list[ToolCallRecord]]:
        """Run `calls` concurrently; results come back in call order."""
        return await self.invoke_for(calls, ctx.task, ctx.episode_id, ctx.turn, ctx.state)

    async def invoke_for(
        self, calls: Sequence[ToolCall], task: Task, episode_id: str, turn: int, state: dict[str, Any]
    ) -> tuple[list[ToolResult], list[ToolCallRecord]]:
        """`invoke` with the context's fields given one by one, as the env steps.

        Each call gets its own `ToolContext` (it carries the call id), so the env does not
        build a context of its own first: fewer objects per step for the collector to walk.
        """
        if len(calls) == 1:
            call = calls[0]
            start = time.perf_counter()
            tool, ready = self._prepare(call)
            cached = False
            if tool is None or isinstance(ready, ToolResult):
                result, attempts = ready, 0
            else:
                ctx = ToolContext(task, episode_id, call.id, turn, state)
                lim = tool.limits
                if tool.cache is not None:
                    result, attempts, cached = await tool.cache.call(tool, ready, ctx, self._run_limited)
                elif lim.retries:
                    result, attempts = await self._run_with_retries(tool, ready, ctx)
                elif lim.max_concurrency or lim.rate_limit or lim.breaker_threshold:
                    result, attempts = await self._run_once(tool, ready, ctx), 1
                else:  # the common case: no limiter
                    result, attempts = await self._guarded(tool, ready, ctx), 1
            one, record = self._finish(call, tool, result, attempts, start, cached)
            return [one], [record]
        if not calls:
            return [], []
        return await self._gather(calls, task, episode_id, turn, state)

    async def _gather(
        self, calls: Sequence[ToolCall], task: Task, episode_id: str, turn: int, state: dict[str, Any]
    ) -> tuple[list[ToolResult], list[ToolCallRecord]]:
        # Apart from `invoke_for`, whose one-call path would otherwise pay for this generator's
        # closure cells on every step.
        pairs = await asyncio.gather(*(self.invoke_for([c], task, episode_id, turn, state) for c in calls))
        return [p[0][0] for p in pairs], [p[1][0] for p in pairs]

    def _prepare(self, call: ToolCall) -> tuple[Tool | None, Any]:
        """The tool and its validated arguments, or the error result that stops the call."""
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return None, ToolResult.error(f"Unknown tool '{_clip(call.name)}'. Available tools: {known}.")
        if not isinstance(call.arguments, dict):  # a trainer's own parser may hand over anything
            return tool, ToolResult.error(_not_an_object(tool, call.arguments))
        allowed = self._allowed[call.name]
        if allowed is not None and not allowed.issuperset(call.arguments):
            return tool, ToolResult.error(_unknown_message(tool, _unknown_arguments(tool, call.arguments)))
        try:
            return tool, self._validate[call.name](call.arguments)
        except ValidationError as exc:
            return tool, ToolResult.error(_validation_message(tool, exc))
        except Exception as exc:  # noqa: BLE001 - an Args model's own model_validate may raise anything
            return tool, ToolResult.error(f"Invalid arguments for tool '{tool.name}': {_describe(exc)}")

    @staticmethod
    def _finish(
        call: ToolCall, tool: Tool | None, result: ToolResult, attempts: int, start: float, cached: bool = False
    ) -> tuple[ToolResult, ToolCallRecord]:
        text, cut = truncate_middle(result.text, (tool.limits if tool else _NO_TOOL_LIMITS).max_output_chars)
        if not text.isascii():  # output decoded with surrogateescape (bytes not UTF-8): U+FFFD, as model text
            text = fix_text(text)
        result = result.addressed(call.name, call.id, text)
        error = text.split("\n", 1)[0][:200] if result.is_error else None
        record = ToolCallRecord(call.name, call.id, attempts, error, cut, time.perf_counter() - start, cached)
        return result, record

    async def _run_limited(self, tool: Tool, args: Any, ctx: ToolContext) -> tuple[ToolResult, int]:
        """One call under all of its tool's guards: the result and the attempts it took."""
        lim = tool.limits
        if lim.retries:
            return await self._run_with_retries(tool, args, ctx)
        if lim.max_concurrency or lim.rate_limit or lim.breaker_threshold:
            return await self._run_once(tool, args, ctx), 1
        return await self._guarded(tool, args, ctx), 1

    async def _run_with_retries(self, tool: Tool, args: Any, ctx: ToolContext) -> tuple[ToolResult, int]:
        lim = tool.limits
        attempt = 0
        while True:
            attempt += 1
            result = await self._run_once(tool, args, ctx)
            if not (result.is_error and result.retryable) or attempt > lim.retries:
                return result, attempt
            delay = min(lim.backoff * 2 ** (attempt - 1), lim.max_backoff)
            await asyncio.sleep(delay * (0.5 + _JITTER.random() / 2))

    async def _run_once(self, tool: Tool, args: Any, ctx: ToolContext) -> ToolResult:
        """One attempt, unless the tool's circuit is open; its outcome goes to the breaker."""
        breaker = breaker_for(tool)
        if breaker is None:
            return await self._run_limited_once(tool, args, ctx)
        retry_in = breaker.admit()
        if retry_in is not None:
            return ToolResult.error(breaker.refusal(tool.name, retry_in), circuit_open=True)
        admitted = _Admitted(breaker, breaker.is_open)  # let through an open circuit: the probe
        result: ToolResult | None = None
        try:
            result = await self._run_limited_once(tool, args, ctx, admitted)
        finally:
            if result is None or admitted.refused:  # cancelled with its step, or refused: no outcome
                breaker.abandon(probe=admitted.probe)
            else:
                breaker.record(_failed(result), result.text.split("\n", 1)[0][:120], probe=admitted.probe)
        return result

    async def _run_limited_once(
        self, tool: Tool, args: Any, ctx: ToolContext, admitted: _Admitted | None = None
    ) -> ToolResult:
        """One attempt, after the tool's concurrency cap and rate limit let it through (and,
        `admitted` by its breaker, if its circuit did not open while it waited)."""
        limiter = _limiter(tool)
        if limiter is None:
            return await self._guarded(tool, args, ctx)
        semaphore = limiter.semaphore()
        if semaphore is not None:
            async with semaphore:
                if limiter.rate is not None:
                    await limiter.rate.wait()
                if admitted is not None and (refusal := admitted.again(tool)) is not None:
                    return refusal
                return await self._guarded(tool, args, ctx)
        if limiter.rate is not None:
            await limiter.rate.wait()
        if admitted is not None and (refusal := admitted.again(tool)) is not None:
            return refusal
        return await self._guarded(tool, args, ctx)

    @staticmethod
    async def _guarded(tool: Tool, args: Any, ctx: ToolContext) -> ToolResult:
        """One run of the tool under its timeout; every failure becomes an error result."""
        t0 = time.monotonic()  # the loop's clock: its deadline counts from here, as `asyncio.timeout`'s would
        started = _start(tool, args, ctx)
        if isinstance(started, ToolResult):
            return started
        return await _resume(tool, *started, time.monotonic() - t0)

    @property
    def releases(self) -> bool:
        """True when some tool overrides `release` (else `release` has nothing to do)."""
        return bool(self._releasing)

    async def release(self, ctx: ToolContext) -> None:
        """Call `release(ctx)` of every tool that has one, all at once; a failing release is
        logged, not raised. At once, not one after another: a release that hangs (a dead
        backend) would keep every tool after it from releasing when the caller gives up
        waiting (the remote server's close timeout), their episode's sessions left behind."""
        if len(self._releasing) == 1:  # the common case: no task to make
            await _release(self._releasing[0], ctx)
        elif self._releasing:
            await asyncio.gather(*(_release(t, ctx) for t in self._releasing))

    @property
    def holds(self) -> bool:
        """True while it holds its tools: from its construction (or `hold`) until `aclose`."""
        return self._held is not None

    async def aclose(self) -> None:
        """Let go of the tools and close every one no other open caller holds (the last holder
        closes a shared tool, once), even when one fails to; then raise the first failure (the
        others are logged), so one broken `close` leaves no other tool's processes behind.
        Does nothing once it let go (a second close, or a first one left behind that resumes,
        would close again what was closed)."""
        held, self._held = self._held, None
        if held is None:
            return
        closing = _let_go_and_pick(held, self.tools.values())
        await _cancel_detached(closing)
        await _aio.close_each(closing, lambda t: t.close(), lambda t: f"tool {t.name!r}", _log)
