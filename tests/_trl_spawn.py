"""Stand-ins that must be importable by name in a spawned process (the TRL pickling tests)."""

from __future__ import annotations

from typing import Any

import toolenv
from toolenv.integrations.verl.demo import Calculator

CALC_TASKS = [{"id": "q", "question": "What is 6 * 7?", "answer": "42"}]


def calc_env() -> toolenv.ToolEnv:
    """A module-level env factory (picklable by name)."""
    return toolenv.ToolEnv(tools=[Calculator()], tasks=CALC_TASKS)


def run_episode(factory: Any) -> tuple[str, str, str, float]:
    """One episode with a TRL environment from `factory`: (class name, tool result, answer reply, reward)."""
    env = factory()
    env.reset(task_id="q")
    result = env.calculator(expression="6 * 7")
    reply = env.answer(answer="42")
    return type(env).__name__, result, reply, env.get_reward()


class EpisodeLoop:
    """Runs in TRL's spawned rollout process in place of its vLLM rollout loop: one episode with the
    `environment_factory` TRL pickled and sent there, its outcome put on TRL's rollout queue."""

    def __init__(self, *, environment_factory: Any, rollout_buffer: Any, **_: Any) -> None:
        self.factory = environment_factory
        self.out = rollout_buffer

    def run(self) -> None:
        self.out.put(run_episode(self.factory))
