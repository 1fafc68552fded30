"""A tool that goes on past its timeout (it caught the cancellation, or cleans up at length) no
longer holds the step: the call ends on time with the timeout error, and the tool is left to
finish in the background (docs/reliability.md, "Some hangs cannot be timed out")."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import Iterator

import pytest

import toolenv
from toolenv import ToolCall, ToolCaller, ToolResult, tool
from toolenv import caller as caller_mod

#: Generous: only there so that a step that waits for the tool fails the test instead of hanging it.
HANG_GUARD_S = 30.0


@pytest.fixture(params=["deadline", "task"] if sys.version_info >= (3, 11) else ["task"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a call keeps its deadline: 3.11+'s `Deadline` in the step's own task, and the
    child task Python 3.10 uses (`_run_in_task`), which runs on 3.11+ too."""
    if request.param == "task":
        monkeypatch.setattr(caller_mod, "_DEADLINES", False)
    return str(request.param)


@pytest.fixture(autouse=True)
def _no_never_retrieved(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    gc.collect()
    assert "never retrieved" not in caplog.text
    assert "destroyed but it is pending" not in caplog.text


async def call(caller: ToolCaller, name: str) -> tuple[ToolResult, toolenv.ToolCallRecord]:
    task = asyncio.ensure_future(caller.invoke_for([ToolCall(id="c", name=name)], toolenv.Task(id="t"), "e", 0, {}))
    (result,), (record,) = await asyncio.wait_for(task, HANG_GUARD_S)
    return result, record


async def background_done() -> None:
    """Wait until every detached tool has ended (a few loop turns: each is one step away)."""
    for _ in range(1000):
        if not caller_mod._DETACHED:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"detached tools still running: {caller_mod._DETACHED}")


