"""`compute_score` for verl's custom reward function hook, scored by the env's own reward.

Use it when the episode does not run through `ToolEnvAgentLoop` (which returns the
env's reward itself), e.g. with verl's `tool_agent` loop and `ToolEnvBaseTool`:

    reward.custom_reward_function.path=examples/verl/toolenv_reward.py
    reward.custom_reward_function.name=compute_score

verl passes the decoded response (tool observations included) as `solution_str`;
the env's parser finds the final answer in it, and the env's reward scores that
answer against the row's task. Tools are not re-run. The response is scored as the
episode's one turn (its calls parsed, with no results), so rewards that read turns
(`format`, per-turn penalties) score what the whole response shows rather than 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from toolenv import _aio
from toolenv._text import clean_parse
from toolenv.episode import Turn
from toolenv.integrations.verl.envs import env_spec_from_row, plain, shared_pool, task_from_row

__all__ = ["acompute_score", "compute_score"]


async def acompute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    reward_keys: Sequence[str] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """The env's final reward for the answer in `solution_str`: `{"score", "answered", "reward/<part>"...}`.

    `reward_keys` fixes the `reward/<part>` keys (missing parts 0.0, others left out): verl takes
    the keys of a batch's first sample and reads them from every sample, so a batch mixing envs
    whose rewards have different parts needs them (`reward.custom_reward_function.reward_kwargs`).
    The default is the env's reward parts.

    Raises:
        ValueError: `extra_info` does not name an env and a task (rows from `toolenv verl-data` do).
    """
    env_id, env_kwargs = env_spec_from_row(extra_info)
    task = task_from_row(extra_info)
    async with shared_pool().lease(env_id, env_kwargs) as env:
        await env.areset(options={"task": task})
        episode = env.episode
        assert episode is not None  # areset just made it
        rf = env.reward_fn
        solution_str, parsed = clean_parse(env.parser, solution_str)  # as a step reads it: no lone surrogates
        turn = Turn(solution_str, parsed)  # the calls' results are in the text, not re-run
        episode.turns.append(turn)
        episode.answer = parsed.answer
        episode.terminated = True
        components = await rf.turn_components(episode, turn) if rf.scores_turns else rf.zero_components()
        for k, v in (await rf.final_components(episode)).items():
            components[k] = components.get(k, 0.0) + v
        score = rf.weighted(components)
    out = {"score": score, "answered": float(episode.answer is not None)}
    keys = list(components) if reward_keys is None else [str(k) for k in plain(reward_keys)]
    out.update({f"reward/{k}": float(components.get(k, 0.0)) for k in keys})
    return out


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    reward_keys: Sequence[str] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """Sync twin of `acompute_score`, on an event loop the calling thread keeps between calls
    (verl calls it once per sample, from its own threads).

    Raises:
        RuntimeError: called inside a running event loop; await `acompute_score` there.
    """
    if asyncio._get_running_loop() is not None:  # in asyncio.__all__; no exception raised per call
        raise RuntimeError("compute_score cannot run inside an event loop; use `await acompute_score(...)`")
    coro = acompute_score(data_source, solution_str, ground_truth, extra_info, reward_keys=reward_keys, **kwargs)
    return _aio.run_on_thread_loop(coro)
