"""The full verl path without Ray: `toolenv verl-data` parquet → RLHFDataset → AgentLoopWorker → DataProto.

The config is verl's own `ppo_trainer` composed by Hydra with the overrides the
docs give, pointing at the example YAML files; the server is a scripted policy
that calls the calculator on the question, then answers with the tool's result.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verl"
CALC = "toolenv.integrations.verl.demo:Calculator"


class CalculatorPolicy:
    """Scripted policy: turn 1 calls the calculator on the question, turn 2 answers with its result."""

    def __init__(self, tokenizer: Any, wrong: bool = False) -> None:
        self.tokenizer = tokenizer
        self.wrong = wrong
        self.calls = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        seen = self.tokenizer.decode(prompt_ids)
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", seen, re.DOTALL)
        if results:
            value = results[-1].strip()
            text = f"<answer>{int(value) + 1 if self.wrong else value}</answer>"
        else:
            expression = re.findall(r"What is (.*?)\?", seen)[-1]
            text = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'
        ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo dataset written by the real CLI in a subprocess."""
    import json

    out = tmp_path_factory.mktemp("verl-data") / "calc.parquet"
    tasks = tmp_path_factory.getbasetemp() / "calc_tasks.jsonl"
    from toolenv.integrations.verl.demo import DEMO_TASKS

    tasks.write_text("".join(json.dumps(t) + "\n" for t in DEMO_TASKS))
    env_kwargs = json.dumps({"tools": [CALC], "tasks": str(tasks)})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolenv.cli",
            "verl-data",
            "toolenv/ToolEnv-v0",
            "--out",
            str(out),
            "--env-kwargs",
            env_kwargs,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote 3 rows" in proc.stdout
    return out


def _config(model_dir: Path, parquet: Path) -> Any:
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    config_dir = str(Path(main_ppo.__file__).parent / "config")
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={parquet}",
        f"data.val_files={parquet}",
        "data.max_prompt_length=1024",
        "data.max_response_length=256",
        "data.return_raw_chat=True",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={EXAMPLES / 'toolenv_tools.yaml'}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={EXAMPLES / 'toolenv_agent.yaml'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=toolenv_agent",
        f"reward.custom_reward_function.path={EXAMPLES / 'toolenv_reward.py'}",
        "reward.custom_reward_function.name=compute_score",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _batch(config: Any, tokenizer: Any, parquet: Path) -> Any:
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=config.data, processor=None)
    return DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))


async def test_agent_loop_worker_produces_rm_scores(tiny_model_dir, tiny_tokenizer, parquet):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config = _config(tiny_model_dir, parquet)
    batch = _batch(config, tiny_tokenizer, parquet)
    assert list(batch.non_tensor_batch["agent_name"]) == ["toolenv_agent"] * 3
    policy = CalculatorPolicy(tiny_tokenizer)
    worker = AgentLoopWorker(config, llm_client=policy)
    out = await worker.generate_sequences(batch)

    assert out.batch["prompts"].shape == (3, 1024)
    assert out.batch["responses"].shape == (3, 256)
    assert out.batch["input_ids"].shape == (3, 1280)
    assert "rollout_log_probs" in out.batch
    rm = out.batch["rm_scores"]
    assert rm.sum(dim=1).tolist() == [1.0, 1.0, 1.0]
    # The score sits on the last response token.
    last = out.batch["attention_mask"][:, 1024:].sum(dim=1) - 1
    assert [rm[i, int(last[i])].item() for i in range(3)] == [1.0, 1.0, 1.0]
    # Observation tokens are masked out, model tokens in: two model segments per row.
    for row in out.batch["response_mask"].tolist():
        edges = sum(1 for a, b in zip(row, row[1:], strict=False) if a != b)
        assert row[0] == 1 and edges == 3  # 1..1 0..0 1..1 0(pad)...
    assert list(out.non_tensor_batch["score"]) == [1.0, 1.0, 1.0]
    assert list(out.non_tensor_batch["tool_calls"]) == [1.0, 1.0, 1.0]
    assert [list(t) for t in out.non_tensor_batch["turn_scores"]] == [[0.0, 1.0]] * 3
    assert "reward/exact_match" in out.meta_info["reward_extra_keys"]
    assert policy.calls == 6


