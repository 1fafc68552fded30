"""What a model trained under TRL reads, for every registered env, and what it scores following it.

TRL shows the env nothing of the model's last message, so the final answer must come through the
answer tool, and tools are called in the chat template's format. A prompt that also tells the model
to write `<answer>...</answer>` (or a `<search>` tag) asks for something that scores 0 under TRL.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import gymnasium as gym
import pytest

import toolenv
from toolenv import registry
from toolenv.integrations.trl import TRLEnvironment, dataset_rows, environment_factory

# The core's generic envs: no tasks of their own (ToolEnv-v0) or a server to name (Remote-v0).
_GENERIC = {"toolenv/ToolEnv-v0", "toolenv/Remote-v0"}
SHIPPED = sorted(e for e in gym.registry if e.startswith("toolenv/") and e not in _GENERIC)
# Parsers a user picks for an env, whose prompts differ (HotpotQA's Search-R1 prompt is the tags one).
VARIANTS = [(e, {}) for e in SHIPPED] + [
    (e, {"parser": "hermes"}) for e in ("toolenv/HotpotQA-v0", "toolenv/HumanEval-v0") if e in SHIPPED
]


def _text_markers(env_id: str, env_kwargs: dict[str, Any]) -> list[str]:
    """Text-format syntax a TRL prompt must not ask for: the answer tag, Hermes' call tag, a tool's tag."""
    with gym.make(env_id, **env_kwargs) as env:
        tools = [t.name for t in env.unwrapped.tools]
    return ["<answer>", "</answer>", "<tool_call>", *(f"<{name}>" for name in tools)]


@pytest.mark.parametrize(("env_id", "env_kwargs"), VARIANTS, ids=[f"{e}{k}" for e, k in VARIANTS])
@pytest.mark.parametrize("answer_tool", ["answer", "submit"])
def test_every_envs_trl_prompt_says_only_to_answer_with_the_tool(
    env_id: str, env_kwargs: dict[str, Any], answer_tool: str
) -> None:
    rows = dataset_rows(env_id, n=3, answer_tool=answer_tool, env_kwargs=env_kwargs)
    markers = _text_markers(env_id, env_kwargs)
    for row in rows:
        text = "\n".join(m["content"] for m in row["prompt"])
        assert [m for m in markers if m in text] == [], text
        assert row["prompt"][0]["role"] == "system"
        assert f"by calling the `{answer_tool}` tool" in row["prompt"][0]["content"]
    # A row naming only its task gets the same text back from `reset` (TRL appends it to an empty prompt).
    env = environment_factory(env_id, answer_tool=answer_tool, env_kwargs=env_kwargs)()
    task = json.loads(rows[0]["task"])
    got = env.reset(task_id=task["id"])
    text = got if isinstance(got, str) else got[-1]["text"]
    assert text == "\n\n".join(m["content"] for m in rows[0]["prompt"])
    env.env.close()


def test_text_mode_prompts_keep_their_own_answer_format() -> None:
    """The rewrites are TRL's: the env's own prompt still says how its parser reads an answer."""
    for env_id in SHIPPED:
        with gym.make(env_id) as env:
            obs, _ = env.reset(options={"task_index": 0})
        assert "<answer>" in obs, env_id


def _text_return(env_id: str, task: toolenv.Task, oracle: Any) -> float:
    """The oracle's return on `task` in the env's own text format."""
    with gym.make(env_id) as env:
        obs, _ = env.reset(options={"task": task})
        total, done, turn = 0.0, False, 0
        while not done:
            obs, reward, term, trunc, _ = env.step(oracle(task, turn, obs))
            total, done, turn = total + float(reward), term or trunc, turn + 1
    return total


def _literal_trl_model(env: TRLEnvironment, row: dict[str, Any], oracle: Any) -> float:
    """A model that knows the oracle's moves and does what its TRL prompt says: it calls the tools,
    and gives the answer by calling the answer tool, unless the prompt tells it to write `<answer>`
    (then it writes it, which TRL does not show the env). Returns TRL's reward."""
    prompt = "\n".join(m["content"] for m in row["prompt"])
    env.reset(**row)
    task, parser = env.env.episode.task, env.env.parser  # type: ignore[union-attr]
    observation = ""
    for turn in range(env.env.max_turns):
        parsed = parser.parse(oracle(task, turn, observation))
        for call in parsed.tool_calls:
            observation = str(getattr(env, call.name)(**call.arguments))
        if parsed.answer is not None:
            if "<answer>" not in prompt and "by calling the `answer` tool" in prompt:
                env.answer(parsed.answer)  # type: ignore[attr-defined]
            break
    return env.get_reward()


@pytest.mark.parametrize("env_id", SHIPPED)
def test_a_model_following_the_trl_prompt_scores_as_the_oracle_does(env_id: str) -> None:
    oracle = registry.load("oracles", env_id.split("/", 1)[1])
    factory = environment_factory(env_id)
    for row in dataset_rows(env_id, n=2):
        task = toolenv.Task.model_validate_json(row["task"])
        expected = _text_return(env_id, task, oracle)
        assert expected > 0
        env = factory()
        assert _literal_trl_model(env, row, oracle) == pytest.approx(expected)
        assert env.env.episode is not None and env.env.episode.terminated
        env.env.close()


def _own_env(**kw: Any) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tasks=[{"id": "a", "question": "2+2? Reply as <answer>N</answer>.", "answer": "4"}], **kw)


def _reworded_env() -> toolenv.ToolEnv:
    return _own_env(answer_tool_rewrites={" as <answer>N</answer>": " with the `{answer_tool}` tool"})


def test_an_envs_own_rewrites_name_the_answer_tool_and_a_prompt_left_asking_for_tags_is_warned_of() -> None:
    with pytest.warns(UserWarning, match=r"task\(s\) of .* \(first 'a'\) still says to write the answer"):
        dataset_rows(_own_env)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = dataset_rows(_reworded_env, answer_tool="submit")
        untouched = dataset_rows(_reworded_env, answer_tool=None)  # no answer tool: nothing to say instead
    assert rows[0]["prompt"][-1] == {"role": "user", "content": "2+2? Reply with the `submit` tool."}
    assert untouched[0]["prompt"] == [{"role": "user", "content": "2+2? Reply as <answer>N</answer>."}]
    env = environment_factory(_reworded_env, answer_tool="submit")()
    note = "Give your final answer by calling the `submit` tool."
    assert env.reset(task_id="a") == f"{note}\n\n2+2? Reply with the `submit` tool."
    assert env.submit(answer="4") and env.get_reward() == 1.0  # type: ignore[attr-defined]
    with _reworded_env() as plain:  # the env's own prompt is as it was
        assert plain.reset(options={"task_id": "a"})[0].endswith("Question: 2+2? Reply as <answer>N</answer>.\n")
