"""Fixtures for the verl integration tests: the tiny offline Qwen2 tokenizer/model, a scripted server,
and a factory for `ToolEnvAgentLoop` built the way verl's worker builds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with the tiny tokenizer (chat template included) and the random Qwen2 model."""
    pytest.importorskip("transformers", reason="the verl tests need transformers (installed with verl)")
    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("verl-model"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    """The tiny tokenizer, loaded back through AutoTokenizer as verl does."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class ScriptedServer:
    """verl's server-manager interface with scripted replies: each call returns the next text's tokens.

    A reply ends with `<|im_end|>` unless it is given as `(text, False)`; log-probs are
    distinct per token (-0.01 * n) so their alignment can be checked.
    """

    def __init__(self, tokenizer: Any, replies: list[Any]) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.calls: list[dict[str, Any]] = []
        self.emitted: list[list[int]] = []
        self.counter = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append(
            {"request_id": request_id, "prompt_ids": list(prompt_ids), "sampling_params": sampling_params}
        )
        reply = self.replies[min(len(self.calls) - 1, len(self.replies) - 1)]
        text, close = reply if isinstance(reply, tuple) else (reply, True)
        ids = self.tokenizer.encode(text + ("<|im_end|>" if close else ""), add_special_tokens=False)
        ids = ids[: sampling_params.get("max_tokens", len(ids))]
        logprobs = []
        for _ in ids:
            self.counter += 1
            logprobs.append(-0.01 * self.counter)
        self.emitted.append(ids)
        return TokenOutput(token_ids=ids, log_probs=logprobs)


def rollout_config(
    prompt_length: int = 1024,
    response_length: int = 512,
    max_turns: int = 4,
    max_model_len: int | None = None,
    max_user_turns: int | None = None,
) -> Any:
    """The slice of verl's trainer config an agent loop reads."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "max_model_len": max_model_len,
                    "full_determinism": False,
                    "multi_turn": {
                        "format": "hermes",
                        "max_user_turns": max_turns if max_user_turns is None else max_user_turns,
                        "max_assistant_turns": max_turns,
                        "max_parallel_calls": 1,
                        "max_tool_response_length": 256,
                        "tool_response_truncate_side": "middle",
                    },
                }
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )


@pytest.fixture
def scripted_server(tiny_tokenizer: Any) -> Any:
    """Factory: `scripted_server([reply, ...])`."""
    return lambda replies: ScriptedServer(tiny_tokenizer, replies)


@pytest.fixture
def make_loop(tiny_tokenizer: Any) -> Any:
    """Factory for a ToolEnvAgentLoop built the way verl's worker builds it (call inside a running loop)."""

    def make(
        server: Any,
        *,
        response_length: int = 512,
        max_turns: int = 4,
        cls: Any = None,
        tools: Any = (),
        tokenizer: Any = None,
        hf_model_type: str = "qwen2",
        max_model_len: int | None = None,
        max_user_turns: int | None = None,
        **loop_kwargs: Any,
    ) -> Any:
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
        from verl.utils.dataset.rl_dataset import RLHFDataset

        from toolenv.integrations.verl.agent_loop import ToolEnvAgentLoop

        cfg = rollout_config(
            response_length=response_length,
            max_turns=max_turns,
            max_model_len=max_model_len,
            max_user_turns=max_user_turns,
        )
        return (cls or ToolEnvAgentLoop)(
            trainer_config=DictConfigWrap(cfg),
            server_manager=server,
            tokenizer=tokenizer or tiny_tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            hf_model_type=hf_model_type,  # picks verl's continuous-token builder for the family
            tools=ToolListWrap(list(tools)),  # verl's BaseTools, for its own tool_agent loop
            **loop_kwargs,
        )

    return make
