"""ToolEnvAgentLoop on replies that did not end as the model meant: empty, cut by the response
budget, aborted by the server; and its request ids under verl's `full_determinism`."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

from toolenv.integrations.verl._turns import ended_itself
from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS

CALC = "toolenv.integrations.verl.demo:Calculator"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
#: Unanswered episodes score -1, so a lost or misplaced final reward shows.
PENALIZED = {"reward": {"exact_match": 1.0, "answer_avoidance_penalty": 1.0}, "max_turns": 10}


async def _row(env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    kwargs = {"tools": [CALC], "tasks": DEMO_TASKS, **(env_kwargs or {})}
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs))[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"]}


def _gae_return(out: Any) -> float:
    """The return of the response's first model token under verl's own reward placement (last
    response token) and GAE with zero values: the episode's reward unless GAE dropped it."""
    import torch
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    rm_scores = out.as_dict()["rm_scores"].unsqueeze(0)
    mask = torch.tensor([out.response_mask])
    _, returns = compute_gae_advantage_return(rm_scores, torch.zeros_like(rm_scores), mask, gamma=1.0, lam=1.0)
    return float(returns[0, out.response_mask.index(1)].item())


def _assert_stream_is_template(tokenizer: Any, out: Any, messages: list[dict[str, Any]]) -> None:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    rendered = tokenizer.encode(text, add_special_tokens=False)
    stream = out.prompt_ids + out.response_ids
    assert stream == rendered[: len(stream)]
    assert tokenizer.decode(rendered[len(stream) :]) == "\n"


class Server:
    """Scripted `TokenOutput`s: (text, stop_reason) per call; the text's tokens as they are."""

    def __init__(self, tokenizer: Any, replies: list[tuple[str, str | None]]) -> None:
        self.tokenizer, self.replies, self.calls = tokenizer, replies, 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        text, reason = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids), stop_reason=reason)


# ---------------------------------------------------------------- empty replies


async def test_an_empty_reply_ends_the_episode_on_the_models_last_token(tiny_tokenizer, scripted_server, make_loop):
    """The server returns no token after an observation. The episode ends there (no retries of
    the same prompt, no empty turns stepped), without the observation nothing answered: the
    response ends on the model's last token, so GAE keeps the reward."""
    server = scripted_server([CALL, ("", False)])
    loop = make_loop(server, max_turns=6)
    out = await loop.run({"logprobs": True}, **await _row(PENALIZED))
    assert len(server.calls) == 2
    assert out.extra_fields["toolenv_stop_reason"] == "empty_reply"
    assert out.response_ids == server.emitted[0] and out.response_mask == [1] * len(server.emitted[0])
    assert len(out.response_logprobs) == len(out.response_ids)
    assert out.reward_score == -1.0 and out.extra_fields["turn_scores"] == [-1.0]
    assert out.extra_fields["reward_extra_info"]["truncated"] == 1.0
    assert _gae_return(out) == -1.0
    assert [m["role"] for m in loop.messages] == ["system", "user", "assistant"]
    assert out.num_turns == 2
    _assert_stream_is_template(tiny_tokenizer, out, loop.messages)


async def test_an_empty_first_reply_ends_the_episode_with_its_final_reward(tiny_tokenizer, scripted_server, make_loop):
    server = scripted_server([("", False)])
    out = await make_loop(server, max_turns=6).run({"logprobs": True}, **await _row(PENALIZED))
    assert len(server.calls) == 1
    # No model token: one turn-end token, masked out, carries the score (verl's v1 trainer fails
    # an empty response); asked-for log-probs are a list, as verl concatenates the batch's.
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert out.response_ids == [im_end] and out.response_mask == [0] and out.response_logprobs == [0.0]
    assert out.extra_fields["toolenv_stop_reason"] == "empty_reply"
    # No model token carries it, but the score (GRPO's group baseline reads it) is the env's.
    assert out.reward_score == -1.0 and out.extra_fields["reward_extra_info"]["truncated"] == 1.0
    assert out.extra_fields["reward_components"] == {"exact_match": 0.0, "answer_avoidance_penalty": -1.0}


