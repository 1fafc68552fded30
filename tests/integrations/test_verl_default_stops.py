"""ToolEnvAgentLoop's default stop strings come from the row's env's parser.

Rows built without `--agent-name` run `toolenv_agent`, which names no `stop`. Without a stop
string a tags-format model writes its query, an `<information>` block of its own and an answer in
one turn: the env scores the answer and the made-up observation is trained on. The loop now
sends the parser's stop strings (less, in chat roles, those that close one of several calls a
turn, as the reference agents do); `stop: []` sends none, a list given is sent as it is.
"""

from __future__ import annotations

from typing import Any

import pytest
from _chat_templates import GLM_TEMPLATE

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS

CALC = "toolenv.integrations.verl.demo:Calculator"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
TAGS = {"parser": "tags", "parser_kwargs": {"tags": {"calc": ["calculator", "expression"]}}}
#: A reply that runs on past its query: a made-up observation, then an answer.
RUN_ON = "<calc>6 * 7</calc>\n<information>42</information>\n<answer>42</answer>"


class StopServer:
    """verl's server manager, cutting each scripted reply at its first stop string (kept, as vLLM
    returns its tokens) or else ending it with `<|im_end|>`."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, replies
        self.calls: list[dict[str, Any]] = []
        self.emitted: list[list[int]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        text = self.replies[min(len(self.calls) - 1, len(self.replies) - 1)]
        cuts = [text.find(s) + len(s) for s in sampling_params.get("stop") or [] if s in text]
        text = text[: min(cuts)] if cuts else text + "<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling_params["max_tokens"]]
        self.emitted.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids))


async def _row(env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    kwargs = {"tools": [CALC], "tasks": DEMO_TASKS, **(env_kwargs or {})}
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs))[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"]}


def _model_text(tokenizer: Any, out: Any) -> str:
    """The response's model tokens (mask 1), decoded."""
    ids = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 1]
    return str(tokenizer.decode(ids))


async def test_without_stop_the_parsers_stop_strings_end_the_turn_at_the_call(tiny_tokenizer, make_loop):
    server = StopServer(tiny_tokenizer, [RUN_ON, "<answer>42</answer>"])
    loop = make_loop(server)  # stop unset, as toolenv_agent in examples/verl/toolenv_agent.yaml
    out = await loop.run({}, **await _row(TAGS))

    assert server.calls[0]["sampling_params"]["stop"] == ["</calc>"]
    assert len(server.calls) == 2 and out.extra_fields["toolenv_stop_reason"] == "terminated"
    # The env answered the query; the model's own <information> block was never generated.
    assert server.emitted[0] == tiny_tokenizer.encode("<calc>6 * 7</calc>", add_special_tokens=False)
    assert "<information>" not in _model_text(tiny_tokenizer, out)
    assert loop.messages[-2] == {"role": "user", "content": "<information>42</information>"}
    assert out.reward_score == 1.0


async def test_an_empty_stop_list_sends_none(tiny_tokenizer, make_loop):
    server = StopServer(tiny_tokenizer, [RUN_ON])
    out = await make_loop(server, stop=[]).run({}, **await _row(TAGS))
    assert "stop" not in server.calls[0]["sampling_params"]
    assert len(server.calls) == 1 and "<information>42</information>" in _model_text(tiny_tokenizer, out)


async def test_a_stop_list_given_is_sent_as_it_is(tiny_tokenizer, make_loop):
    server = StopServer(tiny_tokenizer, ["<answer>42</answer>"])
    await make_loop(server, stop=["</think>"]).run({}, **await _row(TAGS))
    assert server.calls[0]["sampling_params"]["stop"] == ["</think>"]


async def test_the_servers_own_stop_strings_are_kept(tiny_tokenizer, make_loop):
    server = StopServer(tiny_tokenizer, ["<answer>42</answer>"])
    await make_loop(server).run({"stop": ["STOP"]}, **await _row(TAGS))
    assert server.calls[0]["sampling_params"]["stop"] == ["STOP", "</calc>"]


