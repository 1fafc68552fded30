from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import BaseModel

import toolenv
from toolenv import ToolContext, tool
from toolenv.caller import ToolCaller, truncate_middle
from toolenv.types import Task, ToolCall, ToolResult


def ctx() -> ToolContext:
    return ToolContext(task=Task(id="t"))


async def test_unknown_tool_and_bad_arguments_become_errors(add_tool: toolenv.Tool) -> None:
    caller = ToolCaller([add_tool])
    results, records = await caller.invoke(
        [ToolCall(name="nope", id="c0"), ToolCall(name="add", arguments={"a": "x"}, id="c1")], ctx()
    )
    assert results[0].is_error and results[0].text == "Unknown tool 'nope'. Available tools: add."
    assert results[1].is_error and "a: Input should be a valid integer" in results[1].text
    assert "b: Field required" in results[1].text and "Expected arguments: a, b" in results[1].text
    assert [r.call_id for r in results] == ["c0", "c1"]
    assert records[1].error is not None and records[1].attempts == 0


async def test_exceptions_and_wrong_return_types_become_errors() -> None:
    @tool
    async def boom() -> str:
        raise ValueError("bad thing")

    class Wrong(toolenv.Tool):
        name = "wrong"

        class Args(BaseModel):
            pass

        async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
            return "not a result"  # type: ignore[return-value]

    class BadText(Wrong):
        name = "bad_text"

        async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
            return ToolResult(text=42)  # type: ignore[arg-type]

    calls = [ToolCall(name="boom"), ToolCall(name="wrong"), ToolCall(name="bad_text")]
    results, _ = await ToolCaller([boom, Wrong(), BadText()]).invoke(calls, ctx())
    assert results[0].text == "Tool 'boom' failed: ValueError: bad thing"
    assert "returned str, not a ToolResult" in results[1].text
    assert results[2].is_error and "text is int, not str" in results[2].text


async def test_timeout_fires_and_is_reported() -> None:
    """The limit cancels the call in flight (it does not wait for the tool to finish)."""
    ends: list[str] = []

    @tool(timeout=0.05)
    async def hang() -> str:
        try:
            await asyncio.sleep(30)  # only a cancel ends this early
        except asyncio.CancelledError:
            ends.append("cancelled")
            raise
        return "unreachable"

    results, records = await ToolCaller([hang]).invoke([ToolCall(name="hang")], ctx())
    assert ends == ["cancelled"]
    assert results[0].is_error and "timed out after 0.05 s" in results[0].text
    assert records[0].error and records[0].latency_s >= 0.05


async def test_a_tools_own_timeout_without_a_limit_is_reported() -> None:
    @tool(timeout=None)
    async def slow_service() -> str:
        raise TimeoutError("upstream took too long")

    results, _ = await ToolCaller([slow_service]).invoke([ToolCall(name="slow_service")], ctx())
    assert results[0].is_error and results[0].retryable
    assert results[0].text == "Tool 'slow_service' timed out. Try a simpler or smaller request."


async def test_calls_in_a_turn_run_concurrently() -> None:
    """Each call waits until all five are in flight: run one after another, none could finish."""
    started = 0
    all_in = asyncio.Event()

    @tool(timeout=30)
    async def meet() -> str:
        nonlocal started
        started += 1
        if started == 5:
            all_in.set()
        await all_in.wait()
        return "met"

    calls = [ToolCall(name="meet", id=f"c{i}") for i in range(5)]
    results, _ = await asyncio.wait_for(ToolCaller([meet]).invoke(calls, ctx()), 20)
    assert [r.text for r in results] == ["met"] * 5


async def test_concurrency_cap_limits_calls_in_flight() -> None:
    in_flight = 0
    peak = 0

    @tool(max_concurrency=2)
    async def busy() -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return "ok"

    caller = ToolCaller([busy])
    await asyncio.gather(*(caller.invoke([ToolCall(name="busy")], ctx()) for _ in range(8)))
    assert peak == 2


def ticking(rate: float) -> tuple[toolenv.Tool, list[float]]:
    """A tool limited to `rate` calls/s, and the times its calls started."""
    stamps: list[float] = []

    @tool(rate_limit=rate)
    async def tick() -> str:
        stamps.append(time.monotonic())
        return "ok"

    return tick, stamps


