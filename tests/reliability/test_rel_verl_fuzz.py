"""Mutated model replies through verl's agent loop (`ToolEnvAgentLoop`), as a server returns them.

The server here answers each generation with a mutated reply (the fuzzer of `rel_fuzz.py`
over calls in the env's own format and answers), or with nothing, a reply cut at a random
length (finish reason "length"), one cut by the response budget, or one the server aborted.
Each observation role (`tool`, `user`, `inline`) runs with the hermes and the tags parser,
with random response budgets and turn limits. After every episode the output must be one verl
can train on:

- no exception escapes `run`;
- ids, mask and log-probs have one length, within `response_length`;
- the model's tokens (mask 1) are exactly what the server returned, in order, with their
  log-probs; every other token has mask 0 and log-prob 0.0;
- each generation was asked from the stream as it then stood, for what was left of the budget;
- a non-empty response ends on a model token (verl puts the reward on the last token, and
  PPO's GAE drops one on a mask-0 token); the score is the sum of the turn scores, finite;
- `inline` keeps the episode one assistant turn (no role token in the response);
- no more generations than the loop's `max_turns`.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")
pytest.importorskip("transformers", reason="the verl loop needs transformers (installed with verl)")

from rel_fuzz import Mutator

from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS
from toolenv.integrations.verl.envs import EnvPool

CALC = "toolenv.integrations.verl.demo:Calculator"
TAGS = {"parser": "tags", "parser_kwargs": {"tags": {"calc": ["calculator", "expression"]}}}
#: Unanswered episodes score -1: a lost final reward shows in the score.
REWARD = {"reward": {"exact_match": 1.0, "answer_avoidance_penalty": 1.0}, "max_turns": 10}
CORPUS = {
    "hermes": [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "(12 + 30) / 2"}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1 / 0"}}</tool_call>',
        "The answer is <answer>42</answer>",
        "<answer>21</answer>",
        "I am not sure.",
    ],
    "tags": [
        "<calc>6 * 7</calc>",
        "<think>Compute it.</think>\n<calc>(12 + 30) / 2</calc>",
        "<calc>1 / 0</calc>",
        "<answer> 42 </answer>",
        "<answer>21</answer>",
        "I am not sure.",
    ],
}
CASES = [("hermes", "tool"), ("hermes", "user"), ("hermes", "inline"), ("tags", "user"), ("tags", "inline")]
EPISODES = 500  # per case


class FuzzServer:
    """verl's server-manager interface, answering with mutated, empty, cut and aborted replies."""

    def __init__(self, tokenizer: Any, mutate: Mutator, rng: random.Random) -> None:
        self.tokenizer, self.mutate, self.rng = tokenizer, mutate, rng
        self.calls: list[dict[str, Any]] = []
        self.counter = 0

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        r, budget = self.rng, int(sampling_params["max_tokens"])
        roll = r.random()
        reason: str | None = r.choice(["completed", "stop", None])
        if roll < 0.04:  # nothing at all: a stop token at once, the context full
            ids: list[int] = []
            reason = r.choice(["completed", "stop", "aborted", "abort"])
        else:
            text = self.mutate().encode("utf-8", "replace").decode("utf-8")  # no lone surrogates
            if r.random() < 0.6:
                text += "<|im_end|>"  # the model ended its turn (else a stop string, or neither)
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            if roll < 0.1:  # cut by the model's context (SGLang's "length") at a random point
                ids, reason = ids[: r.randint(0, len(ids))], "length"
            elif roll < 0.13:  # aborted mid-generation (a weight sync)
                ids, reason = ids[: r.randint(0, len(ids))], r.choice(["aborted", "abort"])
            elif roll < 0.15:  # a server that returns more than it was asked for
                ids = ids + ids
            else:
                ids = ids[:budget]
        logprobs = []
        for _ in ids:
            self.counter += 1
            logprobs.append(-1e-4 * self.counter)
        self.calls.append({"prompt_ids": list(prompt_ids), "max_tokens": budget, "ids": ids, "logprobs": logprobs})
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason=reason)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    return AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("verl-tok"), with_model=False))