@pytest.mark.parametrize("role", [None, "tool", "user"])
async def test_chat_roles_leave_out_the_stop_that_closes_one_of_several_calls(tiny_tokenizer, make_loop, role):
    """Hermes writes several `<tool_call>` blocks a turn and ends the turn with `<|im_end|>`: in a
    chat, stopping at `</tool_call>` would allow one call a turn."""
    server = StopServer(tiny_tokenizer, [f"{CALL}\n{CALL}", "<answer>42</answer>"])
    out = await make_loop(server, observation_role=role).run({}, **await _row())
    assert "stop" not in server.calls[0]["sampling_params"]
    assert out.extra_fields["reward_extra_info"]["tool_calls"] == 2.0 and out.reward_score == 1.0


async def test_inline_keeps_every_stop_of_the_parser(tiny_tokenizer, make_loop):
    """Inline, the observation follows the stop string in the model's own turn: one call a turn."""
    server = StopServer(tiny_tokenizer, [f"{CALL}\n{CALL}", "<answer>42</answer>"])
    out = await make_loop(server, observation_role="inline").run({}, **await _row())
    assert server.calls[0]["sampling_params"]["stop"] == ["</tool_call>"]
    assert server.emitted[0] == tiny_tokenizer.encode(CALL, add_special_tokens=False)
    assert out.extra_fields["reward_extra_info"]["tool_calls"] == 1.0 and out.reward_score == 1.0


async def test_stop_strings_that_are_special_tokens_are_left_to_the_model(make_loop):
    """GLM's `<|observation|>` is a special token (an EOS id the server stops on): as a stop string
    it cannot match the server's text, which skips special tokens, and a turn ending on it is the
    model's own; the loop sends it as no stop string."""
    pytest.importorskip("transformers")
    from toolenv.integrations.verl.tiny import byte_bpe_tokenizer

    special = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
    roles: dict[str, str | None] = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    glm = byte_bpe_tokenizer(special, ["<answer>42</answer> calculator expression"], GLM_TEMPLATE, roles)
    server = StopServer(glm, ["<answer>42</answer><|user|>"])
    loop = make_loop(server, tokenizer=glm, hf_model_type="glm4_moe")
    out = await loop.run({}, **await _row({"parser": "glm45"}))
    assert "stop" not in server.calls[0]["sampling_params"]
    assert out.reward_score == 1.0


async def test_search_r1_inline_runs_on_the_parsers_stop_string(tiny_tokenizer, make_loop):
    """Search-R1's inline episodes with no `stop` configured: generation stops at `</search>` and
    the observation follows it in the same assistant turn."""
    pytest.importorskip("toolenv_search", reason="the HotpotQA env is in the toolenv-search plugin")
    from toolenv.integrations.verl.envs import task_from_row
    from toolenv_search.envs import gold_query

    kwargs = {"topk": 1}
    row = (await abuild_rows("toolenv/HotpotQA-v0", env_kwargs=kwargs, limit=1))[0]
    task = task_from_row(row["extra_info"])
    search = f"<search> {gold_query(task)} </search>"
    answer = f"<answer> {task.answers[0]} </answer>"
    server = StopServer(tiny_tokenizer, [f"{search}\n<information>made up</information>", answer])
    loop = make_loop(server, observation_role="inline", response_length=2048)
    out = await loop.run({}, raw_prompt=row["prompt"], extra_info=row["extra_info"])

    # The tags parser's every tag: HotpotQA's env reads `<sql>` and `<python>` calls too.
    assert all("</search>" in c["sampling_params"]["stop"] for c in server.calls) and len(server.calls) == 2
    reply1, reply2 = server.emitted
    assert reply1 == tiny_tokenizer.encode(search, add_special_tokens=False)
    runs = [m for i, m in enumerate(out.response_mask) if i == 0 or m != out.response_mask[i - 1]]
    assert runs == [1, 0, 1] and out.response_ids[-len(reply2) :] == reply2
    assert "made up" not in _model_text(tiny_tokenizer, out)
    assert [m["role"] for m in loop.messages] == ["system", "user", "assistant"]
    assert loop.messages[-1]["content"].startswith(f"{search}\n\n<information>Doc 1(Title: ")
    assert out.extra_fields["toolenv_stop_reason"] == "terminated" and out.reward_score == 1.0
