from __future__ import annotations

import asyncio
import contextlib
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
    assert gate.closed == 1  # the envs share the tool object: the last env closed closes it
    venv.close()  # Gymnasium: closing a closed env has no effect
    assert gate.closed == 1


async def test_aclose_then_close_closes_once() -> None:
    gate = _Gate()
    venv = _gated(gate)
    await venv.areset(seed=0)
    await venv.aclose()
    venv.close()
    assert gate.closed == 1  # shared by both envs: closed once
    other = _Gate()
    venv = _gated(other)
    await venv.areset(seed=0)
    venv.close()  # inside a running loop too
    assert other.closed == 1


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


def test_masked_reset_infos_match_gymnasiums_layout() -> None:
    """A reset of some envs gives their infos in Gymnasium's layout, the others masked out,
    also when only some of the reset envs' infos hold a key."""
    venv = ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS, task_order="sequential")] * 4)
    venv.reset()
    infos = [{"task_id": "t1", "turn": 0, "extra": [1, 2]}, {"task_id": "t2", "turn": 0}]
    ours_infos = iter(infos)

    async def fake_reset(**_: Any) -> tuple[str, dict[str, Any]]:
        return "obs", next(ours_infos)

    for i in (1, 3):
        venv.envs[i].areset = fake_reset  # type: ignore[method-assign]
    _, ours = venv.reset(options={"reset_mask": np.array([False, True, False, True])})
    theirs: dict[str, Any] = {}
    for i, info in zip((1, 3), infos, strict=True):
        theirs = venv._add_info(theirs, info, i)
    _same(ours, theirs)
    assert list(ours["extra"]) == [None, [1, 2], None, None]  # a list value stays one cell
    venv.close()


def test_batched_spaces_are_gymnasiums() -> None:
    """The batched spaces, built when first read, are what Gymnasium's SyncVectorEnv builds: a
    Tuple of one text space per env, each sampled from its own generator; and they can be set."""

    def make() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Add()], tasks=TASKS)

    ours, theirs = ToolVectorEnv([make] * 3), gym.vector.SyncVectorEnv([make] * 3)
    for name in ("observation_space", "action_space"):
        space, reference = getattr(ours, name), getattr(theirs, name)
        assert space is getattr(ours, name)  # built once
        assert space == reference and len(space) == 3
        space.seed(7)
        sample = space.sample()
        assert len(sample) == 3 and all(isinstance(x, str) for x in sample) and space.contains(sample)
        assert len(set(map(id, space.spaces))) == 3  # a copy per env
        setattr(ours, name, reference)
        assert getattr(ours, name) is reference
    ours.close()
    theirs.close()


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


# ---------------------------------------------------------------------- contract with Gymnasium's vector envs
def test_reset_or_step_after_close_is_refused_and_opens_nothing() -> None:
    """A closed vector env used to reset and step again, reopening its envs' tools; the second
    `close` then did nothing (Gymnasium: closing a closed env has no effect), so what the new
    episodes held stayed open. As Gymnasium's AsyncVectorEnv, it now raises ClosedEnvironmentError."""
    from gymnasium.error import ClosedEnvironmentError

    gate = _Gate()
    gate.opened.set()
    venv = _gated(gate)
    venv.reset(seed=0)
    venv.close()
    with pytest.raises(ClosedEnvironmentError, match="close"):
        venv.reset(seed=0)
    with pytest.raises(ClosedEnvironmentError, match="close"):
        venv.step([GATE, GATE])

    async def use() -> None:
        with pytest.raises(ClosedEnvironmentError):
            await venv.areset()
        with pytest.raises(ClosedEnvironmentError):
            await venv.astep([GATE, GATE])

    asyncio.run(use())
    assert gate.events == [] and gate.closed == 1
    assert all(e.episode is not None and e.episode.released for e in venv.envs)


def test_call_get_attr_set_attr_and_seeds_as_gymnasiums_sync_vector_env() -> None:
    """`call`, `get_attr`, `set_attr` and the per-env `np_random_seed` of Gymnasium's Sync and Async
    vector envs: missing here, code written for them failed with an AttributeError."""

    def make() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, max_turns=4)

    ours = ToolVectorEnv([make] * 2)
    theirs = gym.vector.SyncVectorEnv([make] * 2)
    states = []
    for venv in (ours, theirs):
        venv.reset(seed=3)
        assert venv.get_attr("max_turns") == (4, 4)
        assert venv.np_random_seed == (3, 4)
        states.append([g.bit_generator.state for g in venv.np_random])  # type: ignore[attr-defined]
        assert venv.call("tool_schemas") == (make().tool_schemas(),) * 2
        venv.set_attr("max_turns", [1, 2])
        assert venv.get_attr("max_turns") == (1, 2)
        venv.set_attr("max_turns", 1)
        assert venv.call("max_turns") == (1, 1)  # not callable: the value itself
        with pytest.raises(ValueError, match="length"):
            venv.set_attr("max_turns", [1, 2, 3])
        _, _, _, truncs, _ = venv.step(["hmm", "hmm"])
        assert truncs.all()
        venv.close()
    assert states[0] == states[1]  # the same generators, as seeded and drawn from