def make_loop(tokenizer: Any, server: Any, pool: EnvPool, response_length: int, max_turns: int, **kw: Any) -> Any:
    """A ToolEnvAgentLoop built the way verl's worker builds it."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from toolenv.integrations.verl.agent_loop import ToolEnvAgentLoop

    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 1024,
                    "response_length": response_length,
                    "full_determinism": False,
                    "multi_turn": {"format": "hermes", "max_user_turns": max_turns, "max_assistant_turns": max_turns},
                }
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    return ToolEnvAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        hf_model_type="qwen2",
        tools=ToolListWrap([]),
        pool=pool,
        **kw,
    )


def check_episode(out: Any, loop: Any, server: FuzzServer, response_length: int, max_turns: int, role: str) -> None:
    """The invariants of one episode's output (see the module docstring)."""
    from toolenv.integrations.verl.agent_loop import STOP_REASONS

    ids, mask, lps = out.response_ids, out.response_mask, out.response_logprobs
    assert len(ids) == len(mask) == len(lps) <= response_length
    assert set(mask) <= {0, 1}
    calls = server.calls
    assert 1 <= len(calls) <= max_turns
    model = [t for c in calls for t in c["ids"][: c["max_tokens"]]]
    model_lps = [lp for c in calls for lp in c["logprobs"][: c["max_tokens"]]]
    assert [t for t, m in zip(ids, mask, strict=True) if m] == model, "model tokens changed, lost or added"
    assert [lp for lp, m in zip(lps, mask, strict=True) if m] == model_lps
    assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if not m)
    stream = out.prompt_ids + ids
    for call in calls:
        used = len(call["prompt_ids"]) - len(out.prompt_ids)
        assert call["max_tokens"] == response_length - used > 0, "asked for what is left of the budget"
        if call["ids"]:  # a call that got tokens: its prompt and its tokens are the stream's
            end = len(call["prompt_ids"])
            assert stream[:end] == call["prompt_ids"]
            assert stream[end : end + min(len(call["ids"]), call["max_tokens"])] == call["ids"][: call["max_tokens"]]
    if any(mask):
        assert mask[-1] == 1, "the response ends on a mask-0 token: GAE would drop the reward"
    else:  # no model token: one masked placeholder, where verl's v1 trainer puts the score
        assert len(mask) == 1 and lps == [0.0], "a response without model tokens is one masked token"
    turn_scores = out.extra_fields["turn_scores"]
    assert math.isfinite(out.reward_score) and out.reward_score == pytest.approx(sum(turn_scores))
    reason = out.extra_fields["toolenv_stop_reason"]
    assert reason in STOP_REASONS
    if reason == "empty_reply":
        assert not calls[-1]["ids"]
    if role == "inline":
        im_start = loop.tokenizer.convert_tokens_to_ids("<|im_start|>")
        assert im_start not in ids, "an inline episode is one assistant turn"
        assert [m["role"] for m in loop.messages].count("assistant") <= 1


@pytest.mark.parametrize(("parser", "role"), CASES, ids=[f"{p}-{r}" for p, r in CASES])
def test_rel_verl_loop_fuzzed_replies(tokenizer: Any, parser: str, role: str) -> None:
    rng = random.Random(f"verl-{parser}-{role}")
    mutate = Mutator(CORPUS[parser], rng, huge_every=10**9)  # a reply is cut to the budget anyway
    env_kwargs = {"tools": [CALC], "tasks": DEMO_TASKS, **REWARD, **(TAGS if parser == "tags" else {})}
    stop = ["</calc>"] if parser == "tags" else []
    reasons: dict[str, int] = {}
    generations = 0

    async def run() -> None:
        nonlocal generations
        rows = await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=env_kwargs)
        pool = EnvPool()
        try:
            for i in range(EPISODES):
                row = rows[i % len(rows)]
                response_length = rng.choice([32, 256, 1024, 2048])
                max_turns = rng.randint(1, 6)
                server = FuzzServer(tokenizer, mutate, rng)
                loop = make_loop(tokenizer, server, pool, response_length, max_turns, observation_role=role, stop=stop)
                out = await loop.run({"logprobs": True}, raw_prompt=row["prompt"], extra_info=row["extra_info"])
                check_episode(out, loop, server, response_length, max_turns, role)
                reason = out.extra_fields["toolenv_stop_reason"]
                reasons[reason] = reasons.get(reason, 0) + 1
                generations += len(server.calls)
        finally:
            await pool.aclose()

    asyncio.run(run())
    print(f"\n[fuzz] verl loop {parser}/{role}: {EPISODES} episodes, {generations} replies, stop reasons {reasons}")
    # The fuzzer reached every way an episode can end but the env's own truncation (10 turns).
    assert {"terminated", "max_turns", "response_length", "empty_reply", "aborted"} <= set(reasons)
