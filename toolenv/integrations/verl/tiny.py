"""A tiny offline Qwen-style tokenizer and random Qwen2 model, for tests, benchmarks and CPU smoke runs.

The tokenizer is a byte-level BPE trained in milliseconds with a Qwen2.5-style chat
template (ChatML, hermes tool calls, tool results grouped in a user turn); the model
is a random 2-layer Qwen2 (about 100k parameters) saved beside it, so its
`model_type` is `qwen2` and verl picks its Qwen continuous-token builder exactly as
for a real checkpoint. Nothing is downloaded. Needs `tokenizers`, `transformers`
and `torch` (all installed with verl).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["QWEN_CHAT_TEMPLATE", "build_tiny_qwen2"]

QWEN_CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS = [
    "You may call one or more functions to assist with the user query.",
    'What is 6 * 7? <tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>',
    "<answer>42</answer> The answer is 42. <information>21</information> <calc>(12 + 30) / 2</calc>",
    "0123456789 + - * / ( ) { } [ ] : , . ? ! ' \" = _ # \n\n system user assistant tool",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ Evaluate an arithmetic expression",
]


def byte_bpe_tokenizer(special: list[str], corpus: list[str], chat_template: str, roles: dict[str, str | None]) -> Any:
    """A small byte-level BPE tokenizer trained here (no download): `special` tokens, the tool
    tags as added tokens, `chat_template`; `roles` names the `eos_token`, `pad_token`... as
    `PreTrainedTokenizerFast` takes them."""
    import tokenizers  # type: ignore[import-untyped,unused-ignore]
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers  # type: ignore[import-untyped,unused-ignore]

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus * 4, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **roles)  # type: ignore[no-untyped-call,unused-ignore]
    fast.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    fast.chat_template = chat_template
    return fast


def build_tiny_qwen2(root: str | Path, *, with_model: bool = True) -> Path:
    """Write the tokenizer (and, with `with_model`, the random model) to `root/tiny-qwen2`; returns that folder."""
    import transformers

    fast = byte_bpe_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        _CORPUS,
        QWEN_CHAT_TEMPLATE,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None},
    )
    out = Path(root) / "tiny-qwen2"
    fast.save_pretrained(out)
    if not with_model:
        return out

    import torch

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.pad_token_id,
    )
    transformers.Qwen2ForCausalLM(config).save_pretrained(out)  # type: ignore[no-untyped-call,unused-ignore]
    return out
