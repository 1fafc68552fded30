"""SkyRL's `get_metrics()` and per-step metadata: failed calls counted apart from parse errors.

`tool_errors` counted every error result, the parser's included (a turn with no action, a call
it could not read), while `tool_calls` counted calls: `tool_errors / tool_calls` could pass 1.
Driven as SkyRL's generator drives an env: `skyrl_gym.make`, `init`, `step`, `get_metrics`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

skyrl_gym = pytest.importorskip(
    "skyrl_gym", reason="the SkyRL integration needs skyrl-gym: pip install 'toolenv[skyrl]' (CI installs it)"
)

import gymnasium as gym  # noqa: E402

from toolenv.integrations.skyrl import close_pooled_envs, dataset_rows, register  # noqa: E402

from ..conftest import calc_env as _calc_env  # noqa: E402

CALC = "toolenv-test/SkyRLMetricsCalc-v0"
GOOD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
FAILING_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": "two", "b": 3}}\n</tool_call>'
UNREADABLE_CALL = '<tool_call>\n{"name": "add", "arguments": \n</tool_call>'


if CALC not in gym.registry:
    gym.register(CALC, entry_point=_calc_env)


@pytest.fixture(autouse=True)
def _registered() -> Iterator[None]:
    register([CALC], generic=False)
    yield
    close_pooled_envs()


def _make(extras: dict[str, Any], prompt: list[dict[str, Any]]) -> Any:
    env = skyrl_gym.make(CALC, env_config={}, extras={**extras, "max_turns": 8})
    env.init(prompt)
    return env


def _row_env() -> Any:
    row = json.loads(json.dumps(dataset_rows(CALC, n=1)[0]))
    prompt = row.pop("prompt")
    row.pop("env_class")
    return _make(row, prompt)


def test_step_metadata_counts_failed_calls_only() -> None:
    env = _row_env()
    no_action = env.step("I think the answer is five.")["metadata"]
    assert no_action["tool_errors"] == 0 and no_action["tool_calls"] == []  # was 1: an error with no call
    unreadable = env.step(UNREADABLE_CALL)["metadata"]
    assert unreadable["tool_errors"] == 0 and unreadable["parse_errors"]  # the parser's, not a tool's
    failing = env.step(FAILING_CALL)["metadata"]
    assert failing["tool_errors"] == 1 and failing["tool_calls"][0]["error"] is not None
    good = env.step(GOOD_CALL)["metadata"]
    assert good["tool_errors"] == 0 and good["tool_calls"][0]["error"] is None
    assert env.step("<answer>5</answer>")["done"] is True
    env.close()


def test_metrics_count_failed_calls_and_parse_errors_apart() -> None:
    env = _row_env()
    for text in ("I think the answer is five.", UNREADABLE_CALL, FAILING_CALL, GOOD_CALL, "<answer>5</answer>"):
        env.step(text)
    metrics = env.get_metrics()
    assert metrics["turns"] == 5 and metrics["return"] == 1.0
    assert metrics["tool_calls"] == 2
    assert metrics["tool_errors"] == 1  # was 3: the no-action turn and the unreadable call counted too
    assert metrics["parse_errors"] == 2
    env.close()


def test_a_turn_with_no_action_never_makes_tool_errors_exceed_tool_calls() -> None:
    env = _row_env()
    for _ in range(4):
        env.step("I do not know.")
    metrics = env.get_metrics()
    assert metrics["tool_calls"] == 0 and metrics["tool_errors"] == 0 and metrics["parse_errors"] == 4
    env.close()


def test_a_failed_reset_reports_the_same_counts_at_zero() -> None:
    """SkyRL averages each key over the samples that have it: a failed sample's counts are there, at 0."""
    done = _row_env()
    done.step("<answer>5</answer>")
    counts = {k for k in done.get_metrics() if not k.startswith("reward/")}
    done.close()
    failed = _make({"extra_info": {"task_id": "no-such-task"}}, [{"role": "user", "content": "What is 2 + 3?"}])
    failed.step("<answer>5</answer>")
    metrics = failed.get_metrics()
    assert set(metrics) == counts and "parse_errors" in counts
    assert metrics["env_error"] == 1.0 and metrics["parse_errors"] == 0.0 and metrics["tool_errors"] == 0.0
    failed.close()
