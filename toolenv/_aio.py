"""Running coroutines from sync code: `run` for a whole program, `run_on_thread_loop` per call,
`complete` for a sync twin's call on a loop it keeps, `BackgroundLoop` for many envs driven from
a trainer's threads on one loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, without building the repr of its result on the way out.

    On Python 3.11 and 3.12, `asyncio.run` restores the SIGINT handler through
    `signal.signal`, which formats the repr of its own handler, and that repr includes
    the main task and the task's result (CPython gh-112559). For a rollout that is the
    text of every trajectory: 0.4 s for 1,024 short episodes. The main task here returns
    None, so its repr stays short.
    """
    box: list[T] = []

    async def main() -> None:
        box.append(await coro)

    asyncio.run(main())
    return box[0]


class _Loop:
    """This thread's loop; closed when the thread's locals go (no 'unclosed loop' warning)."""

    __slots__ = ("loop",)

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __del__(self) -> None:
        try:
            if not self.loop.is_closed():
                self.loop.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing left to tell
            pass


_local = threading.local()


def run_on_thread_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on an event loop this thread keeps between calls.

    For sync entry points called many times, such as verl's per-sample reward hook:
    `asyncio.run` makes and tears down a loop (and its thread pool) on every call, about
    0.2-0.5 ms, against ~0.1 ms for a whole reward computed here.

    Raises:
        RuntimeError: called from inside a running event loop (await the coroutine there).
    """
    if asyncio._get_running_loop() is not None:  # in asyncio.__all__; no exception raised per call
        coro.close()
        raise RuntimeError("cannot run a coroutine to completion inside a running event loop; await it instead")
    held: _Loop | None = getattr(_local, "held", None)
    if held is None or held.loop.is_closed():
        held = _local.held = _Loop()
    return complete(held.loop, coro)


def complete(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """`loop.run_until_complete(coro)`, made cheap for a coroutine that finishes without waiting.

    Why: a sync `step` enters its env's loop once per call, and `run_until_complete` spends
    ~25 µs in the loop's Python machinery (two loop iterations, a done callback, a stop): more
    than a whole `astep` with an in-process tool. Here `coro` becomes a task as it does there,
    and the task's first step runs at once with the loop marked running, as `run_forever`
    marks it (running loop, `is_running()`, async-generator hooks), so the step sees a current
    task, and anyio, httpx and deadlines work. A task that then waits is finished by
    `run_until_complete` itself.

    No library does this (Python 3.12's eager tasks start only on a running loop), so it relies
    on `BaseEventLoop`'s `_ready` queue and `_thread_id`, unchanged since Python 3.4; any other
    loop (uvloop's, say) takes the plain path.
    """
    if loop.is_running() or asyncio._get_running_loop():
        return loop.run_until_complete(coro)  # refuses as it always has
    task = loop.create_task(coro)
    try:
        if isinstance(loop, asyncio.BaseEventLoop):
            _first_step(loop, task)
            if task.done():
                return task.result()
        return loop.run_until_complete(task)  # any other loop type (uvloop's, say) takes this path only
    except BaseException:
        _finish_interrupted(loop, task)
        raise


def _first_step(loop: asyncio.BaseEventLoop, task: asyncio.Task[Any]) -> None:
    """Run what is ready on `loop` now (the new task's first step) with the loop marked running."""
    ready = loop._ready  # type: ignore[attr-defined]
    hooks = sys.get_asyncgen_hooks()
    loop._thread_id = threading.get_ident()  # type: ignore[attr-defined]
    sys.set_asyncgen_hooks(loop._asyncgen_firstiter_hook, loop._asyncgen_finalizer_hook)  # type: ignore[attr-defined]
    asyncio._set_running_loop(loop)
    try:
        for _ in range(len(ready)):  # what is ready now, as one loop iteration runs it
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()
    finally:
        asyncio._set_running_loop(None)
        sys.set_asyncgen_hooks(*hooks)
        loop._thread_id = None  # type: ignore[attr-defined]


def _finish_interrupted(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """After `complete` raised (KeyboardInterrupt, SystemExit, the coroutine's own error): a task
    left pending is cancelled and run to its end now, as `asyncio.run` does on Ctrl-C. Left
    pending on the loop, it would resume inside the next call (a second step running alongside
    the next one, a tool call of an abandoned episode)."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # the first error is the one raised
            loop.run_until_complete(task)
    elif not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" at collection


async def within(seconds: float, aw: Awaitable[T]) -> T:
    """`aw`, cancelled after `seconds` (`asyncio.TimeoutError`): a deadline over a whole HTTP
    request, which httpx's timeout does not give (it bounds each read, so a server trickling its
    reply in pieces would hold the request for as long as it likes)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await aw
    return await asyncio.wait_for(aw, seconds)  # pragma: no cover - Python 3.10


async def gather_all(aws: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """`asyncio.gather`, except that when one fails (or the caller is cancelled) the others are
    cancelled and awaited before the error is raised. `gather` leaves them running: on the
    sync API's loop they would resume inside the next call, beside that call's own step, and a
    rollout would go on writing after its run has failed."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended (a cancel of the caller meanwhile still comes
    through); how it ended is nobody's news, so an error it ended with is marked seen."""
    task.cancel()
    try:
        await asyncio.wait([task])
    finally:
        if task.done() and not task.cancelled():
            task.exception()


async def close_each(
    items: Iterable[T], close: Callable[[T], Awaitable[object]], describe: Callable[[T], str], log: logging.Logger
) -> None:
    """`await close(item)` for every item at once, even when one fails; then raise the first
    failure in `items`' order (the others are logged), so one broken close leaves nothing else
    open. At once, not one after another: a close that hangs (a dead backend) would otherwise
    keep every item after it open, when the caller gives up waiting (a close timeout)."""
    listed = list(items)
    outcomes = await asyncio.gather(*(_outcome(close, item) for item in listed))
    first: Exception | None = None
    for item, exc in zip(listed, outcomes, strict=True):
        if exc is None:
            continue
        if first is None:
            first = exc
        else:
            log.warning("%s failed to close", describe(item), exc_info=exc)
    if first is not None:
        raise first


async def _outcome(close: Callable[[T], Awaitable[object]], item: T) -> Exception | None:
    """The exception `close(item)` raised, or None; anything else (a cancellation) propagates."""
    try:
        await close(item)
    except Exception as exc:  # noqa: BLE001 - handed to `close_each`, which raises the first
        return exc
    return None


_helper: concurrent.futures.ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def call_off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`; on a thread running an event loop (a trainer in Jupyter or Colab,
    SkyRL with `max_env_workers=0`), on a helper thread, since a sync ToolEnv call cannot run
    its coroutine inside a running loop."""
    if asyncio._get_running_loop() is None:  # in asyncio.__all__; no exception raised per call
        return fn(*args, **kwargs)
    global _helper
    with _helper_lock:
        if _helper is None:
            _helper = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="toolenv-sync")
    return _helper.submit(functools.partial(fn, *args, **kwargs)).result()


def close_from_sync(loop: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, T]) -> T:
    """Run a sync `close`'s coroutine to its end on `loop` (or on a loop of its own when `loop`
    is None or closed), also when this thread already runs an event loop (a notebook, a runner
    building envs inside its loop): then on a worker thread, since it cannot run here. A close
    must not quietly do nothing there, leaving the tools open."""
    own = asyncio.new_event_loop() if loop is None or loop.is_closed() else None
    target = own or loop
    assert target is not None
    try:
        result: T = call_off_loop(complete, target, coro)
        return result
    finally:
        if own is not None:
            own.close()


class BackgroundLoop:
    """One event loop on a daemon thread of its own, for sync callers that drive many envs.

    A trainer that holds a whole batch of envs (TRL's and SkyRL's pools: one per sample,
    thousands) and steps them through the sync API would give each `ToolEnv` an event loop of
    its own: three open files each (epoll and the self-pipe), plus any per-loop client a tool
    keeps. Here every env's coroutines run on this one loop, whichever thread hands them over
    (many at once), so an episode's loop-bound state stays on one loop and the process holds
    three files.

    The loop starts on first use, and again in a forked child (the parent's thread is not
    there). A caller interrupted while it waits (Ctrl-C) cancels its call and waits for it to
    end, as `complete` does, so it does not go on beside the caller's next call.
    """

    def __init__(self, name: str = "toolenv-envs") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if there is none in this process yet)."""
        loop = self._loop
        if loop is not None and self._pid == os.getpid():
            return loop
        with self._lock:
            if self._loop is None or self._pid != os.getpid():  # none yet, or a forked child's copy
                loop = asyncio.new_event_loop()
                threading.Thread(target=_serve, args=(loop,), name=self.name, daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for its result (from any thread, a running loop's too).

        Raises:
            RuntimeError: called on the loop's own thread (a tool calling a sync env method
                back), where waiting would deadlock.
        """
        loop = self.loop
        if asyncio._get_running_loop() is loop:  # in asyncio.__all__; no exception raised per call
            coro.close()
            raise RuntimeError(f"a sync env call cannot wait on its own event loop's thread ({self.name}); await it")
        call = _Handoff(coro)
        try:
            loop.call_soon_threadsafe(call.start)
            result: T = call.outcome.result()
            return result
        except BaseException:
            if not call.outcome.done():  # the caller was interrupted, not the call
                loop.call_soon_threadsafe(call.cancel)  # after `start`: the loop runs callbacks in order
                with contextlib.suppress(concurrent.futures.CancelledError):
                    call.outcome.exception()  # its end, before the interrupt reaches the caller
            raise


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """A background loop's thread: it runs until the process ends. A KeyboardInterrupt or
    SystemExit raised in a task (a tool's `sys.exit()`) goes to the waiting caller, as the task's
    error; the loop goes on serving the other callers, whose calls would otherwise never end."""
    while True:
        with contextlib.suppress(KeyboardInterrupt, SystemExit):
            loop.run_forever()
            return


class _Handoff:
    """One call handed to a `BackgroundLoop`: its task, made on the loop, and the outcome the caller waits on."""

    __slots__ = ("coro", "outcome", "task")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.coro)
        self.task.add_done_callback(self._settle)

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
        else:  # the caller was interrupted before it handed `start` over
            self.coro.close()
            self.outcome.cancel()

    def _settle(self, task: asyncio.Task[Any]) -> None:
        self.task = None  # no task <-> handoff cycle left for the collector; a late `cancel` is harmless
        pass_outcome(task, self.outcome)


def pass_outcome(task: asyncio.Future[T], outcome: concurrent.futures.Future[T]) -> None:
    """Give `outcome` (waited on from other threads) the result, error or cancellation of the
    finished `task`."""
    if task.cancelled():
        outcome.cancel()
    elif (error := task.exception()) is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result(task.result())