async def test_a_sample_whose_server_returns_no_token_keeps_the_batch_whole(tiny_model_dir, tiny_tokenizer, parquet):
    """The server returns no token for one sample (an aborted request): its episode ends with an
    empty response, the batch's other samples keep their log-probs, and verl assembles the batch
    (it concatenates every sample's log-probs when the first has them)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.replica import TokenOutput

    class Silent(CalculatorPolicy):
        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
            if "(12 + 30) / 2" in self.tokenizer.decode(prompt_ids):
                self.calls += 1
                return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted")
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw)

    config = _config(tiny_model_dir, parquet)
    policy = Silent(tiny_tokenizer)
    out = await AgentLoopWorker(config, llm_client=policy).generate_sequences(_batch(config, tiny_tokenizer, parquet))
    assert policy.calls == 5  # two turns for each of the others, one for the silent sample
    assert out.batch["rollout_log_probs"].shape == (3, 256)
    assert out.batch["response_mask"][1].sum().item() == 0
    assert list(out.non_tensor_batch["score"]) == [1.0, 0.0, 1.0]
    assert list(out.non_tensor_batch["toolenv_stop_reason"]) == ["terminated", "aborted", "terminated"]


async def test_builtin_tool_agent_with_base_tool_adapter_and_compute_score(tiny_model_dir, tiny_tokenizer, parquet):
    """verl's own tool_agent loop calling the calculator through ToolEnvBaseTool, scored by compute_score."""
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from toolenv.integrations.verl.reward import acompute_score

    config = _config(tiny_model_dir, parquet)
    batch = _batch(config, tiny_tokenizer, parquet)
    batch.non_tensor_batch["agent_name"] = np.array(["tool_agent"] * len(batch), dtype=object)
    worker = AgentLoopWorker(config, llm_client=CalculatorPolicy(tiny_tokenizer))
    out = await worker.generate_sequences(batch)
    assert "rm_scores" not in out.batch  # tool_agent leaves scoring to the reward function

    scores = []
    for i in range(len(out)):
        n = int(out.batch["attention_mask"][i, 1024:].sum())
        text = tiny_tokenizer.decode(out.batch["responses"][i, :n].tolist(), skip_special_tokens=True)
        assert f"<tool_response>\n{['42', '21', '53'][i]}\n</tool_response>" in text
        extra = out.non_tensor_batch["extra_info"][i]
        scores.append(await acompute_score(extra["env_id"], text, None, extra))
    assert [s["score"] for s in scores] == [1.0, 1.0, 1.0]
    assert all(s["answered"] == 1.0 for s in scores)

    wrong = CalculatorPolicy(tiny_tokenizer, wrong=True)
    out = await AgentLoopWorker(config, llm_client=wrong).generate_sequences(_batch(config, tiny_tokenizer, parquet))
    extra = out.non_tensor_batch["extra_info"][0]
    n = int(out.batch["attention_mask"][0, 1024:].sum())
    text = tiny_tokenizer.decode(out.batch["responses"][0, :n].tolist(), skip_special_tokens=True)
    assert (await acompute_score(extra["env_id"], text, None, extra))["score"] == 0.0


async def test_router_replay_gets_the_rollouts_routed_experts(tiny_model_dir, tiny_tokenizer, parquet):
    """MoE training with rollout router replay (R3: `rollout.enable_rollout_routing_replay`) replays
    the experts the rollout chose, which the server returns per generation for every token it saw.
    The episode's are those of its last generation, cut to the episode's tokens, as verl's
    tool_agent keeps them; without them the actor stops ("micro_batch missing 'routed_experts'")."""
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.replica import TokenOutput

    layers, topk = 2, 2

    class Routed(CalculatorPolicy):
        """Each token's experts encode its position (+1, so padding's zeros differ)."""

        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
            out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw)
            seen = len(prompt_ids) + len(out.token_ids) - 1  # the last token is sampled, never fed
            experts = np.repeat(np.arange(1, seen + 1, dtype=np.int32)[:, None, None], layers, axis=1)
            return TokenOutput(**{**out.model_dump(), "routed_experts": np.repeat(experts, topk, axis=2)})

    config = _config(tiny_model_dir, parquet)
    config.actor_rollout_ref.rollout.enable_rollout_routing_replay = True
    batch = _batch(config, tiny_tokenizer, parquet)
    out = await AgentLoopWorker(config, llm_client=Routed(tiny_tokenizer)).generate_sequences(batch)
    routed = out.batch["routed_experts"]
    assert routed.shape == (3, 1024 + 256, layers, topk)
    for i in range(3):
        real = out.batch["attention_mask"][i].nonzero().flatten()  # the episode's tokens, left-padded prompt first
        first, last = int(real[0]), int(real[-1])
        assert routed[i, first:last, 0, 0].tolist() == list(range(1, last - first + 1))
        assert routed[i, :first].abs().sum() == 0


