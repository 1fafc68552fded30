"""A tool still running past its timeout's grace (it caught the cancellation and waits on) no
longer holds the step: the call ends on time with the timeout error, and the tool is left to
finish in the background; a tool whose cleanup awaits briefly (an HTTP client closing its pool)
ends within the grace and is not (docs/reliability.md, "Some hangs cannot be timed out").

Python 3.11+ only: 3.10's deadline (a child task per call) still waits for such a tool."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import toolenv
from toolenv import ToolCall, ToolCaller, ToolResult, deadlines, tool
from toolenv import caller as caller_mod

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 does not detach (docs/reliability.md)")

#: Generous: only there so that a step that waits for the tool fails the test instead of hanging it.
HANG_GUARD_S = 30.0


@pytest.fixture(autouse=True)
def _no_never_retrieved(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    gc.collect()
    assert "never retrieved" not in caplog.text
    assert "destroyed but it is pending" not in caplog.text
    assert not caller_mod._DETACHED


def detached_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "left to finish in the background" in r.getMessage()]


async def call(caller: ToolCaller, name: str) -> tuple[ToolResult, toolenv.ToolCallRecord, int]:
    """One call in a task of its own, as a step makes it: its result, its record, and the
    cancellations its task still holds once it returned (none, whatever the tool did)."""

    async def step() -> tuple[ToolResult, toolenv.ToolCallRecord, int]:
        (result,), (record,) = await caller.invoke_for([ToolCall(id="c", name=name)], toolenv.Task(id="t"), "e", 0, {})
        me = asyncio.current_task()
        assert me is not None
        return result, record, me.cancelling()

    return await asyncio.wait_for(asyncio.ensure_future(step()), HANG_GUARD_S)


async def background_done() -> None:
    """Wait until every detached tool has ended (a few loop turns: each is one step away)."""
    for _ in range(1000):
        if not caller_mod._DETACHED:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"detached tools still running: {caller_mod._DETACHED}")


async def test_a_tool_that_swallows_its_cancellation_times_out_on_time_and_finishes_later(
    caplog: pytest.LogCaptureFixture,
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
    result, record, cancelling = await call(caller, "stubborn")
    assert result.is_error and result.text == (
        "Tool 'stubborn' timed out after 0.05 s. Try a simpler or smaller request."
    )
    assert record.error is not None and record.latency_s >= 0.05
    assert cancelling == 0  # the deadline's cancel was taken back from the step's task
    assert ends == ["caught"] and not release.is_set()  # the step answered while the tool ran on
    (warning,) = detached_warnings(caplog)
    assert warning.startswith("tool 'stubborn' was still running 0.0025 s after its 0.05 s timeout cancelled it")
    assert len(caller_mod._DETACHED) == 1

    release.set()
    await background_done()
    assert ends == ["caught", "finished"]
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_a_tool_that_keeps_yielding_past_the_grace_is_detached(caplog: pytest.LogCaptureFixture) -> None:
    """Bare yields (`sleep(0)` in a loop) after the cancellation: the grace counts them too."""
    release = asyncio.Event()
    spins: list[int] = []

    @tool(timeout=0.05)
    async def spinner() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            spins.append(0)
            while not release.is_set():
                spins[0] += 1
                await asyncio.sleep(0)
        return "late"

    result, _, _ = await call(ToolCaller([spinner]), "spinner")
    assert "timed out after 0.05 s" in result.text and spins[0] >= 1
    assert len(detached_warnings(caplog)) == 1 and len(caller_mod._DETACHED) == 1
    release.set()
    await background_done()


async def test_a_detached_tools_failure_is_logged_at_debug_not_as_never_retrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    @tool(timeout=0.05)
    async def cleanup_fails() -> str:
        try:
            await asyncio.sleep(3600)
        finally:
            await release.wait()
            raise RuntimeError("cleanup broke")

    result, _, _ = await call(ToolCaller([cleanup_fails]), "cleanup_fails")
    assert "timed out after 0.05 s" in result.text
    release.set()
    await background_done()
    (record,) = [r for r in caplog.records if "cleanup broke" in r.getMessage()]
    assert record.levelno == logging.DEBUG and "cleanup_fails" in record.getMessage()


async def test_a_cleanup_that_waits_past_the_grace_is_detached_and_ends() -> None:
    release = asyncio.Event()
    cleaned: list[bool] = []

    @tool(timeout=0.05)
    async def tidy() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # one long wait in its cleanup, then the cancellation goes on out
            cleaned.append(True)
            raise
        return "unreachable"

    result, _, _ = await call(ToolCaller([tidy]), "tidy")
    assert "timed out after 0.05 s" in result.text and not cleaned
    release.set()
    await background_done()
    assert cleaned == [True]


async def test_a_tool_that_cleans_up_without_waiting_is_not_detached() -> None:
    """Ending at once on the cancellation (the common case) keeps its usual result."""

    @tool(timeout=0.05)
    async def prompt() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "caught"
        return "unreachable"

    result, _, _ = await call(ToolCaller([prompt]), "prompt")
    assert result.text == "caught" and not caller_mod._DETACHED


@pytest.mark.parametrize("ending", ["raise", "return"])
async def test_a_cleanup_that_awaits_briefly_is_not_detached(ending: str, caplog: pytest.LogCaptureFixture) -> None:
    """One await in the cleanup (a connection closed, a lock released) ends within the grace:
    the step waits for it, as it always has, and nothing is logged."""
    cleaned: list[bool] = []

    @tool(timeout=0.05)
    async def brief() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0)
            cleaned.append(True)
            if ending == "raise":
                raise
            return "cleaned up"
        return "unreachable"

    result, _, cancelling = await call(ToolCaller([brief]), "brief")
    assert cleaned == [True] and cancelling == 0  # done before the step returned
    expected = "Tool 'brief' timed out after 0.05 s" if ending == "raise" else "cleaned up"
    assert result.text.startswith(expected)
    assert not detached_warnings(caplog) and not caller_mod._DETACHED


async def test_an_httpx_tool_that_times_out_is_not_detached_and_closes_its_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`async with httpx.AsyncClient()` closes its pool with awaits after the cancellation:
    over a real loopback server that answers only after the deadline, the call times out, the
    client is closed by the time the step returns, and nothing is left in the background."""
    answer = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await answer.wait()  # the test lets it answer once the call has timed out
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\nlate")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/judge"
    clients: list[httpx.AsyncClient] = []

    @tool(timeout=0.5)  # a grace of 25 ms: the client's cleanup takes a few loop turns
    async def judge() -> str:
        client = httpx.AsyncClient()
        clients.append(client)
        async with client:
            return (await client.get(url)).text

    try:
        result, _, cancelling = await call(ToolCaller([judge]), "judge")
    finally:
        answer.set()
        server.close()
        await server.wait_closed()
    assert result.text == "Tool 'judge' timed out after 0.5 s. Try a simpler or smaller request."
    assert cancelling == 0
    (client,) = clients
    assert client.is_closed  # its cleanup ran in the step, not in the background
    assert not detached_warnings(caplog) and not caller_mod._DETACHED


