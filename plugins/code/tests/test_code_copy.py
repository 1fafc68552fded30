"""HumanEval-v0 and MBPP-v0 envs pickle and deep-copy: to branch a rollout, or to send an env
to a worker process, as the other plugins' envs do. The copy has its own sessions and grades."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import toolenv  # noqa: F401 - registers the env ids
from toolenv import ToolEnv
from toolenv_code.envs import humaneval_oracle
from toolenv_code.sandbox import SandboxPool, get_pool
from toolenv_code.tool import _STATE_KEY as _SESSION
from toolenv_code.tool import PythonTool

COPIERS: dict[str, Callable[[Any], Any]] = {
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "deepcopy": copy.deepcopy,
}


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _live_sessions() -> set[str]:
    return {sid for s in get_pool().stats() for sid in s["sessions"]}


def _oracle(env: ToolEnv) -> str:
    assert env.episode is not None
    return humaneval_oracle(env.episode.task, 0, "")


@pytest.mark.parametrize("copier", sorted(COPIERS))
@pytest.mark.parametrize("env_id", ["toolenv/HumanEval-v0", "toolenv/MBPP-v0"])
def test_an_env_copies_mid_episode_and_the_copy_grades(env_id: str, copier: str) -> None:
    env = gym.make(env_id, parser="hermes", limit=2).unwrapped
    assert isinstance(env, ToolEnv)
    clones: list[ToolEnv] = []
    try:
        clones.append(COPIERS[copier](env))  # before any reset
        env.reset(seed=0)
        obs, *_ = env.step(_call("print(6 * 7)"))
        assert "42" in obs
        branch = COPIERS[copier](env)
        clones.append(branch)
        obs, *_ = branch.step(_call("print(6 * 8)"))  # the copy runs code...
        assert "48" in obs
        _, reward, terminated, _, _ = branch.step(_oracle(branch))  # ...and grades it
        assert terminated and reward == 1.0
        assert env.episode is not None and not env.episode.terminated  # the original is where it was
        _, reward, terminated, _, _ = env.step("<answer>def nothing(): pass</answer>")
        assert terminated and reward == 0.0
        fresh = clones[0]
        fresh.reset(seed=0)
        assert fresh.step(_oracle(fresh))[1] == 1.0
    finally:
        for e in (env, *clones):
            e.close()


@pytest.mark.parametrize("copier", sorted(COPIERS))
def test_a_stateful_copy_has_its_own_session(copier: str) -> None:
    """The copy cannot carry the sandbox's interpreter along: it starts a fresh session (and says
    so) rather than sharing the original's, whose variables it would change and whose end
    would kill it."""
    env = gym.make("toolenv/MBPP-v0", parser="hermes", stateful=True, limit=1).unwrapped
    assert isinstance(env, ToolEnv)
    branch: ToolEnv | None = None
    try:
        env.reset(seed=0)
        env.step(_call("x = 41"))
        branch = COPIERS[copier](env)
        obs, *_ = branch.step(_call("print(x)"))
        assert "NameError" in obs and "the session was restarted" in obs
        branch.step(_call("x = 1; print(x)"))
        obs, *_ = env.step(_call("print(x + 1)"))
        assert "42" in obs  # the copy did not touch the original's variables
        assert env.episode is not None and branch.episode is not None
        mine, theirs = env.episode.state[_SESSION].id, branch.episode.state[_SESSION].id
        assert mine != theirs and {mine, theirs} <= _live_sessions()
        branch.close()  # closing the copy ends its session, not the original's
        assert theirs not in _live_sessions()
        obs, *_ = env.step(_call("print(x)"))
        assert "41" in obs and "restarted" not in obs
    finally:
        env.close()
        if branch is not None:
            branch.close()


@pytest.mark.parametrize("copier", sorted(COPIERS))
def test_pools_copy_as_the_process_pool_or_a_fresh_one(copier: str) -> None:
    """The process-wide pool is the copy's process's own; a private pool (pipes, threads) is
    re-made with the same settings, its servers started on first use."""
    assert COPIERS[copier](get_pool()) is get_pool()
    pool = SandboxPool(size=1, max_sessions=3)
    try:
        env = ToolEnv(tools=[PythonTool(pool=pool)], tasks=[], parser="hermes")
        tool = COPIERS[copier](env).tools[0]
        assert isinstance(tool, PythonTool)
        other = tool.pool
        try:
            assert other is not pool and other is not get_pool()
            assert (other.size, other._opts) == (pool.size, pool._opts)
            assert other.run("print(1 + 1)").stdout == "2\n"
        finally:
            other.close()
        assert pool.run("print(3)").stdout == "3\n"  # the original's is untouched
    finally:
        pool.close()


def test_a_pickled_env_grades_in_another_process(tmp_path: Path) -> None:
    env = gym.make("toolenv/HumanEval-v0", limit=1).unwrapped
    try:
        env.reset(seed=0)
        (tmp_path / "env.pkl").write_bytes(pickle.dumps(env))
    finally:
        env.close()
    script = (
        "import pickle, sys\n"
        "from toolenv_code.envs import humaneval_oracle\n"
        "env = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "print(env.step(humaneval_oracle(env.episode.task, 0, ''))[1])\n"
        "env.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "env.pkl")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0"
