"""ToolEnvAgentLoop over `toolenv/Remote-v0`: the same sample as against the local env."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")
pytest.importorskip("starlette", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")

from _remote import serving

from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS, Calculator
from toolenv.integrations.verl.envs import EnvPool

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'


async def _sample(env_id: str, env_kwargs: dict[str, Any], scripted_server: Any, make_loop: Any) -> Any:
    row = (await abuild_rows(env_id, env_kwargs=env_kwargs))[0]
    pool = EnvPool()
    loop = make_loop(scripted_server([CALL, "The answer is <answer>42</answer>"]), pool=pool)
    try:
        return await loop.run(
            {"temperature": 1.0, "logprobs": True},
            raw_prompt=row["prompt"],
            extra_info=row["extra_info"],
            data_source=row["data_source"],
        ), loop.messages
    finally:
        await pool.aclose()


async def test_agent_loop_over_a_remote_env_equals_the_local_one(scripted_server: Any, make_loop: Any) -> None:
    local, local_messages = await _sample(
        "toolenv/ToolEnv-v0",
        {"tools": ["toolenv.integrations.verl.demo:Calculator"], "tasks": DEMO_TASKS},
        scripted_server,
        make_loop,
    )
    with serving(lambda: gym.make("toolenv/ToolEnv-v0", tools=[Calculator()], tasks=DEMO_TASKS)) as url:
        remote, remote_messages = await _sample("toolenv/Remote-v0", {"url": url}, scripted_server, make_loop)
    assert remote.reward_score == local.reward_score == 1.0
    assert (remote.prompt_ids, remote.response_ids, remote.response_mask) == (
        local.prompt_ids,
        local.response_ids,
        local.response_mask,
    )
    assert remote_messages == local_messages
    assert _timeless(remote.extra_fields) == _timeless({**local.extra_fields, "toolenv_env_id": "toolenv/Remote-v0"})


def _timeless(value: Any) -> Any:
    """`value` without its wall-clock fields (tool latency)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "tool_latency_s"}
    return value