async def test_timeouts_of_detached_calls_count_against_the_circuit_breaker() -> None:
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
    # the circuit opened on the two timeouts (its 60 s cooldown, less the time since, rounded)
    retry = re.search(r"It will be tried again in (\d+) s", texts[2])
    assert retry is not None and 50 <= int(retry.group(1)) <= 60, texts[2]
    release.set()
    await background_done()


async def test_the_steps_own_cancellation_still_goes_through_the_tool() -> None:
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


async def test_the_steps_own_cancellation_during_the_grace_goes_through_the_tool(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The deadline fired and the tool waits on in its grace when the step itself is cancelled:
    the tool's wait is cancelled, the step waits for the tool to end and raises the
    cancellation, as without a grace; nothing is detached."""
    monkeypatch.setattr(deadlines, "GRACE", 1000.0)  # a 50 s grace: the cancel lands inside it
    caught = asyncio.Event()
    release = asyncio.Event()
    ends: list[str] = []

    @tool(timeout=0.05)
    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            caught.set()
            try:
                await asyncio.Event().wait()  # swallowed the deadline's cancel: waits on
            except asyncio.CancelledError:
                ends.append("cancelled again")
                await release.wait()
                ends.append("finished")
                raise
        return "unreachable"

    step = asyncio.ensure_future(
        ToolCaller([stubborn]).invoke_for([ToolCall(name="stubborn")], toolenv.Task(id="t"), "e", 0, {})
    )
    await caught.wait()
    step.cancel()
    for _ in range(20):
        await asyncio.sleep(0)
    assert ends == ["cancelled again"] and not step.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(step, HANG_GUARD_S)
    assert ends == ["cancelled again", "finished"]
    assert not detached_warnings(caplog) and not caller_mod._DETACHED


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
    and its cleanup runs on that loop, not left pending on a closed loop."""
    ends: list[str] = []

    @tool(timeout=0.05)
    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            try:
                await asyncio.Event().wait()  # never set: only the close ends it
            except asyncio.CancelledError:
                await asyncio.sleep(0.01)  # a cleanup that takes a few loop turns
                ends.append("cancelled at close")
                raise
        return "late"

    env = toolenv.ToolEnv(tools=[stubborn], tasks=[{"question": "q", "answer": "a"}], max_turns=10)
    env.reset(seed=0)
    _, _, _, _, info = env.step('<tool_call>{"name": "stubborn", "arguments": {}}</tool_call>')
    assert "timed out" in info["tool_results"][0].text and len(caller_mod._DETACHED) == 1
    env.close()
    assert ends == ["cancelled at close"] and not caller_mod._DETACHED


def _stubborn_until_cancelled_at_close(ends: list[str]) -> Any:
    """A tool that swallows its timeout's cancellation and waits until cancelled again (as a
    close does); its cleanup awaits once, then says so in `ends`."""

    @tool(timeout=0.05)
    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0)
                ends.append("ended")
        return "late"

    return stubborn


