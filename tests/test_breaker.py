"""Circuit breakers: a tool whose calls keep failing is refused at once, then probed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import toolenv
from toolenv import Task, ToolCall, ToolCaller, ToolEnv, ToolLimits, ToolResult
from toolenv.breaker import CircuitBreaker, breaker_for, reset_breakers


@pytest.fixture(autouse=True)
def _closed_circuits() -> Iterator[None]:
    reset_breakers()  # breakers are per process: each test starts with every circuit closed
    yield
    reset_breakers()


class Flaky(toolenv.Tool):
    """Fails as told: `outcomes` is consumed one per run ("ok", "raise", "retryable", "mistake", "hang")."""

    name = "flaky"

    class Args(BaseModel):
        q: str = "x"

    def __init__(self, outcomes: list[str], **kw: Any) -> None:
        super().__init__(**kw)
        self.outcomes = outcomes
        self.runs = 0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
        outcome = self.outcomes[min(self.runs, len(self.outcomes) - 1)]
        self.runs += 1
        if outcome == "raise":
            raise ConnectionError("server at 127.0.0.1 refused the connection")
        if outcome == "retryable":
            return ToolResult.error("HTTP 503 from the judge", retryable=True)
        if outcome == "mistake":
            return ToolResult.error("no such table: singers")  # the model's error, not the tool's
        if outcome == "hang":
            await asyncio.sleep(10)
        return ToolResult(text="fine")


async def calls(tool: toolenv.Tool, n: int, **args: Any) -> list[tuple[ToolResult, Any]]:
    caller, task = ToolCaller([tool]), Task(id="t", question="q")
    out = []
    for i in range(n):
        (res,), (rec,) = await caller.invoke_for(
            [ToolCall(id=f"c{i}", name=tool.name, arguments=args)], task, "e", 0, {}
        )
        out.append((res, rec))
    return out


async def test_consecutive_failures_open_the_circuit() -> None:
    tool = Flaky(["raise"], breaker_threshold=3, breaker_cooldown=60)
    out = await calls(tool, 6)
    assert tool.runs == 3  # the last three calls never reached the tool
    assert all("ConnectionError" in r.text for r, _ in out[:3])
    for res, rec in out[3:]:
        assert res.is_error and not res.retryable and res.metadata == {"circuit_open": True}
        assert "Tool 'flaky' is unavailable: its last 3 calls failed" in res.text
        assert "refused the connection" in res.text and "tried again in 60 s" in res.text
        assert rec.error is not None and rec.error.startswith("Tool 'flaky' is unavailable")


@pytest.mark.parametrize("failure", ["retryable", "hang"])
async def test_retryable_errors_and_timeouts_count(failure: str) -> None:
    tool = Flaky([failure], breaker_threshold=2, breaker_cooldown=60, timeout=0.05)
    out = await calls(tool, 3)
    assert tool.runs == 2
    assert "unavailable" in out[2][0].text


async def test_the_models_own_mistakes_do_not_count() -> None:
    tool = Flaky(["mistake"], breaker_threshold=2)
    out = await calls(tool, 5)
    assert tool.runs == 5 and all(r.text == "no such table: singers" for r, _ in out)
    out = await calls(tool, 3, q=5)  # invalid arguments never reach the tool nor the breaker
    assert tool.runs == 5 and all("Invalid arguments" in r.text for r, _ in out)
    breaker = breaker_for(tool)
    assert breaker is not None and not breaker.is_open and breaker.failures == 0


async def test_a_success_resets_the_count() -> None:
    tool = Flaky(["raise", "raise", "ok", "raise", "raise", "ok"], breaker_threshold=3)
    out = await calls(tool, 6)
    assert tool.runs == 6
    assert [r.text for r, _ in out][2::3] == ["fine", "fine"]


async def test_after_the_cooldown_one_probe_decides() -> None:
    tool = Flaky(["raise", "raise", "raise", "ok"], breaker_threshold=2, breaker_cooldown=0.05)
    await calls(tool, 3)
    assert tool.runs == 2  # open after two
    await asyncio.sleep(0.06)
    (probe, _), (after, _) = await calls(tool, 2)
    assert "ConnectionError" in probe.text and "unavailable" in after.text  # the probe failed: open again
    assert tool.runs == 3
    await asyncio.sleep(0.06)
    out = await calls(tool, 3)
    assert [r.text for r, _ in out] == ["fine"] * 3  # the probe succeeded: closed
    assert tool.runs == 6


async def test_calls_during_a_probe_are_refused() -> None:
    tool = Flaky(["raise"], breaker_threshold=1, breaker_cooldown=0.05)

    async def slow_ok(args: Any, ctx: Any) -> ToolResult:
        tool.runs += 1
        await asyncio.sleep(0.05)
        return ToolResult(text="fine")

    await calls(tool, 1)
    await asyncio.sleep(0.06)
    tool.run = slow_ok  # type: ignore[method-assign]
    out = await asyncio.gather(*(calls(tool, 1) for _ in range(4)))
    texts = [o[0][0].text for o in out]
    assert texts.count("fine") == 1 and sum("unavailable" in t for t in texts) == 3
    assert [r.text for r, _ in await calls(tool, 2)] == ["fine", "fine"]


async def test_a_cancelled_probe_lets_the_next_call_probe() -> None:
    tool = Flaky(["raise", "hang", "ok"], breaker_threshold=1, breaker_cooldown=0.05)
    await calls(tool, 1)
    await asyncio.sleep(0.06)
    probe = asyncio.ensure_future(calls(tool, 1))
    await asyncio.sleep(0.01)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    [(res, _)] = await calls(tool, 1)
    assert res.text == "fine" and tool.runs == 3


async def test_an_open_circuit_is_not_retried() -> None:
    tool = Flaky(["retryable"], breaker_threshold=2, breaker_cooldown=60, retries=5, backoff=0.001)
    [(res, rec)] = await calls(tool, 1)
    assert "unavailable" in res.text
    assert tool.runs == 2 and rec.attempts == 3  # two failed runs opened it; the third attempt was refused


async def test_tools_that_fail_together_share_one_breaker() -> None:
    # Two envs of a run, each with its own tool object over the same server.
    first, second = Flaky(["raise"], breaker_threshold=2), Flaky(["ok"], breaker_threshold=2)
    await calls(first, 2)
    [(res, _)] = await calls(second, 1)
    assert "unavailable" in res.text and second.runs == 0

    class Other(Flaky):
        name = "other"

    [(res, _)] = await calls(Other(["ok"], breaker_threshold=2), 1)
    assert res.text == "fine"
    [(res, _)] = await calls(Flaky(["ok"], breaker_threshold=3), 1)  # other settings: its own circuit
    assert res.text == "fine"
    reset_breakers()
    [(res, _)] = await calls(second, 1)
    assert res.text == "fine"


def test_an_env_keeps_going_with_an_open_circuit() -> None:
    tool = Flaky(["raise"], breaker_threshold=1, breaker_cooldown=60)
    env = ToolEnv(tools=[tool], tasks=[{"question": "q", "answer": "a"}], max_turns=5)
    env.reset(seed=0)
    observations = [env.step('<tool_call>{"name": "flaky", "arguments": {}}</tool_call>')[0] for _ in range(3)]
    assert "ConnectionError" in observations[0]
    assert all("is unavailable" in o for o in observations[1:])
    _, reward, terminated, _, _ = env.step("<answer>a</answer>")
    assert (reward, terminated) == (1.0, True) and tool.runs == 1
    env.close()


def test_breaker_state_machine() -> None:
    now = [0.0]
    b = CircuitBreaker(threshold=2, cooldown=10, timer=lambda: now[0])
    assert b.admit() is None
    b.record(True, "boom")
    assert not b.is_open
    b.record(True, "boom")
    assert b.is_open and b.admit() == 10
    now[0] = 4
    assert b.admit() == 6
    now[0] = 10
    assert b.admit() is None and b.admit() == 0  # one probe at a time
    b.abandon()
    assert b.admit() is None
    b.record(False)
    assert not b.is_open and b.failures == 0


def test_limits_are_validated() -> None:
    with pytest.raises(ValidationError):
        ToolLimits(breaker_threshold=0)
    with pytest.raises(ValidationError):
        ToolLimits(breaker_cooldown=0)
    assert breaker_for(Flaky(["ok"])) is None  # off by default


class Gated(toolenv.Tool):
    """`q` says how a run ends: "fail" at once, "slow_fail" or "probe" (a success) when its gate opens, "ok"."""

    name = "gated"

    class Args(BaseModel):
        q: str

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.gates = {"slow_fail": asyncio.Event(), "probe": asyncio.Event()}
        self.runs: list[str] = []

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
        self.runs.append(args.q)
        if args.q in self.gates:
            await self.gates[args.q].wait()
        if "fail" in args.q:
            raise ConnectionError("refused")
        return ToolResult(text="fine")


def _clocked(tool: Gated) -> tuple[list[float], Callable[[str], Awaitable[str]]]:
    """The tool's breaker on a clock the test sets (`clock[0]`), and a call of the tool by its `q`."""
    clock = [0.0]
    breaker = breaker_for(tool)
    assert breaker is not None
    breaker.timer = lambda: clock[0]

    async def call(q: str) -> str:
        return (await calls(tool, 1, q=q))[0][0].text

    return clock, call


