"""Fixtures for the reward tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from toolenv.rewards import judge


@pytest.fixture(autouse=True)
def _fresh_judge_caches() -> Iterator[None]:
    """Judges of the same settings share one reply cache per process; a test's judge server may
    get the port (so the URL) of an earlier test's, whose judges a reference cycle keeps alive
    for a while: each test starts without the earlier tests' caches."""
    judge._SHARED.clear()
    yield
