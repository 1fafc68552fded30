"""The `replay` agent: actions read from a JSONL file, keyed by task id.

Two line shapes are accepted:
- `{"task_id": "t1", "actions": ["<tool_call>...</tool_call>", "<answer>5</answer>"]}`
  ;
- a trajectory line written by `toolenv rollout` (its `task.id` and turn actions),
  so a recorded run can be replayed against a changed env or reward.
When a task id appears on several lines (several samples), the first line is used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolenv.agent import Agent, AgentAction, AgentError, EnvInfo
from toolenv.types import Message, Task

__all__ = ["ReplayAgent", "load_replay"]


def load_replay(path: str | Path) -> dict[str, list[str]]:
    """Task id → actions, from a JSONL file.

    Raises:
        ValueError: a line is not JSON or has neither shape (the message names the line).
    """
    table: dict[str, list[str]] = {}
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            key, actions = _row(row)
            if key is None or actions is None:
                raise ValueError(f'{path}:{lineno}: expected {{"task_id": ..., "actions": [...]}} or a trajectory')
            table.setdefault(key, actions)
    return table


def _row(row: Any) -> tuple[str | None, list[str] | None]:
    if not isinstance(row, dict):
        return None, None
    if "task_id" in row and isinstance(row.get("actions"), list):
        actions = row["actions"]
        ok = all(isinstance(a, str) for a in actions)
        return str(row["task_id"]), (list(actions) if ok else None)
    task, turns = row.get("task"), row.get("turns")
    if isinstance(task, dict) and isinstance(turns, list):
        actions = [t.get("action") for t in turns if isinstance(t, dict)]
        ok = all(isinstance(a, str) for a in actions)
        return str(task.get("id", "")), ([str(a) for a in actions] if ok else None)
    return None, None


class ReplayAgent(Agent):
    """Replays recorded actions; a task or turn with no recorded action is an agent error.

    Args:
        path: the JSONL file.
    """

    name = "replay"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._table = load_replay(self.path)
        self._actions: list[str] | None = None
        self._task_id = ""

    def reset(self, task: Task) -> None:
        self._task_id = task.id
        self._actions = self._table.get(task.id)

    async def act(self, observation: str, messages: list[Message], env_info: EnvInfo) -> AgentAction:
        if self._actions is None:
            raise AgentError(f"{self.path.name} has no actions for task {self._task_id!r}")
        if env_info.turn >= len(self._actions):
            raise AgentError(
                f"{self.path.name} has {len(self._actions)} action(s) for task {self._task_id!r}; "
                f"none for turn {env_info.turn}"
            )
        return AgentAction(text=self._actions[env_info.turn])