@pytest.mark.parametrize("actions", ["ab", b"ab", None, 7])
def test_an_action_batch_that_is_no_sequence_of_texts_is_refused_before_any_step(actions: Any) -> None:
    """A single string of `num_envs` characters used to be stepped as one character per env."""
    venv = ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS)] * 2)
    venv.reset(seed=0)
    with pytest.raises(TypeError, match="one text per env"):
        venv.step(actions)
    assert [len(e.episode.turns) for e in venv.envs] == [0, 0]  # type: ignore[union-attr]
    obs, *_ = venv.step(iter(["hmm", "<answer>5</answer>"]))  # any iterable of texts
    assert len(obs) == 2
    venv.close()


async def test_after_a_step_cancelled_part_way_stepping_again_needs_a_reset() -> None:
    """A batch cancelled part-way (a caller's timeout) leaves some envs stepped and some not, and
    the steps that finished were never seen. The next step used to go on from there: envs a turn
    ahead of what the agent saw, an ended episode stepped again. Now it asks for a reset."""
    gate = _Gate()
    venv = _gated(gate, n=3)
    await venv.areset(seed=0)
    step = asyncio.ensure_future(venv.astep(["<answer>a</answer>", GATE, "hmm"]))
    while gate.events != ["start"]:
        await asyncio.sleep(0)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert [len(e.episode.turns) for e in venv.envs] == [1, 0, 1]  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="call reset"):
        await venv.astep(["hmm"] * 3)
    assert [len(e.episode.turns) for e in venv.envs] == [1, 0, 1]  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="call reset"):  # resetting some envs is not enough
        await venv.areset(options={"reset_mask": np.array([True, False, False])})
        await venv.astep(["hmm"] * 3)
    await venv.areset(seed=1)
    _, _, terms, _, _ = await venv.astep(["<answer>a</answer>", "hmm", "hmm"])
    assert list(terms) == [True, False, False]
    await venv.aclose()


def _same_batch(ours: tuple[Any, ...], theirs: tuple[Any, ...]) -> None:
    """Two vector steps (or resets) agree, infos in full (tool-call latencies aside)."""
    for a, b in zip(ours[:-1], theirs[:-1], strict=True):
        assert repr(a) == repr(b)

    def drop_latency(infos: dict[str, Any]) -> dict[str, Any]:
        return {
            k: drop_latency(v) if isinstance(v, dict) else v
            for k, v in infos.items()
            if k not in ("tool_calls", "_tool_calls")
        }

    _same(drop_latency(ours[-1]), drop_latency(theirs[-1]))


@pytest.mark.parametrize("mode", ["SameStep", gym.vector.AutoresetMode.SAME_STEP])
def test_same_step_autoreset_matches_gymnasiums_sync_vector_env(mode: Any) -> None:
    """`autoreset_mode` as SyncVectorEnv takes it (and `gym.make_vec` passes it on): with SAME_STEP
    an ended env is reset in the step that ended it, its last observation and info in `final_obs`
    and `final_info`. It used to be passed on to `ToolEnv(...)` and refused there."""

    def make() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, max_turns=2, task_order="sequential")

    ours = gym.make_vec(
        "toolenv/ToolEnv-v0", num_envs=3, autoreset_mode=mode, tools=[Add()], tasks=TASKS, max_turns=2,
        task_order="sequential",
    )  # fmt: skip
    assert isinstance(ours, ToolVectorEnv)
    theirs = gym.vector.SyncVectorEnv([make] * 3, autoreset_mode=mode)
    assert ours.metadata["autoreset_mode"] is gym.vector.AutoresetMode.SAME_STEP is ours.autoreset_mode
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    _same_batch(ours.reset(seed=0), theirs.reset(seed=0))
    steps = []
    for actions in ([call, "<answer>5</answer>", "hmm"], ["hmm", call, call], ["<answer>14</answer>"] * 3):
        steps.append(ours.step(actions))
        _same_batch(steps[-1], theirs.step(actions))
    obs, rewards, terms, truncs, infos = steps[1]  # envs 0 and 2 truncated at max_turns
    assert list(truncs) == [True, False, True] and list(infos["_final_obs"]) == [True, False, True]
    assert "Question:" in obs[0] and "<tool_response>" in infos["final_obs"][0]
    assert list(infos["final_info"]["episode_stats"]["turns"]) == [2, 0, 2]
    assert list(infos["turn"]) == [0, 1, 0]  # the reset's info beside the final one
    ours.close()
    theirs.close()