def test_closing_an_env_whose_shared_tool_runs_detached_ends_it_on_the_envs_loop() -> None:
    """The tool is shared with an env still open, so closing the first env does not close it
    (nor cancel its calls, as closing a tool does): the call detached on the closing env's loop
    is still cancelled and run to its end before that loop closes."""
    ends: list[str] = []
    stubborn = _stubborn_until_cancelled_at_close(ends)
    tasks = [{"question": "q", "answer": "a"}]
    env = toolenv.ToolEnv(tools=[stubborn], tasks=tasks, max_turns=10)
    other = toolenv.ToolEnv(tools=[stubborn], tasks=tasks, max_turns=10)
    try:
        env.reset(seed=0)
        env.step('<tool_call>{"name": "stubborn", "arguments": {}}</tool_call>')
        assert len(caller_mod._DETACHED) == 1
        env.close()
        assert ends == ["ended"] and not caller_mod._DETACHED
    finally:
        other.close()


def test_a_closed_sync_env_leaves_no_coroutine_to_the_garbage_collector(tmp_path: Path) -> None:
    """In a fresh interpreter (its real stderr): a sync env detaches a tool that swallows its
    cancellation, then closes; collecting everything prints nothing ("Exception ignored",
    "never retrieved", "destroyed but it is pending" are what a coroutine left on the closed
    loop would give), and the tool's cleanup ran on the env's loop."""
    script = textwrap.dedent(
        """
        import asyncio, gc
        import toolenv
        from toolenv import tool

        @tool(timeout=0.05)
        async def stubborn() -> str:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                try:
                    await asyncio.Event().wait()
                finally:
                    await asyncio.sleep(0.01)
                    print("cleaned up", flush=True)
            return "late"

        env = toolenv.ToolEnv(tools=[stubborn], tasks=[{"question": "q", "answer": "a"}], max_turns=10)
        env.reset(seed=0)
        _, _, _, _, info = env.step('<tool_call>{"name": "stubborn", "arguments": {}}</tool_call>')
        print(info["tool_results"][0].text, flush=True)
        env.close()
        del env, info
        gc.collect()
        print("collected", flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "Tool 'stubborn' timed out after 0.05 s. Try a simpler or smaller request.",
        "cleaned up",
        "collected",
    ]
    stderr = out.stderr.splitlines()
    assert len(stderr) == 1 and "'stubborn' was still running 0.0025 s after its 0.05 s timeout" in stderr[0]


def test_closing_a_vector_env_ends_the_calls_detached_on_its_loop() -> None:
    """A sync vector env steps its envs on a private loop of its own: a call detached there is
    cancelled and run to its end before that loop closes, not left to the garbage collector."""
    ends: list[str] = []
    stubborn = _stubborn_until_cancelled_at_close(ends)
    tasks = [{"question": "q", "answer": "a"}]
    venv = toolenv.ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[stubborn], tasks=tasks, max_turns=10)] * 2)
    venv.reset(seed=0)
    obs, *_ = venv.step(['<tool_call>{"name": "stubborn", "arguments": {}}</tool_call>'] * 2)
    assert all("timed out" in o for o in obs) and len(caller_mod._DETACHED) == 2
    venv.close()
    assert ends == ["ended", "ended"] and not caller_mod._DETACHED
