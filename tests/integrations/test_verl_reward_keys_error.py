"""A verl batch mixing envs with different reward components failed in verl's postprocessing with
a bare `KeyError 'reward/execution_match'` (found by the verl porting review). The agent loop now
logs, once per new set of reward components, which `reward_keys` to set."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from toolenv.integrations.verl import _turns
from toolenv.integrations.verl._turns import RewardKeys

LOGGER = "toolenv.integrations.verl.agent_loop"


def test_one_set_of_keys_says_nothing_however_many_episodes() -> None:
    keys = RewardKeys()
    assert all(keys.add("toolenv/Spider-v0", ["execution_match"]) is None for _ in range(5))
    assert keys.add("toolenv/Chinook-v0", ["execution_match"]) is None  # another env, the same keys


def test_a_second_set_names_the_reward_keys_to_set_once() -> None:
    keys = RewardKeys()
    assert keys.add("toolenv/Spider-v0", ["execution_match"]) is None
    error = keys.add("toolenv/HotpotQA-v0", ["format", "exact_match"])
    assert error is not None
    assert "set reward_keys: [exact_match, execution_match, format]" in error
    assert "toolenv/Spider-v0: execution_match; toolenv/HotpotQA-v0: exact_match, format" in error
    assert keys.add("toolenv/HotpotQA-v0", ["exact_match", "format"]) is None  # once per set
    assert keys.add("toolenv/Spider-v0", ["execution_match"]) is None


@pytest.fixture
def fresh_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is process-wide: each test starts from none."""
    monkeypatch.setattr(_turns, "REWARD_KEYS", RewardKeys())


async def test_the_loop_logs_it_for_rows_of_different_rewards(
    scripted_server: Any, make_loop: Any, fresh_keys: None, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
    pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")
    from toolenv.integrations.verl.data import abuild_rows
    from toolenv.integrations.verl.demo import DEMO_TASKS

    caplog.set_level(logging.ERROR, logger=LOGGER)
    calc = "toolenv.integrations.verl.demo:Calculator"
    rows = []
    for reward in ("exact_match", {"exact_match": 1.0, "format": 0.1}):
        kwargs = {"tools": [calc], "tasks": DEMO_TASKS, "reward": reward}
        row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs))[0]
        rows.append({"raw_prompt": row["prompt"], "extra_info": row["extra_info"]})
    for row in (*rows, *rows):
        out = await make_loop(scripted_server(["<answer>42</answer>"])).run({}, **row)
        assert out.extra_fields["toolenv_error"] == ""
    errors = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "set reward_keys: [exact_match, format]" in errors[0], errors
    caplog.clear()
    loop = make_loop(scripted_server(["<answer>42</answer>"]), reward_keys=["exact_match", "format"])
    await loop.run({}, **rows[0])
    assert not [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
