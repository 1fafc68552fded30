"""Train a model with TRL's GRPOTrainer on a toolenv env, the env's tools and reward included.

    pip install "toolenv[trl]" toolenv-sql
    python examples/trl_grpo.py --model Qwen/Qwen3-0.6B --env toolenv/Spider-v0 --max-steps 200

With no `--model`, it runs one step on CPU with the tiny offline Qwen2 (a random
100k-parameter model, no download): a smoke run of the whole wiring, whose rewards
mean nothing. The model sees the env's tools through its own chat template and calls
them natively; every call runs in the env (validated, time-limited, recorded), and
the env's reward scores each rollout (TRL calls `get_reward`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental in TRL

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from toolenv.integrations.trl import dataset_rows, environment_factory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="toolenv/Spider-v0", help="env id (default: %(default)s)")
    p.add_argument("--model", default=None, help="a Hugging Face model id or folder; none: the tiny offline model")
    p.add_argument("--tasks", type=int, default=None, help="use the first N tasks")
    p.add_argument("--max-steps", type=int, default=1)
    p.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    args = p.parse_args()

    env_kwargs = {"max_turns": 4}
    rows = dataset_rows(args.env, n=args.tasks if args.model else 2, env_kwargs=env_kwargs)
    model, tokenizer = args.model, None
    if model is None:  # the smoke run: a tiny random Qwen2 with TRL's Qwen2.5 template (TRL parses its calls)
        from transformers import AutoTokenizer
        from trl.chat_template_utils import qwen2_5_chat_template

        from toolenv.integrations.verl.tiny import build_tiny_qwen2

        model = str(build_tiny_qwen2(Path(tempfile.mkdtemp(prefix="toolenv-trl-"))))
        tokenizer = AutoTokenizer.from_pretrained(model)
        tokenizer.chat_template = qwen2_5_chat_template
    config = GRPOConfig(
        output_dir=args.out or tempfile.mkdtemp(prefix="toolenv-trl-out-"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=args.max_steps,
        max_completion_length=64 if args.model is None else 1024,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=args.model is None,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
        environment_factory=environment_factory(args.env, env_kwargs=env_kwargs),  # the env owns the reward
        args=config,
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    print(f"step 1: reward {logged['reward']:.3f}, tool calls per sample {logged['tools/call_frequency']:.2f}")
    for env in trainer.environments:
        ep = env.env.episode
        print(f"  task {ep.task.id}: {len(ep.turns)} turns, return {sum(t.reward for t in ep.turns):.2f}")


if __name__ == "__main__":
    main()
