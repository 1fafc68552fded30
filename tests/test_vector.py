from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from toolenv.vector import ToolVectorEnv, batch_infos

from .conftest import TASKS, Add, Sleep


def test_make_vec_vector_entry_point_steps_concurrently() -> None:
    sleep = Sleep()
    venv = gym.make_vec(
        "toolenv/ToolEnv-v0", num_envs=16, vectorization_mode="vector_entry_point", tools=[sleep, Add()], tasks=TASKS
    )
    assert isinstance(venv, ToolVectorEnv)
    obs, infos = venv.reset(seed=0)
    assert len(obs) == 16 and all("Question:" in o for o in obs)
    assert set(infos["task_id"]) <= {"t1", "t2", "t3"}
    action = '<tool_call>{"name": "sleep", "arguments": {"seconds": 0.2}}</tool_call>'
    t0 = time.perf_counter()
    obs, rew, term, trunc, infos = venv.step([action] * 16)
    assert time.perf_counter() - t0 < 1.0  # 16 x 0.2 s overlapped
    assert all("slept 0.2" in o for o in obs)
    assert rew.shape == (16,) and not term.any()
    venv.close()


def test_next_step_autoreset_and_rewards() -> None:
    venv = ToolVectorEnv([lambda: __import__("toolenv").ToolEnv(tools=[Add()], tasks=TASKS[:1]) for _ in range(3)])
    venv.reset(seed=0)
    obs, rew, term, trunc, infos = venv.step(["<answer>5</answer>", "<answer>4</answer>", "nothing"])
    assert np.array_equal(rew, [1.0, 0.0, 0.0])
    assert np.array_equal(term, [True, True, False])
    obs, rew, term, trunc, infos = venv.step(["x", "x", "<answer>5</answer>"])
    assert "Question: 2+3?" in obs[0] and rew[0] == 0.0  # env 0 was reset, action ignored
    assert term[2] and rew[2] == 1.0
    with pytest.raises(ValueError, match="got 2 actions for 3 envs"):
        venv.step(["a", "b"])
    venv.close()


def test_async_vector_env_with_shared_memory_is_refused_clearly() -> None:
    with pytest.raises(TypeError, match="cannot travel through Gymnasium's shared memory"):
        gym.make_vec("toolenv/ToolEnv-v0", num_envs=2, vectorization_mode="async", tools=[Add()], tasks=TASKS)


def test_sync_vector_env_works() -> None:
    venv = gym.make_vec("toolenv/ToolEnv-v0", num_envs=2, vectorization_mode="sync", tools=[Add()], tasks=TASKS)
    obs, _ = venv.reset(seed=0)
    assert len(obs) == 2
    venv.close()


_LEAF = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.none(),
)
_INFO = st.dictionaries(
    st.sampled_from(["a", "b", "c", "final_obs"]),
    st.one_of(_LEAF, st.dictionaries(st.sampled_from(["x", "y"]), _LEAF, max_size=2)),
    max_size=4,
)


def _kinds_agree(infos: list[dict[str, Any]]) -> bool:
    for key in {k for info in infos for k in info}:
        values = [info[key] for info in infos if key in info]
        if len({type(v) for v in values}) > 1:
            return False
        if isinstance(values[0], dict) and not _kinds_agree(values):
            return False
    return True


def _same(ours: Any, theirs: Any) -> None:
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs)
        for key in theirs:
            _same(ours[key], theirs[key])
    else:
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert [repr(v) for v in ours.tolist()] == [repr(v) for v in theirs.tolist()]


@settings(max_examples=300, deadline=None)
@given(st.lists(_INFO, min_size=1, max_size=5))
def test_batch_infos_matches_gymnasiums_layout(infos: list[dict[str, Any]]) -> None:
    # Envs that disagree about a key's kind (a dict in one, a number in another) make
    # Gymnasium's own merge fail or overwrite; the layout is only defined when they agree.
    assume(_kinds_agree(infos))
    reference = ToolVectorEnv.__new__(ToolVectorEnv)
    reference.num_envs = len(infos)
    theirs: dict[str, Any] = {}
    for i, info in enumerate(infos):
        theirs = reference._add_info(theirs, info, i)
    _same(batch_infos(infos), theirs)