async def test_an_empty_reply_after_a_stop_string_turn_drops_its_closing_token(tiny_tokenizer, make_loop):
    """The mask-0 token that closes a stop-string turn goes with the observation it came with."""
    tags = {"parser": "tags", "parser_kwargs": {"tags": {"calc": ["calculator", "expression"]}}}
    reply = "<calc>6 * 7</calc>"
    server = Server(tiny_tokenizer, [(reply, "completed"), ("", "completed")])
    out = await make_loop(server, stop=["</calc>"]).run({}, **await _row({**PENALIZED, **tags}))
    assert out.response_ids == tiny_tokenizer.encode(reply, add_special_tokens=False)
    assert out.response_mask[-1] == 1 and _gae_return(out) == -1.0


# ---------------------------------------------------------------- cut replies


async def test_a_reply_cut_by_the_response_budget_is_not_stepped(scripted_server, make_loop):
    """A complete call followed by text cut at `response_length`: as in verl's tool_agent, the
    call of a cut turn is not run, the turn stays in the response and the episode ends truncated
    with its final reward on that turn's last token."""
    reply = CALL + " and now I will also check the result with another call"
    server = scripted_server([reply])
    cut = len(server.tokenizer.encode(CALL, add_special_tokens=False)) + 4
    out = await make_loop(server, response_length=cut).run({}, **await _row(PENALIZED))
    assert len(server.calls) == 1 and out.response_ids == server.emitted[0] and len(out.response_ids) == cut
    assert out.extra_fields["toolenv_stop_reason"] == "response_length"
    assert out.extra_fields["reward_extra_info"]["tool_calls"] == 0.0
    assert out.response_mask == [1] * cut
    assert out.reward_score == -1.0 and out.extra_fields["turn_scores"] == [-1.0]
    assert out.extra_fields["reward_components"] == {"exact_match": 0.0, "answer_avoidance_penalty": -1.0}
    assert _gae_return(out) == -1.0


async def test_a_cut_call_is_not_charged_as_an_invalid_call(scripted_server, make_loop):
    """A call cut mid-arguments is not the model's parse error: only the truncation is scored."""
    reward = {"reward": {"exact_match": 1.0, "invalid_call_penalty": 1.0, "answer_avoidance_penalty": 1.0}}
    server = scripted_server([CALL, CALL])
    first = len(server.tokenizer.encode(CALL + "<|im_end|>", add_special_tokens=False))
    loop = make_loop(server, response_length=first + 40, max_turns=10)
    out = await loop.run({}, **await _row(reward))
    assert len(server.calls) == 2 and 0 < len(server.emitted[1]) < first - 1  # cut inside the call
    assert out.extra_fields["toolenv_stop_reason"] == "response_length"
    assert out.extra_fields["reward_extra_info"]["tool_calls"] == 1.0
    assert out.extra_fields["reward_components"] == {
        "exact_match": 0.0,
        "invalid_call_penalty": 0.0,
        "answer_avoidance_penalty": -1.0,
    }
    assert out.reward_score == -1.0 and out.extra_fields["turn_scores"] == [0.0, -1.0]
    assert out.response_mask[-1] == 1 and _gae_return(out) == -1.0


async def test_a_reply_that_ends_exactly_at_the_budget_is_stepped(scripted_server, make_loop):
    server = scripted_server(["<answer>42</answer>"])
    n = len(server.tokenizer.encode("<answer>42</answer><|im_end|>", add_special_tokens=False))
    out = await make_loop(server, response_length=n).run({}, **await _row(PENALIZED))
    assert len(out.response_ids) == n
    assert out.extra_fields["toolenv_stop_reason"] == "terminated" and out.reward_score == 1.0


