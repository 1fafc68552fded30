"""The sampling seed of one turn, as every reference agent draws it."""

from __future__ import annotations

#: Seeds of successive episodes lie this far apart.
EPISODE_STRIDE = 1 << 20


def turn_seed(seed: int, episode: int, turn: int) -> int:
    """`seed + turn`, offset per episode (its spawn number): the samples of a task are different
    draws, and a fresh agent with the same seed draws them again."""
    return seed + episode * EPISODE_STRIDE + turn
