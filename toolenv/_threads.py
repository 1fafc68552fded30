"""Daemon worker threads that a process exit never waits for.

A thread cannot be stopped: a call stuck in one (a sync tool past its timeout, a blocking
teardown on a dead backend) holds it until the call returns, which may be never.
`asyncio.to_thread` runs calls on the loop's default executor, a `ThreadPoolExecutor`,
whose threads `asyncio.run` (with no bound before Python 3.12) and the interpreter join on
the way out, so one such call kept the process from ever exiting. Here threads are daemons
that nothing joins, an idle one is reused, and `running()` names the calls still in them.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["WORKERS", "DaemonThreadExecutor", "DaemonThreads", "call_name"]


class DaemonThreads:
    """Daemon threads, one per job in flight: an idle one takes the next job, else a new one starts.

    Unbounded on purpose: a thread whose call is stuck takes no new work, and a bound (asyncio's
    default executor has min(32, cpus + 4) threads) let that many stuck calls queue every later
    one until it timed out too. Idle threads exit after `IDLE_S` seconds, so a burst leaves none.
    """

    IDLE_S = 2.0

    def __init__(self, name: str) -> None:
        self.name = name  # each thread's name
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []
        self.workers: set[_Worker] = set()  # alive, idle or busy

    def run(self, job: Callable[[], object], what: Callable[..., Any]) -> None:
        """Run `job()` on a thread; `what`, the function it calls, names it in `running()`.

        `job` hands its result or error to whoever waits for it: it must not raise.
        """
        with self.lock:
            worker = self.idle.pop() if self.idle else None
        if worker is None:
            worker = _Worker(self)
            with self.lock:
                self.workers.add(worker)
            try:
                worker.start()
            except BaseException:  # no thread to be had ("can't start new thread"): the caller's error
                with self.lock:
                    self.workers.discard(worker)
                raise
        worker.jobs.put((job, what))

    def running(self) -> list[tuple[str, float]]:
        """The calls running now: each one's name (see `call_name`) and seconds since it started."""
        now = time.monotonic()
        with self.lock:
            current = [w.current for w in self.workers]
        return [(call_name(what), now - started) for what, started in (c for c in current if c is not None)]

    def forget(self) -> None:
        """After a fork: the parent's threads do not exist in the child."""
        self.lock = threading.Lock()
        self.idle = []
        self.workers = set()


class _Worker(threading.Thread):
    def __init__(self, pool: DaemonThreads) -> None:
        super().__init__(name=pool.name, daemon=True)
        self.pool = pool
        self.jobs: queue.SimpleQueue[tuple[Callable[[], object], Callable[..., Any]]] = queue.SimpleQueue()
        self.current: tuple[Callable[..., Any], float] | None = None  # what it runs, since when (monotonic)

    def run(self) -> None:
        try:
            self._serve()
        finally:
            with self.pool.lock:
                self.pool.workers.discard(self)

    def _serve(self) -> None:
        while True:
            try:
                job, what = self.jobs.get(timeout=self.pool.IDLE_S)
            except queue.Empty:
                with self.pool.lock:
                    if self in self.pool.idle:
                        self.pool.idle.remove(self)
                        return
                continue  # taken off the idle list just now: its job is on the way
            self.current = (what, time.monotonic())
            try:
                job()
            finally:
                self.current = None
                del job, what  # an idle thread keeps nothing of the call alive
            with self.pool.lock:
                self.pool.idle.append(self)


def call_name(fn: Callable[..., Any]) -> str:
    """`module.qualname` of what a thread runs; `asyncio.to_thread` hands the executor
    `partial(context.run, func, ...)`, named here by `func`."""
    while isinstance(fn, functools.partial):
        in_context = isinstance(getattr(fn.func, "__self__", None), contextvars.Context) and bool(fn.args)
        fn = fn.args[0] if in_context else fn.func
    name = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else name


#: The process's pool: sync function tools, and `toolenv serve`'s `asyncio.to_thread` calls.
WORKERS = DaemonThreads("toolenv-worker")
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WORKERS.forget)


class DaemonThreadExecutor(concurrent.futures.ThreadPoolExecutor):
    """A loop's default executor (`asyncio.to_thread`) on `DaemonThreads`, which a stop does not wait for.

    asyncio shuts its own down with `wait=True` when the loop ends: one sync call that never
    returns, which a stop had already given up on, kept the process from exiting. Here
    `shutdown` refuses new calls and waits for none still running; `running()` names them.
    Like the pool, no bound on threads (see `DaemonThreads`): the calls in flight are bounded
    upstream instead (`toolenv serve --max-sessions`).

    A `ThreadPoolExecutor` subclass only because `loop.set_default_executor` takes nothing
    else; `submit` and `shutdown` are its own, and it starts none of the base class's threads.
    """

    def __init__(self, threads: DaemonThreads = WORKERS) -> None:
        super().__init__(thread_name_prefix=threads.name)
        self.threads = threads
        self.closed = False
        self.closing = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Run `fn(*args, **kwargs)` on one of the pool's threads."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():  # cancelled before it started: not run
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting call, as ThreadPoolExecutor does
                future.set_exception(exc)
            else:
                future.set_result(result)

        with self.closing:
            if self.closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self.threads.run(job, fn)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; never wait for a call still running (nothing waits to start)."""
        with self.closing:
            self.closed = True

    def running(self) -> list[tuple[str, float]]:
        """The calls running now on the pool's threads, each one's name and seconds since it
        started: this executor's, and those of anything else sharing its pool (sync function tools)."""
        return self.threads.running()