@pytest.mark.parametrize("old_call_ends", ["failing", "cancelled"])
async def test_a_call_from_before_the_circuit_opened_is_not_taken_for_its_probe(old_call_ends: str) -> None:
    """While the one probe is out, a call let through before the circuit opened may end (fail,
    or be cancelled with its episode): that is not the probe's outcome, so no second probe goes."""
    tool = Gated(breaker_threshold=1, breaker_cooldown=10)
    clock, call = _clocked(tool)

    old = asyncio.ensure_future(call("slow_fail"))
    await asyncio.sleep(0)  # let through while closed; now waiting on its gate
    assert "ConnectionError" in await call("fail")  # the circuit opens
    clock[0] = 11.0
    probe = asyncio.ensure_future(call("probe"))
    await asyncio.sleep(0)  # the probe is out
    if old_call_ends == "failing":
        tool.gates["slow_fail"].set()
        assert "ConnectionError" in await old
    else:
        old.cancel()
        with pytest.raises(asyncio.CancelledError):
            await old
    clock[0] = 30.0
    assert "unavailable" in await call("ok")  # still the one probe out: refused
    tool.gates["probe"].set()
    assert await probe == "fine" and await call("ok") == "fine"  # the probe closed the circuit
    assert tool.runs == ["slow_fail", "fail", "probe", "ok"]