async def test_a_tool_that_swallows_its_cancellation_times_out_on_time_and_finishes_later(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    release = asyncio.Event()
    ends: list[str] = []

    @tool(timeout=0.05)
    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ends.append("caught")
            await release.wait()  # swallowed: waits on as long as it likes
            ends.append("finished")
        return "late"

    caller = ToolCaller([stubborn])
    result, record = await call(caller, "stubborn")
    assert result.is_error and result.text == (
        "Tool 'stubborn' timed out after 0.05 s. Try a simpler or smaller request."
    )
    assert record.error is not None and record.latency_s >= 0.05
    assert ends == ["caught"] and not release.is_set()  # the step answered while the tool ran on
    assert "stubborn" in caplog.text and "past its 0.05 s timeout" in caplog.text
    assert len(caller_mod._DETACHED) == 1
    # The step's task holds no cancellation of the deadline's: it awaits on undisturbed.
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0
    await asyncio.sleep(0.001)

    release.set()
    await background_done()
    assert ends == ["caught", "finished"]
    assert asyncio.all_tasks() == {me}


async def test_a_detached_tools_failure_is_logged_at_debug_not_as_never_retrieved(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    release = asyncio.Event()

    @tool(timeout=0.05)
    async def cleanup_fails() -> str:
        try:
            await asyncio.sleep(3600)
        finally:
            await release.wait()
            raise RuntimeError("cleanup broke")

    result, _ = await call(ToolCaller([cleanup_fails]), "cleanup_fails")
    assert "timed out after 0.05 s" in result.text
    release.set()
    await background_done()
    (record,) = [r for r in caplog.records if "cleanup broke" in r.getMessage()]
    assert record.levelno == logging.DEBUG and "cleanup_fails" in record.getMessage()


async def test_a_cleanup_that_awaits_once_after_the_cancellation_is_detached_and_ends(path: str) -> None:
    release = asyncio.Event()
    cleaned: list[bool] = []

    @tool(timeout=0.05)
    async def tidy() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # one wait in its cleanup, then the cancellation goes on out
            cleaned.append(True)
            raise
        return "unreachable"

    result, _ = await call(ToolCaller([tidy]), "tidy")
    assert "timed out after 0.05 s" in result.text and not cleaned
    release.set()
    await background_done()
    assert cleaned == [True]


async def test_a_tool_that_cleans_up_without_waiting_is_not_detached(path: str) -> None:
    """Ending at once on the cancellation (the common case) keeps its usual result."""

    @tool(timeout=0.05)
    async def prompt() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "caught"
        return "unreachable"

    result, _ = await call(ToolCaller([prompt]), "prompt")
    assert result.text == "caught" and not caller_mod._DETACHED


async def test_timeouts_of_detached_calls_count_against_the_circuit_breaker(path: str) -> None:
    release = asyncio.Event()

    @tool(timeout=0.05, breaker_threshold=2, breaker_cooldown=60)
    async def flaky() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()
        return "late"

    caller = ToolCaller([flaky])
    texts = [(await call(caller, "flaky"))[0].text for _ in range(3)]
    assert "timed out" in texts[0] and "timed out" in texts[1]
    assert "It will be tried again in 60 s" in texts[2]  # the circuit opened on the two timeouts
    release.set()
    await background_done()


async def test_the_steps_own_cancellation_still_goes_through_the_tool(path: str) -> None:
    """Cancelling the step (Ctrl-C, a shutdown) is not a timeout: it waits for the tool to end,
    as it always has, and the cancellation comes out of the step."""
    release = asyncio.Event()
    ends: list[str] = []
    started = asyncio.Event()

    @tool(timeout=60)
    async def stubborn() -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ends.append("caught")
            await release.wait()
            ends.append("finished")
            raise
        return "unreachable"

    step = asyncio.ensure_future(
        ToolCaller([stubborn]).invoke_for([ToolCall(name="stubborn")], toolenv.Task(id="t"), "e", 0, {})
    )
    await started.wait()
    step.cancel()
    for _ in range(20):
        await asyncio.sleep(0)
    assert ends == ["caught"] and not step.done()  # not detached: the step waits for its tool
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(step, HANG_GUARD_S)
    assert ends == ["caught", "finished"] and not caller_mod._DETACHED


def test_the_env_answers_on_time_and_its_next_step_works() -> None:
    """A sync env (its own loop): the step returns the timeout observation while the tool runs
    on, the next steps work, and the detached tool finishes on a later step."""
    release: list[asyncio.Event] = []
    ends: list[str] = []

    @tool(timeout=0.05)
    async def stubborn() -> str:
        event = asyncio.Event()
        release.append(event)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await event.wait()
            ends.append("finished")
        return "late"

    @tool
    def add(a: int, b: int) -> int:
        return a + b

    env = toolenv.ToolEnv(tools=[stubborn, add], tasks=[{"question": "q", "answer": "a"}], max_turns=10)
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step('<tool_call>{"name": "stubborn", "arguments": {}}</tool_call>')
        (result,) = info["tool_results"]
        assert "timed out after 0.05 s" in result.text and not ends
        _, _, _, _, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
        assert [r.text for r in info["tool_results"]] == ["5"]
        release[0].set()  # its loop runs again on the next step: the tool ends there
        for _ in range(3):
            _, _, _, _, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>')
            assert [r.text for r in info["tool_results"]] == ["2"]
            if ends:
                break
        assert ends == ["finished"] and not caller_mod._DETACHED
    finally:
        env.close()


def test_closing_the_env_cancels_its_tools_still_running_past_their_timeout() -> None:
    """A sync env closes its own loop: a tool left running there is cancelled as its env closes,
    not left pending on a closed loop (kept forever, or "destroyed but it is pending")."""
    ends: list[str] = []

    @tool(timeout=0.05)
    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            try:
                await asyncio.Event().wait()  # never set: only the close ends it
            except asyncio.CancelledError:
                ends.append("cancelled at close")
                raise
        return "late"

    env = toolenv.ToolEnv(tools=[stubborn], tasks=[{"question": "q", "answer": "a"}], max_turns=10)
    env.reset(seed=0)
    _, _, _, _, info = env.step('<tool_call>{"name": "stubborn", "arguments": {}}</tool_call>')
    assert "timed out" in info["tool_results"][0].text and len(caller_mod._DETACHED) == 1
    env.close()
    assert ends == ["cancelled at close"] and not caller_mod._DETACHED
