"""`toolenv._aio.run`: asyncio.run without the repr of the result (CPython gh-112559)."""

from __future__ import annotations

import asyncio

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
