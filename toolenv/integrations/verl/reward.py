"""`compute_score` for verl's custom reward function hook, scored by the env's own reward.

Use it when the episode does not run through `ToolEnvAgentLoop` (which returns the
env's reward itself), e.g. with verl's `tool_agent` loop and `ToolEnvBaseTool`:

    reward.custom_reward_function.path=examples/verl/toolenv_reward.py
    reward.custom_reward_function.name=compute_score

verl passes the decoded response (tool observations included) as `solution_str`.
The observations the env's parser writes (`format_results`: Search-R1's
`<information>…</information>`, Hermes' `<tool_response>…</tool_response>`...) are taken
out first, so that only the model's own text is read: an `<answer>` inside a retrieved
page is not the model's answer. The env's parser then finds the final answer in that
text, and the env's reward scores it against the row's task. Tools are not re-run. The
model's text is scored as the episode's one turn (its calls parsed, with no results), so
rewards that read turns (`format`, per-turn penalties) score what it shows rather than 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from toolenv import _aio
from toolenv._text import clean_parse
from toolenv.episode import Turn
from toolenv.integrations._metrics import answered
from toolenv.integrations.verl.envs import env_spec_from_row, plain, shared_pool, task_from_row
from toolenv.parsers.base import ActionParser
from toolenv.types import ToolResult

__all__ = ["acompute_score", "compute_score", "model_text", "observation_marks"]

#: A result's text that no format changes (letters only: JSON and XML escape nothing in it).
_PLACEHOLDER = "TOOLENVRESULTPLACEHOLDER"


def observation_marks(parser: ActionParser) -> tuple[tuple[str, str], ...]:
    """The (opening, closing) text around a result in `parser`'s observations, found by formatting
    a placeholder result, error and parse error (`<information>`, `</information>` for Search-R1's
    tags). Derived from the parser rather than listed, so every parser, a custom one too, gives
    its own. Empty when a format writes a result bare (pythonic): nothing marks it in the text.
    """
    renders: list[tuple[Callable[[Any], str], Any]] = [
        (parser.format_results, [ToolResult(text=_PLACEHOLDER)]),
        (parser.format_results, [ToolResult.error(_PLACEHOLDER)]),
        (parser.format_errors, [_PLACEHOLDER]),
    ]
    found: list[tuple[str, str]] = []
    for render, arg in renders:
        try:
            text = render(arg)
        except Exception:  # noqa: BLE001, S112 - a format that cannot write this one gives no marks for it
            continue
        before, sep, after = text.partition(_PLACEHOLDER)
        pair = (before.strip(), after.strip())  # the line breaks around them vary with the trainer
        if sep and _PLACEHOLDER not in after and all(pair) and pair not in found:
            found.append(pair)
    return tuple(found)


def model_text(text: str, marks: Sequence[tuple[str, str]]) -> str:
    """`text` with each observation `marks` delimit replaced by a line break: what the model wrote.

    Only whole observations go (an opening the model wrote and never closed stays its text).
    Linear in `text`: each mark's next opening is looked up once per observation passed, and a
    closing that is missing once is missing for every later opening of its mark.
    """
    upcoming = {pair: text.find(pair[0]) for pair in marks}
    out: list[str] = []
    pos = 0
    while live := [(at, pair) for pair, at in upcoming.items() if at >= 0]:
        at, (opening, closing) = min(live)
        end = text.find(closing, at + len(opening))
        if end < 0:
            del upcoming[(opening, closing)]
            continue
        out += [text[pos:at], "\n"]
        pos = end + len(closing)
        for pair, next_at in upcoming.items():
            if 0 <= next_at < pos:
                upcoming[pair] = text.find(pair[0], pos)
    out.append(text[pos:])
    return "".join(out)


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

    The answer is read from the model's own text: the observations the env's parser writes are
    taken out first (`model_text`, `observation_marks`).

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
        own = model_text(solution_str, observation_marks(env.parser))  # an answer in a retrieved page is not one
        solution_str, parsed = clean_parse(env.parser, own)  # as a step reads it: no lone surrogates
        turn = Turn(solution_str, parsed)  # the calls' results are in the text, not re-run
        episode.turns.append(turn)
        episode.answer = parsed.answer
        episode.terminated = True
        components = await rf.turn_components(episode, turn) if rf.scores_turns else rf.zero_components()
        for k, v in (await rf.final_components(episode)).items():
            components[k] = components.get(k, 0.0) + v
        score = rf.weighted(components)
    out = {"score": score, "answered": answered(episode.answer)}
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
