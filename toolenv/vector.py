"""`ToolVectorEnv`: many ToolEnvs stepped concurrently in one event loop.

Gymnasium's AsyncVectorEnv runs one process per env; tool-use episodes spend
their time waiting on tools, so here every sub-env's `astep` runs as a coroutine
in the same loop and all tool calls of all episodes overlap.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import metadata
from typing import Any, TypeVar

import numpy as np
from gymnasium import Wrapper
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from toolenv import _aio
from toolenv.caller import end_detached
from toolenv.env import ToolEnv, end_info

__all__ = ["ToolVectorEnv", "batch_infos"]

T = TypeVar("T")
_log = logging.getLogger(__name__)


def batch_infos(infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-env info dicts in Gymnasium's vector layout: `key` → array, `_key` → bool mask.

    The result equals what `VectorEnv._add_info` builds env by env, but key by key:
    Gymnasium's version allocates a fresh mask per key per env (13 ms per step of
    1,024 envs here, a quarter of the vector env's own overhead).
    """
    return _batch(list(infos), None, len(infos))


def _batch(infos: list[Mapping[str, Any]], where: list[int] | None, n: int) -> dict[str, Any]:
    """`batch_infos` of `infos[k]`, env `where[k]`'s info (`where` None: env `k`'s, for all `n`)."""
    if not all(type(info) is dict for info in infos):  # a defaultdict or Counter answers a missing key
        infos = [dict(info) for info in infos]
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for info in infos for k in info):
        try:  # the usual case: every info has the key
            values = [info[key] for info in infos]
            pos = where
        except KeyError:
            have = [k for k, info in enumerate(infos) if key in info]
            values = [infos[k][key] for k in have]
            pos = have if where is None else [where[k] for k in have]
        first = values[0]
        array: Any
        if key != "final_obs" and isinstance(first, dict):
            nested = [k for k, v in enumerate(values) if isinstance(v, dict)]
            if len(nested) == len(values):
                array = _batch(values, pos, n)
            else:  # the envs whose value is no dict are left out, as Gymnasium leaves them
                array = _batch([values[k] for k in nested], [k if pos is None else pos[k] for k in nested], n)
        elif key != "final_obs" and isinstance(first, np.ndarray):
            array = np.zeros((n, *first.shape), dtype=first.dtype)
            for p, v in zip(range(n) if pos is None else pos, values, strict=True):
                array[p] = v
        elif key == "final_obs" or not (type(first) in (int, float, bool) or isinstance(first, np.number)):
            cells = np.fromiter(values, dtype=object, count=len(values))  # a list value stays one cell
            if pos is None:
                array = cells
            else:
                array = np.full(n, None, dtype=object)
                array[pos] = cells
        else:
            kind = type(first)
            array = np.zeros(n, dtype=kind)
            if all(type(v) is kind for v in values):
                array[slice(None) if pos is None else pos] = np.array(values, dtype=kind)
            else:  # one by one, each value cast as Gymnasium casts it
                for p, v in zip(range(n) if pos is None else pos, values, strict=True):
                    array[p] = v
        if pos is None:
            mask = np.ones(n, dtype=np.bool_)
        else:
            mask = np.zeros(n, dtype=np.bool_)
            mask[pos] = True
        out[key] = array
        out[f"_{key}"] = mask
    return out


async def _gather_indexed(n: int, start: Callable[[int], Awaitable[T]]) -> list[T]:
    """`[await start(i) for i in range(n)]`, each in a task of its own, all at once; as
    `_aio.gather_all`, when one fails (or this is cancelled) the others are cancelled and
    awaited, then the error is raised.

    `asyncio.gather` adds a done callback to each task, which the loop schedules as one more
    handle when the task ends (~1.5 µs per env and step, a tenth of a reset's cost); here each
    task stores its own result and counts itself done.
    """
    if not n:
        return []
    loop = asyncio.get_running_loop()
    results: list[Any] = [None] * n
    done = loop.create_future()
    left = n

    async def run(i: int) -> None:
        nonlocal left
        try:
            results[i] = await start(i)  # the coroutine made here: never one left unawaited
        except BaseException as exc:
            if not done.done():
                done.set_exception(exc)  # the first failure, as `asyncio.gather` raises it
            raise
        left -= 1
        if not left and not done.done():
            done.set_result(None)

    tasks = [loop.create_task(run(i)) for i in range(n)]
    try:
        await done
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return results


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