def test_disabled_autoreset_steps_only_envs_reset_since_they_ended() -> None:
    """With `autoreset_mode=DISABLED` the caller resets ended envs (`reset_mask`); stepping one
    before that is a clear error, raised before any env steps."""
    venv = ToolVectorEnv(
        [lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS[:1])] * 2, autoreset_mode=gym.vector.AutoresetMode.DISABLED
    )
    assert venv.metadata["autoreset_mode"] is gym.vector.AutoresetMode.DISABLED
    venv.reset(seed=0)
    _, _, terms, _, _ = venv.step(["<answer>5</answer>", "hmm"])
    assert list(terms) == [True, False]
    with pytest.raises(RuntimeError, match=r"envs \[0\] have ended"):
        venv.step(["hmm", "hmm"])
    assert [len(e.episode.turns) for e in venv.envs] == [1, 1]  # type: ignore[union-attr]
    venv.reset(options={"reset_mask": terms})
    _, rewards, terms, _, _ = venv.step(["<answer>5</answer>", "<answer>5</answer>"])
    assert list(rewards) == [1.0, 1.0] and terms.all()  # env 0's action was not ignored
    venv.close()
    with pytest.raises(ValueError, match="'NextStep'"):
        ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS)], autoreset_mode="sometimes")


def test_close_closes_the_loops_of_sync_calls_made_through_call() -> None:
    """A sub-env's sync method reached through `call` (`truncate`, `end_episode`) runs on that
    env's own private loop; `close` used to leave those loops (three open files each) open."""
    venv = ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS)] * 2)
    venv.reset(seed=0)
    venv.step(["hmm", "hmm"])
    assert venv.call("truncate") == (0.0, 0.0)
    loops = [e._loop for e in venv.envs]
    assert all(loop is not None and not loop.is_closed() for loop in loops)
    venv.close()
    assert all(loop is not None and loop.is_closed() for loop in loops)


def test_close_after_aclose_still_closes_the_loop_sync_calls_made() -> None:
    """Sync steps, then `aclose` on another loop (it marks the vector env closed), then `close`:
    Gymnasium's `close` returned at once, leaving the private loop the sync calls made open."""
    import asyncio

    venv = ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS)] * 2)
    venv.reset(seed=0)
    loop = venv._loop
    assert loop is not None and not loop.is_closed()
    asyncio.run(venv.aclose())
    assert venv.closed and not loop.is_closed()
    venv.close()
    assert loop.is_closed() and venv._loop is None
    venv.close()  # again: nothing left to do


def test_batch_infos_of_defaultdicts_marks_only_the_envs_that_have_the_key() -> None:
    """A wrapper's info may be a defaultdict: a key one env lacks is masked out for it, and
    reading it adds nothing to that env's info."""
    from collections import defaultdict

    from toolenv.vector import batch_infos

    first: defaultdict[str, int] = defaultdict(int, x=1)
    second: defaultdict[str, int] = defaultdict(int)
    out = batch_infos([first, second])
    assert out["_x"].tolist() == [True, False] and out["x"][0] == 1
    assert "x" not in second


async def _step_in_flight() -> tuple[_Gate, ToolVectorEnv, asyncio.Future[Any]]:
    """A gated vector env of two, reset, with a step whose calls have both started and wait."""
    gate = _Gate()
    venv = _gated(gate)
    await venv.areset(seed=0)
    step = asyncio.ensure_future(venv.astep([GATE, GATE]))
    while gate.events.count("start") < 2:
        await asyncio.sleep(0)
    return gate, venv, step


