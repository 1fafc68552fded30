"""The `replay` agent: actions read from a JSONL file, keyed by task id and sample.

Two line shapes are accepted:
- `{"task_id": "t1", "actions": ["<tool_call>...</tool_call>", "<answer>5</answer>"]}`,
  with an optional `"sample": k` (0 when absent);
- a trajectory line written by `toolenv rollout` (its `task.id`, `sample` and turn actions),
  so a recorded run can be replayed against a changed env or reward, a killed run's too
  (its partial last line is left out with a warning). A turn whose calls the model gave as the
  API's tool calls (`agent_metadata["native_tool_calls"]`) is replayed as those calls
  (`AgentAction.parsed`), as the env ran them: its text is a rendering the env's format may not
  read back (a `codeblock` or `tags` env).
When a (task id, sample) appears on several lines, the first line is used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from toolenv.agent import Agent, AgentAction, AgentError, EnvInfo
from toolenv.types import Message, ParsedAction, Task

__all__ = ["ReplayAgent", "load_replay", "load_replay_samples"]

#: Task id -> sample -> actions.
Recorded = dict[str, dict[int, list[str]]]
#: Task id -> sample -> each turn's native calls as the env ran them, and how many the model made
#: (None: a turn written as text).
_Native = dict[str, dict[int, list[tuple[ParsedAction, int] | None]]]


def load_replay_samples(path: str | Path) -> Recorded:
    """Task id → sample → actions, from a JSONL file.

    A partial last line (one with no newline at its end that is not a whole line: what a run
    killed mid-write leaves) is left out with a warning naming it, as `toolenv view`, `toolenv
    export` and resuming the run leave it out, so a killed run's own output replays.

    Raises:
        ValueError: any other line is not JSON or has neither shape (the message names the line).
    """
    return _load(path)[0]


def _load(path: str | Path) -> tuple[Recorded, _Native]:
    """`load_replay_samples`, and the native turns of the trajectory lines among them."""
    from toolenv.report.html import partial_line_warning

    file = Path(path)
    table: Recorded = {}
    natives: _Native = {}
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
            key, sample, actions = _row(row)
            if key is None or sample is None or actions is None:
                raise ValueError(
                    f'{path}:{lineno}: expected {{"task_id": ..., "actions": [...]}} or a trajectory, '
                    "with any sample a non-negative int"
                )
            if sample not in table.setdefault(key, {}):
                table[key][sample] = actions
                native = _native_turns(row)
                if native is not None:
                    natives.setdefault(key, {})[sample] = native
    return table, natives


def _native_turns(row: dict[str, Any]) -> list[tuple[ParsedAction, int] | None] | None:
    """Each turn's calls as the env ran them, for a trajectory line with a native turn; else None."""
    turns = row.get("turns")
    if not isinstance(turns, list):
        return None
    out: list[tuple[ParsedAction, int] | None] = []
    for turn in turns:
        meta = turn.get("agent_metadata") if isinstance(turn, dict) else None
        count = meta.get("native_tool_calls") if isinstance(meta, dict) else None
        parsed = turn.get("parsed") if isinstance(count, int) and count > 0 else None
        if not isinstance(count, int) or not isinstance(parsed, dict):
            out.append(None)
            continue
        try:
            out.append((ParsedAction.model_validate(parsed), count))
        except ValidationError:  # not as toolenv writes it: the turn's text is replayed instead
            out.append(None)
    return out if any(p is not None for p in out) else None


def load_replay(path: str | Path) -> dict[str, list[str]]:
    """Task id → the actions of its first recorded sample (see `load_replay_samples`)."""
    return {task: samples[min(samples)] for task, samples in load_replay_samples(path).items()}


def _sample(value: Any) -> int | None:
    """A line's `sample` (0 when absent); None when it is not a non-negative int."""
    if value is None:
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _row(row: Any) -> tuple[str | None, int | None, list[str] | None]:
    if not isinstance(row, dict):
        return None, None, None
    if "task_id" in row and isinstance(row.get("actions"), list):
        actions = row["actions"]
        ok = all(isinstance(a, str) for a in actions)
        return str(row["task_id"]), _sample(row.get("sample")), (list(actions) if ok else None)
    task, turns = row.get("task"), row.get("turns")
    if isinstance(task, dict) and isinstance(turns, list):
        actions = [t.get("action") for t in turns if isinstance(t, dict)]
        ok = all(isinstance(a, str) for a in actions)
        return str(task.get("id", "")), _sample(row.get("sample")), ([str(a) for a in actions] if ok else None)
    return None, None, None


class ReplayAgent(Agent):
    """Replays recorded actions; a task, sample or turn with no recorded action is an agent error.

    In a rollout with several samples per task, sample k (`EnvInfo.sample`) plays the recorded
    sample k of its task. Outside the runner, the first recorded sample is played.

    Args:
        path: the JSONL file.
    """

    name = "replay"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._table, self._natives = _load(self.path)
        self._task_id = ""

    def reset(self, task: Task) -> None:
        self._task_id = task.id

    async def act(self, observation: str, messages: list[Message], env_info: EnvInfo) -> AgentAction:
        recorded = self._table.get(self._task_id)
        if recorded is None:
            raise AgentError(f"{self.path.name} has no actions for task {self._task_id!r}")
        sample = min(recorded) if env_info.episode is None else env_info.sample
        actions = recorded.get(sample)
        if actions is None:
            held = ", ".join(map(str, sorted(recorded)))
            raise AgentError(
                f"{self.path.name} has no sample {sample} of task {self._task_id!r} (it holds sample(s) {held})"
            )
        if env_info.turn >= len(actions):
            raise AgentError(
                f"{self.path.name} has {len(actions)} action(s) for sample {sample} of task {self._task_id!r}; "
                f"none for turn {env_info.turn}"
            )
        native = self._natives.get(self._task_id, {}).get(sample)
        turn = native[env_info.turn] if native is not None else None
        if turn is None:
            return AgentAction(text=actions[env_info.turn], metadata={"replayed_sample": sample})
        meta = {"replayed_sample": sample, "native_tool_calls": turn[1]}
        return AgentAction(text=actions[env_info.turn], parsed=turn[0], metadata=meta)
