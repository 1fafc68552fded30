"""ToolEnvAgentLoop's output through verl 0.9.1's default trainer path (`trainer.use_v1=True`):
`AgentLoopWorkerTQ._agent_loop_postprocess` stores it with its staleness tags, then
`PPOTrainer._compute_metrics` reads the tags as ints after every step.

Both run as verl wrote them; only TransferQueue (a separate service, not installed with verl)
is replaced by an in-memory store.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

from toolenv.integrations.verl._turns import merge_server_fields
from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS

CALC = "toolenv.integrations.verl.demo:Calculator"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'


class KVBatchMeta:
    def __init__(self, keys: list[str], partition_id: str, tags: list[dict[str, Any]]) -> None:
        self.keys, self.partition_id, self.tags = keys, partition_id, tags


class FakeTransferQueue(types.ModuleType):
    """The four TransferQueue calls the two verl functions make, over a dict."""

    KVBatchMeta = KVBatchMeta

    def __init__(self) -> None:
        super().__init__("transfer_queue")
        self.rows: dict[str, Any] = {}
        self.tags: list[dict[str, Any]] = []

    def init(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def async_kv_put(self, **kwargs: Any) -> None:
        pass

    async def async_kv_batch_put(self, keys: list[str], fields: Any, tags: list[dict[str, Any]], partition_id: str):
        for i, key in enumerate(keys):
            self.rows[key] = fields[i]
        self.tags.extend(tags)

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> Any:
        import torch
        from tensordict import TensorDict

        rows = [self.rows[k] for k in keys]
        out: dict[str, Any] = {}
        for name in select_fields:
            if name in ("values", "advantages", "returns", "token_level_rewards"):  # written by later stages
                values = [torch.zeros(r["responses"].shape[0]) for r in rows]
            else:
                values = [r[name] for r in rows]
            if all(isinstance(v, torch.Tensor) and v.dim() > 0 for v in values):
                out[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            else:
                out[name] = torch.tensor([int(v) for v in values])
        return TensorDict(out, batch_size=[len(rows)])


@pytest.fixture
def tq(monkeypatch: pytest.MonkeyPatch) -> FakeTransferQueue:
    fake = FakeTransferQueue()
    if importlib.util.find_spec("transfer_queue") is None:
        monkeypatch.setitem(sys.modules, "transfer_queue", fake)
    from verl.trainer.ppo.v1 import agent_loop_tq, trainer_base

    monkeypatch.setattr(agent_loop_tq, "tq", fake)
    monkeypatch.setattr(trainer_base, "tq", fake)
    return fake


class StepTaggingServer:
    """Scripted replies, each tagged as verl's LLMServerClient tags them (llm_server.py:160):
    the weights moved from step 3 to step 4 between the two turns."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.replies = [CALL, "<answer>42</answer>"]
        self.calls = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        ids = self.tokenizer.encode(self.replies[self.calls] + "<|im_end|>", add_special_tokens=False)
        self.calls += 1
        out = TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids))
        out.extra_fields["global_steps"] = 2 + self.calls
        out.extra_fields.setdefault("min_global_steps", 2 + self.calls)
        out.extra_fields.setdefault("max_global_steps", 2 + self.calls)
        return out


async def _row() -> dict[str, Any]:
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC], "tasks": DEMO_TASKS}))[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"], "data_source": row["data_source"]}


async def test_default_trainer_stores_and_reads_the_staleness_tags(tq, tiny_tokenizer, make_loop):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator
    from verl.trainer.ppo.v1 import trainer_base

    out = await make_loop(StepTaggingServer(tiny_tokenizer)).run({}, **await _row())
    assert out.reward_score == 1.0

    # verl's worker stores the trajectory with its tags...
    worker = _v1_worker()
    await worker._agent_loop_postprocess(out, validate=False, uid="u0", session_id=0, global_steps=4)

    # ...and the trainer's metrics step reads them as ints (TypeError when they are None).
    trainer = types.SimpleNamespace(
        config=OmegaConf.create({"actor_rollout_ref": {"rollout": {}, "model": {}}}),
        use_critic=False,
        _rollout_moe_lb_metrics_accumulator=RolloutMoELoadBalanceMetricsAccumulator(),
        _get_n_gpus_for_throughput=lambda: 1,
    )
    metrics: dict[str, Any] = {}
    batch = KVBatchMeta(["u0_0_0"], "train", tq.tags)
    trainer_base.PPOTrainer._compute_metrics(trainer, batch, metrics, {"step": 1.0}, 5, 0)
    assert [(t["min_global_steps"], t["max_global_steps"]) for t in tq.tags] == [(3, 4)]
    assert metrics["training/off_policy/trajectory_spans/max"] == 2
    assert metrics["training/off_policy/trajectory_staleness_worst/max"] == 1  # (5 - 1) - 3
    assert metrics["training/num_turns/max"] == 4
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (3, 4)


def test_server_fields_keep_the_earliest_and_latest_step() -> None:
    merged: dict[str, Any] = {}
    merge_server_fields(merged, {"global_steps": 5, "min_global_steps": 5, "max_global_steps": 5})
    merge_server_fields(merged, {"global_steps": 6, "min_global_steps": 6, "max_global_steps": 7})
    merge_server_fields(merged, {"min_global_steps": None, "max_global_steps": None})
    assert merged == {"global_steps": 5, "min_global_steps": 5, "max_global_steps": 7}
    merge_server_fields(merged, {"spec_num_draft_tokens": 3})
    merge_server_fields(merged, {"spec_num_draft_tokens": 4})
    assert merged["spec_num_draft_tokens"] == 7


class EmptyServer:
    """A server whose reply has no token (vLLM can return none: an EOS-only sample it trims, a
    request that stopped at once)."""

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(token_ids=[], log_probs=[])


def _v1_worker() -> Any:
    from verl.trainer.ppo.v1 import agent_loop_tq

    worker_cls = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    worker = worker_cls.__new__(worker_cls)
    worker.processor = None
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.mm_processor_kwargs = {}
    return worker


async def test_an_empty_reply_is_stored_by_the_default_trainer(tq, tiny_tokenizer, make_loop):
    """A GRPO group where one sample's model wrote no token: verl's v1 worker stores each sample
    with its score on the response's last position (`AgentLoopOutput.as_dict`), so an empty
    response cannot carry it (IndexError there; the session fails and verl drops the whole
    group). The sample keeps its place in the group: one masked-out token carries its score."""
    row = await _row()
    empty = await make_loop(EmptyServer()).run({"logprobs": True}, **row)
    full = await make_loop(StepTaggingServer(tiny_tokenizer)).run({"logprobs": True}, **row)
    assert empty.extra_fields["toolenv_stop_reason"] == "empty_reply"
    worker = _v1_worker()
    await worker._agent_loop_postprocess(empty, validate=False, uid="u0", session_id=0, global_steps=4)
    await worker._agent_loop_postprocess(full, validate=False, uid="u0", session_id=1, global_steps=4)
    stored = tq.rows["u0_0_0"]
    assert stored["responses"].numel() == 1 and stored["response_mask"].tolist() == [0]
    assert stored["rm_scores"].tolist() == [empty.reward_score]
    assert stored["rollout_log_probs"].shape == stored["responses"].shape
    assert stored["input_ids"].numel() == stored["prompts"].numel() + 1
    assert [t["status"] for t in tq.tags] == ["success", "success"]
