"""`tuned_gc`: the collector is tuned inside the block, left alone when the program tuned it,
and put back afterwards; the rollout runner runs its episodes inside it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import toolenv
from toolenv.gc_tuning import DEFAULT_GEN0_THRESHOLD, LIVE_OBJECTS_PER_EPISODE, gen0_threshold_for, tuned_gc
from toolenv.runner import arollout


@pytest.fixture(autouse=True)
def default_collector() -> Iterator[tuple[int, ...]]:
    """Each test starts from CPython's defaults and leaves them as it found them."""
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    yield saved
    gc.unfreeze()
    gc.set_threshold(*saved)
    if not enabled:
        gc.disable()


def test_block_freezes_and_raises_the_threshold_then_restores() -> None:
    survivor = [object() for _ in range(10)]
    with tuned_gc() as applied:
        assert applied
        assert gc.get_threshold() == (DEFAULT_GEN0_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0  # what was alive at the start is out of the collector's way
        assert not any(o is survivor for o in gc.get_objects())  # frozen: no collection walks it
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
    assert any(o is survivor for o in gc.get_objects())


def test_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), tuned_gc():
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_nested_blocks_restore_once_at_the_outermost_exit() -> None:
    outer = tuned_gc()
    assert outer.__enter__()
    with tuned_gc() as inner:
        assert not inner and gc.get_threshold()[0] == DEFAULT_GEN0_THRESHOLD
    assert gc.get_threshold()[0] == DEFAULT_GEN0_THRESHOLD  # the outer block still runs tuned
    outer.__exit__(None, None, None)
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_a_program_that_tuned_the_collector_itself_is_left_alone() -> None:
    gc.set_threshold(200_000, 5, 5)
    with tuned_gc() as applied:
        assert not applied and gc.get_threshold() == (200_000, 5, 5) and gc.get_freeze_count() == 0
    gc.set_threshold(700, 10, 10)
    gc.disable()
    with tuned_gc() as applied:
        assert not applied and gc.get_threshold() == (700, 10, 10) and not gc.isenabled()
    gc.enable()


def test_someone_elses_freeze_is_kept() -> None:
    theirs = [object()]  # frozen by the program below
    gc.freeze()
    with tuned_gc() as applied:
        assert applied and gc.get_threshold()[0] == DEFAULT_GEN0_THRESHOLD
    # Not unfrozen behind the program's back: its frozen object is still out of the collector's
    # view. (The freeze count itself may drop: frozen objects that die are taken off it.)
    assert gc.get_freeze_count() > 0 and not any(o is theirs for o in gc.get_objects())
    assert gc.get_threshold() == (700, 10, 10)


def test_bad_threshold_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least 1"), tuned_gc(0):
        pass


def test_rollout_runs_its_episodes_tuned_unless_told_not_to() -> None:
    from tests.test_rollout_runner import example

    seen: list[int] = []

    def note(_: toolenv.Trajectory) -> None:
        seen.append(gc.get_threshold()[0])

    import asyncio

    from toolenv.runner import arollout

    asyncio.run(arollout(example.ENV_ID, example.ScriptedAgent(), n=2, on_trajectory=note))
    asyncio.run(arollout(example.ENV_ID, example.ScriptedAgent(), n=2, on_trajectory=note, tune_gc=False))
    assert seen == [DEFAULT_GEN0_THRESHOLD] * 2 + [700] * 2
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_what_the_block_made_leaves_it_in_the_oldest_generation_unwalked() -> None:
    """At the exit the young generation holds everything the block made; with the threshold back
    at 700, the next allocation would walk all of it. It goes to the oldest generation instead,
    as the objects frozen at the start do, and garbage cycles among it still go at a full collection."""
    import weakref

    class Node:
        pass

    with tuned_gc():
        kept = [[i] for i in range(5_000)]
        cycle = Node()
        cycle.self = cycle  # type: ignore[attr-defined]
        gone = weakref.ref(cycle)
        del cycle
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(x) in oldest for x in kept)
    assert gc.get_count()[0] < 700  # nothing left for the next young collection to walk
    assert gone() is not None  # not collected on the way out...
    gc.collect()
    assert gone() is None  # ...but by the next full collection


def test_gen0_threshold_is_sized_for_the_episodes_in_flight() -> None:
    assert gen0_threshold_for(1) == DEFAULT_GEN0_THRESHOLD
    assert gen0_threshold_for(1024) == 1024 * LIVE_OBJECTS_PER_EPISODE > DEFAULT_GEN0_THRESHOLD


def test_the_runner_sizes_the_young_generation_for_its_concurrency() -> None:
    import asyncio

    tasks = [{"id": f"t{i}", "question": "q", "answer": "a"} for i in range(600)]
    seen: list[int] = []
    run = arollout(
        lambda: toolenv.ToolEnv(tasks=tasks),
        "oracle",
        concurrency=600,
        on_trajectory=lambda _: seen.append(gc.get_threshold()[0]),
    )
    assert asyncio.run(run).summary.episodes == 600
    assert set(seen) == {600 * LIVE_OBJECTS_PER_EPISODE}
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
