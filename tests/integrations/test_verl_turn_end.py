"""How ToolEnvAgentLoop closes a turn, for a model whose turns do not end with `<|im_end|>`.

GLM-4.5-style chat (built offline here): the model ends a tool-call turn with `<|observation|>`
and an answer with `<|user|>`; its template writes nothing after an assistant message, and
verl's GLM token builder drops that trailing role token and re-renders the next message. The
loop must not add an EOS of its own in between.
"""

from __future__ import annotations

from typing import Any

import pytest
from _chat_templates import GLM_TEMPLATE

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

from toolenv.integrations.verl._turns import stopped_on_string, template_turn_end_id
from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS

CALC = "toolenv.integrations.verl.demo:Calculator"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'


@pytest.fixture(scope="module")
def glm_tokenizer() -> Any:
    """A byte-level BPE with GLM's role tokens and template; EOS is `<|endoftext|>`."""
    pytest.importorskip("transformers")
    from toolenv.integrations.verl.tiny import byte_bpe_tokenizer

    special = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
    corpus = ['What is 6 * 7? calculator expression tool_call tool_response answer 0123456789 {}":, <calc>']
    roles: dict[str, str | None] = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    return byte_bpe_tokenizer(special, corpus, GLM_TEMPLATE, roles)


class Server:
    """Scripted replies given as exact text (special tokens included, nothing appended)."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.calls = tokenizer, replies, 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        ids = self.tokenizer.encode(self.replies[self.calls], add_special_tokens=False)
        self.calls += 1
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids))


async def _row(env_kwargs: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
    kwargs = {"tools": [CALC], "tasks": DEMO_TASKS, **(env_kwargs or {})}
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs))[index]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"]}


def _stream_text(tokenizer: Any, out: Any) -> str:
    return str(tokenizer.decode(out.prompt_ids + out.response_ids))


async def test_glm_turns_get_no_eos_between_call_and_observation(glm_tokenizer, make_loop):
    server = Server(glm_tokenizer, [CALL + "<|observation|>", "<answer>42</answer><|user|>"])
    loop = make_loop(server, tokenizer=glm_tokenizer, hf_model_type="glm4_moe", observation_role="tool")
    assert type(loop.continuous_token_builder).__name__ == "GLMContinuousTokenBuilder"
    assert loop.turn_end_id is None  # the GLM template writes nothing after an assistant message
    out = await loop.run({}, **await _row())
    assert out.reward_score == 1.0
    assert glm_tokenizer.eos_token_id not in out.response_ids
    text = _stream_text(glm_tokenizer, out)
    assert "</tool_call><|observation|>" in text and text.count("<|observation|>") == 1
    # Each model token is the server's (mask 1), in order; only the trailing role token was handed
    # to verl's builder, which renders it as context.
    model = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 1]
    assert glm_tokenizer.decode(model) == CALL + "<answer>42</answer><|user|>"


async def test_glm_stop_string_turn_is_closed_by_the_next_role_token_only(glm_tokenizer, make_loop):
    """A turn cut by a stop string: the GLM template writes no turn-end token, so none is added."""
    env_kwargs = {"parser": "tags", "parser_kwargs": {"tags": {"calc": ["calculator", "expression"]}}}
    server = Server(glm_tokenizer, ["<calc>6 * 7</calc>", "<answer>42</answer><|user|>"])
    loop = make_loop(server, tokenizer=glm_tokenizer, hf_model_type="glm4_moe", stop=["</calc>"])
    out = await loop.run({}, **await _row(env_kwargs))
    assert out.reward_score == 1.0
    assert glm_tokenizer.eos_token_id not in out.response_ids
    assert "</calc><|user|>\n<information>42</information><|assistant|>" in _stream_text(glm_tokenizer, out)


def test_turn_end_token_comes_from_the_template(glm_tokenizer, tiny_tokenizer):
    assert template_turn_end_id(tiny_tokenizer) == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert template_turn_end_id(glm_tokenizer) is None


def test_stopped_on_string_needs_the_stop_string_completed_by_the_last_token(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<calc>6 * 7</calc>", add_special_tokens=False)
    assert stopped_on_string(tiny_tokenizer, ids, ["</calc>"])
    assert not stopped_on_string(tiny_tokenizer, ids, [])
    assert not stopped_on_string(tiny_tokenizer, ids + tiny_tokenizer.encode(" ok"), ["</calc>"])
    end = tiny_tokenizer.encode("<answer>42</answer><|im_end|>", add_special_tokens=False)
    assert not stopped_on_string(tiny_tokenizer, end, ["</calc>"])


async def test_chatml_turn_that_ends_without_stop_string_is_left_to_verls_builder(
    tiny_tokenizer, scripted_server, make_loop
):
    """No stop string configured: a reply that ends without `<|im_end|>` (e.g. on another EOS) gets
    nothing inserted by the loop, as in verl's own ToolAgentLoop."""
    server = scripted_server([(CALL, False), "<answer>42</answer>"])
    out = await make_loop(server).run({}, **await _row())
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    first_obs = out.response_mask.index(0)
    assert out.response_ids[:first_obs] == server.emitted[0]
    assert out.response_ids[first_obs] != im_end
