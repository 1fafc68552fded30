"""`ToolVectorEnv`: many ToolEnvs stepped concurrently in one event loop.

Gymnasium's AsyncVectorEnv runs one process per env; tool-use episodes spend
their time waiting on tools, so here every sub-env's `astep` runs as a coroutine
in the same loop and all tool calls of all episodes overlap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any, TypeVar

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from toolenv import _aio
from toolenv.env import ToolEnv

__all__ = ["ToolVectorEnv", "batch_infos"]

T = TypeVar("T")


def batch_infos(infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-env info dicts in Gymnasium's vector layout: `key` → array, `_key` → bool mask.

    The result equals what `VectorEnv._add_info` builds env by env, but key by key:
    Gymnasium's version allocates a fresh mask per key per env (13 ms per step of
    1,024 envs here, a quarter of the vector env's own overhead).
    """
    return _batch(list(enumerate(infos)), len(infos))


def _batch(entries: list[tuple[int, Mapping[str, Any]]], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for _, info in entries for k in info):
        present = [(i, info[key]) for i, info in entries if key in info]
        first = present[0][1]
        array: Any
        if key != "final_obs" and isinstance(first, dict):
            array = _batch([(i, v) for i, v in present if isinstance(v, dict)], n)
        else:
            if key == "final_obs" or not (type(first) in (int, float, bool) or isinstance(first, np.number)):
                array = (
                    np.zeros((n, *first.shape), dtype=first.dtype)
                    if key != "final_obs" and isinstance(first, np.ndarray)
                    else np.full(n, None, dtype=object)
                )
            else:
                array = np.zeros(n, dtype=type(first))
            for i, v in present:  # one by one: a list value must land in one object cell
                array[i] = v
        mask = np.zeros(n, dtype=np.bool_)
        mask[[i for i, _ in present]] = True
        out[key] = array
        out[f"_{key}"] = mask
    return out


def _reset_mask(options: dict[str, Any] | None, n: int) -> tuple[Any, dict[str, Any] | None]:
    """Gymnasium's `options["reset_mask"]` (validated as Gymnasium does) and the other options."""
    if options is None or "reset_mask" not in options:
        return None, options
    rest = {k: v for k, v in options.items() if k != "reset_mask"}
    mask = options["reset_mask"]
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(f"`options['reset_mask']` must contain at least one True value, got {mask}")
    return mask, rest


class ToolVectorEnv(VectorEnv[tuple[str, ...], tuple[str, ...], Any]):
    """A vector of ToolEnvs with Gymnasium's next-step autoreset.

    Observations and actions are tuples of strings; rewards, terminations and
    truncations are NumPy arrays; infos follow Gymnasium's dict-of-arrays layout.
    An exception in one env's step cancels the other envs' steps and is raised;
    call `reset` before stepping again.
    """

    def __init__(self, env_fns: Sequence[Callable[[], ToolEnv]]) -> None:
        if not env_fns:
            raise ValueError("ToolVectorEnv needs at least one env")
        self.envs: list[ToolEnv] = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        first = self.envs[0]
        self.metadata = {**first.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = first.render_mode
        self._needs_reset = np.zeros(self.num_envs, dtype=bool)
        self._obs: list[str] = [""] * self.num_envs  # each env's latest observation
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_entry_point(cls, entry_point: str, num_envs: int = 1, **kwargs: Any) -> ToolVectorEnv:
        """Build `num_envs` envs from a `"module:factory"` string (Gymnasium's vector entry point)."""
        factory = metadata.EntryPoint("env", entry_point, "toolenv.envs").load()
        return cls([lambda: factory(**kwargs) for _ in range(num_envs)])

    # ------------------------------------------------------------------ async API
    async def areset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every sub-env (seeds `seed, seed+1, …` when an int is given), or with
        `options={"reset_mask": mask}` (a bool array) only the envs it selects."""
        seeds: list[int | None]
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            if len(seed) != self.num_envs:
                raise ValueError(f"got {len(seed)} seeds for {self.num_envs} envs")
            seeds = list(seed)
        mask, options = _reset_mask(options, self.num_envs)
        which: Sequence[int] = range(self.num_envs) if mask is None else np.flatnonzero(mask).tolist()
        results = await _aio.gather_all(self.envs[i].areset(seed=seeds[i], options=options) for i in which)
        infos: list[tuple[int, Mapping[str, Any]]] = []
        for i, (obs, info) in zip(which, results, strict=True):
            self._obs[i] = obs
            self._needs_reset[i] = False
            infos.append((i, info))
        return tuple(self._obs), _batch(infos, self.num_envs)

    async def astep(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], dict[str, Any]]:
        """Step every sub-env concurrently; an env that ended last step is reset instead."""
        if len(actions) != self.num_envs:
            raise ValueError(f"got {len(actions)} actions for {self.num_envs} envs")

        async def one(i: int, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            env = self.envs[i]
            if self._needs_reset[i]:
                obs, info = await env.areset()
                return obs, 0.0, False, False, info
            obs, reward, term, trunc, info = await env.astep(action)
            return obs, float(reward), term, trunc, info

        results = await _aio.gather_all(one(i, a) for i, a in enumerate(actions))
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terms = np.array([r[2] for r in results], dtype=bool)
        truncs = np.array([r[3] for r in results], dtype=bool)
        self._needs_reset = terms | truncs
        self._obs = [r[0] for r in results]
        return tuple(self._obs), rewards, terms, truncs, batch_infos([r[4] for r in results])

    async def aclose(self) -> None:
        """Close every sub-env's tools (after this, `close` has nothing left to do)."""
        for e in self.envs:
            await e.aclose()
        self.closed = True

    # ------------------------------------------------------------------ sync API
    def _run(self, coro: Any) -> Any:
        if asyncio._get_running_loop() is not None:  # in asyncio.__all__; no exception raised per step
            coro.close()
            raise RuntimeError("ToolVectorEnv.reset/step cannot run inside a running event loop; use areset/astep")
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return _aio.complete(self._loop, coro)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        return self._run(self.areset(seed=seed, options=options))  # type: ignore[no-any-return]

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], dict[str, Any]]:
        return self._run(self.astep(actions))  # type: ignore[no-any-return]

    def render(self) -> tuple[Any, ...] | None:
        """Each sub-env's `render()`: the episode so far as text (`render_mode="ansi"`), else None."""
        return tuple(e.render() for e in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every sub-env, then the private loop: also after the async API alone was used,
        and inside a running event loop (on a worker thread, as `ToolEnv.close`)."""
        loop, self._loop = self._loop, None
        try:
            _aio.close_from_sync(loop, self.aclose())
        finally:
            if loop is not None:
                loop.close()
