"""The sampling seed of one turn, as every reference agent draws it."""

from __future__ import annotations

from toolenv.agent import EnvInfo

#: Seeds of successive episodes lie this far apart.
EPISODE_STRIDE = 1 << 20


def turn_seed(seed: int, episode: int, turn: int) -> int:
    """`seed + turn`, offset per episode (its spawn number): the samples of a task are different
    draws, and a fresh agent with the same seed draws them again."""
    return seed + episode * EPISODE_STRIDE + turn


def episode_seed(seed: int, spawned: int, env_info: EnvInfo) -> int:
    """The seed of `env_info`'s turn: offset by the episode's number in its rollout
    (`env_info.episode`, the same when the run resumes or retries the episode; counting spawns
    would give a retried episode the seed of the run's first), else by `spawned`, the agent
    copy's spawn number (a loop of one's own that spawns a copy per episode)."""
    episode = env_info.episode if env_info.episode is not None else spawned
    return turn_seed(seed, episode, env_info.turn)
