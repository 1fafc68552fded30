"""ResultCache: repeated calls answered from memory, identical calls in flight run once."""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import toolenv
from toolenv import ResultCache, Task, ToolCall, ToolCaller, ToolContext, ToolEnv, ToolResult
from toolenv.result_cache import task_key


class Lookup(toolenv.Tool):
    """Look a key up (counts its runs; waits `delay` seconds, or until `gate` opens, when given)."""

    name = "lookup"

    class Args(BaseModel):
        key: str
        upper: bool = False

    def __init__(self, delay: float = 0.0, gate: asyncio.Event | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.delay, self.gate = delay, gate
        self.runs: list[str] = []

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
        self.runs.append(args.key)
        if self.gate is not None:
            await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        if args.key == "bad":
            return ToolResult.error("no such key")
        value = f"{args.key}@{ctx.task.id}"
        return ToolResult(text=value.upper() if args.upper else value, metadata={"turn": ctx.turn})


def call(key: str, cid: str = "c0", **extra: Any) -> ToolCall:
    return ToolCall(id=cid, name="lookup", arguments={"key": key, **extra})


async def invoke(caller: ToolCaller, calls: list[ToolCall], task: Task, episode: str = "e1") -> Any:
    return await caller.invoke_for(calls, task, episode, 0, {})


async def test_a_repeated_call_is_answered_from_the_cache() -> None:
    tool = Lookup(cache=ResultCache())
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    (first,), (rec1,) = await invoke(caller, [call("a", "c1")], task)
    (second,), (rec2,) = await invoke(caller, [call("a", "c2")], task)
    assert tool.runs == ["a"]
    assert first.text == second.text == "a@t1"
    # Each answer is addressed to its own call; the record says where it came from.
    assert (first.call_id, second.call_id) == ("c1", "c2")
    assert (rec1.cached, rec1.attempts) == (False, 1)
    assert (rec2.cached, rec2.attempts) == (True, 0)
    stats = tool.cache.stats() if tool.cache else None
    assert stats is not None and (stats.hits, stats.misses, stats.joined, stats.size) == (1, 1, 0, 1)
    assert stats.saved == pytest.approx(0.5)


async def test_the_key_is_the_validated_arguments() -> None:
    tool = Lookup(cache=ResultCache())
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    await invoke(caller, [call("a")], task)
    await invoke(caller, [call("a", upper=False)], task)  # the default spelled out: the same call
    (up,), _ = await invoke(caller, [call("a", upper=True)], task)
    assert tool.runs == ["a", "a"]
    assert up.text == "A@T1"


async def test_errors_and_invalid_calls_are_not_stored() -> None:
    tool = Lookup(cache=ResultCache())
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    for _ in range(2):
        (res,), (rec,) = await invoke(caller, [call("bad")], task)
        assert res.is_error and not rec.cached
    assert tool.runs == ["bad", "bad"]
    (res,), (rec,) = await invoke(caller, [ToolCall(id="c", name="lookup", arguments={"key": 3})], task)
    assert res.is_error and "key" in res.text and not rec.cached
    assert tool.cache is not None and tool.cache.stats().size == 0


async def test_task_scope_keys_by_content_not_id(tmp_path: Path) -> None:
    # Tasks given one at a time all get id "0": two of them over different databases must not
    # share results, while copies of one task (a GRPO group's) do.
    import sqlite3

    dbs = []
    for name, rows in (("a", 3), ("b", 5)):
        path = tmp_path / f"{name}.sqlite"
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE t (x INTEGER)")
            con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(rows)])
        dbs.append(str(path))

    runs: list[str] = []

    @toolenv.tool(cache=ResultCache(scope="task"))
    def count(table: str, ctx: toolenv.ToolContext) -> str:
        """Count a table's rows in the task's database."""
        runs.append(ctx.task.context["db"])
        with sqlite3.connect(ctx.task.context["db"]) as con:
            return str(con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    env = toolenv.ToolEnv(tools=[count], max_turns=2)
    action = '<tool_call>{"name": "count", "arguments": {"table": "t"}}</tool_call>'
    seen = []
    for db in (dbs[0], dbs[1], dbs[0]):
        await env.areset(options={"task": {"question": "how many?", "context": {"db": db}}})
        assert env.episode is not None and env.episode.task.id == "0"
        obs, *_ = await env.astep(action)
        seen.append(obs)
    await env.aclose()
    assert ["3" in seen[0], "5" in seen[1], "3" in seen[2]] == [True, True, True], seen
    assert runs == [dbs[0], dbs[1]]  # the third episode's task equals the first: answered from the cache
    assert task_key(Task(id="0", context={"db": dbs[0]})) != task_key(Task(id="0", context={"db": dbs[1]}))


@pytest.mark.parametrize(
    ("scope", "runs"),
    [("task", ["a", "a"]), ("episode", ["a", "a", "a"]), ("shared", ["a"])],
)
async def test_scopes(scope: Any, runs: list[str]) -> None:
    tool = Lookup(cache=ResultCache(scope=scope))
    caller = ToolCaller([tool])
    t1, t2 = Task(id="t1", question="q"), Task(id="t2", question="q")
    await invoke(caller, [call("a")], t1, "e1")
    await invoke(caller, [call("a")], t1, "e2")  # same task, another episode
    await invoke(caller, [call("a")], t2, "e3")  # another task, another episode
    await invoke(caller, [call("a")], t1, "e1")  # the first call again
    assert tool.runs == runs


async def test_ttl_and_lru_eviction() -> None:
    now = [0.0]
    tool = Lookup(cache=ResultCache(maxsize=2, ttl=10.0, timer=lambda: now[0]))
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    await invoke(caller, [call("a")], task)
    now[0] = 9.0
    await invoke(caller, [call("a")], task)  # still fresh
    assert tool.runs == ["a"]
    now[0] = 10.5
    await invoke(caller, [call("a")], task)  # expired: runs again
    assert tool.runs == ["a", "a"]
    await invoke(caller, [call("b")], task)
    await invoke(caller, [call("a")], task)  # a is now the most recently used
    await invoke(caller, [call("c")], task)  # evicts b, the least recently used
    await invoke(caller, [call("a")], task)
    await invoke(caller, [call("b")], task)
    assert tool.runs == ["a", "a", "b", "c", "b"]


async def test_identical_calls_in_flight_run_once() -> None:
    tool = Lookup(delay=0.05, cache=ResultCache())
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    outs = await asyncio.gather(*(invoke(caller, [call("a", f"c{i}")], task, f"e{i}") for i in range(10)))
    assert tool.runs == ["a"]
    assert [o[0][0].text for o in outs] == ["a@t1"] * 10
    assert [o[0][0].call_id for o in outs] == [f"c{i}" for i in range(10)]
    assert [o[1][0].cached for o in outs] == [False] + [True] * 9
    assert tool.cache is not None
    stats = tool.cache.stats()
    assert (stats.misses, stats.joined, stats.hits) == (1, 9, 0)


async def test_calls_in_one_turn_share_too() -> None:
    tool = Lookup(delay=0.01, cache=ResultCache())
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    results, records = await invoke(caller, [call("a", "x"), call("a", "y"), call("b", "z")], task)
    assert sorted(tool.runs) == ["a", "b"]
    assert [r.call_id for r in results] == ["x", "y", "z"]
    assert [r.cached for r in records] == [False, True, False]


async def test_a_shared_error_is_not_stored() -> None:
    tool = Lookup(delay=0.02, cache=ResultCache())
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    outs = await asyncio.gather(*(invoke(caller, [call("bad", f"c{i}")], task) for i in range(3)))
    assert tool.runs == ["bad"]  # one run, its error handed to the two that waited
    assert all(o[0][0].is_error for o in outs)
    await invoke(caller, [call("bad")], task)
    assert tool.runs == ["bad", "bad"]


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop's other tasks step until `condition` holds (no wall-clock wait)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    pytest.fail("the condition never held")


async def turns(n: int) -> None:
    """Let the loop's other tasks take `n` steps (no wall-clock wait)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_cancelled_first_caller_leaves_the_waiters_to_run_it() -> None:
    gate = asyncio.Event()
    tool = Lookup(gate=gate, delay=0.01, cache=ResultCache())  # the rerun waits: the other waiter joins it
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    first = asyncio.ensure_future(invoke(caller, [call("a", "c0")], task))
    await until(lambda: tool.runs == ["a"])
    waiters = [asyncio.ensure_future(invoke(caller, [call("a", f"c{i}")], task)) for i in (1, 2)]
    await turns(20)  # each waiter reaches its wait on the run in flight in its first step
    first.cancel()
    gate.set()
    outs = await asyncio.gather(*waiters)
    assert first.cancelled()
    assert [o[0][0].text for o in outs] == ["a@t1", "a@t1"]
    assert tool.runs == ["a", "a"]  # the cancelled run, then one of the waiters' (the other joined it)
    assert sorted(o[1][0].cached for o in outs) == [False, True]


async def test_after_a_cancelled_run_an_instant_rerun_is_shared_not_repeated() -> None:
    """The first caller is cancelled; both waiters wake. The first to go runs the call again and,
    never suspending, is done at once: the other takes its stored result instead of a third run."""
    gate = asyncio.Event()
    tool = Lookup(gate=gate, cache=ResultCache())
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    first = asyncio.ensure_future(invoke(caller, [call("a", "c0")], task))
    await until(lambda: tool.runs == ["a"])
    waiters = [asyncio.ensure_future(invoke(caller, [call("a", f"c{i}")], task)) for i in (1, 2)]
    await turns(20)
    first.cancel()
    gate.set()
    outs = await asyncio.gather(*waiters)
    assert [o[0][0].text for o in outs] == ["a@t1", "a@t1"]
    assert tool.runs == ["a", "a"]  # the cancelled run and one rerun, not a rerun per waiter


async def test_a_cancelled_waiter_does_not_cancel_the_run() -> None:
    gate = asyncio.Event()
    tool = Lookup(gate=gate, cache=ResultCache())
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    first = asyncio.ensure_future(invoke(caller, [call("a", "c0")], task))
    await until(lambda: tool.runs == ["a"])
    waiter = asyncio.ensure_future(invoke(caller, [call("a", "c1")], task))
    await turns(20)  # the waiter reaches its wait on the run in flight in its first step
    waiter.cancel()
    await until(waiter.done)
    gate.set()
    (res,), (rec,) = await first
    assert waiter.cancelled()
    assert res.text == "a@t1" and not rec.cached
    assert tool.runs == ["a"]


async def test_a_timeout_is_shared_not_stored() -> None:
    tool = Lookup(delay=1.0, cache=ResultCache(), timeout=0.05)
    caller, task = ToolCaller([tool]), Task(id="t1", question="q")
    outs = await asyncio.gather(*(invoke(caller, [call("a", f"c{i}")], task) for i in range(2)))
    assert all("timed out" in o[0][0].text for o in outs)
    assert tool.runs == ["a"]
    assert tool.cache is not None and tool.cache.stats().size == 0


async def test_unserialisable_arguments_run_uncached() -> None:
    class Opaque(BaseModel):
        model_config = {"arbitrary_types_allowed": True}
        thing: object

    cache = ResultCache()
    ctx = ToolContext(task=Task(id="t", question="q"))
    assert cache.key(Lookup(), Opaque(thing=object()), ctx) is None

    runs = []

    async def run(tool: Any, args: Any, ctx: Any) -> tuple[ToolResult, int]:
        runs.append(args)
        return ToolResult(text="ok"), 1

    for _ in range(2):
        result, attempts, cached = await cache.call(Lookup(), Opaque(thing=object()), ctx, run)
        assert (result.text, attempts, cached) == ("ok", 1, False)
    assert len(runs) == 2


async def test_a_task_that_cannot_be_serialised_runs_uncached_instead_of_raising() -> None:
    """A task-scoped key digests the task's JSON: a context value JSON cannot hold (an object
    from a dataframe row, a handle) raised out of the step instead of an answer."""

    class Handle:
        pass

    tool = Lookup(cache=ResultCache(scope="task"))
    caller, task = ToolCaller([tool]), Task(id="t9", question="q", context={"handle": Handle()})
    for cid in ("c1", "c2"):
        (result,), (record,) = await invoke(caller, [call("a", cid)], task)
        assert result.text == "a@t9" and not result.is_error and not record.cached
    assert tool.runs == ["a", "a"]


def test_a_class_attribute_cache_is_shared_by_every_env() -> None:
    class Shared(Lookup):
        cache = ResultCache(scope="shared")

    tools = [Shared(), Shared()]
    envs = [ToolEnv(tools=[t], tasks=[{"id": "t", "question": "q", "answer": "x"}]) for t in tools]
    action = '<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>'
    observations = []
    for env in envs:
        env.reset(seed=0)
        obs, _, _, _, info = env.step(action)
        observations.append((obs, info["tool_calls"][0].cached))
        env.close()
    assert observations[0][0] == observations[1][0] and "k@t" in observations[0][0]
    assert [cached for _, cached in observations] == [False, True]
    assert (tools[0].runs, tools[1].runs) == (["k"], [])


def test_the_record_reaches_the_trajectory() -> None:
    tool = Lookup(cache=ResultCache())
    env = ToolEnv(tools=[tool], tasks=[{"id": "t", "question": "q", "answer": "k@t"}], max_turns=4)

    class Twice(toolenv.Agent):
        async def act(self, observation: str, messages: Any, env_info: Any) -> toolenv.AgentAction:
            if env_info.turn < 2:
                return toolenv.AgentAction(text='<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>')
            return toolenv.AgentAction(text="<answer>k@t</answer>")

    (traj,) = toolenv.rollout(lambda: env, Twice(), n=1).trajectories
    calls = [c for turn in traj.turns for c in turn.calls]
    assert [c.cached for c in calls] == [False, True]
    assert traj.reward == 1.0


def test_copies_start_empty_with_the_same_settings() -> None:
    cache = ResultCache(128, ttl=5.0, scope="shared")
    cache.put(("lookup", b"{}"), ToolResult(text="x"))
    for other in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert (other.maxsize, other.ttl, other.scope) == (128, 5.0, "shared")
        assert other.stats().size == 0 and other.get(("lookup", b"{}")) is None
    assert cache.get(("lookup", b"{}")) is not None
    cache.clear()
    assert cache.stats().size == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"maxsize": 0}, "maxsize"), ({"ttl": 0}, "ttl"), ({"scope": "global"}, "scope")],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResultCache(**kwargs)


def test_function_tools_take_a_cache() -> None:
    cache = ResultCache(scope="shared")

    @toolenv.tool(cache=cache, timeout=5)
    def square(x: int) -> int:
        """Square a number."""
        return x * x

    assert square.cache is cache and square.limits.timeout == 5
    caller = ToolCaller([square])
    task = Task(id="t", question="q")
    for _ in range(3):
        (res,), _ = asyncio.run(caller.invoke_for([ToolCall(name="square", arguments={"x": 4})], task, "e", 0, {}))
        assert res.text == "16"
    assert (cache.stats().misses, cache.stats().hits) == (1, 2)


def test_shared_cache_from_a_config() -> None:
    from toolenv.result_cache import shared_cache

    mine = ResultCache()
    assert shared_cache("ns", mine) is mine
    assert shared_cache("ns", None) is None and shared_cache("ns", False) is None
    one = shared_cache(("test_shared_cache", 1), {"maxsize": 10, "scope": "shared"})
    assert one is not None and (one.maxsize, one.scope) == (10, "shared")
    assert shared_cache(("test_shared_cache", 1), {"scope": "shared", "maxsize": 10}) is one
    assert shared_cache(("test_shared_cache", 2), {"maxsize": 10, "scope": "shared"}) is not one
    assert shared_cache(("test_shared_cache", 1), True) is not one
    with pytest.raises(ValueError, match="unknown cache setting"):
        shared_cache("ns", {"max_size": 10})
    with pytest.raises(ValueError, match="scope"):
        shared_cache("ns", {"scope": "everywhere"})


async def test_infinities_and_nan_are_not_one_key_with_each_other_or_none() -> None:
    """JSON has no infinity: the key's serialiser wrote inf, -inf and NaN as `null`, so
    `x=1e400` (inf once parsed), `x=-1e400`, `x=NaN` and `x=None` shared one stored answer."""

    class Sign(toolenv.Tool):
        """The sign of a number."""

        name = "sign"
        cache = ResultCache(scope="shared")

        class Args(BaseModel):
            x: float | None

        async def run(self, args: Any, ctx: toolenv.ToolContext) -> ToolResult:
            return ToolResult(text=repr(args.x))

    caller, task = ToolCaller([Sign()]), Task(id="t", question="q")
    texts = []
    for x in (float("inf"), float("-inf"), float("nan"), None, float("inf")):
        (res,), _ = await caller.invoke_for([ToolCall(id="c", name="sign", arguments={"x": x})], task, "e", 0, {})
        texts.append(res.text)
    assert texts == ["inf", "-inf", "nan", "None", "inf"]