def record_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every `asyncio.sleep` delay from now until `monkeypatch.undo()` (the sleeps still happen)."""
    real_sleep = asyncio.sleep
    waits: list[float] = []

    async def recording_sleep(delay: float, result: object = None) -> object:
        waits.append(delay)
        return await real_sleep(delay, result)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    return waits


async def test_rate_limit_spaces_calls() -> None:
    tick, stamps = ticking(20)
    caller = ToolCaller([tick])
    await asyncio.gather(*(caller.invoke([ToolCall(name="tick")], ctx()) for _ in range(6)))
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert len(stamps) == 6
    assert min(gaps) >= 0.05 * 0.8  # at most 20 calls/s


async def test_retries_with_backoff_for_retryable_errors() -> None:
    attempts = 0

    @tool(retries=3, backoff=0.01)
    async def flaky() -> ToolResult:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            return ToolResult.error("try again", retryable=True)
        return ToolResult(text="done")

    results, records = await ToolCaller([flaky]).invoke([ToolCall(name="flaky")], ctx())
    assert results[0].text == "done" and records[0].attempts == 3


async def test_non_retryable_errors_are_not_retried() -> None:
    attempts = 0

    @tool(retries=3, backoff=0.01)
    async def broken() -> ToolResult:
        nonlocal attempts
        attempts += 1
        return ToolResult.error("permanent")

    _, records = await ToolCaller([broken]).invoke([ToolCall(name="broken")], ctx())
    assert attempts == 1 and records[0].attempts == 1


async def test_output_truncation() -> None:
    @tool(max_output_chars=100)
    async def big() -> str:
        return "a" * 50 + "b" * 10_000 + "c" * 50

    results, records = await ToolCaller([big]).invoke([ToolCall(name="big")], ctx())
    assert len(results[0].text) <= 100 and records[0].truncated
    assert results[0].text.startswith("a") and results[0].text.endswith("c")
    assert "characters truncated" in results[0].text


def test_truncate_middle_keeps_short_text() -> None:
    assert truncate_middle("abc", 10) == ("abc", False)
    assert truncate_middle("abc", None) == ("abc", False)


def test_duplicate_tool_names_rejected(add_tool: toolenv.Tool) -> None:
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        ToolCaller([add_tool, type(add_tool)()])


def test_records_compare_equal_regardless_of_latency() -> None:
    from toolenv.caller import ToolCallRecord

    a = ToolCallRecord("x", "c0", 1, None, False, latency_s=0.1)
    b = ToolCallRecord("x", "c0", 1, None, False, latency_s=0.9)
    assert a == b
    assert a != ToolCallRecord("x", "c0", 2, None, False, latency_s=0.1)


async def test_args_model_that_overrides_model_validate_is_still_called_through_it() -> None:
    seen: list[object] = []

    class Upper(BaseModel):
        word: str

        @classmethod
        def model_validate(cls, obj: object, **kw: object) -> Upper:  # type: ignore[override]
            seen.append(obj)
            return super().model_validate({"word": str(obj["word"]).upper()})  # type: ignore[index]

    class Shout(toolenv.Tool):
        name = "shout"
        Args = Upper

        async def run(self, args: Upper, ctx: ToolContext) -> ToolResult:
            return ToolResult(text=args.word)

    @tool
    def echo(word: str) -> str:
        return word

    caller = ToolCaller([Shout(), echo])
    results, _ = await caller.invoke(
        [
            ToolCall(name="shout", arguments={"word": "hi"}, id="a"),
            ToolCall(name="echo", arguments={"word": "hi"}, id="b"),
            ToolCall(name="echo", arguments={"word": 3}, id="c"),
        ],
        ctx(),
    )
    assert [r.text for r in results[:2]] == ["HI", "hi"] and seen == [{"word": "hi"}]
    assert results[2].is_error and "word: Input should be a valid string" in results[2].text


async def test_args_model_whose_own_validation_raises_becomes_an_error_result() -> None:
    class Picky(BaseModel):
        word: str

        @classmethod
        def model_validate(cls, obj: object, **kw: object) -> Picky:  # type: ignore[override]
            raise LookupError("no such word in the dictionary")

    class Spell(toolenv.Tool):
        name = "spell"
        Args = Picky

        async def run(self, args: Picky, ctx: ToolContext) -> ToolResult:
            return ToolResult(text=args.word)

    results, records = await ToolCaller([Spell()]).invoke([ToolCall(name="spell", arguments={"word": "x"})], ctx())
    assert results[0].is_error
    assert results[0].text == "Invalid arguments for tool 'spell': LookupError: no such word in the dictionary"
    assert records[0].attempts == 0 and records[0].error == results[0].text


async def test_a_tool_that_waits_past_its_first_step_still_gets_its_deadline_and_its_value() -> None:
    class Twice(toolenv.Tool):
        """Waits twice, then answers; the first wait is where the caller arms the deadline."""

        name = "twice"
        limits = toolenv.ToolLimits(timeout=0.5)

        class Args(BaseModel):
            seconds: float

        async def run(self, args: Args, ctx: ToolContext) -> ToolResult:  # type: ignore[override]
            await asyncio.sleep(0)
            await asyncio.sleep(args.seconds)
            return ToolResult(text=f"after {args.seconds}")

    caller = ToolCaller([Twice()])
    ok, late = [
        await caller.invoke([ToolCall(name="twice", arguments={"seconds": s}, id=str(s))], ctx()) for s in (0.01, 5.0)
    ]
    assert ok[0][0].text == "after 0.01" and not ok[0][0].is_error
    assert late[0][0].is_error and "timed out after 0.5 s" in late[0][0].text


async def test_a_high_rate_limit_waits_for_its_slot_without_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rate above 100 calls/s was capped near 100/s: the throttler polled every 10 ms.
    A call must instead sleep until its own slot (1/rate apart), and again only for the rest
    of the spacing when the call before it was let through late."""
    tick, stamps = ticking(1000)
    caller = ToolCaller([tick])
    waits = record_sleeps(monkeypatch)
    n = 20
    out = await asyncio.gather(*(caller.invoke([ToolCall(name="tick")], ctx()) for _ in range(n)))
    monkeypatch.undo()
    assert all(r[0][0].text == "ok" for r in out)
    assert len(waits) <= 3 * n  # a sleep to its slot, the rest of the spacing, no polling
    assert max(waits) <= (n - 1) / 1000  # no call sleeps past its slot
    assert min(b - a for a, b in zip(stamps, stamps[1:], strict=False)) >= 0.001 * 0.9


