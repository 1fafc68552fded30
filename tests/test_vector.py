from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import toolenv
from toolenv.vector import ToolVectorEnv, batch_infos

from .conftest import TASKS, Add, Meet


def test_make_vec_vector_entry_point_steps_concurrently() -> None:
    meet = Meet(16)
    venv = gym.make_vec(
        "toolenv/ToolEnv-v0", num_envs=16, vectorization_mode="vector_entry_point", tools=[meet, Add()], tasks=TASKS
    )
    assert isinstance(venv, ToolVectorEnv)
    obs, infos = venv.reset(seed=0)
    assert len(obs) == 16 and all("Question:" in o for o in obs)
    assert set(infos["task_id"]) <= {"t1", "t2", "t3"}
    action = '<tool_call>{"name": "meet", "arguments": {}}</tool_call>'
    obs, rew, term, trunc, infos = venv.step([action] * 16)
    # Every env's call was in flight at once: stepped one after another, none would meet.
    assert [r.text for rs in infos["tool_results"] for r in rs] == ["met"] * 16
    assert all("met" in o for o in obs)
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


# ---------------------------------------------------------------------- failures, close, partial reset
class _Flaky(toolenv.Reward):
    """Fails to score an answer of `boom` (a judge that cannot be reached, say)."""

    name = "flaky"

    async def final(self, episode: toolenv.Episode) -> float:
        if episode.answer == "boom":
            raise ConnectionError("judge unreachable")
        return 0.0


class _Gate(toolenv.Tool):
    """Wait for the test to open the gate; record how each call ended."""

    name = "gate"

    class Args(BaseModel):
        pass

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()
        self.events: list[str] = []
        self.closed = 0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        self.events.append("start")
        try:
            await self.opened.wait()
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise
        self.events.append("done")
        return toolenv.ToolResult(text="open")

    async def close(self) -> None:
        self.closed += 1


GATE = '<tool_call>{"name": "gate", "arguments": {}}</tool_call>'


def _gated(gate: _Gate, n: int = 2, **kwargs: Any) -> ToolVectorEnv:
    def make() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[gate], tasks=TASKS, reward=[(_Flaky(), 1.0)], max_turns=5, **kwargs)

    return ToolVectorEnv([make] * n)


def test_an_error_in_one_env_cancels_the_others_steps_and_is_raised_as_is() -> None:
    gate = _Gate()
    venv = _gated(gate)
    venv.reset(seed=0)
    with pytest.raises(ConnectionError, match="judge unreachable"):
        venv.step(["<answer>boom</answer>", GATE])
    assert gate.events == ["start", "cancelled"]  # not left pending on the loop
    gate.opened.set()
    venv.reset(seed=0)
    venv.step([GATE, GATE])
    assert gate.events == ["start", "cancelled", "start", "done", "start", "done"]
    assert [len(e.episode.turns) for e in venv.envs] == [1, 1]  # type: ignore[union-attr]
    venv.close()


def test_close_after_async_use_closes_every_tool_once() -> None:
    gate = _Gate()
    venv = _gated(gate, n=3)

    async def use() -> None:
        await venv.areset(seed=0)

    asyncio.run(use())
    venv.close()
    assert gate.closed == 3
    venv.close()  # Gymnasium: closing a closed env has no effect
    assert gate.closed == 3


async def test_aclose_then_close_closes_once_and_sync_calls_refuse_inside_a_loop() -> None:
    gate = _Gate()
    venv = _gated(gate)
    await venv.areset(seed=0)
    with pytest.raises(RuntimeError, match="use areset/astep"):
        venv.step([GATE, GATE])
    await venv.aclose()
    venv.close()
    assert gate.closed == 2
    other = _Gate()
    venv = _gated(other)
    await venv.areset(seed=0)
    venv.close()  # inside a running loop too
    assert other.closed == 2


def test_reset_mask_resets_only_the_masked_envs() -> None:
    venv = ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS, task_order="sequential")] * 3)
    first, _ = venv.reset()
    stepped, *_ = venv.step(["hello"] * 3)
    options = {"reset_mask": np.array([False, True, False])}
    obs, infos = venv.reset(options=options)
    assert "reset_mask" in options  # the caller's dict is left as it was
    assert obs[0] == stepped[0] and obs[2] == stepped[2]  # the others keep their observation...
    assert [len(e.episode.turns) for e in venv.envs] == [1, 0, 1]  # type: ignore[union-attr]
    assert "Question: 10+4?" in obs[1]  # ... and env 1 started its next task
    assert list(infos["_task_id"]) == [False, True, False] and infos["task_id"][1] == "t2"
    with pytest.raises(ValueError, match="at least one True"):
        venv.reset(options={"reset_mask": np.zeros(3, dtype=bool)})
    with pytest.raises(ValueError, match="shape"):
        venv.reset(options={"reset_mask": np.ones(2, dtype=bool)})
    venv.close()


