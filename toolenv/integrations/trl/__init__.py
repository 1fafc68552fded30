"""toolenv envs in TRL's `GRPOTrainer` through its `environment_factory` (TRL >= 1.6).

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from toolenv.integrations.trl import dataset_rows, environment_factory

    trainer = GRPOTrainer(
        model="Qwen/Qwen3-0.6B",
        train_dataset=Dataset.from_list(dataset_rows("toolenv/Spider-v0")),
        environment_factory=environment_factory("toolenv/Spider-v0"),
        args=GRPOConfig(...),
    )

The env owns the reward (TRL calls each environment's `get_reward`), so `reward_funcs`
may be left out. Importing this package does not import TRL.
"""

from toolenv.integrations.trl.environment import (
    ANSWER_DOC,
    EnvironmentFactory,
    ToolCallError,
    TRLEnvironment,
    dataset_rows,
    environment_factory,
    episode_metrics,
)
from toolenv.integrations.trl.schema import tool_signature

__all__ = [
    "ANSWER_DOC",
    "EnvironmentFactory",
    "TRLEnvironment",
    "ToolCallError",
    "dataset_rows",
    "environment_factory",
    "episode_metrics",
    "tool_signature",
]