def _kept_options(env: ToolEnv, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The options of a reset that the env's autoresets repeat (`ToolEnv.autoreset_options`)."""
    if not options:
        return None
    return {k: v for k, v in options.items() if k in env.autoreset_options} or None


def _action_list(actions: Any, n: int) -> list[Any]:
    """The action batch as a list of `n` actions, or a TypeError/ValueError before any env steps."""
    if isinstance(actions, str | bytes):  # iterable, but one text: never one character per env
        raise TypeError(f"actions must be one text per env ({n} of them), got a single {type(actions).__name__}")
    try:
        listed = list(actions)
    except TypeError:
        raise TypeError(f"actions must be one text per env ({n} of them), got {type(actions).__name__}") from None
    if len(listed) != n:
        raise ValueError(f"got {len(listed)} actions for {n} envs")
    return listed


def _build(env_fns: Sequence[Callable[[], ToolEnv]]) -> list[ToolEnv]:
    """`[fn() for fn in env_fns]`, each a ToolEnv (stepped through its async API, which Gymnasium's
    wrappers do not pass on); when one fails or is no ToolEnv, the envs made are closed."""
    envs: list[Any] = []
    try:
        for i, fn in enumerate(env_fns):
            env = fn()
            envs.append(env)
            if not isinstance(env, ToolEnv):
                hint = (
                    "a Gymnasium wrapper (gym.make adds them): pass `lambda: gym.make(...).unwrapped`, "
                    'or use gym.make_vec(id, num_envs=n, vectorization_mode="vector_entry_point")'
                    if isinstance(env, Wrapper)
                    else "not a toolenv ToolEnv"
                )
                raise TypeError(f"ToolVectorEnv steps ToolEnvs: env_fns[{i}] made {type(env).__name__}, {hint}")
    except BaseException:
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - the error that stopped the build is the one to raise
                _log.warning("an env of the vector env failed to close", exc_info=True)
        raise
    return envs


class ToolVectorEnv(VectorEnv[tuple[str, ...], tuple[str, ...], Any]):
    """A vector of ToolEnvs with Gymnasium's autoreset modes (next-step by default).

    Observations and actions are tuples of strings; rewards, terminations and
    truncations are NumPy arrays; infos follow Gymnasium's dict-of-arrays layout.
    An exception in one env's step cancels the other envs' steps and is raised;
    call `reset` before stepping again (a step refuses until then, as after a step
    or reset cancelled part-way). As in Gymnasium's AsyncVectorEnv, a step or reset while
    another is in flight raises `AlreadyPendingCallError`, `aclose` during one waits for it
    to end, and after `close`, `reset` and `step` raise `ClosedEnvironmentError`.

    `max_episode_steps` (what `gym.make_vec` gives a vector entry point) truncates an
    episode at that step as its env's own `max_turns` would: final reward scored, tools
    released, the end's info keys included (Gymnasium's `TimeLimit` only sets the flag).

    `autoreset_mode` as in Gymnasium's SyncVectorEnv: `NEXT_STEP` resets an ended env on
    the next step (its action ignored), `SAME_STEP` in the step that ended it (the ended
    episode's last observation and info in `infos["final_obs"]` and `infos["final_info"]`),
    `DISABLED` never (reset ended envs with `options={"reset_mask": ...}` before stepping).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], ToolEnv]],
        *,
        max_episode_steps: int | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    ) -> None:
        try:
            self.autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            valid = ", ".join(repr(m.value) for m in AutoresetMode)
            raise ValueError(
                f"autoreset_mode must be an AutoresetMode or one of {valid}, got {autoreset_mode!r}"
            ) from None
        if not env_fns:
            raise ValueError("ToolVectorEnv needs at least one env")
        if max_episode_steps is not None and not (isinstance(max_episode_steps, int) and max_episode_steps > 0):
            raise ValueError(f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}")
        self.max_episode_steps = max_episode_steps
        self.envs: list[ToolEnv] = _build(env_fns)
        self.num_envs = len(self.envs)
        first = self.envs[0]
        self.metadata = {**first.metadata, "autoreset_mode": self.autoreset_mode}
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self._observation_space: Any = None  # the batched spaces, built on first use
        self._action_space: Any = None
        self.render_mode = first.render_mode
        self._needs_reset = np.zeros(self.num_envs, dtype=bool)
        self._elapsed = [0] * self.num_envs  # steps since each env's reset
        self._obs: list[str] = [""] * self.num_envs  # each env's latest observation
        # Each env's options for its autoreset: the agent-describing ones (`native_tools`) of its
        # latest explicit reset. Gymnasium autoresets with none, but then a `native_tools` agent's
        # second episode would get a prompt teaching the text call format again.
        self._autoreset_options: list[dict[str, Any] | None] = [None] * self.num_envs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unfinished = False  # a step or reset raised or was cancelled part-way: reset all
        self._pending: asyncio.Future[None] | None = None  # done when the step or reset in flight ends
        self._closing = False  # `aclose` started: no step or reset may start

    @classmethod
    def from_entry_point(
        cls,
        entry_point: str | Callable[..., ToolEnv],
        num_envs: int = 1,
        *,
        max_episode_steps: int | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        **kwargs: Any,
    ) -> ToolVectorEnv:
        """Build `num_envs` envs from an env factory or its `"module:factory"` string (Gymnasium's
        vector entry point); `max_episode_steps=-1` means no limit, as in `gym.make`. The
        other keywords go to the factory."""
        factory = (
            metadata.EntryPoint("env", entry_point, "toolenv.envs").load()
            if isinstance(entry_point, str)
            else entry_point
        )
        if max_episode_steps == -1:
            max_episode_steps = None
        return cls(
            [lambda: factory(**kwargs) for _ in range(num_envs)],
            max_episode_steps=max_episode_steps,
            autoreset_mode=autoreset_mode,
        )

    # The batched spaces are Tuples of one copy of the single space per env, each copy with a
    # random generator of its own: at 1,024 envs some 12,000 objects, a third of what the vector
    # env keeps alive, which every full collection walks (a few ms each), and the construction
    # builds them all; few programs sample them. They are built when first read, as Gymnasium
    # builds them (`batch_space`).
    @property
    def observation_space(self) -> Any:
        """The batched observation space: a Tuple of `num_envs` text spaces (built on first use)."""
        if self._observation_space is None:
            self._observation_space = batch_space(self.single_observation_space, self.num_envs)
        return self._observation_space

    @observation_space.setter
    def observation_space(self, space: Any) -> None:
        self._observation_space = space

    @property
    def action_space(self) -> Any:
        """The batched action space: a Tuple of `num_envs` text spaces (built on first use)."""
        if self._action_space is None:
            self._action_space = batch_space(self.single_action_space, self.num_envs)
        return self._action_space

    @action_space.setter
    def action_space(self, space: Any) -> None:
        self._action_space = space

    # ------------------------------------------------------------------ async API
    async def areset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every sub-env (seeds `seed, seed+1, …` when an int is given), or with
        `options={"reset_mask": mask}` (a bool array) only the envs it selects. The other options
        go to each env reset (one value for all: a task per env takes a reset per mask); their
        `autoreset_options` (`native_tools`) are given again to that env's autoresets."""
        self._refuse_if_closed("reset")
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
        pending = self._begin("reset")
        try:
            envs = self.envs
            results = await _gather_indexed(
                len(which), lambda k: envs[which[k]].areset(seed=seeds[which[k]], options=options)
            )
        except BaseException:
            self._unfinished = True  # some envs reset, some not
            raise
        finally:
            pending.set_result(None)
        if mask is None or mask.all():
            self._unfinished = False
        infos: list[Mapping[str, Any]] = []
        kept = _kept_options(self.envs[0], options)
        for i, (obs, info) in zip(which, results, strict=True):
            self._autoreset_options[i] = kept
            self._obs[i] = obs
            self._needs_reset[i] = False
            self._elapsed[i] = 0
            infos.append(info)
        return tuple(self._obs), _batch(infos, None if mask is None else list(which), self.num_envs)

    async def astep(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], dict[str, Any]]:
        """Step every sub-env concurrently; with next-step autoreset an env that ended last
        step is reset instead, with same-step autoreset one that ends now is reset after it."""
        self._refuse_if_closed("step")
        actions = _action_list(actions, self.num_envs)
        if self._unfinished:
            raise RuntimeError(
                "the previous step or reset of this vector env raised or was cancelled part-way, "
                "so its envs are at different turns; call reset() before stepping again"
            )
        mode = self.autoreset_mode
        if mode is AutoresetMode.DISABLED and self._needs_reset.any():
            ended = np.flatnonzero(self._needs_reset).tolist()
            raise RuntimeError(
                f"the episodes of envs {ended} have ended and autoreset is disabled: reset them "
                "(reset(options={'reset_mask': mask})) before stepping"
            )

        async def one(i: int, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            env = self.envs[i]
            if self._needs_reset[i]:  # next-step autoreset
                obs, info = await env.areset(options=self._autoreset_options[i])
                self._elapsed[i] = 0
                return obs, 0.0, False, False, info
            obs, reward, term, trunc, info = await self._step_one(i, action)
            if mode is AutoresetMode.SAME_STEP and (term or trunc):
                final_obs, final_info = obs, info
                obs, info = await env.areset(options=self._autoreset_options[i])
                self._elapsed[i] = 0
                info = {"final_obs": final_obs, "final_info": final_info, **info}
            return obs, reward, term, trunc, info

        # The usual step (no autoreset due, no step limit, no same-step reset) awaits each env's
        # own `astep`: no wrapper coroutine per env, whose frames every resume would pass through.
        plain = self.max_episode_steps is None and mode is not AutoresetMode.SAME_STEP and not self._needs_reset.any()
        envs = self.envs
        pending = self._begin("step")
        try:
            if plain:
                results = await _gather_indexed(self.num_envs, lambda i: envs[i].astep(actions[i]))
            else:
                results = await _gather_indexed(self.num_envs, lambda i: one(i, actions[i]))
        except BaseException:
            self._unfinished = True  # the steps that finished were never seen
            raise
        finally:
            pending.set_result(None)
        if plain:
            self._elapsed = [k + 1 for k in self._elapsed]
        rewards = np.array([float(r[1]) for r in results], dtype=np.float64)
        terms = np.array([r[2] for r in results], dtype=bool)
        truncs = np.array([r[3] for r in results], dtype=bool)
        self._needs_reset = terms | truncs if mode is not AutoresetMode.SAME_STEP else np.zeros_like(terms)
        self._obs = [r[0] for r in results]
        return tuple(self._obs), rewards, terms, truncs, batch_infos([r[4] for r in results])

    async def _step_one(self, i: int, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Env `i`'s step, truncated (scored and released like `max_turns`) at `max_episode_steps`."""
        env = self.envs[i]
        obs, reward, term, trunc, info = await env.astep(action)
        self._elapsed[i] += 1
        limit = self.max_episode_steps
        if limit is None or term or trunc or self._elapsed[i] < limit:
            return obs, float(reward), term, trunc, info
        final = await env.atruncate()
        ep = env.episode
        if ep is not None and ep.turns:
            info = {**info, "reward_components": dict(ep.turns[-1].reward_components), **end_info(ep)}
        return obs, float(reward) + final, term, True, info

    async def aclose(self) -> None:
        """Close every sub-env's tools, also when one fails to; then raise the first failure (the
        others are logged). After this, `close` only closes the private event loops.

        A step or reset in flight on this loop is waited for first (as AsyncVectorEnv's `close`
        waits for its pending call): closed under it, its tool calls would go on using closed
        tools, or reopen what they hold. No other step or reset starts meanwhile."""
        self._closing = True
        pending = self._pending
        if pending is not None and not pending.done() and pending.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({pending})  # not `await pending`: a cancelled close must not cancel it
        try:
            await _aio.close_each(self.envs, lambda e: e.aclose(), lambda e: "an env of the vector env", _log)
        finally:
            self.closed = True

    def _refuse_if_closed(self, what: str) -> None:
        """A closed vector env stays closed: reopening its tools here would leave them open, since
        a second `close` does nothing."""
        if self.closed or self._closing:
            raise ClosedEnvironmentError(f"ToolVectorEnv.{what} called after close(); make a new vector env")

    def _begin(self, what: str) -> asyncio.Future[None]:
        """A future for the step or reset starting now, set when it ends; or AlreadyPendingCallError
        while another is in flight (each env would take two turns at once, on one set of actions)."""
        pending = self._pending
        if pending is not None and not pending.done() and not pending.get_loop().is_closed():
            raise AlreadyPendingCallError(
                f"ToolVectorEnv.{what} called while a step or reset of it is in flight; await that one first", what
            )
        self._pending = asyncio.get_running_loop().create_future()
        return self._pending

    # ------------------------------------------------------------------ sync API
    def _run(self, coro: Any) -> Any:
        """Run a sync method's coroutine on the private loop; on a thread already running an event
        loop (a notebook cell), on a helper thread (as `ToolEnv._run`), the private loop the same."""
        if asyncio._get_running_loop() is not None:  # in asyncio.__all__; no exception raised per step
            return _aio.call_off_loop(self._run_here, coro)
        return self._run_here(coro)

    def _run_here(self, coro: Any) -> Any:
        """`_run` on a thread running no event loop."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        pending = self._pending
        if pending is not None and not pending.done() and pending.get_loop() is self._loop:
            # A sync call interrupted twice (Ctrl-C while it unwound) left its step here: let it
            # end; nobody saw how, so the envs may be a turn ahead (a step needs a reset first).
            try:
                self._loop.run_until_complete(asyncio.wait({pending}))
            except BaseException:
                coro.close()
                raise
            finally:
                self._unfinished = True
        return _aio.complete(self._loop, coro)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        return self._run(self.areset(seed=seed, options=options))  # type: ignore[no-any-return]

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], dict[str, Any]]:
        return self._run(self.astep(actions))  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        """The vector env without its private event loop, which cannot be pickled or deep-copied."""
        state = self.__dict__.copy()
        state["_loop"] = state["_pending"] = None
        return state

    def render(self) -> tuple[Any, ...] | None:
        """Each sub-env's `render()`: the episode so far as text (`render_mode="ansi"`), else None
        (a tuple of None, as Gymnasium's SyncVectorEnv gives)."""
        return tuple(e.render() for e in self.envs)

    # ------------------------------------------------------------------ Gymnasium's sub-env access
    # What Gymnasium's SyncVectorEnv and AsyncVectorEnv offer (not its VectorEnv base), so code
    # written for them runs unchanged.
    @property
    def np_random_seed(self) -> tuple[int | None, ...]:  # type: ignore[override]
        """Each sub-env's `np_random_seed`."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Each sub-env's `np_random`."""
        return self.get_attr("np_random")

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each sub-env's method `name` called with the arguments (an attribute that is not
        callable: its value), as SyncVectorEnv's `call`."""
        results = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each sub-env's attribute `name`."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute `name` of each sub-env: a list or tuple gives one value per env, any
        other value is set on all of them."""
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        for env, value in zip(self.envs, values, strict=True):
            env.set_wrapper_attr(name, value)

    def close(self, **kwargs: Any) -> None:
        """Gymnasium's `close`; after `aclose` (which marks the env closed) it still closes the
        private event loops that sync calls made, which Gymnasium's would skip."""
        if self.closed:
            self._close_loops()
            return
        super().close(**kwargs)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every sub-env, then the private loops (the vector env's, and any a sub-env's sync
        method made): also after the async API alone was used, and inside a running event loop
        (on a worker thread, as `ToolEnv.close`)."""
        if asyncio._get_running_loop() is not None and any(e._in_step for e in self.envs):  # in asyncio.__all__
            # A step in flight on this thread's loop cannot end while this waits for it (as `ToolEnv.close`).
            warnings.warn(
                "ToolVectorEnv.close() inside a running event loop while a step is in flight: its tool calls "
                "may go on with closed tools; await the step, or `await venv.aclose()`, which waits for it",
                RuntimeWarning,
                stacklevel=3,
            )
            for env in self.envs:
                env._in_step = False  # not waited for by their `aclose`; each step's own end sets it again
        try:
            _aio.close_from_sync(self._loop, self.aclose())
        finally:
            self._close_loops()

    def _close_loops(self) -> None:
        """Close the vector env's private loop and those a sub-env's sync method made (`call`),
        each once the tool calls left running on it past their timeout have ended (`end_detached`)."""
        loop, self._loop = self._loop, None
        if loop is not None:
            try:
                end_detached(loop)
            finally:
                loop.close()
        for env in self.envs:
            own, env._loop = env._loop, None
            if own is not None and not own.is_running():
                try:
                    end_detached(own)
                finally:
                    own.close()
