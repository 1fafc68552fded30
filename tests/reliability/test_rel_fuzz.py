"""Fuzzing every registered env with broken, mutated and near-valid model output.

No exception may escape `step`/`astep`, and an action with nothing usable in it
must come back as an error observation. Each env gets `TOOLENV_REL_FUZZ_ACTIONS`
mutated actions (10,000 in CI) through several concurrent episodes with a huge
`max_turns`, resetting when an answer ends one; hypothesis adds a smaller
structured part, and a short run keeps each env's default reward (the code
envs' bulk run scores with `format` so it does not grade every `<answer>`).
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rel_fuzz import FRAGMENTS, Mutator, StepStats, check_step, format_call, near_valid_calls
from rel_support import (
    CORE,
    CORE_PARSERS,
    CORE_VARIANTS,
    FUZZ_ACTIONS,
    OPTION_VARIANTS,
    cheap,
    core_corpus,
    env_names,
    make_env,
    option_variants,
    oracle,
    sandbox_only,
)

import toolenv
from toolenv.parsers import CodeBlockParser

ENVS = [*env_names(), *CORE_VARIANTS, *option_variants()]
# The built-in plugins' envs and the option variants of some; CI installs them all, a partial
# install skips the missing ones.
BUILT_IN = [
    "Chinook-v0", "HotpotQA-v0", "HumanEval-v0", "MBPP-v0", "MCP-v0", "Spider-v0", "VisualSearch-v0",
    *OPTION_VARIANTS,
]  # fmt: skip
LANES = 4  # concurrent episodes per env: the code sandbox runs blocks in parallel


@pytest.mark.parametrize("name", BUILT_IN)
def test_rel_built_in_env_is_fuzzed(name: str) -> None:
    """Says (as a skip with the reason) which built-in env this run does not cover."""
    if name not in ENVS:
        pytest.skip(f"toolenv/{name} is not installed, so it is not fuzzed (install its plugin to cover it)")
    env = make_env(name, **sandbox_only(name))
    assert env.tools and env.tasks and oracle(name) is not None, "fuzzing needs tools, tasks and an oracle"
    env.close()


def test_rel_every_parser_is_fuzzed() -> None:
    # The core env is fuzzed with each model format (a variant per parser); `tags` and
    # `codeblock` through the plugin envs that use them. A new parser must join one or the other.
    from toolenv.parsers import parser_names

    assert {"hermes", *CORE_PARSERS, "tags", "codeblock"} == set(parser_names())


def test_rel_mutations_splice_every_formats_markers() -> None:
    # The mutator's alphabet takes each parser's markers from the parser itself, so a format
    # added later is fuzzed with its own tokens, not only with those of older formats.
    for marker in ("<｜tool▁sep｜>", "<|tool_call_argument_begin|>", "<arg_value>", "<|tool_call>", "</atem:invoke>"):
        assert marker in FRAGMENTS
    assert len(FRAGMENTS) == len(set(FRAGMENTS))


def corpus_for(name: str, env: toolenv.ToolEnv, tasks: int = 6) -> list[str]:
    """Valid actions (the oracle's, or the core env's list) plus near-valid schema-built calls."""
    actions = core_corpus(name) if name == CORE or name in CORE_VARIANTS else []
    policy = oracle(name)
    if policy is not None:
        for i in range(tasks):
            obs, _ = env.reset(options={"task_index": i})
            assert env.episode is not None
            for turn in range(4):
                action = policy(env.episode.task, turn, obs)
                actions.append(action)
                obs, _, term, trunc, _ = env.step(action)
                if term or trunc:
                    break
    return actions + near_valid_calls(env)


async def fuzz_lane(env: toolenv.ToolEnv, mutate: Mutator, n: int, seed: int) -> StepStats:
    """Drive one env with `n` mutated actions through `astep`, resetting when an episode ends."""
    stats = StepStats()
    await env.areset(seed=seed)
    stats.episodes += 1
    for _ in range(n):
        action = mutate()
        try:
            out = await env.astep(action)
        except Exception as exc:
            raise AssertionError(f"astep raised {type(exc).__name__}: {exc} on action {action[:300]!r}") from exc
        check_step(env, action, out, stats)
        if out[2] or out[3]:
            await env.areset()
            stats.episodes += 1
    return stats


@pytest.mark.parametrize("name", ENVS)
def test_rel_mutation_fuzz(name: str) -> None:
    """FUZZ_ACTIONS mutated actions per env: no exception escapes, malformed input gets errors."""
    overrides: dict[str, Any] = {"max_turns": 10**6, **cheap(name)}
    seed_env = make_env(name, **sandbox_only(name))
    corpus = corpus_for(name, seed_env)
    seed_env.close()
    envs = [make_env(name, **overrides) for _ in range(LANES)]
    per_lane = -(-FUZZ_ACTIONS // LANES)

    async def run() -> StepStats:
        lanes = [
            fuzz_lane(env, Mutator(corpus, random.Random(f"{name}-{i}")), per_lane, seed=i)
            for i, env in enumerate(envs)
        ]
        total = StepStats()
        for s in await asyncio.gather(*lanes):
            total.merge(s)
        for env in envs:
            await env.aclose()
        return total

    stats = asyncio.run(run())
    print(f"\n[fuzz] {name}: {stats}")
    assert stats.actions >= FUZZ_ACTIONS
    assert stats.malformed > stats.actions // 4, "the fuzzer mostly produced malformed actions"
    assert stats.episodes > 1
    # A ```python block always carries a string, so only the other parsers can produce invalid calls.
    assert stats.invalid_calls > 0 or isinstance(envs[0].parser, CodeBlockParser)
    assert stats.max_action_chars >= 100_000 or FUZZ_ACTIONS < 2_000, "huge actions were tried"


@pytest.mark.parametrize("name", ENVS)
def test_rel_fuzz_default_reward(name: str) -> None:
    """A shorter run with the env's own reward (the code envs grade every answer here)."""
    env = make_env(name, **sandbox_only(name))
    corpus = corpus_for(name, env, tasks=3)
    env.close()
    env = make_env(name, max_turns=8, **sandbox_only(name))
    stats = asyncio.run(fuzz_lane(env, Mutator(corpus, random.Random(name)), 300, seed=0))
    env.close()
    assert stats.actions == 300 and stats.episodes > 1


