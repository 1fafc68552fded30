"""What the env sees under TRL: a warning for rewards that read the model's text (which TRL never
passes the env), `episode_metrics` for logging toolenv's reward components from a reward
function, and environment class names (TRL's reward column) that do not depend on garbage
collection. Driven as `GRPOTrainer` drives an environment: `reset(**row)`, tool methods, `get_reward`."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from typing import Any

import pytest

import toolenv
from toolenv.integrations.trl import ToolCallError, dataset_rows, environment_factory, episode_metrics
from toolenv.rewards import TurnReward

from ..conftest import TASKS, Add
from . import test_trl
from .test_trl import CALL, one_step_config

#: test_trl's `trl_parts` fixture (the tiny Qwen2, TRL's template, a scripted policy), here as `scripted_qwen2`.
scripted_qwen2 = test_trl.trl_parts

_LOGGER = "toolenv.integrations.trl.environment"


def _said(turn: Any) -> float:
    return float("thanks" in turn.action)


def text_rewards_env() -> toolenv.ToolEnv:
    """Every kind of reward part that reads the model's text, next to one that does not."""
    reward = [
        (toolenv.rewards.ExactMatch(), 1.0),
        (toolenv.rewards.FormatReward(require_think=True), 0.2),
        (TurnReward(lambda episode, turn: _said(turn), name="politeness"), 0.1),
        (toolenv.rewards.InvalidCallPenalty(-0.1), 1.0),
    ]
    return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, reward=reward, max_turns=5)


def answer_only_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, reward={"exact_match": 1.0, "tool_call_penalty": 0.1})


def scored_env() -> toolenv.ToolEnv:
    reward = {"exact_match": 1.0, "answer_avoidance_penalty": 1.0, "tool_call_penalty": 0.5}
    return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, reward=reward, max_turns=5)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == _LOGGER and r.levelno == logging.WARNING]


def test_factory_warns_once_naming_the_rewards_that_read_the_models_text(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=_LOGGER)
    factory = environment_factory(text_rewards_env)
    for row in dataset_rows(text_rewards_env, n=2):  # making and running environments warns no more
        env = factory()
        env.reset(**row)
        env.get_reward()
    said = _warnings(caplog)
    assert len(said) == 1, said
    text = said[0]
    # Each part named with what it sees under TRL; the answer's reward is not named.
    assert "'format'" in text and "always 0.0" in text
    assert "'politeness'" in text and "turn.action" in text
    assert "'invalid_call_penalty'" in text and "failed tool calls" in text
    assert "exact_match" not in text and "docs/trl.md" in text


def test_factory_of_a_format_reward_without_think_says_it_is_1_when_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=_LOGGER)
    environment_factory("toolenv/ToolEnv-v0", env_kwargs={"reward": {"exact_match": 1.0, "format": 0.1}})
    (text,) = _warnings(caplog)
    assert "'format'" in text and "1.0 for every answered episode" in text


def test_factory_of_rewards_that_read_no_text_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=_LOGGER)
    environment_factory(answer_only_env)()
    environment_factory("toolenv/ToolEnv-v0", env_kwargs={"reward": {"penalties": {"per_invalid": 0.0}}})
    assert _warnings(caplog) == []


def _run(factory: Any, row: dict[str, Any], moves: list[tuple[str, dict[str, Any]]]) -> Any:
    env = factory()
    env.reset(**row)
    for name, arguments in moves:
        with contextlib.suppress(ToolCallError):  # TRL counts it as a failed call and goes on
            getattr(env, name)(**arguments)
    return env


def test_episode_metrics_scores_open_episodes_before_reporting_them() -> None:
    factory = environment_factory(scored_env)
    row = dataset_rows(scored_env, n=1)[0]  # t1: 2+3? -> 5
    answered = _run(factory, row, [("add", {"a": 2, "b": 3}), ("answer", {"answer": "5"})])
    unanswered = _run(factory, row, [("add", {"a": 2, "b": 3}), ("add", {"a": "x", "b": 1})])
    # As TRL's reward step has it: the user's reward functions run before the env's get_reward.
    assert unanswered.env.episode.truncated is False
    first = episode_metrics([answered, unanswered])
    assert first[0] == {
        "return": 0.5,
        "turns": 2.0,
        "tool_calls": 1.0,
        "tool_errors": 0.0,
        "infra_errors": 0.0,
        "parse_errors": 0.0,
        "answered": 1.0,
        "terminated": 1.0,
        "truncated": 0.0,
        "env_error": 0.0,
        "reward/exact_match": 1.0,
        "reward/answer_avoidance_penalty": 0.0,
        "reward/tool_call_penalty": -1.0,
    }
    assert first[1]["truncated"] == 1.0 and first[1]["answered"] == 0.0
    assert first[1]["reward/answer_avoidance_penalty"] == -1.0 and first[1]["tool_errors"] == 1.0
    assert first[1]["return"] == -1.0 + 0.5 * -2.0
    # get_reward (TRL's, after the reward functions) is not changed by the episode having been scored.
    assert [answered.get_reward(), unanswered.get_reward()] == [first[0]["return"], first[1]["return"]]
    assert episode_metrics([answered, unanswered]) == first
    silent = _run(factory, row, [])  # the model replied without calling anything: no turn at all
    (metrics,) = episode_metrics([silent])
    assert metrics["turns"] == 0.0 and metrics["truncated"] == 1.0 and metrics["return"] == silent.get_reward() == -1.0
    assert metrics["reward/answer_avoidance_penalty"] == -1.0 and metrics["reward/exact_match"] == 0.0


