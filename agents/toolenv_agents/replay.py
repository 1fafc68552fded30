"""The `replay` agent: actions read from a JSONL file, keyed by task id.

Two line shapes are accepted:
- `{"task_id": "t1", "actions": ["<tool_call>...</tool_call>", "<answer>5</answer>"]}`
  ;
- a trajectory line written by `toolenv rollout` (its `task.id` and turn actions),
  so a recorded run can be replayed against a changed env or reward, a killed run's too
  (its partial last line is left out with a warning).
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

    A partial last line (one with no newline at its end that is not a whole line: what a run
    killed mid-write leaves) is left out with a warning naming it, as `toolenv view`, `toolenv
    export` and resuming the run leave it out, so a killed run's own output replays.

    Raises:
        ValueError: any other line is not JSON or has neither shape (the message names the line).
    """
    from toolenv.report.html import partial_line_warning

    file = Path(path)
    table: dict[str, list[str]] = {}
    # surrogateescape: bytes a kill cut inside a character make their line invalid, not the file
    with file.open(encoding="utf-8", errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                line.encode("utf-8")
                row: Any = json.loads(line)
            except (UnicodeEncodeError, json.JSONDecodeError) as exc:
                if not line.endswith("\n"):  # only the last line lacks one: cut by a kill
                    partial_line_warning(file, None)(lineno)
                    continue
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "bytes that are not UTF-8"
                raise ValueError(f"{path}:{lineno}: not valid JSON ({why})") from None
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
