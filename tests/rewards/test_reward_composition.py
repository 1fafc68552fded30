"""Composed rewards: a part that reports its score through `turn_components`/`final_components`."""

from __future__ import annotations

import pytest

import toolenv
from toolenv.episode import Episode, Turn
from toolenv.rewards import Reward, WeightedSum, get_reward


class _Split(Reward):
    """Reports its scores as several components (a custom composite), overriding only the
    `*_components` hooks, which the `Reward` base documents as the components by name."""

    name = "split"

    async def turn_components(self, episode: Episode, turn: Turn) -> dict[str, float]:
        return {"calls": -0.25, "style": 0.05}

    async def final_components(self, episode: Episode) -> dict[str, float]:
        return {"correct": 1.0 if episode.answer == "x" else 0.0, "short": 0.5}


class _Renamed(Reward):
    """One component, under a key other than its name."""

    name = "renamed"

    async def final_components(self, episode: Episode) -> dict[str, float]:
        return {"other": 0.75}


def test_a_part_that_reports_its_own_components_is_scored() -> None:
    """A part overriding only `turn_components`/`final_components` scored 0 every step: the sum
    called its `turn`/`final` (the base's zeros), so a composite part's components were lost."""
    env = toolenv.ToolEnv(tasks=[{"question": "q", "answer": "x"}], reward=[(_Split(), 2.0), ("exact_match", 1.0)])
    env.reset(seed=0)
    _, r1, *_, info1 = env.step("nothing parseable")
    _, r2, term, *_, info2 = env.step("<answer>x</answer>")
    env.close()
    assert info1["reward_components"] == {"split": pytest.approx(-0.2), "exact_match": 0.0}
    assert r1 == pytest.approx(2 * -0.2)
    assert term
    assert info2["reward_components"] == {"split": pytest.approx(-0.2 + 1.5), "exact_match": 1.0}
    assert r2 == pytest.approx(2 * 1.3 + 1.0)


async def test_a_part_with_one_component_under_another_key_keeps_its_value() -> None:
    reward = WeightedSum([(_Renamed(), 1.0)])
    env = toolenv.ToolEnv(tasks=[{"question": "q", "answer": "x"}], reward=reward)
    await env.areset(seed=0)
    _, r, *_, info = await env.astep("<answer>y</answer>")
    await env.aclose()
    assert info["reward_components"] == {"renamed": 0.75} and r == 0.75


async def test_a_sum_nested_as_a_part_still_reports_its_weighted_total() -> None:
    inner = get_reward([(_Split(), 0.5), ("exact_match", 1.0)])
    inner.name = "inner"
    env = toolenv.ToolEnv(tasks=[{"question": "q", "answer": "x"}], reward=[(inner, 2.0)])
    await env.areset(seed=0)
    _, r, *_, info = await env.astep("<answer>x</answer>")
    await env.aclose()
    inner_total = 0.5 * (-0.2 + 1.5) + 1.0
    assert info["reward_components"] == {"inner": pytest.approx(inner_total)}
    assert r == pytest.approx(2 * inner_total)


class _NaNPart(Reward):
    name = "nan_part"

    async def final_components(self, episode: Episode) -> dict[str, float]:
        return {"ok": 1.0, "broken": float("nan")}


async def test_a_non_finite_component_of_a_part_is_named_by_the_parts_key() -> None:
    """As for any part: the step raises, naming the component, rather than reporting NaN."""
    env = toolenv.ToolEnv(tasks=[{"question": "q", "answer": "x"}], reward=[(_NaNPart(), 1.0)])
    await env.areset(seed=0)
    with pytest.raises(ValueError, match="reward component 'nan_part' is nan"):
        await env.astep("<answer>x</answer>")
    await env.aclose()
