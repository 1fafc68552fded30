"""Build toolenv envs from what a parquet row carries, and reuse them across samples.

A verl dataset row names its env (`extra_info.env_id`) and may carry keyword
overrides (`extra_info.env_kwargs`, JSON). Tool objects cannot travel in parquet,
so a `tools` override lists references instead: `"package.module:Name"` (a Tool
class, factory or instance) or the name of a `toolenv.tools` plugin.

verl builds a fresh agent loop per sample; building a fresh env per sample would
reload task lists and tool backends, so idle envs are pooled per (env_id, kwargs)
in this process and handed to one episode at a time. An env that failed is closed, not pooled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from toolenv.env import ToolEnv
from toolenv.registry import resolve_tool, resolved_tools
from toolenv.types import Task

__all__ = ["EnvPool", "env_spec_from_row", "make_env", "plain", "resolve_tool", "shared_pool", "task_from_row"]

logger = logging.getLogger(__name__)

#: Factory arguments that select tasks; a row names its task itself, so they are not stored with it.
TASK_SELECTION_KEYS = frozenset({"tasks", "limit", "exclude_empty_gold"})


def make_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> ToolEnv:
    """`gym.make(env_id, **env_kwargs)` unwrapped to the ToolEnv, with `tools` references resolved.

    Raises:
        ValueError: the env is unknown, its factory rejects the kwargs, or it is not a ToolEnv.
    """
    import gymnasium as gym

    import toolenv  # noqa: F401 - registers toolenv/* ids with Gymnasium

    try:
        env = gym.make(env_id, **resolved_tools(env_kwargs or {}))
    except gym.error.Error as exc:
        raise ValueError(f"cannot make env {env_id!r}: {exc}") from None
    except TypeError as exc:
        raise ValueError(f"env {env_id!r} rejected its keyword arguments: {exc}") from None
    inner = env.unwrapped
    if not isinstance(inner, ToolEnv):
        raise ValueError(f"env {env_id!r} is a {type(inner).__name__}, not a toolenv.ToolEnv")
    return inner


def _decode(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"extra_info.{what} is not valid JSON: {exc.msg}") from None
    return value


def plain(value: Any) -> Any:
    """Numpy scalars and arrays, OmegaConf containers and dataclass configs (what verl's and
    SkyRL's workers hand over) as plain Python: dicts, lists and scalars."""
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return value
    if hasattr(value, "tolist"):  # numpy, from parquet
        return value.tolist()
    if isinstance(value, Mapping):  # dicts and OmegaConf's DictConfig
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence):  # lists, tuples and OmegaConf's ListConfig
        return [plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def env_spec_from_row(extra_info: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """`(env_id, env_kwargs)` named by a row's `extra_info`.

    Raises:
        ValueError: `env_id` is missing or `env_kwargs` is not a JSON object.
    """
    info = plain(extra_info or {})
    env_id = info.get("env_id")
    if not isinstance(env_id, str) or not env_id:
        raise ValueError("the dataset row has no extra_info.env_id; build the data with `toolenv verl-data`")
    kwargs = _decode(info.get("env_kwargs") or {}, "env_kwargs")
    if not isinstance(kwargs, dict):
        raise ValueError("extra_info.env_kwargs must be a JSON object")
    return env_id, kwargs


def task_from_row(extra_info: Mapping[str, Any] | None) -> Task:
    """The row's Task (`extra_info.task`, a JSON string or a mapping).

    Raises:
        ValueError: the task is missing or invalid.
    """
    raw = plain(extra_info or {}).get("task")
    if raw is None:
        raise ValueError("the dataset row has no extra_info.task; build the data with `toolenv verl-data`")
    try:
        if isinstance(raw, str):
            return Task.model_validate_json(raw)
        return Task.model_validate(raw)
    except ValueError as exc:
        raise ValueError(f"extra_info.task is not a valid toolenv Task: {exc}") from None


class EnvPool:
    """Idle envs per (env_id, kwargs); `lease` hands one env to one episode at a time.

    An env that failed (an exception out of its lease, or `discard`) is closed rather than
    pooled: it may hold broken state, such as a tool mid-call or a half-closed connection.
    """

    def __init__(self) -> None:
        self._idle: dict[str, list[ToolEnv]] = defaultdict(list)
        #: Leased envs marked failed (by id: a ToolEnv need not be hashable), closed when their lease ends.
        self._failed: set[int] = set()
        self.created = 0

    @staticmethod
    def key(env_id: str, env_kwargs: Mapping[str, Any]) -> str:
        """The pool key: env id plus canonical JSON of the kwargs."""
        return env_id + "|" + json.dumps(env_kwargs, sort_keys=True, default=repr)

    @asynccontextmanager
    async def lease(self, env_id: str, env_kwargs: Mapping[str, Any]) -> AsyncIterator[ToolEnv]:
        """Borrow an env (made on demand in a worker thread, since factories may load data). It
        goes back to the pool when the block ends, its episode released, unless the block raised
        or `discard` marked it: then it is closed."""
        key = self.key(env_id, env_kwargs)
        try:  # one atomic take: verl's reward threads lease from this pool too
            env = self._idle[key].pop()
        except IndexError:
            env = await asyncio.to_thread(make_env, env_id, env_kwargs)
            self.created += 1
        healthy = False
        try:
            yield env
            healthy = id(env) not in self._failed
        finally:
            self._failed.discard(id(env))
            await self._give_back(key, env, healthy)

    def discard(self, env: ToolEnv) -> None:
        """Mark a leased env as failed (its reset, a step or its reward raised): its lease closes
        it when it ends instead of handing it to another episode."""
        self._failed.add(id(env))

    async def _give_back(self, key: str, env: ToolEnv, healthy: bool) -> None:
        """Pool a healthy env, its episode's tools released (a sample cut short frees its tools'
        sessions now); close any other. Failures here are logged: the episode's own outcome
        (or exception) is what its caller needs."""
        if healthy:
            try:
                await env.aend_episode()
            except Exception:  # a tool that cannot release: closed below, not reused
                logger.warning("toolenv: releasing env %r's episode failed; closing it", key, exc_info=True)
            else:
                self._idle[key].append(env)
                return
        try:
            await env.aclose()
        except Exception:  # see above
            logger.warning("toolenv: closing the failed env %r raised too", key, exc_info=True)

    def envs(self) -> Iterator[ToolEnv]:
        """Every idle env."""
        for envs in self._idle.values():
            yield from envs

    async def aclose(self) -> None:
        """Close every idle env's tools."""
        for env in list(self.envs()):
            await env.aclose()
        self._idle.clear()


_POOL = EnvPool()


def shared_pool() -> EnvPool:
    """The process-wide pool every agent loop in this (Ray worker) process shares."""
    return _POOL