async def test_an_aborted_generation_is_not_stepped(tiny_tokenizer, make_loop):
    """verl's server reports a request aborted mid-generation (weight sync) with what it had."""
    server = Server(tiny_tokenizer, [(CALL, "aborted")])
    out = await make_loop(server).run({}, **await _row(PENALIZED))
    assert server.calls == 1
    assert out.extra_fields["toolenv_stop_reason"] == "aborted"
    assert out.extra_fields["reward_extra_info"]["tool_calls"] == 0.0
    assert out.response_mask[-1] == 1 and out.reward_score == -1.0 and _gae_return(out) == -1.0


async def test_a_reply_sglang_cut_at_the_context_length_is_not_stepped(tiny_tokenizer, make_loop):
    """verl's SGLang server passes SGLang's finish reason on, and caps `max_new_tokens` by the
    model's context: a reply cut there ("length") is cut, though shorter than the budget."""
    half = CALL[: len(CALL) // 2]
    reward = {"reward": {"exact_match": 1.0, "invalid_call_penalty": 1.0, "answer_avoidance_penalty": 1.0}}
    server = Server(tiny_tokenizer, [(half, "length")])
    out = await make_loop(server).run({}, **await _row(reward))
    assert server.calls == 1 and out.extra_fields["toolenv_stop_reason"] == "response_length"
    assert out.extra_fields["reward_components"]["invalid_call_penalty"] == 0.0
    assert out.reward_score == -1.0 and _gae_return(out) == -1.0


@pytest.mark.parametrize("reason", ["aborted", "abort"])  # verl's vLLM server, SGLang's
async def test_an_aborted_empty_generation_ends_the_episode(tiny_tokenizer, make_loop, reason):
    server = Server(tiny_tokenizer, [(CALL + "<|im_end|>", "completed"), ("", reason)])
    out = await make_loop(server).run({}, **await _row(PENALIZED))
    assert server.calls == 2 and out.extra_fields["toolenv_stop_reason"] == "aborted"
    assert out.response_mask[-1] == 1 and out.reward_score == -1.0 and _gae_return(out) == -1.0


def test_ended_itself_tells_a_finished_reply_from_a_cut_one(tiny_tokenizer):
    def ids(text: str) -> list[int]:
        return list(tiny_tokenizer.encode(text, add_special_tokens=False))

    assert ended_itself(tiny_tokenizer, ids("<answer>42</answer><|im_end|>"), [], [])
    assert ended_itself(tiny_tokenizer, ids("<calc>6 * 7</calc>"), ["</calc>"], [])
    assert not ended_itself(tiny_tokenizer, ids("<calc>6 * 7</calc>"), [], [])
    assert ended_itself(tiny_tokenizer, ids("<calc>6 * 7</calc>"), [], ids("</calc>")[-1:])
    assert not ended_itself(tiny_tokenizer, ids(CALL + " and"), ["</calc>"], [])
    assert not ended_itself(tiny_tokenizer, [], [], [])


# ---------------------------------------------------------------- request ids


async def test_request_ids_follow_verls_full_determinism(tiny_tokenizer, scripted_server, make_loop):
    """Under `rollout.full_determinism` verl routes a request to a replica (each samples with its
    own seed) by a hash of its id and passes the id on to vLLM: as in verl's tool_agent, the id
    is `det-<priority>`, the same in every run. Otherwise every episode gets a fresh one."""
    import numpy as np

    ids: list[set[str]] = []
    for deterministic in (True, True, False, False):
        server = scripted_server([CALL, "<answer>42</answer>"])
        loop = make_loop(server)
        loop.rollout_config.full_determinism = deterministic
        out = await loop.run({}, priority=np.int64(7), **await _row())
        assert out.reward_score == 1.0
        ids.append({call["request_id"] for call in server.calls})
    assert ids[0] == ids[1] == {"det-7"}
    assert len(ids[2]) == len(ids[3]) == 1 and ids[2] != ids[3] and ids[2] != {"det-7"}


# ---------------------------------------------------------------- the model's context (max_model_len)


class ContextServer:
    """vLLM's rule for `rollout.max_model_len` (verl's vLLM server): `max_tokens` is clamped to the
    room left in the context, a reply cut there is reported "completed" like any other, and a
    prompt that leaves no room is refused with a ValueError."""

    def __init__(self, tokenizer: Any, replies: list[str], max_model_len: int) -> None:
        self.tokenizer, self.replies, self.max_model_len = tokenizer, replies, max_model_len
        self.prompts: list[list[int]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"Prompt length ({len(prompt_ids)}) leaves no room to generate within {self.max_model_len}"
            )
        self.prompts.append(list(prompt_ids))
        text = self.replies[min(len(self.prompts) - 1, len(self.replies) - 1)]
        ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        ids = ids[: max(1, min(sampling_params["max_tokens"], room))]
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids), stop_reason="completed")


