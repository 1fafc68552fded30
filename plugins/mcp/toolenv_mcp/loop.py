"""The one background thread and event loop on which every MCP session of the process lives.

Why a thread of its own: an MCP `ClientSession` (and the anyio task groups of its
transport) belongs to the task and loop that opened it, but toolenv runs tools in many
loops — a sync env's private loop, a vector env's loop, verl's worker threads, each
`asyncio.run` of a script — and a session kept open across calls and episodes must
outlive all of them. So sessions are opened and used only here, and callers hand their
calls over with `asyncio.run_coroutine_threadsafe`, awaiting the result through
`asyncio.wrap_future`: cancelling the caller's await (toolenv's timeout) cancels the call
on this loop. The other choices reconnect per call (GEM's `asyncio.run` in a thread) or
tie a session to one loop; no library offers a loop-independent shared session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["call", "get_loop", "in_loop_thread", "run_sync", "started", "stop", "submit"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def get_loop() -> asyncio.AbstractEventLoop:
    """The background loop, started on first use (a daemon thread named `toolenv-mcp`)."""
    global _loop, _thread
    loop = _loop
    if loop is not None:
        return loop
    with _lock:
        if _loop is None:
            new = asyncio.new_event_loop()
            started = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(new)
                new.call_soon(started.set)
                try:
                    new.run_forever()
                finally:  # stopped (at exit): end what is left, then close the loop
                    left = asyncio.all_tasks(new)
                    for task in left:
                        task.cancel()
                    if left:
                        new.run_until_complete(asyncio.wait(left, timeout=1.0))
                    new.close()

            _thread = threading.Thread(target=serve, name="toolenv-mcp", daemon=True)
            _thread.start()
            started.wait()
            _loop = new
        return _loop


def started() -> bool:
    """True once the background loop runs."""
    return _loop is not None


def in_loop_thread() -> bool:
    """True on the background thread itself (where blocking on it would deadlock)."""
    return _thread is not None and threading.current_thread() is _thread


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule `coro` on the background loop from any thread."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


async def call(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` on the background loop from any loop; cancelling this await cancels it there."""
    if in_loop_thread():
        return await coro
    return await asyncio.wrap_future(submit(coro))


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Block the calling thread (inside an event loop or not) until `coro` finishes on the background loop."""
    if in_loop_thread():
        coro.close()
        raise RuntimeError("toolenv-mcp: a blocking call was made on the MCP loop itself; use the async API")
    future = submit(coro)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise


def stop(timeout: float = 1.0) -> None:
    """Stop the loop and let the thread end (at exit, after every connection is closed)."""
    global _loop, _thread
    with _lock:
        loop, thread, _loop, _thread = _loop, _thread, None, None
    if loop is None or thread is None:
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout)


def _forget_after_fork() -> None:
    """A forked child has the parent's loop object but not its thread: start afresh on demand."""
    global _loop, _thread, _lock
    _loop, _thread, _lock = None, None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