@pytest.mark.parametrize(
    "script", ["run_hotpotqa_grpo.sh", "run_hotpotqa_ppo.sh", "run_spider_grpo.sh", "run_spider_ppo.sh"]
)
def test_launch_script_overrides_compose(script, tmp_path):
    """Every override a launch script passes to main_ppo exists in verl's ppo_trainer config."""
    import shlex

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer import main_ppo

    text = (EXAMPLES / script).read_text()
    block = text[text.index("python -m verl.trainer.main_ppo") :].split('"$@"')[0]
    values = {
        "HERE": str(EXAMPLES),
        "DATA_DIR": str(tmp_path),
        "MODEL": "Qwen/Qwen2.5-3B-Instruct",
        "N_GPUS": "8",
        "NNODES": "2",
        "AGENT_LOOP": re.search(r"^AGENT_LOOP=(\w+)$", text, re.MULTILINE).group(1),  # type: ignore[union-attr]
    }
    block = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], block.replace("\\\n", " "))
    overrides = shlex.split(block)[3:]
    assert overrides and all("=" in o for o in overrides)
    config_dir = str(Path(main_ppo.__file__).parent / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    agent = cfg.actor_rollout_ref.rollout.agent
    names = [loop["name"] for loop in OmegaConf.load(agent.agent_loop_config_path)]
    assert agent.default_agent_loop in names and "toolenv_agent" in names
    assert cfg.trainer.nnodes == 2
    assert cfg.data.filter_overlong_prompts is True  # see test_overlong_prompts_are_filtered_not_cut
    if "ppo" in script.split("_")[-1]:
        assert cfg.algorithm.adv_estimator == "gae" and cfg.critic.model.path == "Qwen/Qwen2.5-3B-Instruct"
    else:
        assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 8


async def test_overlong_prompts_are_filtered_not_cut(tiny_model_dir, tiny_tokenizer, parquet, make_loop):
    """verl 0.9.1 leaves `data.filter_overlong_prompts` off (its `truncation: error` is not read), and
    the agent loop then cuts a prompt longer than `max_prompt_length` from the left: the system
    prompt, with the tool and answer instructions, goes first. The launch scripts turn the filter
    on, which drops such rows when the dataset loads; it reads toolenv rows as they are."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = _config(tiny_model_dir, parquet)
    row = _batch(config, tiny_tokenizer, parquet)[0].non_tensor_batch
    system_header = tiny_tokenizer.encode("<|im_start|>system", add_special_tokens=False)
    loop = make_loop(CalculatorPolicy(tiny_tokenizer))
    full = await loop.ct_build_initial_tokens(list(row["raw_prompt"]))
    assert full[: len(system_header)] == system_header
    loop.rollout_config.prompt_length = len(full) - 1
    cut = await loop.ct_build_initial_tokens(list(row["raw_prompt"]))
    assert cut == full[1:] and cut[: len(system_header)] != system_header

    def rows(limit: int, keep_long: bool) -> int:
        data = config.data.copy()
        data.max_prompt_length, data.filter_overlong_prompts = limit, not keep_long
        data.tool_config_path = None  # as in the scripts: else the filter counts a tools block the loop never sends
        return len(RLHFDataset(data_files=[str(parquet)], tokenizer=tiny_tokenizer, config=data, processor=None))

    assert rows(len(full) - 1, keep_long=True) == 3  # verl's default: every row kept, then cut
    assert rows(len(full) + 64, keep_long=False) == 3
    assert rows(8, keep_long=False) == 0
