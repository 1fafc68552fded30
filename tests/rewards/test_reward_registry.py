"""Reward names, spec forms, and components as the env reports them."""

from __future__ import annotations

import pytest

import toolenv
from toolenv import tool
from toolenv.rewards import (
    ActionPenalties,
    ExactMatch,
    FormatReward,
    LLMJudge,
    ToolCallPenalty,
    ToolSuccessBonus,
    WeightedSum,
    get_reward,
    record_reward_info,
    reward_names,
)


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def test_builtin_names_are_registered() -> None:
    assert {
        "exact_match",
        "em",
        "f1",
        "format",
        "tool_call_penalty",
        "invalid_call_penalty",
        "answer_avoidance_penalty",
        "penalties",
        "tool_success",
        "judge",
    } <= set(reward_names())


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("format", FormatReward),
        ("penalties", ActionPenalties),
        ("tool_call_penalty", ToolCallPenalty),
        ("tool_success", ToolSuccessBonus),
        ("judge", LLMJudge),
    ],
)
def test_names_build_their_reward(name: str, cls: type) -> None:
    reward = get_reward(name)
    assert isinstance(reward, WeightedSum)
    assert isinstance(reward.parts[name][0], cls) and reward.weights == {name: 1.0}


def test_spec_forms() -> None:
    assert get_reward({"exact_match": 1.0, "format": 0.2}).weights == {"exact_match": 1.0, "format": 0.2}
    listed = get_reward([(ExactMatch(), 1.0), ("tool_call_penalty", 0.05), (FormatReward(name="fmt"), 0.5)])
    assert listed.weights == {"exact_match": 1.0, "tool_call_penalty": 0.05, "fmt": 0.5}
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        get_reward("nope")
    with pytest.raises(ValueError, match="unique"):
        get_reward([(FormatReward(), 1.0), (FormatReward(), 2.0)])


def test_env_reports_every_component_every_step() -> None:
    env = toolenv.ToolEnv(
        tools=[add],
        tasks=[{"question": "2+3?", "answer": "5"}],
        reward={"exact_match": 1.0, "format": 0.2, "tool_call_penalty": 0.1, "tool_success": 0.05},
    )
    env.reset(seed=0)
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    _, r1, _, _, info1 = env.step(call)
    assert info1["reward_components"] == {
        "exact_match": 0.0,
        "format": 0.0,
        "tool_call_penalty": -1.0,
        "tool_success": 1.0,
    }
    assert r1 == pytest.approx(-0.1 + 0.05)
    _, r2, term, _, info2 = env.step("<answer>5</answer>")
    assert term
    assert info2["reward_components"] == {
        "exact_match": 1.0,
        "format": 1.0,
        "tool_call_penalty": 0.0,
        "tool_success": 0.0,
    }
    assert r2 == pytest.approx(1.2)
    assert info2["episode_stats"]["return"] == pytest.approx(float(r1) + float(r2))
    assert env.episode is not None
    assert [t.reward_components for t in env.episode.turns] == [info1["reward_components"], info2["reward_components"]]
    env.close()


async def test_weighted_sums_nest() -> None:
    from toolenv.env import ToolEnv
    from toolenv.rewards import ExactMatch, TokenF1, WeightedSum

    inner = WeightedSum([(ExactMatch(), 1.0), (TokenF1(), 1.0)])
    inner.name = "inner"
    env = ToolEnv(tasks=[{"question": "q", "answer": "x y"}], reward=[(inner, 0.5)])
    await env.areset(seed=0)
    _, reward, *_, info = await env.astep("<answer>x</answer>")
    f1 = 2 * (1.0 * 0.5) / 1.5
    assert info["reward_components"] == {"inner": pytest.approx(0.0 + f1)}
    assert reward == pytest.approx(0.5 * f1)


def test_a_list_of_names_weighs_each_one() -> None:
    """`reward: [f1, format]` in a YAML config: each name at weight 1 (it used to unpack the
    name's letters: "unknown reward 'f'")."""
    assert get_reward(["f1", "format"]).weights == {"f1": 1.0, "format": 1.0}
    assert get_reward(["em"]).weights == {"exact_match": 1.0}
    assert get_reward([ExactMatch(), ["format", 0.2]]).weights == {"exact_match": 1.0, "format": 0.2}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([("f1",)], r"reward spec item \('f1',\) must be"),
        ([("f1", 1.0, 2.0)], r"must be a name, a Reward, a \(reward, weight\) pair"),
        ([(1.0, "f1")], r"must be a name, a Reward, a \(reward, weight\) pair"),
        ({"f1": None}, r"the weight of 'f1' must be a finite number, got None"),
        ({"f1": "heavy"}, r"the weight of 'f1' must be a finite number, got 'heavy'"),
        ({"f1": float("nan")}, r"the weight of 'f1' must be a finite number, got nan"),
        ([(ExactMatch(), float("inf"))], r"the weight of 'exact_match' must be a finite number, got inf"),
    ],
)
def test_bad_specs_say_what_is_wrong_when_built(spec: object, message: str) -> None:
    """A bad weight is refused when the env is built, not at the first step that scores it."""
    with pytest.raises(ValueError, match=message):
        get_reward(spec)  # type: ignore[arg-type]


