"""A tiny Qwen3-VL built offline for tests that run TRL's real vision code paths (GRPO, SFT)."""

from __future__ import annotations

from typing import Any

import pytest

#: Qwen-VL's vision tokens, added to the tiny tokenizer.
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def tiny_qwen3_vl() -> tuple[Any, Any, Any]:
    """A real `Qwen3VLProcessor` (Pillow image processor, a small tokenizer trained here, TRL's
    Qwen3-VL template), a tiny random Qwen3-VL config and its tokenizer: no download."""
    pytest.importorskip("trl", reason="TRL's vision code paths need trl (pip install toolenv[trl]); CI installs it")
    transformers = pytest.importorskip("transformers", reason="the TRL checks need transformers (CI installs it)")
    pil = pytest.importorskip(
        "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl", reason="Qwen-VL's Pillow image processor"
    )
    from trl.chat_template_utils import qwen3_vl_chat_template

    from toolenv.integrations.verl.tiny import byte_bpe_tokenizer

    corpus = ["You may call one or more functions: crop bbox units pixels answer code", '0123456789 [ ] { } , . " \n']
    roles = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None}
    tok = byte_bpe_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>", *VISION_TOKENS], corpus, "", roles)

    class ImageQwen3VLProcessor(transformers.Qwen3VLProcessor):  # type: ignore[misc]
        def __init__(self, image_processor: Any = None, tokenizer: Any = None, **kw: Any) -> None:
            super().__init__(image_processor, tokenizer, None, **kw)

    # `size`, not min_pixels/max_pixels: transformers 5.10 writes those into the class's shared
    # default, and every Qwen2-VL image processor made later in the process would shrink images.
    images = pil.Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128}
    )
    processor = ImageQwen3VLProcessor(images, tok, chat_template=qwen3_vl_chat_template)
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = transformers.Qwen3VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 4096,
            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    return processor, config, tok
