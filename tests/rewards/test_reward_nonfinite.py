"""A NaN or infinite reward is an error naming its component, never a silent NaN in the sum
(which would poison every average and has no JSON number)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import toolenv
from toolenv.agent import Agent, AgentAction, EnvInfo
from toolenv.rewards import Reward, TurnReward, WeightedSum
from toolenv.trajectory import read_trajectories


class FinalNaN(Reward):
    name = "judge"

    async def final(self, episode: toolenv.Episode) -> float:
        return math.nan


def test_weighted_sum_names_the_non_finite_component() -> None:
    with pytest.raises(ValueError, match=r"reward component 'judge' is nan; a reward must be a finite number"):
        WeightedSum.total({"exact_match": 1.0, "judge": math.nan}, {"exact_match": 1.0, "judge": 0.5})
    with pytest.raises(ValueError, match=r"reward component 'x' is -inf"):
        WeightedSum.total({"x": -math.inf}, {"x": 1.0})
    with pytest.raises(ValueError, match=r"the weighted reward is inf"):
        WeightedSum.total({"x": 1.0}, {"x": math.inf})
    assert WeightedSum.total({"x": 0.0, "y": 2.0}, {"y": 0.5}) == 1.0


def test_step_raises_it_and_a_rollout_records_it_as_the_episodes_error(tmp_path: Path) -> None:
    tasks = [{"id": f"t{i}", "question": "2+3?", "answer": "5"} for i in range(3)]

    def make() -> toolenv.ToolEnv:
        reward = [("exact_match", 1.0), (TurnReward(lambda ep, t: float("nan")), 1.0)]
        return toolenv.ToolEnv(tools=[], tasks=tasks, parser="hermes", reward=reward, max_turns=2)

    env = make()
    env.reset(options={"task": env.tasks[0]})
    with pytest.raises(ValueError, match="reward component 'turn_reward' is nan"):
        env.step("<answer>5</answer>")

    final_nan = toolenv.ToolEnv(tools=[], tasks=tasks, reward=[("exact_match", 1.0), (FinalNaN(), 1.0)])
    final_nan.reset(options={"task": final_nan.tasks[0]})
    with pytest.raises(ValueError, match="reward component 'judge' is nan"):
        final_nan.step("<answer>5</answer>")

    class Answers(Agent):
        name = "answers"

        async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
            return AgentAction(text="<answer>5</answer>")

    res = toolenv.rollout(make, Answers(), out=tmp_path)
    assert res.new == 3 and all(math.isfinite(t.reward) for t in res.trajectories)
    written = read_trajectories(tmp_path / "trajectories.jsonl", strict=True)  # every line reads back
    assert len(written) == 3
    assert all("reward component 'turn_reward' is nan" in (t.error or "") for t in written)
    again = toolenv.rollout(make, Answers(), out=tmp_path)
    assert (again.new, again.skipped) == (0, 3)  # resume skips them instead of rerunning them forever


class Numpy32(Reward):
    name = "np"

    async def final(self, episode: toolenv.Episode) -> float:
        import numpy as np

        return np.float32(0.5)  # type: ignore[return-value]  # what a reward computed with numpy returns


class ReturnsNone(Reward):
    name = "forgot_return"

    async def final(self, episode: toolenv.Episode) -> float:
        return None  # type: ignore[return-value]


def test_a_numpy_scalar_component_is_reported_as_a_float() -> None:
    """`info["reward_components"]` goes to JSON (trajectories, the remote env, loggers): a numpy
    float32 from a user's reward is not JSON serialisable, so each part's value is a float."""
    import json

    env = toolenv.ToolEnv(tools=[], tasks=[{"question": "q", "answer": "a"}], reward=[(Numpy32(), 1.0), ("em", 1.0)])
    env.reset(seed=0)
    _, reward, _, _, info = env.step("<answer>a</answer>")
    env.close()
    assert type(info["reward_components"]["np"]) is float and reward == 1.5
    assert json.loads(json.dumps(info["reward_components"])) == {"np": 0.5, "exact_match": 1.0}


def test_a_reward_that_returns_no_number_is_an_error_naming_it() -> None:
    env = toolenv.ToolEnv(tools=[], tasks=[{"question": "q", "answer": "a"}], reward=[(ReturnsNone(), 1.0)])
    env.reset(seed=0)
    with pytest.raises(TypeError, match=r"reward component 'forgot_return' is None; a reward must be a number"):
        env.step("<answer>a</answer>")
    turn_none = WeightedSum([(TurnReward(lambda ep, t: None, name="per_step"), 1.0)])  # type: ignore[arg-type,return-value]
    env = toolenv.ToolEnv(tools=[], tasks=[{"question": "q", "answer": "a"}], reward=turn_none, max_turns=3)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="reward component 'per_step' is None"):
        env.step("no action")
