"""ToolEnvAgentLoop with `observation_role="inline"`: Search-R1's one-response episodes.

The whole episode is one assistant turn: after `<search> q </search>` (generation stopped on
`</search>`) the raw text `\\n\\n<information>...</information>\\n\\n`, tokenized on its own, joins
the response with mask 0 and generation continues in the same turn. Run on the real
`toolenv/HotpotQA-v0` (bundled BM25 index) with the tiny Qwen-style tokenizer.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")
pytest.importorskip("toolenv_search", reason="the HotpotQA env is in the toolenv-search plugin")

from pydantic import BaseModel

import toolenv
from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS
from toolenv.integrations.verl.envs import EnvPool, make_env, task_from_row
from toolenv_search.envs import gold_query

HOTPOT = "toolenv/HotpotQA-v0"
#: One passage per search keeps the observation short; unanswered episodes score -1, so a lost or
#: misplaced final reward shows.
HOTPOT_KWARGS = {"topk": 1, "reward": {"exact_match": 1.0, "answer_avoidance_penalty": 1.0}}
STOP = ["</search>"]
#: A passage is some 600 tokens of the tiny byte-level tokenizer.
RESPONSE_LENGTH = 2048


async def _hotpot_row() -> dict[str, Any]:
    row = (await abuild_rows(HOTPOT, env_kwargs=HOTPOT_KWARGS, limit=1))[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"]}


async def _observation(row: dict[str, Any], reply: str) -> str:
    """What the env itself answers `reply` with, on a separate env."""
    env = make_env(HOTPOT, HOTPOT_KWARGS)
    try:
        await env.areset(options={"task": task_from_row(row["extra_info"])})
        obs, *_ = await env.astep(reply)
    finally:
        await env.aclose()
    return str(obs)


def _replies(row: dict[str, Any]) -> tuple[str, str]:
    task = task_from_row(row["extra_info"])
    search = f"<think> I will look it up. </think>\n<search> {gold_query(task)} </search>"
    return search, f"<think> Found it. </think>\n<answer> {task.answers[0]} </answer>"


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _gae_return(out: Any) -> float:
    """The return of the response's first token under verl's reward placement (last response
    token) and GAE with zero values: the episode's reward unless GAE dropped it."""
    import torch
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    rm_scores = out.as_dict()["rm_scores"].unsqueeze(0)
    mask = torch.tensor([out.response_mask])
    _, returns = compute_gae_advantage_return(rm_scores, torch.zeros_like(rm_scores), mask, gamma=1.0, lam=1.0)
    return float(returns[0, 0].item())


async def test_search_r1_episode_is_one_response_with_raw_observations(tiny_tokenizer, scripted_server, make_loop):
    row = await _hotpot_row()
    search, answer = _replies(row)
    obs = await _observation(row, search)
    assert obs.startswith("<information>Doc 1(Title: ") and obs.endswith("</information>")
    server = scripted_server([(search, False), answer])  # the search stops on </search>: no <|im_end|>
    loop = make_loop(server, observation_role="inline", stop=STOP, response_length=RESPONSE_LENGTH)
    out = await loop.run({"logprobs": True}, **row)

    reply1, reply2 = server.emitted
    assert reply1 == _ids(tiny_tokenizer, search)
    assert reply2 == _ids(tiny_tokenizer, answer + "<|im_end|>")
    obs_ids = _ids(tiny_tokenizer, f"\n\n{obs}\n\n")
    assert out.response_ids == reply1 + obs_ids + reply2
    assert out.response_mask == [1] * len(reply1) + [0] * len(obs_ids) + [1] * len(reply2)
    # No turn-end token, no role tokens between the search and the answer: one assistant turn.
    im_end, im_start = tiny_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|im_start|>"])
    assert im_end not in out.response_ids[:-1] and im_start not in out.response_ids
    # Model tokens keep the server's log-probs; observation tokens get 0.0.
    n = len(reply1) + len(reply2)
    model_lp = [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 1]
    assert model_lp == pytest.approx([-0.01 * (i + 1) for i in range(n)])
    assert out.response_logprobs[len(reply1) : len(reply1) + len(obs_ids)] == [0.0] * len(obs_ids)
    # The answer was generated from the prompt, the search and the observation (token-in).
    assert server.calls[1]["prompt_ids"] == out.prompt_ids + reply1 + obs_ids
    assert server.calls[1]["sampling_params"]["stop"] == STOP

    # The reward lands on the last model token, and the env scored the answer.
    assert out.extra_fields["toolenv_stop_reason"] == "terminated" and out.reward_score == 1.0
    assert out.extra_fields["turn_scores"] == [0.0, 1.0] and out.num_turns == 4
    assert out.response_mask[-1] == 1 and out.as_dict()["rm_scores"][-1].item() == 1.0
    assert _gae_return(out) == 1.0

    # The conversation record: one assistant message holding replies and observation, whose
    # chat-template rendering is the token stream's text.
    assert [m["role"] for m in loop.messages] == ["system", "user", "assistant"]
    assert loop.messages[-1]["content"] == f"{search}\n\n{obs}\n\n{answer}"
    rendered = tiny_tokenizer.apply_chat_template(loop.messages, tokenize=False, add_generation_prompt=False)
    assert rendered == tiny_tokenizer.decode(out.prompt_ids + out.response_ids) + "\n"


