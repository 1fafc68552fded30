"""`toolenv._aio`: asyncio.run without the repr of the result (CPython gh-112559), a loop per thread,
and `complete`, the cheap run_until_complete of the sync twins."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from toolenv import _aio


class _Loud:
    """A result whose repr is counted (a rollout's result reprs every trajectory)."""

    reprs = 0

    def __repr__(self) -> str:
        type(self).reprs += 1
        return "<loud>"


async def _make() -> _Loud:
    await asyncio.sleep(0)
    return _Loud()


def test_run_returns_the_result_without_its_repr() -> None:
    _Loud.reprs = 0
    result = _aio.run(_make())
    assert isinstance(result, _Loud)
    assert _Loud.reprs == 0


def test_run_raises_what_the_coroutine_raises() -> None:
    async def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        _aio.run(fail())


async def _this_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_thread_loop_is_kept_between_calls_and_per_thread() -> None:
    import threading

    first, second = _aio.run_on_thread_loop(_this_loop()), _aio.run_on_thread_loop(_this_loop())
    assert first is second and not first.is_closed()
    theirs: list[asyncio.AbstractEventLoop] = []
    t = threading.Thread(target=lambda: theirs.extend(_aio.run_on_thread_loop(_this_loop()) for _ in range(2)))
    t.start()
    t.join()
    assert theirs[0] is theirs[1] and theirs[0] is not first
    del t
    import gc

    gc.collect()
    assert theirs[0].is_closed()  # the thread ended: its loop was closed with it


async def test_thread_loop_refuses_a_running_loop() -> None:
    coro = _this_loop()
    with pytest.raises(RuntimeError, match="inside a running event loop"):
        _aio.run_on_thread_loop(coro)
    assert coro.cr_frame is None  # closed, so no "never awaited" warning


# ---------------------------------------------------------------------- complete
@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    new = asyncio.new_event_loop()
    yield new
    new.run_until_complete(new.shutdown_asyncgens())
    new.close()


async def _what_the_step_sees() -> tuple[bool, bool, asyncio.AbstractEventLoop, bool]:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    return task is not None, loop.is_running(), loop, sys.get_asyncgen_hooks().firstiter is not None


def test_complete_runs_the_coroutine_as_a_task_on_a_running_loop(loop: asyncio.AbstractEventLoop) -> None:
    has_task, running, seen, hooked = _aio.complete(loop, _what_the_step_sees())
    assert has_task and running and seen is loop and hooked  # as run_until_complete shows them
    assert not loop.is_running() and asyncio._get_running_loop() is None  # and left as before
    assert sys.get_asyncgen_hooks().firstiter is None


def test_complete_finishes_a_coroutine_that_waits(loop: asyncio.AbstractEventLoop) -> None:
    async def waits() -> list[int]:
        done = []
        for i in range(3):
            await asyncio.sleep(0.001)
            done.append(i)
        return done

    assert _aio.complete(loop, waits()) == [0, 1, 2]
    assert not loop.is_running()


def test_complete_keeps_timers_and_handles_of_earlier_calls(loop: asyncio.AbstractEventLoop) -> None:
    ran: list[str] = []

    async def schedules() -> None:
        asyncio.get_running_loop().call_soon(ran.append, "soon")
        asyncio.get_running_loop().call_later(0.001, ran.append, "later")

    _aio.complete(loop, schedules())
    _aio.complete(loop, asyncio.sleep(0.01))  # the next call runs what the first left
    assert ran == ["soon", "later"]


def test_complete_raises_what_the_coroutine_raises(loop: asyncio.AbstractEventLoop) -> None:
    async def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        _aio.complete(loop, fails())
    assert _aio.complete(loop, _this_loop()) is loop  # the loop is still usable


def test_complete_lets_keyboard_interrupt_through_and_restores_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    async def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _aio.complete(loop, interrupted())
    assert not loop.is_running() and asyncio._get_running_loop() is None
    assert sys.get_asyncgen_hooks().firstiter is None
    gc.collect()
    assert errors == []  # the task's exception was retrieved: nothing logged at collection
    assert _aio.complete(loop, _this_loop()) is loop


def test_complete_leaves_unfinished_async_generators_to_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    closed: list[bool] = []

    async def numbers() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            closed.append(True)

    async def first() -> tuple[int, AsyncIterator[int]]:
        gen = numbers()
        return await gen.__anext__(), gen

    value, gen = _aio.complete(loop, first())
    assert value == 1 and closed == []
    loop.run_until_complete(loop.shutdown_asyncgens())  # the loop knows the generator, as after run_until_complete
    assert closed == [True]
    del gen


async def test_complete_refuses_inside_a_running_loop() -> None:
    other = asyncio.new_event_loop()
    coro = asyncio.sleep(0)
    try:
        with pytest.raises(RuntimeError, match="another loop is running"):
            _aio.complete(other, coro)
    finally:
        coro.close()
        other.close()


def test_a_sync_step_gives_what_run_until_complete_gives() -> None:
    import toolenv

    @toolenv.tool(timeout=5)
    async def multiply(a: int, b: int) -> str:
        """Multiply two integers."""
        assert asyncio.current_task() is not None  # what a deadline and anyio need
        return str(a * b)

    env = toolenv.ToolEnv(tools=[multiply], tasks=[{"question": "6*7?", "answer": "42"}])
    action = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    env.reset(seed=0)
    fast = env.step(action)
    env.reset(seed=0)
    assert env._loop is not None
    plain = env._loop.run_until_complete(env.astep(action))
    assert fast[0] == plain[0] and "42" in fast[0]
    assert fast[1:4] == plain[1:4]
    assert [r.text for r in fast[4]["tool_results"]] == [r.text for r in plain[4]["tool_results"]] == ["42"]
    env.close()


def _interrupt_soon() -> None:
    """Ctrl-C as the loop sees it: a KeyboardInterrupt raised out of a callback while a task waits."""

    def interrupt() -> None:
        raise KeyboardInterrupt

    asyncio.get_running_loop().call_soon(interrupt)


@pytest.mark.parametrize("first_step_waits", [True, False])
def test_an_interrupted_call_is_cancelled_not_left_to_resume_in_the_next(
    loop: asyncio.AbstractEventLoop, first_step_waits: bool
) -> None:
    events: list[str] = []

    async def waits() -> None:
        if first_step_waits:
            await asyncio.sleep(0)  # interrupted in run_until_complete, not in the first step
        _interrupt_soon()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        events.append("resumed")

    with pytest.raises(KeyboardInterrupt):
        _aio.complete(loop, waits())
    assert events == ["cancelled"]  # finished before the interrupt reached the caller
    assert not loop.is_running() and asyncio._get_running_loop() is None
    _aio.complete(loop, asyncio.sleep(0.1))  # the next call runs nothing of the interrupted one
    assert events == ["cancelled"]
    assert asyncio.all_tasks(loop) == set()


# ---------------------------------------------------------------------- BackgroundLoop
def test_background_loop_runs_calls_from_many_threads_on_one_loop_at_once() -> None:
    import threading

    bg = _aio.BackgroundLoop("test-bg")
    n, arrived = 8, []
    everyone: list[asyncio.Event] = []

    async def meet(i: int) -> tuple[int, asyncio.AbstractEventLoop]:
        if not everyone:
            everyone.append(asyncio.Event())
        arrived.append(i)
        if len(arrived) == n:
            everyone[0].set()
        await asyncio.wait_for(everyone[0].wait(), 60)  # a guard against a hang: all n wait at once
        return i, asyncio.get_running_loop()

    out: list[tuple[int, asyncio.AbstractEventLoop]] = []
    threads = [threading.Thread(target=lambda i=i: out.append(bg.run(meet(i)))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i for i, _ in out) == list(range(n))
    assert {loop for _, loop in out} == {bg.loop} and bg.loop.is_running()
    assert bg.run(_this_loop()) is bg.loop  # the caller's thread runs no loop of its own


def test_background_loop_raises_the_calls_error_and_refuses_its_own_thread() -> None:
    bg = _aio.BackgroundLoop("test-bg")

    async def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        bg.run(fail())

    async def calls_back() -> None:
        bg.run(asyncio.sleep(0))  # a tool calling a sync env method: waiting here would deadlock

    with pytest.raises(RuntimeError, match="its own event loop's thread"):
        bg.run(calls_back())


async def test_background_loop_serves_a_thread_that_runs_an_event_loop() -> None:
    """A notebook's thread runs a loop: the call waits there rather than refusing."""
    bg = _aio.BackgroundLoop("test-bg")
    assert bg.run(_this_loop()) is bg.loop is not asyncio.get_running_loop()


def test_background_loop_survives_a_task_that_raises_system_exit() -> None:
    bg = _aio.BackgroundLoop("test-bg")

    async def exits() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        bg.run(exits())
    assert bg.run(_this_loop()) is bg.loop  # the loop goes on serving


def test_an_interrupted_background_call_ends_before_the_interrupt_reaches_the_caller() -> None:
    import signal
    import threading

    bg = _aio.BackgroundLoop("test-bg")
    events: list[str] = []
    main = threading.main_thread().ident
    assert main == threading.get_ident() and main is not None

    async def waits() -> None:
        signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, delivered to the waiting main thread
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)  # the cancelled call takes a moment to clean up
            events.append("cleaned up")
            raise
        events.append("resumed")

    with pytest.raises(KeyboardInterrupt):
        bg.run(waits())
    assert events == ["cleaned up"]
    assert bg.run(_this_loop()) is bg.loop


def test_background_loop_starts_again_in_a_forked_child() -> None:
    import os

    bg = _aio.BackgroundLoop("test-bg")
    parent_loop = bg.run(_this_loop())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's loop thread is not here
        try:
            loop = bg.run(_this_loop())
            ok = loop is not parent_loop and bg.run(_make()) is not None
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    assert said == b"ok"
    assert bg.run(_this_loop()) is parent_loop
