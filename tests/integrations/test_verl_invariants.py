"""ToolEnvAgentLoop's token invariants over many random episodes (CPU, offline, tiny Qwen tokenizer).

Random replies (calls, several calls, answers, text without an action, empty replies, aborted
generations), roles, stop strings, response budgets and model contexts; every episode must keep:
ids, mask and log-probs of one length within the budget; model tokens (mask 1) exactly the
server's tokens with their log-probs, in order; observation tokens with log-prob 0.0; every
generation's prompt a prefix of the final stream (token-in); a response ending on a model
token (verl puts the reward there), or, with no model token, one masked turn-end token; the
reward the sum of the turn scores; and, for chat observations, the stream a prefix of the chat
template's rendering of the final conversation (no retokenization drift).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
TAG_CALL = "<calc>6 * 7</calc>"
TAGS = {"parser": "tags", "parser_kwargs": {"tags": {"calc": ["calculator", "expression"]}}}
END = "<|im_end|>"


async def _row(env_kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = {"tools": ["toolenv.integrations.verl.demo:Calculator"], "tasks": DEMO_TASKS, **env_kwargs}
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs))[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"]}


class Server:
    """Scripted replies and stop reasons; distinct log-probs per token."""

    def __init__(self, tokenizer: Any, replies: list[str], reasons: list[str | None]) -> None:
        self.tokenizer, self.replies, self.reasons = tokenizer, replies, reasons
        self.calls: list[list[int]] = []
        self.emitted: list[tuple[list[int], list[float]]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        i = len(self.calls)
        self.calls.append(list(prompt_ids))
        text = self.replies[min(i, len(self.replies) - 1)]
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling_params["max_tokens"]]
        lps = [-(1 + i) - j / 1000 for j in range(len(ids))]
        self.emitted.append((ids, lps))
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason=self.reasons[min(i, len(self.reasons) - 1)])


@pytest.mark.parametrize("seed", range(120))
async def test_random_episodes_keep_the_token_invariants(seed: int, tiny_tokenizer: Any, make_loop: Any) -> None:
    rng = random.Random(seed)
    role = rng.choice(["tool", "user", "inline"])
    tags = role == "inline" or rng.random() < 0.3
    env_kwargs: dict[str, Any] = {**(TAGS if tags else {}), "max_turns": rng.choice([2, 3, 10])}
    stop = ["</calc>"] if tags else rng.choice([[], ["</tool_call>"]])
    call = TAG_CALL if tags else CALL
    # Replies end as a server ends them: on the turn's end, on a stop string, or cut by max_tokens.
    pool = [call if stop else call + END, call + END, f"{call}\n{call}{END}", f"<answer>42</answer>{END}", ""]
    pool += [f"no action here{END}", f"x{END}"]
    replies = [rng.choice(pool) for _ in range(8)]
    reasons = [rng.choice(["completed", "completed", "completed", "aborted", None]) for _ in range(8)]
    server = Server(tiny_tokenizer, replies, reasons)
    budget = rng.choice([20, 40, 60, 90, 150, 400])
    context = rng.choice([None, None, 300, 350, 420])
    loop = make_loop(
        server,
        response_length=budget,
        max_turns=rng.choice([2, 4, 8]),
        max_model_len=context,
        observation_role="user" if role == "tool" and tags else role,
        stop=stop,
    )
    out = await loop.run({"logprobs": True}, **await _row(env_kwargs))

    n = len(out.response_ids)
    assert n == len(out.response_mask) == len(out.response_logprobs) <= budget
    generated = any(out.response_mask)  # no env fails here: all mask 0 is a response without model tokens
    if not generated:  # one masked turn-end token carries the score (verl's v1 trainer fails an empty response)
        assert out.response_ids == [tiny_tokenizer.convert_tokens_to_ids(END)] and out.response_logprobs == [0.0]
    if context and generated:
        assert len(out.prompt_ids) + n <= context
    stream = out.prompt_ids + out.response_ids
    for prompt in server.calls:
        if len(prompt) <= len(stream):  # longer: an observation taken back after an empty reply
            assert stream[: len(prompt)] == prompt
    model = [(t, lp) for t, m, lp in zip(out.response_ids, out.response_mask, out.response_logprobs, strict=True) if m]
    assert model == [(t, lp) for ids, lps in server.emitted for t, lp in zip(ids, lps, strict=True)][: len(model)]
    assert all(lp == 0.0 for m, lp in zip(out.response_mask, out.response_logprobs, strict=True) if not m)
    if generated:
        assert out.response_mask[-1] == 1
    assert sum(out.extra_fields["turn_scores"]) == pytest.approx(out.reward_score)
    if role != "inline" and generated:
        text = tiny_tokenizer.apply_chat_template(loop.messages, tokenize=False, add_generation_prompt=False)
        assert stream == tiny_tokenizer.encode(text, add_special_tokens=False)[: len(stream)]
