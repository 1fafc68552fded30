"""The `transformers` agent with a tiny random Qwen2 model and a tokenizer built here (no download)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from pydantic import BaseModel

import toolenv
from toolenv.runner import arollout

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def _missing() -> str | None:
    for mod in ("torch", "transformers", "tokenizers"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (the transformers agent needs torch + toolenv-agents[transformers])"
    return None


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = _missing()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<answer>", "</answer>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "What is 2 + 3? The answer is 5.",
        '{"name": "add", "arguments": {"a": 2, "b": 3}}',
        "system user assistant tool",
    ]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    out = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


class Add(toolenv.Tool):
    """Add two integers."""

    name = "add"

    class Args(BaseModel):
        a: int
        b: int

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        return toolenv.ToolResult(text=str(args.a + args.b))


async def test_generates_with_chat_template_tokens_and_logprobs(tiny_model: Path) -> None:
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=12)

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(
            tools=[Add()], tasks=[{"id": "t", "question": "What is 2 + 3?", "answer": "5"}], max_turns=2
        )

    res = await arollout(env, agent, n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.model == str(tiny_model) and len(traj.turns) >= 1
    turn = traj.turns[0]
    assert turn.token_ids and len(turn.token_ids) <= 12 and turn.completion_tokens == len(turn.token_ids)
    assert turn.logprobs is not None and len(turn.logprobs) == len(turn.token_ids)
    assert all(lp <= 0.0 for lp in turn.logprobs)
    # The action is the decoded generation (special tokens dropped).
    text_ids = [i for i in turn.token_ids if i not in agent.tokenizer.all_special_ids]
    assert turn.action == agent.tokenizer.decode(text_ids, skip_special_tokens=True)
    # The prompt is the chat template with the env's tools and messages.
    ids = agent.prompt_ids(traj.prompt_messages, toolenv.agent.EnvInfo("", traj.task, tool_schemas=[Add().schema()]))
    rendered = agent.tokenizer.decode(ids)
    assert rendered.startswith("<|im_start|>system\nTools:") and '"name": "add"' in rendered
    assert rendered.endswith("<|im_start|>assistant") and "What is 2 + 3?" in rendered
    assert turn.prompt_tokens == len(ids)


async def test_greedy_is_deterministic(tiny_model: Path) -> None:
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=8)
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    msgs = [toolenv.Message(role="user", content="What is 2 + 3?")]
    a, b = await agent.act("", msgs, info), await agent.act("", msgs, info)
    assert a.token_ids == b.token_ids and a.text == b.text
