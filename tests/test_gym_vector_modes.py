"""Every registered toolenv env under Gymnasium's own vector modes, end to end.

`gym.make_vec(id, num_envs=2, vectorization_mode="sync" | "async")`: "async" builds each env
in a worker process from a cloudpickled factory, and its actions, observations and infos cross
pipes. For each env id toolenv registers (plugins from the `toolenv.envs` entry points, plus
`ToolEnv-v0` and `Remote-v0` against a loopback server) this resets with a seed, steps each
sub-env with its oracle's first action, then with a malformed one, and checks what comes back
against Gymnasium's vector API: a tuple of strings, finite float rewards, boolean flags, infos
in the vector layout (`infos[k]` one entry per env, `infos["_k"]` the mask). Closing must leave
no process behind (workers, MCP servers, code sandboxes).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from _remote import TASKS, add, serving

from toolenv import Task
from toolenv._gym import register_envs
from toolenv.registry import entries

NUM_ENVS = 2
MALFORMED = "no call and no answer here"
PLUGIN_IDS = sorted(e.name for e in entries("envs"))
ORACLES: dict[str, Callable[[Task, int, str], str]] = {e.name: e.load() for e in entries("oracles")}
#: Every id toolenv registers with Gymnasium, without the namespace.
ENV_NAMES = sorted(i.split("/", 1)[1] for i in register_envs())


def _task_call(task: Task, turn: int, observation: str) -> str:
    """The oracle of the `_remote` tasks (ToolEnv-v0 and Remote-v0): the call their context
    names, else the gold answer."""
    if "call" not in task.context:
        return f"<answer>{task.answers[0]}</answer>"
    name, arguments = task.context["call"]
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def remote_url() -> Iterator[str]:
    """A real `toolenv serve` app of `_remote.make_env` on 127.0.0.1."""
    with serving() as url:
        yield url


def _env_kwargs(name: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Small envs: two tasks each (MCP-v0 then starts one demo server per env)."""
    if name == "ToolEnv-v0":
        return {"tools": [add], "tasks": TASKS}
    if name == "Remote-v0":
        return {"url": request.getfixturevalue("remote_url")}
    return {"limit": 2}


def _oracle(name: str) -> Callable[[Task, int, str], str]:
    return ORACLES.get(name, _task_call)


# ------------------------------------------------------------------ processes
def _stop_shared_pools() -> None:
    """Close the code plugin's process-wide sandbox pool: by design one per process, shared by
    every env in it and closed at exit, so a sync vector env's `close` leaves it running."""
    sandbox = sys.modules.get("toolenv_code.sandbox")
    if sandbox is not None:
        sandbox.shutdown_pool()


def _is_multiprocessing_helper(cmdline: list[str]) -> bool:
    """multiprocessing's resource tracker and forkserver: one per interpreter, not an env's."""
    return any("multiprocessing." in part for part in cmdline)


def _live_descendants() -> set[int]:
    """Pids of this process's running descendants (zombies have exited; helpers excluded)."""
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError:
        return _live_descendants_from_proc()
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not _is_multiprocessing_helper(p.cmdline()):
                found.add(p.pid)
        except psutil.Error:  # exited meanwhile
            continue
    return found


def _live_descendants_from_proc() -> set[int]:
    """`_live_descendants` read off /proc, where psutil is not installed."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmdline = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z" and not _is_multiprocessing_helper(cmdline):
            parents[int(d.name)] = int(ppid)
    found: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


# ------------------------------------------------------------------ checks
def _check_observations(obs: Any) -> None:
    assert isinstance(obs, tuple) and len(obs) == NUM_ENVS
    assert all(isinstance(o, str) for o in obs), [type(o) for o in obs]


def _check_infos(infos: dict[str, Any]) -> None:
    """Gymnasium's vector layout: each key one entry per env with its `_key` boolean mask;
    a dict value is itself in that layout."""
    for key, value in infos.items():
        if key.startswith("_"):
            assert key[1:] in infos, f"mask {key!r} of no key"
            continue
        mask = infos.get(f"_{key}")
        assert isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (NUM_ENVS,), key
        if isinstance(value, dict):
            _check_infos(value)
        else:
            assert isinstance(value, np.ndarray) and value.shape[:1] == (NUM_ENVS,), (key, type(value))


def _check_step(result: tuple[Any, ...]) -> None:
    obs, rewards, terminated, truncated, infos = result
    _check_observations(obs)
    assert isinstance(rewards, np.ndarray) and rewards.shape == (NUM_ENVS,)
    assert all(math.isfinite(float(r)) for r in rewards), rewards
    for flags in (terminated, truncated):
        assert isinstance(flags, np.ndarray) and flags.dtype == np.bool_ and flags.shape == (NUM_ENVS,)
    _check_infos(infos)


def _run(envs: gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv, name: str) -> None:
    """Reset seeded, one oracle step, one malformed step."""
    obs, infos = envs.reset(seed=0)
    _check_observations(obs)
    _check_infos(infos)
    assert infos["_task_id"].all()
    task_lists = envs.get_attr("tasks")
    by_id = [{t.id: t for t in tasks} for tasks in task_lists]
    oracle = _oracle(name)
    actions = tuple(oracle(by_id[i][str(infos["task_id"][i])], 0, obs[i]) for i in range(NUM_ENVS))
    result = envs.step(actions)
    _check_step(result)
    obs, _, terminated, _, infos = result
    ended = terminated | result[3]
    # The first oracle step calls a tool or answers: an episode going on saw the tool's output.
    for i in range(NUM_ENVS):
        if not ended[i]:
            assert infos["_tool_results"][i] and infos["tool_results"][i], (name, obs[i])
    _check_step(envs.step((MALFORMED,) * NUM_ENVS))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", ENV_NAMES)
def test_every_env_runs_under_gymnasiums_vector_modes(name: str, mode: str, request: pytest.FixtureRequest) -> None:
    before = _live_descendants()
    vector_kwargs = {"shared_memory": False} if mode == "async" else {}
    envs = gym.make_vec(
        f"toolenv/{name}",
        num_envs=NUM_ENVS,
        vectorization_mode=mode,
        vector_kwargs=vector_kwargs,
        **_env_kwargs(name, request),
    )
    try:
        assert isinstance(envs, gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv)
        _run(envs, name)
    finally:
        envs.close()
    _stop_shared_pools()
    assert _live_descendants() - before == set(), f"{name} ({mode}) left processes running after close"


@pytest.mark.parametrize("name", PLUGIN_IDS)
def test_every_plugin_env_runs_in_spawned_workers(name: str) -> None:
    """Workers started by "spawn" (macOS's default; "forkserver" is Linux's from Python 3.14)
    import everything afresh: the factory must load from the entry points with no state of
    the parent's registration."""
    before = _live_descendants()
    envs = gym.make_vec(
        f"toolenv/{name}",
        num_envs=NUM_ENVS,
        vectorization_mode="async",
        vector_kwargs={"shared_memory": False, "context": "spawn"},
        limit=2,
    )
    try:
        assert isinstance(envs, gym.vector.AsyncVectorEnv)
        _run(envs, name)
    finally:
        envs.close()
    assert _live_descendants() - before == set(), f"{name} (spawn) left processes running after close"


def test_async_mode_with_shared_memory_is_refused_with_a_clear_error() -> None:
    """Gymnasium's default `shared_memory=True` cannot carry free text: a TypeError saying what to use."""
    with pytest.raises(TypeError, match="shared_memory"):
        gym.make_vec("toolenv/Spider-v0", num_envs=NUM_ENVS, vectorization_mode="async", limit=2)
