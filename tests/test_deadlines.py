"""`Deadline`: a tool call's timeout with `asyncio.timeout`'s rules, on shared timers."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import pytest
from pydantic import BaseModel

import toolenv
from toolenv import ToolCall, ToolCaller, ToolResult

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="Deadline needs Task.uncancel (Python 3.11+)")


class Wait(toolenv.Tool):
    """Wait `seconds`, then answer; with `swallow`, a cancellation is caught and answered."""

    name = "wait"

    class Args(BaseModel):
        seconds: float
        swallow: bool = False

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
        try:
            await asyncio.sleep(args.seconds)
        except asyncio.CancelledError:
            if not args.swallow:
                raise
            return ToolResult(text="caught")
        return ToolResult(text="done")


def wait(seconds: float, swallow: bool = False) -> ToolCall:
    return ToolCall(id="c", name="wait", arguments={"seconds": seconds, "swallow": swallow})


async def call(caller: ToolCaller, c: ToolCall) -> ToolResult:
    (result,), _ = await caller.invoke_for([c], toolenv.Task(id="t"), "e", 0, {})
    return result


async def test_a_call_past_its_deadline_times_out_never_early_and_within_a_percent() -> None:
    """The timer is set for no earlier than the timeout and at most 1% past it (read from the
    loop's own clock, so a loaded machine's late wake-ups cannot fail or hide it)."""
    from toolenv.deadlines import _BUCKETS

    loop = asyncio.get_running_loop()
    caller = ToolCaller([Wait(timeout=0.2)])
    before = loop.time()
    t0 = time.perf_counter()
    task = asyncio.create_task(call(caller, wait(5)))
    for _ in range(100):  # the call arms its deadline within its first steps
        await asyncio.sleep(0)
        if loop in _BUCKETS and _BUCKETS[loop].due:
            break
    after = loop.time()
    ((when, members),) = _BUCKETS[loop].due.items()
    assert len(members) == 1
    assert before + 0.2 <= when <= after + 0.2 * 1.01 + 1e-9, (when - before, after - before)
    result = await task
    took = time.perf_counter() - t0
    assert result.is_error and "timed out after 0.2 s" in result.text
    assert took >= 0.2, took  # never early
    assert loop.time() >= when
    assert (asyncio.current_task() or pytest.fail()).cancelling() == 0  # the deadline's cancel was taken back


async def test_a_call_in_time_answers_and_leaves_no_cancellation_behind() -> None:
    caller = ToolCaller([Wait(timeout=0.5)])
    assert (await call(caller, wait(0.01))).text == "done"
    await asyncio.sleep(0)  # a pending cancel would be delivered here
    assert (asyncio.current_task() or pytest.fail()).cancelling() == 0


async def test_cancelling_the_step_is_not_reported_as_a_timeout() -> None:
    caller = ToolCaller([Wait(timeout=5)])
    task = asyncio.create_task(call(caller, wait(5)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_step_cancelled_as_its_deadline_fires_stays_cancelled() -> None:
    # Both ask to cancel before the call runs again; asyncio.timeout's rule: the outer request
    # wins, so the step is cancelled rather than told its tool timed out.
    from toolenv.deadlines import _BUCKETS

    caller = ToolCaller([Wait(timeout=30)])
    task = asyncio.create_task(call(caller, wait(5)))
    await asyncio.sleep(0.02)
    (deadline,) = (d for members in _BUCKETS[asyncio.get_running_loop()].due.values() for d in members)
    deadline.expire()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_tool_that_swallows_the_cancellation_answers_normally() -> None:
    caller = ToolCaller([Wait(timeout=0.05)])
    assert (await call(caller, wait(5, swallow=True))).text == "caught"
    assert (asyncio.current_task() or pytest.fail()).cancelling() == 0


async def test_calls_in_flight_together_share_a_timer() -> None:
    from toolenv.deadlines import _BUCKETS

    caller = ToolCaller([Wait(timeout=30)])
    loop = asyncio.get_running_loop()
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]
    tasks = [asyncio.create_task(call(caller, wait(0.2))) for _ in range(1000)]
    await asyncio.sleep(0.05)  # every call is waiting now
    armed = len(loop._scheduled) - timers_before  # type: ignore[attr-defined]
    assert sum(len(m) for m in _BUCKETS[loop].due.values()) == 1000
    assert armed <= 1000 + 3  # the 1,000 sleeps themselves, and at most a few deadline buckets
    assert [r.text for r in await asyncio.gather(*tasks)] == ["done"] * 1000
    assert sum(len(m) for m in _BUCKETS[loop].due.values()) == 0


async def test_a_deadline_needs_a_task() -> None:
    from toolenv.deadlines import Deadline

    loop = asyncio.get_running_loop()
    made: list[BaseException] = []

    def outside_any_task() -> None:
        try:
            Deadline(1.0)
        except RuntimeError as exc:
            made.append(exc)

    loop.call_soon(outside_any_task)
    await asyncio.sleep(0.01)
    assert made and "inside a task" in str(made[0])


def test_event_loops_that_kept_deadlines_are_freed() -> None:
    # The per-loop buckets are keyed weakly by the loop; a bucket that referred to its loop
    # would keep every loop alive (a sync env's private loop, each `asyncio.run`).
    import gc
    import weakref

    caller = ToolCaller([Wait(timeout=30)])
    loops = []

    async def one() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        assert (await call(caller, wait(0.001))).text == "done"

    for _ in range(5):
        asyncio.run(one())
    gc.collect()
    assert [ref() for ref in loops] == [None] * 5