def _prompt_len(tokenizer: Any, row: dict[str, Any]) -> int:
    text = tokenizer.apply_chat_template(row["raw_prompt"], add_generation_prompt=True, tokenize=False)
    return len(tokenizer.encode(text, add_special_tokens=False))


async def test_a_reply_cut_by_the_models_context_is_not_stepped(tiny_tokenizer, make_loop):
    """`rollout.max_model_len` below prompt + response length: the server cuts the reply where the
    context ends and calls it completed. The loop must see the cut (a half-written turn is not
    run) instead of stepping it and sending the server a prompt that no longer fits."""
    row = await _row(PENALIZED)
    call = tiny_tokenizer.encode(CALL, add_special_tokens=False)
    max_model_len = _prompt_len(tiny_tokenizer, row) + len(call) + 4
    server = ContextServer(tiny_tokenizer, [CALL + " and now I will also check the result"], max_model_len)
    out = await make_loop(server, max_model_len=max_model_len).run({"logprobs": True}, **row)
    assert len(server.prompts) == 1
    assert len(out.prompt_ids) + len(out.response_ids) == max_model_len
    assert out.response_mask == [1] * len(out.response_ids)
    assert out.extra_fields["toolenv_stop_reason"] == "max_model_len"
    assert out.extra_fields["reward_extra_info"]["tool_calls"] == 0.0
    assert out.reward_score == -1.0 and _gae_return(out) == -1.0


async def test_an_observation_that_overflows_the_models_context_is_not_appended(tiny_tokenizer, make_loop):
    """The call fits, its observation would fill the context: the episode ends on the model's
    last token, as when the observation overflows `response_length`."""
    row = await _row(PENALIZED)
    call = tiny_tokenizer.encode(CALL + "<|im_end|>", add_special_tokens=False)
    max_model_len = _prompt_len(tiny_tokenizer, row) + len(call) + 5
    server = ContextServer(tiny_tokenizer, [CALL, "<answer>42</answer>"], max_model_len)
    out = await make_loop(server, max_model_len=max_model_len).run({"logprobs": True}, **row)
    assert len(server.prompts) == 1
    assert out.response_ids == call and out.response_mask == [1] * len(call)
    assert len(out.response_logprobs) == len(call)
    assert out.extra_fields["toolenv_stop_reason"] == "max_model_len"
    assert out.reward_score == -1.0 and _gae_return(out) == -1.0


async def test_a_prompt_that_fills_the_models_context_gets_an_empty_response(tiny_tokenizer, make_loop):
    row = await _row(PENALIZED)
    max_model_len = _prompt_len(tiny_tokenizer, row)
    server = ContextServer(tiny_tokenizer, [CALL], max_model_len)
    out = await make_loop(server, max_model_len=max_model_len).run({"logprobs": True}, **row)
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert server.prompts == [] and out.response_ids == [im_end] and out.response_logprobs == [0.0]
    assert out.response_mask == [0]
    assert out.extra_fields["toolenv_stop_reason"] == "max_model_len" and out.reward_score == -1.0