async def test_a_step_or_reset_while_a_step_is_in_flight_is_refused_and_changes_nothing() -> None:
    """Two overlapping `astep`s (a `gather` of two, a second task) both stepped every env: each
    episode got two turns from one batch of actions and the agent saw neither. As Gymnasium's
    AsyncVectorEnv refuses a call while one is pending, the second is AlreadyPendingCallError."""
    from gymnasium.error import AlreadyPendingCallError

    gate, venv, first = await _step_in_flight()
    with pytest.raises(AlreadyPendingCallError, match="in flight"):
        await venv.astep(["<answer>5</answer>", "hmm"])
    with pytest.raises(AlreadyPendingCallError, match="in flight"):
        await venv.areset(seed=1)
    gate.opened.set()
    obs, _, terms, _, _ = await first
    assert all("open" in o for o in obs) and not terms.any()
    assert [len(e.episode.turns) for e in venv.envs] == [1, 1]  # type: ignore[union-attr]
    _, rewards, terms, _, _ = await venv.astep(["<answer>5</answer>", "hmm"])  # the refusals left no mark
    assert terms.tolist() == [True, False]
    await venv.aclose()


async def test_aclose_while_a_step_is_in_flight_waits_for_it_then_closes() -> None:
    """`aclose` during a step used to close the tools under the running calls, which then went on
    using them (a closed connection, a client reopened after close). As AsyncVectorEnv's close
    waits for its pending call, it now waits for the step to end; no step starts meanwhile."""
    from gymnasium.error import ClosedEnvironmentError

    gate, venv, step = await _step_in_flight()
    closing = asyncio.ensure_future(venv.aclose())
    for _ in range(10):  # let `aclose` run as far as it can
        await asyncio.sleep(0)
    assert gate.closed == 0 and not closing.done()
    assert all(not e.episode.released for e in venv.envs)  # type: ignore[union-attr]
    with pytest.raises(ClosedEnvironmentError):
        await venv.astep(["hmm", "hmm"])
    gate.opened.set()
    obs, *_ = await step
    assert all("open" in o for o in obs)
    await closing
    assert gate.events == ["start", "start", "done", "done"] and gate.closed == 1 and venv.closed


async def test_a_sync_close_inside_the_loop_of_a_step_in_flight_does_not_wait_for_it() -> None:
    """A notebook's `venv.close()` runs on the thread of the loop the step is on: each env's close
    waiting for its step there would never end. It closes at once, and says so."""
    gate, venv, step = await _step_in_flight()
    with pytest.warns(RuntimeWarning, match="step is in flight"):
        venv.close()
    assert gate.closed == 1 and venv.closed
    gate.opened.set()
    with contextlib.suppress(Exception):  # the step ends with closed tools, as the warning said
        await step


def test_envs_gymnasium_wrapped_are_refused_clearly_and_closed() -> None:
    """`ToolVectorEnv([lambda: gym.make(id)] * n)`, as one builds Gymnasium's SyncVectorEnv, used
    to fail at `reset` with "'OrderEnforcing' object has no attribute 'areset'", and `close`
    failed the same way, leaving every env's tools open. Now the vector env refuses such envs
    when it is built, says what to do, and closes the envs it made."""
    gates = [_Gate(), _Gate()]

    def plain() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[gates[0]], tasks=TASKS)

    def wrapped() -> Any:
        return gym.make("toolenv/ToolEnv-v0", tools=[gates[1]], tasks=TASKS)

    with pytest.raises(TypeError, match=r"env_fns\[1\] made OrderEnforcing.*unwrapped.*vector_entry_point"):
        ToolVectorEnv([plain, wrapped, plain])
    assert [g.closed for g in gates] == [1, 1]

    def broken() -> toolenv.ToolEnv:
        raise OSError("no database")

    with pytest.raises(OSError, match="no database"):  # an env that fails to build: the others are closed
        ToolVectorEnv([plain, broken])
    assert gates[0].closed == 2


def test_a_sync_call_first_lets_a_step_left_on_its_loop_end() -> None:
    """A sync step interrupted twice (Ctrl-C, then Ctrl-C again while it unwinds) leaves its
    coroutine pending on the private loop; the next sync call lets it end first rather than
    refusing, as a step in flight, every call from then on; nobody saw that step's results, so
    stepping needs a reset first."""
    gate = _Gate()
    venv = _gated(gate)
    venv.reset(seed=0)
    loop = venv._loop
    assert loop is not None
    left = loop.create_task(venv.astep([GATE, GATE]))

    async def started() -> None:
        while gate.events.count("start") < 2:
            await asyncio.sleep(0)

    loop.run_until_complete(started())
    gate.opened.set()
    with pytest.raises(RuntimeError, match="call reset"):
        venv.step(["hmm", "hmm"])
    assert left.done() and gate.events == ["start", "start", "done", "done"]
    venv.reset(seed=1)
    assert [len(e.episode.turns) for e in venv.envs] == [0, 0]  # type: ignore[union-attr]
    venv.close()
