"""Faults and leaks through the TRL and SkyRL adapters, whose envs share one `BackgroundLoop`.

Both adapters run every env's coroutines on one event loop on a daemon thread
(`toolenv._aio.BackgroundLoop`), called from the trainer's threads. One env's fault must
stay that env's: a tool that raises SystemExit or KeyboardInterrupt, one that hangs, a
caller interrupted while it waits. Every other env's calls, in flight at the time or made
later, must go on being answered. And thousands of envs and episodes must leave the
process's fds and threads where they were.
"""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from rel_support import CORE_TASKS, add, gauges, needs_proc

import toolenv
from toolenv import tool

FAULTY = "toolenv-rel/Faulty-v0"
#: One event per hanging call, set by the test to let it go (or by the call's end).
RELEASE: list[threading.Event] = []
#: What the hanging tool saw: "started", "cancelled", "released".
HANG_EVENTS: list[str] = []


@tool
def exits_in_thread() -> str:
    """`sys.exit()` in a sync tool (run in a worker thread)."""
    raise SystemExit(3)


@tool
async def exits() -> str:
    """`sys.exit()` in an async tool (on the shared loop's own thread)."""
    raise SystemExit(4)


@tool
async def interrupts() -> str:
    """A KeyboardInterrupt raised on the shared loop's thread, inside a tool."""
    raise KeyboardInterrupt


@tool
def interrupts_in_thread() -> str:
    """A KeyboardInterrupt raised in a sync tool's worker thread."""
    raise KeyboardInterrupt


@tool(timeout=0.4)
async def hangs() -> str:
    """Never answers: the tool's timeout ends it."""
    await asyncio.sleep(3600)
    return "unreachable"


@tool(timeout=600.0)
async def holds() -> str:
    """Waits until the test lets it go (its timeout is far off); notes whether it was cancelled."""
    released = threading.Event()
    RELEASE.append(released)
    HANG_EVENTS.append("started")
    try:
        while not released.is_set():
            await asyncio.sleep(0.01)
    except asyncio.CancelledError:
        HANG_EVENTS.append("cancelled")
        raise
    HANG_EVENTS.append("released")
    return "released"


@tool
async def slow_add(a: int, b: int) -> str:
    """Add, after yielding to the loop a few times (calls of many threads overlap on it)."""
    for _ in range(5):
        await asyncio.sleep(0.005)
    return str(a + b)


TOOLS = [add, exits_in_thread, exits, interrupts, interrupts_in_thread, hangs, holds, slow_add]


def faulty_env(**kwargs: Any) -> toolenv.ToolEnv:
    """The core env with the faulty tools (the Gymnasium entry point of `FAULTY`)."""
    return toolenv.ToolEnv(**{"tools": TOOLS, "tasks": CORE_TASKS, "max_turns": 1000, **kwargs})


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    import gymnasium as gym

    if FAULTY not in gym.registry:
        gym.register(FAULTY, entry_point=faulty_env)


# ---------------------------------------------------------------------- the two adapters, one interface
class Adapter:
    """One sample's env, made and driven as the trainer does; `call` runs one tool call."""

    name: str

    def call(self, tool_name: str, **arguments: Any) -> tuple[bool, str]:
        """(is_error, text) of one call."""
        raise NotImplementedError

    def close(self) -> None:
        """Whatever the trainer does when the sample is done."""


class TRLAdapter(Adapter):
    name = "trl"

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.env = factory()
        self.env.reset(task_id="sum")

    def call(self, tool_name: str, **arguments: Any) -> tuple[bool, str]:
        from toolenv.integrations.trl import ToolCallError

        try:
            return False, str(getattr(self.env, tool_name)(**arguments))
        except ToolCallError as exc:
            return True, str(exc)


class SkyRLAdapter(Adapter):
    name = "skyrl"

    def __init__(self) -> None:
        from toolenv.integrations.skyrl import ToolEnvTextEnv

        self.env = ToolEnvTextEnv({}, {"extra_info": {"task_id": "sum"}}, env_id=FAULTY, observation_role="tool")
        self.env.init(None)

    def call(self, tool_name: str, **arguments: Any) -> tuple[bool, str]:
        text = "<tool_call>" + json.dumps({"name": tool_name, "arguments": arguments}) + "</tool_call>"
        out = self.env.step(text)
        (message,) = out["observations"]
        (record,) = out["metadata"]["tool_calls"]
        return bool(record["error"]), str(message["content"])

    def close(self) -> None:
        self.env.close()