class _Unhashable(Flaky):
    """A tool over a backend whose `breaker_key` carries its options as a dict (unhashable)."""

    def __init__(self, outcomes: list[str], options: dict[str, Any], **kw: Any) -> None:
        super().__init__(outcomes, **kw)
        self.options = options

    def breaker_key(self) -> Any:
        return (type(self).__name__, self.options)


async def test_an_unhashable_breaker_key_gives_the_tool_a_circuit_of_its_own() -> None:
    """A `breaker_key` that cannot be hashed is the tool's bug, not the step's: the call is
    still answered (it raised out of the step), and the tool has a breaker of its own."""
    tool = _Unhashable(["raise"], {"url": "http://127.0.0.1:1"}, breaker_threshold=2, breaker_cooldown=60)
    other = _Unhashable(["ok"], {"url": "http://127.0.0.1:2"}, breaker_threshold=2, breaker_cooldown=60)
    out = await calls(tool, 3)
    assert tool.runs == 2 and "ConnectionError" in out[0][0].text and "unavailable" in out[2][0].text
    assert breaker_for(tool) is breaker_for(tool) is not breaker_for(other)
    assert [r.text for r, _ in await calls(other, 2)] == ["fine", "fine"]
    tool.limits = ToolLimits(breaker_threshold=5, breaker_cooldown=60)  # new settings: a new breaker
    fresh = breaker_for(tool)
    assert fresh is not None and fresh.threshold == 5 and not fresh.is_open
    reset_breakers()
    assert breaker_for(tool) is not fresh


async def test_calls_queued_behind_the_concurrency_cap_when_the_circuit_opens_are_refused() -> None:
    """Calls let through while the circuit was closed, still waiting for a slot of the tool's
    cap when it opens, were each sent to the dead server (and waited out its timeout) anyway."""
    tool = Gated(max_concurrency=1, breaker_threshold=1, breaker_cooldown=10)
    clock, call = _clocked(tool)
    breaker = breaker_for(tool)
    assert breaker is not None

    first = asyncio.ensure_future(call("slow_fail"))
    await asyncio.sleep(0)  # it holds the one slot
    queued = [asyncio.ensure_future(call("ok")) for _ in range(3)]
    await asyncio.sleep(0)  # let through the closed circuit, waiting for the slot
    tool.gates["slow_fail"].set()
    assert "ConnectionError" in await first  # the circuit opens
    for text in await asyncio.gather(*queued):
        assert text.startswith("Tool 'gated' is unavailable: its last 1 calls failed")
    assert tool.runs == ["slow_fail"]
    assert breaker.is_open and not breaker.probing  # a refused call is no outcome

    clock[0] = 11.0
    assert await call("ok") == "fine" and not breaker.is_open  # the cooldown over: the probe closes it
    assert tool.runs == ["slow_fail", "ok"]