def test_render_gives_each_envs_frame() -> None:
    venv = ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS, render_mode="ansi")] * 2)
    venv.reset(seed=0)
    frames = venv.render()
    assert frames is not None and len(frames) == 2 and all("[user]" in f for f in frames)  # type: ignore[operator]
    venv.close()


def test_a_vector_env_copies_mid_episode() -> None:
    """The vector env's private event loop (made by the first sync `reset`) cannot be pickled
    or deep-copied; the copies go on from the same turn, each on its own loop."""
    import copy
    import pickle

    venv = ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS, task_order="sequential")] * 2)
    venv.reset(seed=0)
    venv.step(['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'] * 2)
    for branch in (copy.deepcopy(venv), pickle.loads(pickle.dumps(venv))):
        _, rewards, terms, *_ = branch.step(["<answer>5</answer>", "<answer>6</answer>"])
        assert list(rewards) == [1.0, 0.0] and terms.all()
        branch.close()
    assert all(e.episode is not None and not e.episode.terminated for e in venv.envs)
    venv.close()


def test_make_vec_max_episode_steps_truncates_and_scores_each_episode() -> None:
    """Gymnasium gives a vector entry point `max_episode_steps` (`make_vec(..., max_episode_steps=N)`
    or the spec's); it used to reach `ToolEnv(...)` and fail there. It truncates each episode at
    its Nth step as the env's own `max_turns` would: scored, tools released, end info included."""
    venv = gym.make_vec(
        "toolenv/ToolEnv-v0",
        num_envs=2,
        vectorization_mode="vector_entry_point",
        max_episode_steps=2,
        tools=[Add()],
        tasks=TASKS[:1],
        max_turns=10,
        reward={"exact_match": 1.0, "answer_avoidance_penalty": 0.5},
    )
    assert isinstance(venv, ToolVectorEnv)
    venv.reset(seed=0)
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    _, rewards, terms, truncs, infos = venv.step([call, call])
    assert not truncs.any()
    _, rewards, terms, truncs, infos = venv.step([call, "<answer>5</answer>"])
    assert list(terms) == [False, True] and list(truncs) == [True, False]
    assert all(e.episode is not None and e.episode.released for e in venv.envs)
    final = venv.envs[0].episode.final_components  # type: ignore[union-attr]
    assert final is not None and final["answer_avoidance_penalty"] == -1.0 and rewards[0] == -0.5
    assert infos["_episode_stats"].all() and list(infos["episode_stats"]["turns"]) == [2, 2]
    assert infos["reward_components"]["answer_avoidance_penalty"][0] == -1.0
    obs, rewards, terms, truncs, _ = venv.step(["x", "x"])  # next-step autoreset of both
    assert all("Question: 2+3?" in o for o in obs) and not rewards.any()
    for _ in range(2):
        _, _, _, truncs, _ = venv.step(["hmm", "hmm"])
    assert truncs.all()  # counted again from the reset
    venv.close()
    unlimited = gym.make_vec("toolenv/ToolEnv-v0", num_envs=1, max_episode_steps=-1, tools=[Add()], tasks=TASKS)
    assert isinstance(unlimited, ToolVectorEnv) and unlimited.max_episode_steps is None  # as in `gym.make`
    unlimited.close()


def test_close_closes_every_env_when_one_fails_to() -> None:
    """One env whose tool fails to close used to stop `close` there: the envs after it kept
    their tools (processes, connections) open. Now all are closed and the first failure raised."""

    class Stuck(_Gate):
        async def close(self) -> None:
            await super().close()
            raise OSError("cannot close")

    gates = [Stuck(), _Gate(), _Gate()]
    venv = ToolVectorEnv([lambda g=g: toolenv.ToolEnv(tools=[g], tasks=TASKS) for g in gates])  # type: ignore[misc]
    venv.reset(seed=0)
    with pytest.raises(OSError, match="cannot close"):
        venv.close()
    assert [g.closed for g in gates] == [1, 1, 1]


def test_specs_serialise_to_json_and_back() -> None:
    """`EnvSpec.to_json` refuses callables; the vector entry point used to be a `functools.partial`,
    so no toolenv env's spec (`env.spec.to_json()`, for an experiment's record) could be written."""
    from gymnasium.envs.registration import EnvSpec

    text = gym.spec("toolenv/ToolEnv-v0").to_json()
    venv = gym.make_vec(EnvSpec.from_json(text), num_envs=2, tools=[Add()], tasks=TASKS)
    assert isinstance(venv, ToolVectorEnv) and len(venv.reset(seed=0)[0]) == 2
    venv.close()