@pytest.fixture(params=["trl", "skyrl"])
def make_adapter(request: pytest.FixtureRequest) -> Iterator[Callable[[], Adapter]]:
    made: list[Adapter] = []
    if request.param == "trl":
        pytest.importorskip("trl", reason="the TRL adapter needs trl (CI installs it)")
        from toolenv.integrations.trl import environment_factory

        factory = environment_factory(FAULTY)

        def make() -> Adapter:
            made.append(TRLAdapter(factory))
            return made[-1]
    else:
        pytest.importorskip("skyrl_gym", reason="the SkyRL adapter needs skyrl-gym (CI installs it)")

        def make() -> Adapter:
            made.append(SkyRLAdapter())
            return made[-1]

    yield make
    for adapter in made:
        adapter.close()
    if request.param == "skyrl":
        from toolenv.integrations.skyrl import close_pooled_envs

        close_pooled_envs()


def still_works(adapter: Adapter) -> None:
    assert adapter.call("add", a=2, b=3) == (False, "5")


# ---------------------------------------------------------------------- faults
@pytest.mark.parametrize("fault", ["exits", "exits_in_thread"])
def test_rel_adapter_tool_system_exit_is_an_error_result(make_adapter: Callable[[], Adapter], fault: str) -> None:
    """`sys.exit()` in a tool is that call's error; the loop every env shares goes on."""
    adapter, other = make_adapter(), make_adapter()
    is_error, text = adapter.call(fault)
    assert is_error and "SystemExit" in text, text
    still_works(adapter)
    still_works(other)


@pytest.mark.parametrize("fault", ["interrupts", "interrupts_in_thread"])
def test_rel_adapter_tool_keyboard_interrupt_reaches_its_caller_only(
    make_adapter: Callable[[], Adapter], fault: str
) -> None:
    """A KeyboardInterrupt raised in a tool goes to the caller that made the call (Ctrl-C
    semantics), while calls of other envs in flight on the same loop at that moment finish
    with their answers, and later calls are answered."""
    adapter = make_adapter()
    others = [make_adapter() for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(o.call, "slow_add", a=i, b=1) for i, o in enumerate(others)]
        with pytest.raises(KeyboardInterrupt):
            adapter.call(fault)
        assert [f.result(timeout=60) for f in futures] == [(False, str(i + 1)) for i in range(8)]
    fresh = make_adapter()
    still_works(fresh)
    for other in others:
        still_works(other)


def test_rel_adapter_hanging_tool_times_out_and_does_not_hold_other_envs(
    make_adapter: Callable[[], Adapter],
) -> None:
    """A call that hangs holds nobody else: other envs' calls are answered while it waits,
    and its own timeout ends it with an error result; its env goes on."""
    RELEASE.clear()
    HANG_EVENTS.clear()
    holder, hanger, other = make_adapter(), make_adapter(), make_adapter()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(holder.call, "holds")
        try:
            for i in range(20):  # answered while `holds` still waits on the same loop
                assert other.call("add", a=i, b=1) == (False, str(i + 1))
            is_error, text = hanger.call("hangs")
            assert is_error and "timed out" in text, text
            assert not held.done() and HANG_EVENTS == ["started"]
        finally:
            for event in RELEASE:
                event.set()
        assert held.result(timeout=60) == (False, "released")
    still_works(hanger)
    still_works(holder)


@needs_proc
def test_rel_adapter_interrupted_caller_cancels_its_call_first(make_adapter: Callable[[], Adapter]) -> None:
    """Ctrl-C while the trainer's main thread waits on a call: the call is cancelled and has
    ended before the KeyboardInterrupt reaches the caller (it does not run on beside the
    trainer's next call); other envs and new envs are answered afterwards."""
    RELEASE.clear()
    HANG_EVENTS.clear()
    adapter, other = make_adapter(), make_adapter()
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main, "SIGINT goes to the main thread"

    seen: list[str] = []  # what the poker saw, for the failure message

    def interrupt_once_started() -> None:
        for _ in range(6000):  # up to a minute
            if HANG_EVENTS:
                break
            threading.Event().wait(0.01)
        seen.append(f"events {list(HANG_EVENTS)}, SIGINT handler {signal.getsignal(signal.SIGINT)!r}")
        signal.pthread_kill(main, signal.SIGINT)
        for _ in range(6000):  # the call is cancelled within a minute, or the test fails, never hangs
            if "cancelled" in HANG_EVENTS:
                return
            threading.Event().wait(0.01)
        seen.append(f"no cancel a minute after SIGINT: events {list(HANG_EVENTS)}; released the call")
        for event in RELEASE:
            event.set()

    # Ctrl-C as Python sets it up: a process started in the background by a shell without job
    # control inherits SIGINT ignored, and Python then leaves it so (the call would wait forever).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    poker = threading.Thread(target=interrupt_once_started, daemon=True)
    poker.start()
    try:
        try:
            adapter.call("holds")
        except KeyboardInterrupt:
            pass
        else:
            pytest.fail(f"the interrupt never reached the caller: {seen}")
        assert HANG_EVENTS == ["started", "cancelled"], (HANG_EVENTS, seen)
    finally:
        poker.join()
        signal.signal(signal.SIGINT, previous)
        for event in RELEASE:
            event.set()
    if isinstance(adapter, TRLAdapter):  # TRL keeps the env for its next rollout: it goes on
        still_works(adapter)
    still_works(other)
    still_works(make_adapter())


