"""Reset options and actions as Gymnasium's contract has them: unknown option keys and actions
outside the action space are refused; a vector env's autoreset keeps the agent-describing options."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import toolenv
from toolenv.vector import ToolVectorEnv

from .conftest import TASKS, Add


def _env(**kw: Any) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, **kw)


# ---------------------------------------------------------------- autoreset keeps native_tools
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_autoreset_keeps_native_tools_but_not_the_task(mode: AutoresetMode) -> None:
    venv = ToolVectorEnv([lambda: _env(task_order="sequential") for _ in range(2)], autoreset_mode=mode)
    native_prompt, _ = _env().reset(options={"task_id": "t1", "native_tools": True})
    venv.reset(options={"task_id": "t3", "native_tools": True})
    obs, *_, infos = venv.step(["<answer>x</answer>"] * 2)
    if mode is AutoresetMode.NEXT_STEP:
        obs, *_, infos = venv.step(["", ""])
    assert venv.get_attr("native_tools") == (True, True)
    assert list(infos["task_id"]) == ["t1", "t1"]  # the env's own order, not task t3 again
    assert obs == (native_prompt, native_prompt)  # no call format taught again
    venv.close()


def test_autoreset_after_a_plain_reset_drops_native_tools_again() -> None:
    venv = ToolVectorEnv([lambda: _env() for _ in range(1)])
    venv.reset(options={"native_tools": True})
    venv.reset()  # a reset without it: the agent no longer gives the tools itself
    venv.step(["<answer>x</answer>"])
    venv.step([""])
    assert venv.get_attr("native_tools") == (False,)
    venv.close()


# ---------------------------------------------------------------- non-text actions
@pytest.mark.parametrize(
    ("action", "named"), [(b"<answer>5</answer>", "bytes"), ([151644, 872], "list"), (None, "NoneType")]
)
def test_a_non_text_action_is_refused_and_the_episode_goes_on(action: Any, named: str) -> None:
    env = _env()
    env.reset(options={"task_id": "t1"})
    with pytest.raises(TypeError, match=rf"takes the model's reply as a str, got {named} .*decode"):
        env.step(action)
    assert env.episode is not None and env.episode.turns == []  # nothing recorded or scored
    _, reward, terminated, _, _ = env.step("<answer>5</answer>")
    assert (reward, terminated) == (1.0, True)
    env.close()


def test_a_str_subclass_action_is_text() -> None:
    env = _env()
    env.reset(options={"task_id": "t1"})
    _, reward, *_ = env.step(np.str_("<answer>5</answer>"))
    assert reward == 1.0
    env.close()


def test_vector_env_refuses_a_non_text_action() -> None:
    venv = ToolVectorEnv([lambda: _env() for _ in range(2)])
    venv.reset(seed=0)
    with pytest.raises(TypeError, match="got bytes"):
        venv.step(["<answer>5</answer>", b"<answer>5</answer>"])
    venv.close()


# ---------------------------------------------------------------- reset option keys
@pytest.mark.parametrize(
    ("options", "close"),
    [({"taskid": "t2"}, "task_id"), ({"task_idx": 1}, "task_index"), ({"native_tool": True}, "native_tools")],
)
def test_a_misspelt_reset_option_is_refused_with_the_close_match(options: dict[str, Any], close: str) -> None:
    env = _env()
    with pytest.raises(ValueError, match=rf"unknown reset option .*did you mean [^)]*'{close}'.*task_id"):
        env.reset(options=options)
    env.close()


def test_a_subclass_declares_its_own_reset_options() -> None:
    class Tagged(toolenv.ToolEnv):
        reset_options: ClassVar[frozenset[str]] = toolenv.ToolEnv.reset_options | {"tag"}

        async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            obs, info = await super().areset(seed=seed, options=options)
            return obs, {**info, "tag": (options or {}).get("tag")}

    env = Tagged(tools=[Add()], tasks=TASKS)
    _, info = env.reset(options={"task_id": "t2", "tag": "x"})
    assert (info["task_id"], info["tag"]) == ("t2", "x")
    with pytest.raises(ValueError, match=r"unknown reset option 'tags'.*did you mean 'tag'"):
        env.reset(options={"tags": "x"})
    env.close()


def test_vector_env_refuses_a_list_of_task_ids_clearly_and_a_mask_gives_each_env_its_task() -> None:
    venv = ToolVectorEnv([lambda: _env() for _ in range(2)])
    with pytest.raises(TypeError, match=r"'task_id' takes one value, got a list.*reset_mask"):
        venv.reset(options={"task_id": ["t1", "t2"]})
    venv.reset(options={"reset_mask": np.array([True, False]), "task_id": "t1"})
    _, infos = venv.reset(options={"reset_mask": np.array([False, True]), "task_id": "t2"})
    assert venv.get_attr("episode")[0].task.id == "t1" and infos["task_id"][1] == "t2"
    venv.close()


def test_a_remote_env_refuses_a_non_text_action_as_a_local_one_does() -> None:
    """The served env's client turned bytes into "b'...'" text and sent it, as the local env did."""
    from _remote import make_env, serving

    from toolenv.remote import RemoteToolEnv

    with serving(make_env) as url:
        env = RemoteToolEnv(url)
        try:
            env.reset(options={"task_id": "t1"})
            with pytest.raises(TypeError, match="decode bytes"):
                env.step(b"<answer>5</answer>")
            obs, reward, terminated, *_ = env.step("<answer>5</answer>")  # the episode goes on
            assert terminated and reward == 1.0
        finally:
            env.close()
