"""SkyRL: a turn limit that overrides the row's stored one is warned of; a custom env's ways in.

SkyRL's generator always puts its `generator.max_turns` (default 1) in `extras["max_turns"]`,
which wins over the `max_turns` a row stores in `extra_info.env_kwargs`: that is warned of once
per process and pair of values. A custom env id `register` does not know gets an error naming
the ways that work, and each of them runs an episode through the real `skyrl_gym.make`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

skyrl_gym = pytest.importorskip(
    "skyrl_gym", reason="the SkyRL integration needs skyrl-gym: pip install 'toolenv[skyrl]' (CI installs it)"
)

import gymnasium as gym  # noqa: E402

from toolenv.integrations.skyrl import close_pooled_envs, dataset_rows, register  # noqa: E402

from ..conftest import Add  # noqa: E402
from ..conftest import calc_env as _calc_env  # noqa: E402

TURNS = "toolenv-test/SkyRLTurns-v0"
WARNED_TWICE = "toolenv-test/SkyRLTurnsTwice-v0"
FACTORY = "toolenv-test/SkyRLFactory-v0"
GYM_REGISTERED = "shop-test/SkyRLShop-v0"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
LOGGER = "toolenv.integrations.skyrl.env"


for _id in (TURNS, WARNED_TWICE, GYM_REGISTERED):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_calc_env)


@pytest.fixture(autouse=True)
def _pool_closed() -> Iterator[None]:
    yield
    close_pooled_envs()


def _sample(env_id: str, generator_max_turns: int, env_config: Any = None, **row_kwargs: Any) -> Any:
    """What SkyRL's generator does per sample: a row of `dataset_rows`, its prompt and env_class
    taken off, `extras["max_turns"]` set to `generator.max_turns`, `make`, `init`."""
    row = json.loads(json.dumps(dataset_rows(env_id, n=1, **row_kwargs)[0]))
    prompt, env_class = row.pop("prompt"), row.pop("env_class")
    extras = {**row, "max_turns": generator_max_turns}
    env = skyrl_gym.make(env_class, env_config=env_config or {}, extras=extras)
    env.init(prompt)
    return env


def _turn_warnings(caplog: pytest.LogCaptureFixture, env_id: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and env_id in r.getMessage()]


def test_generator_max_turns_overriding_the_rows_stored_max_turns_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    register(TURNS)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        env = _sample(TURNS, 1, env_kwargs={"max_turns": 4})
    # SkyRL's value still wins (it cannot be told from an explicit setting), as documented ...
    out = env.step(CALL)
    assert out["done"] is True and out["metadata"]["truncated"] is True and env.max_turns == 1
    env.close()
    # ... but not silently: one line naming both values, which wins and how to change it.
    (message,) = _turn_warnings(caplog, TURNS)
    assert "\n" not in message
    assert "generator.max_turns=1" in message and "max_turns=4" in message
    assert "extra_info.env_kwargs" in message and "generator.max_turns=4" in message


def test_the_turn_limit_warning_comes_once_per_pair_of_values(caplog: pytest.LogCaptureFixture) -> None:
    register(WARNED_TWICE)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):  # a batch's samples: one warning, not one per sample
            _sample(WARNED_TWICE, 2, env_kwargs={"max_turns": 5}).close()
        assert len(_turn_warnings(caplog, WARNED_TWICE)) == 1
        _sample(WARNED_TWICE, 3, env_kwargs={"max_turns": 5}).close()  # another pair: warned of too
        assert len(_turn_warnings(caplog, WARNED_TWICE)) == 2
        env = _sample(WARNED_TWICE, 6, env_kwargs={"max_turns": 6})  # the same value: nothing to say
        assert env.max_turns == 6
        env.close()
        assert len(_turn_warnings(caplog, WARNED_TWICE)) == 2


def test_a_registered_max_turns_overriding_the_rows_names_register(caplog: pytest.LogCaptureFixture) -> None:
    register(WARNED_TWICE, max_turns=2)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            env = _sample(WARNED_TWICE, 9, env_kwargs={"max_turns": 7})
        assert env.max_turns == 2
        env.close()
        (message,) = _turn_warnings(caplog, WARNED_TWICE)
        assert "register(max_turns=2)" in message and "max_turns=7" in message
    finally:
        register(WARNED_TWICE)


def test_register_of_an_unknown_id_names_the_ways_to_bring_a_custom_env() -> None:
    with pytest.raises(ValueError) as raised:
        register("shop/SQL-v0")
    message = str(raised.value)
    assert "\n" not in message and "shop/SQL-v0" in message
    assert "gymnasium.register" in message and "toolenv.envs" in message and "toolenv/ToolEnv-v0" in message
    assert "entry_point=" in message


def test_a_custom_env_registered_with_gymnasium_runs_under_skyrl() -> None:
    """The documented way: `gymnasium.register(id, entry_point=factory)`, then `register(id)`."""
    assert register(GYM_REGISTERED, generic=False) == [GYM_REGISTERED]
    env = _sample(GYM_REGISTERED, 3)
    out = env.step(CALL)
    assert out["done"] is False and out["observations"][0]["content"] == "5"
    env.close()


def test_register_takes_a_custom_envs_factory_as_its_entry_point() -> None:
    """As TRL's `environment_factory`: a callable making the env, here registered under an id."""
    assert FACTORY not in gym.registry
    with pytest.raises(ValueError, match="max_turns must be at least 1"):
        register(FACTORY, entry_point=_calc_env, max_turns=0)
    assert FACTORY not in gym.registry  # a refused call registers nothing, with Gymnasium neither
    assert register(FACTORY, entry_point=_calc_env, generic=False) == [FACTORY]
    assert register(FACTORY, entry_point=_calc_env, generic=False) == [FACTORY]  # idempotent
    assert gym.registry[FACTORY].entry_point is _calc_env
    env = _sample(FACTORY, 3)
    out = env.step(CALL)
    assert out["done"] is False and out["observations"][0]["content"] == "5"
    assert env.step("<answer>5</answer>")["reward"] == 1.0
    env.close()
    with pytest.raises(ValueError, match="already has 'toolenv-test/SkyRLFactory-v0'"):
        register(FACTORY, entry_point=Add)  # another env under the same id: refused
    with pytest.raises(ValueError, match="Malformed environment ID"):
        register("shop sql", entry_point=_calc_env)
    with pytest.raises(ValueError, match="one env id"):
        register([FACTORY, TURNS], entry_point=_calc_env)