# ---------------------------------------------------------------------- leaks
ENVS_PER_BATCH = 64  # a generation batch: the trainer holds one env per sample at once
BATCHES = 16  # 1,024 envs and episodes per adapter


def _trl_batches(batches: int) -> int:
    from toolenv.integrations.trl import environment_factory

    factory = environment_factory(FAULTY)
    played = 0
    for _ in range(batches):
        envs = [factory() for _ in range(ENVS_PER_BATCH)]

        def episode(i: int, envs: list[Any] = envs) -> None:
            env = envs[i]
            env.reset(task_id="sum")
            assert env.add(a=i, b=1) == str(i + 1)
            env.answer(answer="5")
            assert env.get_reward() == 1.0

        with ThreadPoolExecutor(8) as pool:  # TRL's tool calls come from its threads
            list(pool.map(episode, range(ENVS_PER_BATCH)))
        played += len(envs)
        del envs
    return played


def _skyrl_batches(batches: int) -> int:
    from toolenv.integrations.skyrl import ToolEnvTextEnv

    played = 0
    for _ in range(batches):

        def episode(i: int) -> None:
            env = ToolEnvTextEnv({}, {"extra_info": {"task_id": "sum"}}, env_id=FAULTY)
            env.init(None)
            call = '<tool_call>{"name": "add", "arguments": {"a": %d, "b": 1}}</tool_call>' % i  # noqa: UP031
            assert env.step(call)["observations"][0]["content"] == str(i + 1)
            assert env.step("<answer>5</answer>")["done"]
            if i % 16:  # as SkyRL's generator does after a finished episode
                env.close()
            # else: dropped without close (the generator raised between two calls): closed when collected

        with ThreadPoolExecutor(8) as pool:  # SkyRL's max_env_workers
            list(pool.map(episode, range(ENVS_PER_BATCH)))
        played += ENVS_PER_BATCH
    return played


def _idle_gauges() -> dict[str, Any]:
    """The gauges once the sync tools' idle worker threads have left (they do, idle for
    `DaemonThreads.IDLE_S`), so that neither reading counts threads that are on their way out."""
    from toolenv._threads import WORKERS

    deadline = time.monotonic() + 30
    while any(t.name == WORKERS.name for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return gauges()


@needs_proc
@pytest.mark.parametrize("adapter", ["trl", "skyrl"])
def test_rel_adapter_envs_leave_no_fds_or_threads(adapter: str) -> None:
    """1,024 envs and episodes per adapter, from eight threads, 64 envs held at a time: fds
    and threads come back to where one warm-up batch left them (the shared loop's thread,
    started once, and SkyRL's env pool drained at the end, as a run's end does)."""
    pytest.importorskip("trl" if adapter == "trl" else "skyrl_gym", reason=f"the {adapter} adapter is not installed")
    run = _trl_batches if adapter == "trl" else _skyrl_batches

    def drained() -> None:
        gc.collect()  # SkyRL's dropped envs are closed when collected
        if adapter == "skyrl":
            from toolenv.integrations.skyrl import close_pooled_envs

            close_pooled_envs()

    run(1)  # warm-up: the loop's thread, imports
    drained()
    baseline = _idle_gauges()
    played = run(BATCHES)
    drained()
    after = _idle_gauges()
    print(
        f"\n[leaks] {adapter}: {played} envs and episodes: fds {baseline['fds']}->{after['fds']}, "
        f"threads {baseline['threads']}->{after['threads']}, children "
        f"{len(baseline['children'])}->{len(after['children'])}, RSS {after['rss_mb'] - baseline['rss_mb']:+.1f} MiB"
    )
    assert after["fds"] <= baseline["fds"], "file descriptors leaked"
    assert after["threads"] <= baseline["threads"], f"threads leaked: {sorted(t.name for t in threading.enumerate())}"
    assert after["children"] <= baseline["children"], "child processes leaked"