def _structured(draw: st.DrawFn, env: toolenv.ToolEnv) -> str:
    """Hypothesis-built actions: schema-named calls with arbitrary JSON, or fragment soup."""
    names = [t.name for t in env.tools] + ["", "nope"]
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
        max_leaves=12,
    )
    keys = [k for t in env.tools for k in t.Args.model_fields] + ["zzz"]
    kind = draw(st.integers(0, 2))
    if kind == 0:
        args = draw(st.dictionaries(st.sampled_from(keys), json_values, max_size=3))
        return format_call(env.parser, draw(st.sampled_from(names)), args)
    if kind == 1:
        return "".join(draw(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=25)))
    return draw(st.text(max_size=200))


@pytest.mark.parametrize("name", ENVS)
def test_rel_hypothesis_actions(name: str) -> None:
    """Hypothesis's structured actions (100 per env) keep the same invariants."""
    env = make_env(name, max_turns=10**6, **cheap(name))
    env.reset(seed=0)
    stats = StepStats()

    @settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        action = data.draw(st.composite(lambda draw: _structured(draw, env))())
        out = env.step(action)
        check_step(env, action, out, stats)
        if out[2] or out[3]:
            env.reset()

    one()
    env.close()
    assert stats.actions >= 100
    json.dumps(vars(stats))  # figures stay serialisable for the report


# Observations should stay bounded whatever the model wrote; the fuzzer found two ways they do not.
OBS_BOUND = 64 * 1024


def test_rel_observation_bounded_for_huge_unknown_tool_name() -> None:
    env = make_env(CORE, max_turns=10)
    env.reset(seed=0)
    obs, *_ = env.step("<tool_call>" + json.dumps({"name": "x" * 1_000_000, "arguments": {}}) + "</tool_call>")
    env.close()
    assert len(obs) <= OBS_BOUND, f"observation of {len(obs)} characters"


def test_rel_observation_bounded_for_many_unclosed_tags() -> None:
    env = make_env(CORE, max_turns=10)
    env.reset(seed=0)
    obs, *_ = env.step("<tool_call>" * 50_000)
    env.close()
    assert len(obs) <= OBS_BOUND, f"observation of {len(obs)} characters"


@pytest.mark.parametrize("name", ENVS)
def test_rel_observation_bounded_for_huge_valid_looking_action(name: str) -> None:
    """A megabyte inside one well-formed call of the env's own tool comes back truncated."""
    env = make_env(name, max_turns=10, **cheap(name))
    env.reset(seed=0)
    tool = env.tools[0]
    props = tool.schema()["function"]["parameters"].get("properties", {})
    key = next((k for k, p in props.items() if p.get("type") == "string"), next(iter(props), "x"))
    obs, _, _, _, info = env.step(format_call(env.parser, tool.name, {key: "é" * 1_000_000}))
    env.close()
    assert info["tool_results"] and len(obs) <= OBS_BOUND, f"observation of {len(obs)} characters"