def test_a_factorys_own_key_error_is_not_an_unknown_name() -> None:
    from toolenv.rewards import base

    def broken() -> ExactMatch:
        return {}["missing"]  # type: ignore[no-any-return]

    base.register_reward("broken_factory", broken)
    try:
        with pytest.raises(KeyError, match="missing"):
            get_reward("broken_factory")
    finally:
        del base._FACTORIES["broken_factory"]


def test_a_config_passes_settings_to_a_named_reward() -> None:
    """A YAML config can set a named reward's arguments, not only its weight: as a mapping
    `{name: {weight, **settings}}` or as a list item `{name: ..., weight: ..., **settings}`."""
    mapped = get_reward({"exact_match": 1.0, "tool_call_penalty": {"weight": 0.1, "per_call": -0.5, "free_calls": 2}})
    assert mapped.weights == {"exact_match": 1.0, "tool_call_penalty": 0.1}
    penalty = mapped.parts["tool_call_penalty"][0]
    assert isinstance(penalty, ToolCallPenalty) and (penalty.per_call, penalty.free_calls) == (-0.5, 2)

    listed = get_reward(["f1", {"name": "tool_call_penalty", "free_calls": 3}, {"name": "format", "weight": 0.2}])
    assert listed.weights == {"f1": 1.0, "tool_call_penalty": 1.0, "format": 0.2}
    assert listed.parts["tool_call_penalty"][0].free_calls == 3  # type: ignore[attr-defined]

    renamed = get_reward({"tool_call_penalty": {"name": "cost", "weight": 0.05}})
    assert renamed.weights == {"cost": 0.05}


def test_a_configured_reward_scores_in_the_env() -> None:
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    env = toolenv.ToolEnv(
        tools=[ping],
        tasks=[{"question": "q", "answer": "a"}],
        reward=[{"name": "tool_call_penalty", "weight": 1.0, "per_call": -0.25, "free_calls": 1}],
    )
    env.reset(seed=0)
    call = '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
    assert env.step(call)[1] == 0.0  # the free call
    assert env.step(call)[1] == -0.25
    env.close()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"tool_call_penalty": {"per_cal": -1}}, r"reward 'tool_call_penalty' takes no setting\(s\) \['per_cal'\]"),
        ([{"name": "format", "strict": True}], r"reward 'format' takes no setting\(s\) \['strict'\]; its settings: "),
        ([{"weight": 1.0}], r"or a mapping with a 'name'"),
        ({"f1": {"weight": "heavy"}}, r"the weight of 'f1' must be a finite number, got 'heavy'"),
        ({"nope": {"weight": 1.0}}, r"unknown reward 'nope'"),
    ],
)
def test_bad_reward_settings_say_what_is_wrong(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_reward(spec)  # type: ignore[arg-type]


class _Noted(toolenv.Reward):
    """A final reward that leaves details under its own name, as the judge and `ToolVerified` do."""

    name = "noted"

    def __init__(self, score: float) -> None:
        self.score = score

    async def final(self, episode: toolenv.Episode) -> float:
        record_reward_info(episode, self.name, score=self.score)
        return self.score


def test_reward_info_is_kept_by_component_name() -> None:
    """A `WeightedSum({key: (reward, weight)})` reports components by key; the details each part
    recorded were kept by the reward's own name instead, so two judges (or two verifiers)
    under two keys overwrote each other's reward info."""
    reward = WeightedSum({"strict": (_Noted(0.0), 1.0), "lenient": (_Noted(1.0), 0.5), "noted": (_Noted(0.5), 1.0)})
    env = toolenv.ToolEnv(tools=[add], tasks=[{"question": "q", "answer": "x"}], reward=reward)
    env.reset(seed=0)
    _, r, term, _, info = env.step("<answer>x</answer>")
    env.close()
    assert term and r == 1.0
    assert info["reward_components"] == {"strict": 0.0, "lenient": 1.0, "noted": 0.5}
    assert info["reward_info"] == {"strict": {"score": 0.0}, "lenient": {"score": 1.0}, "noted": {"score": 0.5}}


def test_reward_info_may_hold_a_name_and_an_episode_field() -> None:
    """What a reward records is its own: a `name` (the judge model's, the tool's) or an `episode`
    field is kept, not taken for `record_reward_info`'s own arguments."""
    from toolenv.caller import ToolCaller
    from toolenv.types import Task

    ep = toolenv.Episode(task=Task(question="q", answer="a"), episode_id="e", caller=ToolCaller([]))
    record_reward_info(ep, "judge", name="gpt-judge", episode="e-1", score=1.0)
    assert toolenv.rewards.reward_info(ep)["judge"] == {"name": "gpt-judge", "episode": "e-1", "score": 1.0}
