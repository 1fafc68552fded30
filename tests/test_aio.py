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
