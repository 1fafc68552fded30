"""A reward spec may name a reward by a `"module:Name"` reference, as `tools=` names tools: a
reward defined in the user's own module is then reachable from a config, the CLI or verl's
env_kwargs, in a process that never registered it."""

from __future__ import annotations

import copy
import itertools
import json
import textwrap
from pathlib import Path

import pytest

import toolenv
from toolenv.cli import main
from toolenv.rewards import get_reward, reward_names
from toolenv.rewards.base import Reward

from .conftest import TASKS, Add

_SERIAL = itertools.count()

# A module of the user's: a Reward class with a setting, a ready instance, a factory function,
# and an object that is no reward. It registers nothing.
SOURCE = """
import toolenv


class Said(toolenv.Reward):
    name = "said"

    def __init__(self, word: str = "5") -> None:
        self.word = word

    async def final(self, episode):
        return 1.0 if episode.answer and self.word in episode.answer else 0.0


READY = Said("Paris")


def make_said(word: str = "14") -> Said:
    return Said(word)


NOT_A_REWARD = 42
"""


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a fresh module holding `SOURCE`, importable from `sys.path` (a new name per
    test: nothing of it is imported or registered yet)."""
    name = f"user_rewards_{next(_SERIAL)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _score(spec: object, answer: str, task: int = 0) -> float:
    env = toolenv.ToolEnv(tools=[Add()], tasks=[copy.deepcopy(TASKS[task])], reward=spec)  # type: ignore[arg-type]
    env.reset(seed=0)
    return float(env.step(f"<answer>{answer}</answer>")[1])


def test_a_reward_class_by_reference(mod: str) -> None:
    assert _score(f"{mod}:Said", "5") == 1.0
    assert _score(f"{mod}:Said", "6") == 0.0
    assert f"{mod}:Said" not in reward_names()  # resolved, not registered under the reference


def test_a_reward_instance_and_a_factory_by_reference(mod: str) -> None:
    assert _score(f"{mod}:READY", "Paris", task=2) == 1.0
    assert _score(f"{mod}:make_said", "14", task=1) == 1.0


def test_a_reference_takes_settings_and_weights_in_every_spec_form(mod: str) -> None:
    ref = f"{mod}:Said"
    weighted = get_reward({ref: 0.5, "exact_match": 1.0})
    assert weighted.weights == {"said": 0.5, "exact_match": 1.0}
    assert _score({ref: {"weight": 2.0, "word": "Paris"}}, "Paris", task=2) == 2.0
    assert _score([{"name": ref, "word": "Paris"}], "Paris", task=2) == 1.0
    assert _score([(ref, 3.0)], "5") == 3.0
    assert _score([ref], "5") == 1.0


def test_a_bad_reference_says_what_is_wrong(mod: str) -> None:
    with pytest.raises(ValueError, match=r"cannot import reward 'no_such_module_xyz:R'"):
        get_reward("no_such_module_xyz:R")
    with pytest.raises(ValueError, match=rf"cannot import reward '{mod}:Nope'"):
        get_reward(f"{mod}:Nope")
    with pytest.raises(ValueError, match=rf"reward reference '{mod}:NOT_A_REWARD' is int, not a Reward"):
        get_reward(f"{mod}:NOT_A_REWARD")
    with pytest.raises(ValueError, match=rf"reward '{mod}:READY' takes no setting\(s\) \['word'\]; its settings: none"):
        get_reward({f"{mod}:READY": {"word": "x"}})
    with pytest.raises(ValueError, match=r"takes no setting\(s\) \['colour'\]; its settings: word"):
        get_reward({f"{mod}:Said": {"colour": "x"}})


def test_a_reference_to_something_that_builds_no_reward_is_refused(mod: str) -> None:
    with pytest.raises(ValueError, match=r"built Add, not a toolenv.Reward"):
        get_reward("tests.conftest:Add")


def test_the_unknown_reward_error_says_how_to_reach_a_custom_reward() -> None:
    with pytest.raises(ValueError) as info:
        get_reward("subem_never_registered")
    message = str(info.value)
    assert message.startswith("unknown reward 'subem_never_registered'; known rewards: ")
    assert "'module:Name'" in message and "entry point" in message
    assert "\n" not in message


def test_gym_make_takes_a_reference(mod: str) -> None:
    import gymnasium as gym

    env = gym.make("toolenv/ToolEnv-v0", tasks=[copy.deepcopy(TASKS[0])], reward=f"{mod}:Said")
    try:
        parts = env.unwrapped.reward_fn.parts  # type: ignore[attr-defined]
        assert list(parts) == ["said"] and isinstance(parts["said"][0], Reward)
    finally:
        env.close()


def test_the_cli_takes_a_reference_in_env_arg(mod: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--env-arg reward=module:Name` in a process where nothing registered the reward."""
    from _examples import load_example

    example = load_example("rollout_example")
    out = tmp_path / "run"
    code = main(
        [
            "rollout", example.ENV_ID, "--agent", "rollout_example:ScriptedAgent", "-n", "2", "--no-progress",
            "--env-arg", f"reward={mod}:Said", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    # Lines are written as episodes finish, in either order under load: compare by task.
    by_task = {r["task"]["id"]: r["reward_components"] for r in rows}
    assert by_task == {"sum-1": {"said": 1.0}, "sum-2": {"said": 0.0}}  # "5" is in "5", not in "14"
