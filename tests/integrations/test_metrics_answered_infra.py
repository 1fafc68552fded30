"""The trainer integrations' episode counts: `answered` is a non-empty answer, and the failed
calls that were not the model's fault are counted apart (`infra_errors`).

An empty `<answer></answer>` is no answer to every reward (`answer_avoidance_penalty` charges
it), so a policy that learned to answer nothing must not look 100% answered on a dashboard; and
a retriever outage must show as an outage, not as a policy whose tool calls got worse.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from toolenv import ToolResult
from toolenv.integrations._metrics import EPISODE_COUNTS, answered, failed_calls, failed_reset, infra_errors


def test_answered_is_a_non_empty_answer() -> None:
    assert [answered(a) for a in (None, "", "  \n", "5", " Paris ")] == [0.0, 0.0, 0.0, 1.0, 1.0]


def test_infra_errors_count_failed_calls_that_are_not_the_models_fault() -> None:
    results = [
        ToolResult(text="ok", name="sql"),
        ToolResult(text="syntax error", name="sql", is_error=True),
        ToolResult(text="HTTP 503", name="search", is_error=True, retryable=True),
        ToolResult(text="unavailable", name="search", is_error=True, metadata={"circuit_open": True}),
        ToolResult(text="no such database", name="sql", is_error=True, metadata={"infra_error": True}),
        ToolResult(text="write a call", name="parser", is_error=True, retryable=True),  # no call: not counted
    ]
    assert failed_calls(results) == 4 and infra_errors(results) == 3
    assert "infra_errors" in EPISODE_COUNTS and failed_reset()["infra_errors"] == 0.0


def test_verl_compute_score_counts_an_empty_answer_as_unanswered() -> None:
    from toolenv.integrations.verl.data import build_rows
    from toolenv.integrations.verl.reward import compute_score

    kwargs = {"tools": ["toolenv.integrations.verl.demo:Calculator"], "tasks": [{"question": "2+3?", "answer": "5"}]}
    row = build_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs)[0]
    empty = compute_score(row["data_source"], "<answer></answer>", None, row["extra_info"])
    given = compute_score(row["data_source"], "<answer>5</answer>", None, row["extra_info"])
    assert empty["answered"] == 0.0 and given["answered"] == 1.0 and given["score"] == 1.0


skyrl_gym = pytest.importorskip(
    "skyrl_gym", reason="the SkyRL integration needs skyrl-gym: pip install 'toolenv[skyrl]' (CI installs it)"
)

import gymnasium as gym  # noqa: E402

from toolenv.integrations.skyrl import close_pooled_envs, dataset_rows, register  # noqa: E402

from ..conftest import calc_env as _calc_env  # noqa: E402

CALC = "toolenv-test/SkyRLAnsweredCalc-v0"
if CALC not in gym.registry:
    gym.register(CALC, entry_point=_calc_env)


@pytest.fixture
def _registered() -> Iterator[None]:
    register([CALC], generic=False)
    yield
    close_pooled_envs()


def _episode(reply: str) -> dict[str, Any]:
    row = json.loads(json.dumps(dataset_rows(CALC, n=1)[0]))
    prompt = row.pop("prompt")
    row.pop("env_class")
    env = skyrl_gym.make(CALC, env_config={}, extras={**row, "max_turns": 4})
    env.init(prompt)
    env.step(reply)
    metrics: dict[str, Any] = env.get_metrics()
    env.close()
    return metrics


@pytest.mark.usefixtures("_registered")
def test_skyrl_counts_an_empty_answer_as_unanswered() -> None:
    empty, given = _episode("<answer></answer>"), _episode("<answer>5</answer>")
    assert empty["answered"] == 0.0 and given["answered"] == 1.0
    assert empty["infra_errors"] == 0 and given["infra_errors"] == 0
