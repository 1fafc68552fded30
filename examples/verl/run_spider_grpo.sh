#!/usr/bin/env bash
# GRPO on toolenv/Spider-v0 (text-to-SQL: <sql> queries run read-only on SQLite, execution-match reward).
# Single node:   bash examples/verl/run_spider_grpo.sh
# Extra or changed verl overrides go after the script name, e.g. trainer.total_epochs=3.
# The SQLite databases ship inside toolenv-sql; every rollout worker opens them read-only itself.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODEL=${MODEL:-Qwen/Qwen2.5-3B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/toolenv}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
# The agent loop (examples/verl/toolenv_agent.yaml): stored in every row as agent_name, which verl
# uses over default_agent_loop, so both come from this one variable.
AGENT_LOOP=toolenv_sql_agent
ENV_KWARGS='{"max_turns": 4}'
# Training leaves out the tasks whose gold query returns no rows (13 of the bundled 697): any query returning
# none scores 1.0 there, a reward the policy learns to take. Validation keeps the standard set.
TRAIN_ENV_KWARGS='{"max_turns": 4, "exclude_empty_gold": true}'

mkdir -p "$DATA_DIR"
# The bundled Spider sample is dev data (697 questions over 10 databases): it checks the pipeline.
# For real runs build Spider train tasks and pass them: --env-kwargs '{"tasks": "spider_train.jsonl", ...}'.
# Train on 90% of the tasks and validate on the other 10% (--split: a fixed hash of the task id;
# Spider's paraphrases of one gold query stay together).
toolenv verl-data toolenv/Spider-v0 --out "$DATA_DIR/spider_train.parquet" --split train --agent-name "$AGENT_LOOP" --env-kwargs "$TRAIN_ENV_KWARGS"
toolenv verl-data toolenv/Spider-v0 --out "$DATA_DIR/spider_val.parquet" --split test --agent-name "$AGENT_LOOP" --env-kwargs "$ENV_KWARGS"

python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/spider_train.parquet" \
    data.val_files="$DATA_DIR/spider_val.parquet" \
    data.train_batch_size=64 \
    data.max_prompt_length=2048 \
    data.filter_overlong_prompts=True \
    data.max_response_length=2048 \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/toolenv_agent.yaml" \
    actor_rollout_ref.rollout.agent.default_agent_loop="$AGENT_LOOP" \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.logger='["console"]' \
    trainer.project_name=toolenv \
    trainer.experiment_name=spider-grpo \
    "$@"