@pytest.mark.parametrize("room", [0, 1])
async def test_an_observation_that_does_not_fit_is_not_appended(room, tiny_tokenizer, scripted_server, make_loop):
    """The observation needs room for itself and at least one model token after it: when it
    does not have it, the response ends on the search's last token (where verl puts the reward;
    PPO's GAE drops one on a mask-0 token). With one token to spare it goes in, and the next
    reply, cut at the budget, stays unstepped."""
    row = await _hotpot_row()
    search, answer = _replies(row)
    obs_ids = _ids(tiny_tokenizer, f"\n\n{await _observation(row, search)}\n\n")
    reply1 = _ids(tiny_tokenizer, search)
    server = scripted_server([(search, False), answer])
    loop = make_loop(server, observation_role="inline", stop=STOP, response_length=len(reply1) + len(obs_ids) + room)
    out = await loop.run({"logprobs": True}, **row)
    assert out.extra_fields["toolenv_stop_reason"] == "response_length"
    assert out.reward_score == -1.0 and out.extra_fields["reward_extra_info"]["truncated"] == 1.0
    assert out.response_mask[-1] == 1 and _gae_return(out) == -1.0
    assert len(out.response_logprobs) == len(out.response_ids)
    if room == 0:
        assert len(server.calls) == 1
        assert out.response_ids == reply1 and out.response_mask == [1] * len(reply1)
        assert loop.messages[-1] == {"role": "assistant", "content": search}
        assert out.num_turns == 2
    else:
        assert len(server.calls) == 2 and server.calls[1]["sampling_params"]["max_tokens"] == 1
        assert out.response_ids == reply1 + obs_ids + server.emitted[1] and len(server.emitted[1]) == 1
        assert out.extra_fields["reward_extra_info"]["answered"] == 0.0
        assert loop.messages[-1]["content"].startswith(f"{search}\n\n<information>")


async def test_an_empty_reply_after_an_inline_observation_removes_it(tiny_tokenizer, scripted_server, make_loop):
    row = await _hotpot_row()
    search, _ = _replies(row)
    server = scripted_server([(search, False), ("", False)])
    loop = make_loop(server, observation_role="inline", stop=STOP, response_length=RESPONSE_LENGTH)
    out = await loop.run({"logprobs": True}, **row)
    assert len(server.calls) == 2 and out.extra_fields["toolenv_stop_reason"] == "empty_reply"
    reply1 = _ids(tiny_tokenizer, search)
    assert out.response_ids == reply1 and out.response_mask == [1] * len(reply1)
    assert len(out.response_logprobs) == len(reply1)
    assert out.reward_score == -1.0 and _gae_return(out) == -1.0
    assert [m["role"] for m in loop.messages] == ["system", "user", "assistant"]
    assert loop.messages[-1]["content"] == search
    assert out.num_turns == 2


