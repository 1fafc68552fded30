"""What a plugin author hits when registering rewards: shadowing, sync hooks, lookup by name."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolenv.caller import ToolCaller
from toolenv.episode import Episode
from toolenv.rewards import ExactMatch, Reward, WeightedSum, get_reward
from toolenv.rewards import base as reward_base
from toolenv.types import Task


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Leave the process's reward registry as it was."""
    saved = dict(reward_base._FACTORIES)
    yield
    reward_base._FACTORIES.clear()
    reward_base._FACTORIES.update(saved)


class _Shadow(Reward):
    name = "exact_match"

    async def final(self, episode: Episode) -> float:
        return 1.0


def test_a_second_factory_cannot_take_a_registered_name(clean_registry: None) -> None:
    """A plugin registering "exact_match" silently replaced the core reward for every env."""
    with pytest.raises(
        ValueError, match=r"'exact_match' is already registered by toolenv\.rewards\.match:ExactMatch"
    ) as err:
        reward_base.register_reward("exact_match", _Shadow)
    assert f"{__name__}:_Shadow" in str(err.value) and "replace=True" in str(err.value)
    assert reward_base._FACTORIES["exact_match"] is ExactMatch


def test_registering_the_same_factory_again_or_on_purpose_is_fine(clean_registry: None, tmp_path: Path) -> None:
    reward_base.register_reward("exact_match", ExactMatch)  # a module imported twice
    (tmp_path / "h8_reloaded_reward.py").write_text(
        "from toolenv.rewards import Reward, register_reward\n"
        "class Mine(Reward):\n    name = 'h8_mine'\n"
        "register_reward('h8_mine', Mine)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("h8_reloaded_reward")
        importlib.reload(module)  # a new class object of the same module:qualname
        assert reward_base._FACTORIES["h8_mine"] is module.Mine
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("h8_reloaded_reward", None)
    reward_base.register_reward("exact_match", _Shadow, replace=True)
    assert reward_base._FACTORIES["exact_match"] is _Shadow


def _episode() -> Episode:
    return Episode(task=Task(question="q", answer="a"), episode_id="e", caller=ToolCaller([]))


class _SyncFinal(Reward):
    name = "brevity"

    def final(self, episode: Episode) -> float:  # type: ignore[override]  # the slip: no `async`
        return 0.75


class _SyncTurn(Reward):
    name = "step_cost"

    def turn(self, episode: Episode, turn: object) -> float:  # type: ignore[override]
        return -0.25


def test_a_sync_final_or_turn_hook_is_scored() -> None:
    """`def final` (no async) failed every episode with "float can't be used in 'await' expression"."""
    summed = get_reward([(_SyncFinal(), 2.0), (_SyncTurn(), 1.0)])
    episode = _episode()
    assert asyncio.run(summed.final_components(episode)) == {"brevity": 0.75, "step_cost": 0.0}
    assert asyncio.run(summed.final(episode)) == 1.5
    turns = asyncio.run(summed.turn_components(episode, None))  # type: ignore[arg-type]
    assert turns == {"brevity": 0.0, "step_cost": -0.25}
    renamed = WeightedSum({"short": (_SyncFinal(), 1.0)})
    assert asyncio.run(renamed.final_components(episode)) == {"short": 0.75}


def test_a_sync_final_hook_works_in_an_env_episode() -> None:
    import gymnasium as gym

    env = gym.make(
        "toolenv/ToolEnv-v0", tasks=[{"question": "q", "answer": "a"}], parser="hermes", tools=[], reward=[_SyncFinal()]
    )
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("<answer>a</answer>")
    assert terminated and reward == 0.75 and info["reward_components"]["brevity"] == 0.75
    env.close()


PLUGIN = """
import toolenv

def make_env(**kw):
    return toolenv.ToolEnv(tasks=[{"question": "q", "answer": "a"}], tools=[], **kw)
"""

#: A submodule the entry point's module does not import.
PLUGIN_REWARDS = """
from toolenv.rewards import Reward, register_reward

NAME = "h8_const_reward"

class Const(Reward):
    name = NAME
    async def final(self, episode):
        return 0.5

register_reward(NAME, Const)  # not a string literal: `toolenv list` cannot read it
register_reward("h8_literal_reward", Const)
"""


@pytest.fixture
def plugin_site(tmp_path: Path) -> Path:
    """A package with a `toolenv.envs` entry point, found through a dist-info folder on sys.path."""
    (tmp_path / "h8plug").mkdir()
    (tmp_path / "h8plug" / "__init__.py").write_text(PLUGIN)
    (tmp_path / "h8plug" / "scoring.py").write_text(PLUGIN_REWARDS)
    info = tmp_path / "h8plug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: h8plug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[toolenv.envs]\nH8Plug-v0 = h8plug:make_env\n")
    return tmp_path


def _run(site: Path, code: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_reward_registered_under_a_non_literal_name_is_found_by_name(plugin_site: Path) -> None:
    res = _run(
        plugin_site,
        """
        import json
        from toolenv.rewards import get_reward
        print(json.dumps({"weights": get_reward("h8_const_reward").weights}))
        """,
    )
    assert res == {"weights": {"h8_const_reward": 1.0}}


def test_the_unknown_reward_error_lists_plugin_rewards(plugin_site: Path) -> None:
    res = _run(
        plugin_site,
        """
        import json, sys
        from toolenv.rewards import get_reward
        try:
            get_reward("h8_no_such_reward")
            err = ""
        except ValueError as e:
            err = str(e)
        print(json.dumps({"err": err}))
        """,
    )
    err = str(res["err"])
    assert "unknown reward 'h8_no_such_reward'" in err
    assert "h8_literal_reward" in err and "h8_const_reward" in err and "exact_match" in err