def test_episode_metrics_of_an_environment_whose_reset_failed() -> None:
    factory = environment_factory(scored_env)
    env = factory()
    row = {"prompt": [{"role": "user", "content": "hi"}], "task_id": "no-such-task"}
    assert env.reset(**row) is None and env.error is not None
    (metrics,) = episode_metrics([env])
    assert metrics["env_error"] == 1.0 and metrics["return"] == 0.0 and metrics["tool_calls"] == 0.0
    assert episode_metrics([None]) == [{}]  # not a toolenv environment: nothing to report


def test_the_default_name_does_not_depend_on_garbage_collection() -> None:
    first = environment_factory("toolenv/ToolEnv-v0", env_kwargs={"max_turns": 3})
    name, cls = first.name, first.environment_class
    first()
    del first
    again = environment_factory("toolenv/ToolEnv-v0", env_kwargs={"max_turns": 3})
    assert again.name == name and again.environment_class is cls  # the same settings: the same class
    del again
    gc.collect()
    assert environment_factory("toolenv/ToolEnv-v0", env_kwargs={"max_turns": 3}).name == name


def test_other_settings_of_one_env_id_get_a_suffix_kept_for_the_process() -> None:
    names = {n: environment_factory("toolenv/ToolEnv-v0", env_kwargs={"max_turns": n}).name for n in (3, 4)}
    assert names[3] != names[4] and names[4].startswith("TRLToolenvToolEnvV0Environment_")
    gc.collect()
    for n in (4, 3):  # made again, in the other order: each keeps its name
        assert environment_factory("toolenv/ToolEnv-v0", env_kwargs={"max_turns": n}).name == names[n]
    other = environment_factory("toolenv/ToolEnv-v0", env_kwargs={"max_turns": 3}, raise_tool_errors=False)
    assert other.name not in names.values()  # another class: TRL tells the columns apart by name


def test_the_docs_recipe_logs_the_components_under_grpo(scripted_qwen2: Any, tmp_path: Any) -> None:
    """docs/trl.md's zero-weight reward function under TRL's real GRPOTrainer: it runs before the env's
    `get_reward`, yet logs the unanswered sample as scored (truncated, its penalty), and TRL's own
    reward column agrees with the return it logs."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOTrainer

    def toolenv_metrics(environments: list[Any], log_metric: Any, **kwargs: Any) -> list[float]:
        for metrics in episode_metrics(environments):
            for key, value in metrics.items():
                log_metric(f"toolenv/{key}", value)
        return [0.0] * len(environments)

    add = CALL.format(name="add", args='{"a": 2, "b": 3}')
    script = [[add, CALL.format(name="answer", args='{"answer": "5"}'), "Done."], [add, "I give up."]]
    root, tok, cls = scripted_qwen2
    cls.script = staticmethod(lambda text, i: script[i % 2])
    factory = environment_factory(scored_env)
    trainer = GRPOTrainer(
        model=cls.from_pretrained(root),
        processing_class=tok,
        reward_funcs=[toolenv_metrics],
        train_dataset=Dataset.from_list(dataset_rows(scored_env, n=1) * 2),
        environment_factory=factory,
        args=one_step_config(tmp_path, batch=2, completion=256, reward_weights=[0.0]),
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["toolenv/answered"] == 0.5 and logged["toolenv/truncated"] == 0.5
    assert logged["toolenv/reward/answer_avoidance_penalty"] == -0.5 and logged["toolenv/tool_calls"] == 1.0
    assert logged["toolenv/return"] == logged[f"rewards/{factory.name}/mean"] == (0.5 + -1.5) / 2