async def test_calls_cancelled_while_waiting_for_the_rate_limit_do_not_delay_later_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fifty calls queue at 10 calls/s and are cancelled with their episodes; the next call
    must wait at most one spacing, not behind the fifty abandoned slots (5 s)."""
    from toolenv.caller import _RateLimit

    limit = _RateLimit(10.0)
    queued = [asyncio.ensure_future(limit.wait()) for _ in range(50)]
    await asyncio.sleep(0)  # each has booked its slot
    for t in queued:
        t.cancel()
    await asyncio.gather(*queued, return_exceptions=True)
    waits = record_sleeps(monkeypatch)
    await limit.wait()
    monkeypatch.undo()
    assert sum(waits) <= 0.1 + 1e-6


class Busy(toolenv.Tool):
    """Counts the calls in flight at once (slotted: a size few other objects share, so a new
    instance soon lands at a dead one's address)."""

    __slots__ = ("in_flight", "peak", "spare1", "spare2")
    name = "busy"

    class Args(BaseModel):
        pass

    def __init__(self, **limits: object) -> None:
        super().__init__(**limits)
        self.in_flight = self.peak = 0

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return ToolResult(text="ok")


async def test_a_tool_never_inherits_the_limiter_of_a_dead_tool() -> None:
    """Limiters were kept by `id(tool)`: a new tool at a dead tool's address got its
    concurrency cap (and the table grew with every tool ever made)."""
    import gc

    async def run_many(t: Busy) -> None:
        caller = ToolCaller([t])
        await asyncio.gather(*(caller.invoke([ToolCall(name="busy")], ctx()) for _ in range(6)))

    first = Busy(max_concurrency=1)
    await run_many(first)
    dead = id(first)
    del first
    gc.collect()
    kept = []
    for _ in range(5000):
        second = Busy(max_concurrency=3)
        if id(second) == dead:
            break
        kept.append(second)
    else:
        pytest.skip("no new tool landed at the dead tool's address")
    await run_many(second)
    assert second.peak == 3


@pytest.mark.parametrize("limit", [16, 20, 40, 41, 60, 100, 1000])
@pytest.mark.parametrize("length", [17, 50, 99, 101, 5000, 123_456])
def test_truncated_text_fits_its_limit_and_counts_what_went(limit: int, length: int) -> None:
    """The marker was not counted: a cut text could come out longer than the limit (or than
    the text itself), and the count it reported was short by the marker's length."""
    import re

    text = "".join(chr(0x4E00 + i % 500) for i in range(length))  # CJK: one character, one index
    out, cut = truncate_middle(text, limit)
    if length <= limit:
        assert (out, cut) == (text, False)
        return
    assert cut and len(out) <= limit
    counted = re.search(r"(\d+) characters truncated", out)
    kept = [c for c in out if "\u4e00" <= c <= "\u9fff"]
    if counted is not None:
        assert int(counted.group(1)) == length - len(kept)
    assert text.startswith("".join(kept[:1])) and text.endswith("".join(kept[-1:]))


async def test_a_tools_own_timeout_is_not_reported_as_the_limit() -> None:
    """A TimeoutError the tool raised itself (its HTTP client's, a socket's) was reported as
    the caller's limit firing: "timed out after 30 s" for a call that took no time."""

    @tool(timeout=30)
    async def upstream() -> str:
        await asyncio.sleep(0)
        raise TimeoutError("read timed out")

    (result,), (record,) = await ToolCaller([upstream]).invoke([ToolCall(name="upstream")], ctx())
    assert result.is_error and result.retryable
    assert result.text == "Tool 'upstream' timed out. Try a simpler or smaller request."
    assert record.error == result.text


async def test_changed_limits_take_effect_on_the_next_call() -> None:
    busy = Busy(max_concurrency=1)
    caller = ToolCaller([busy])
    await asyncio.gather(*(caller.invoke([ToolCall(name="busy")], ctx()) for _ in range(6)))
    assert busy.peak == 1
    busy.limits = toolenv.ToolLimits(max_concurrency=3)
    busy.peak = 0
    await asyncio.gather(*(caller.invoke([ToolCall(name="busy")], ctx()) for _ in range(6)))
    assert busy.peak == 3


async def test_results_with_images_or_metadata_of_the_wrong_type_become_errors() -> None:
    """Only the text's type was checked: bytes or a PIL image in `images` went into the
    observation and crashed later, far from the tool (the agent's request, the trajectory)."""
    from toolenv.types import ToolImage

    png = ToolImage(data=b"\x89PNG", width=1, height=1)

    class Pictures(toolenv.Tool):
        name = "pictures"

        class Args(BaseModel):
            kind: str

        async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
            kind = args.kind  # type: ignore[attr-defined]
            if kind == "bytes":
                return ToolResult(text="x", images=[png, b"\x89PNG"])  # type: ignore[list-item]
            if kind == "not a list":
                return ToolResult(text="x", images=png)  # type: ignore[arg-type]
            if kind == "metadata":
                return ToolResult(text="x", metadata=[1, 2])  # type: ignore[arg-type]
            return ToolResult(text="x", images=[png], metadata={"k": 1})

    calls = [ToolCall(name="pictures", arguments={"kind": k}, id=k) for k in ("bytes", "not a list", "metadata", "ok")]
    results, _ = await ToolCaller([Pictures()]).invoke(calls, ctx())
    assert results[0].is_error and "images" in results[0].text and "bytes" in results[0].text
    assert results[1].is_error and "images" in results[1].text
    assert results[2].is_error and "metadata is list" in results[2].text
    assert not results[3].is_error and results[3].images == [png] and results[3].metadata == {"k": 1}
    for r in results:
        r.model_dump_json()  # every result serialises (a trajectory can be written)


async def test_a_tool_without_arguments_says_so_when_given_some() -> None:
    @toolenv.tool
    def now() -> str:
        """The time."""
        return "noon"

    results, _ = await ToolCaller([now]).invoke([ToolCall(name="now", arguments={"tz": "UTC"}, id="c")], ctx())
    assert results[0].is_error
    assert (
        results[0].text == "Invalid arguments for tool 'now': unknown argument(s) 'tz'. This tool takes no arguments."
    )