async def test_a_second_search_continues_the_same_turn(tiny_tokenizer, scripted_server, make_loop):
    """Three replies, two observations: still one assistant message, the mask alternating."""
    row = await _hotpot_row()
    search, answer = _replies(row)
    server = scripted_server([(search, False), (search, False), answer])
    loop = make_loop(server, observation_role="inline", stop=STOP, response_length=RESPONSE_LENGTH)
    out = await loop.run({}, **row)
    obs = await _observation(row, search)
    obs_ids = _ids(tiny_tokenizer, f"\n\n{obs}\n\n")
    a, b, c = server.emitted
    assert out.response_ids == a + obs_ids + b + obs_ids + c
    assert out.response_mask == [1] * len(a) + [0] * len(obs_ids) + [1] * len(b) + [0] * len(obs_ids) + [1] * len(c)
    zeros = [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 0]
    assert zeros == [0.0] * 2 * len(obs_ids)
    assert [m["role"] for m in loop.messages] == ["system", "user", "assistant"]
    assert loop.messages[-1]["content"] == f"{search}\n\n{obs}\n\n{search}\n\n{obs}\n\n{answer}"
    assert out.reward_score == 1.0 and out.num_turns == 6


class Snapshot(toolenv.Tool):
    """Return a picture of `what`."""

    name = "snapshot"

    class Args(BaseModel):
        what: str

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        from PIL import Image

        image = toolenv.ToolImage.from_pil(Image.new("RGB", (2, 2), "red"))
        return toolenv.ToolResult(text="a red square", images=[image])


async def test_an_inline_observation_with_images_is_refused(scripted_server, make_loop):
    """Raw text cannot carry an image: the loop stops with a clear error instead of dropping it."""
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs={"tasks": DEMO_TASKS}, limit=1))[0]
    env_kwargs = {"tools": [Snapshot()], "parser": "tags", "parser_kwargs": {"tags": {"snap": ["snapshot", "what"]}}}
    server = scripted_server([("<snap>the square</snap>", False), "<answer>42</answer>"])
    pool = EnvPool()
    loop = make_loop(server, observation_role="inline", stop=["</snap>"], env_kwargs=env_kwargs, pool=pool)
    try:
        with pytest.raises(ValueError, match=r"observation_role='inline'.*'snapshot' hold images"):
            await loop.run({}, raw_prompt=row["prompt"], extra_info=row["extra_info"])
    finally:
        await pool.aclose()
    assert len(server.calls) == 1


def test_an_unknown_observation_role_is_refused(scripted_server, make_loop):
    with pytest.raises(ValueError, match="'tool', 'user', 'inline' or None"):
        make_loop(scripted_server([]), observation_role="assistant")


async def test_a_turn_the_model_ended_keeps_its_end_token_and_is_continued(tiny_tokenizer, scripted_server, make_loop):
    """A reply that ends on `<|im_end|>` without a search or an answer: the token is the model's
    (mask 1, as generated) and the env's error observation follows it in the same response."""
    row = await _hotpot_row()
    _, answer = _replies(row)
    server = scripted_server(["<think> Hmm. </think>", answer])
    loop = make_loop(server, observation_role="inline", stop=STOP, response_length=RESPONSE_LENGTH)
    out = await loop.run({}, **row)
    obs = await _observation(row, "<think> Hmm. </think>")
    assert "No tool call and no final answer" in obs
    obs_ids = _ids(tiny_tokenizer, f"\n\n{obs}\n\n")
    a, b = server.emitted
    assert a[-1] == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert out.response_ids == a + obs_ids + b
    assert out.response_mask == [1] * len(a) + [0] * len(obs_ids) + [1] * len(b)
    assert loop.messages[-1]["content"] == f"<think> Hmm. </think>\n\n{obs}\n\n{answer}"
    assert out.reward_score == 1.0
