"""The typed record of one rolled-out episode, one JSON line per trajectory.

A trajectory holds everything a report or a training pipeline needs: the task,
the prompt messages, and per turn the action, the parsed tool calls, the tool
results (images kept as base64 PNG/JPEG), the observation, the reward and its
components, timings and token counts when the agent knows them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolenv.image_store import IMAGE_STORE, IMAGES_DIR, ImageStore
from toolenv.types import Message, ParsedAction, Task, ToolResult

__all__ = ["CallStats", "Trajectory", "TurnRecord", "read_trajectories"]

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CallStats(_Model):
    """How one tool call went (the caller's record, JSON-friendly)."""

    name: str
    call_id: str = ""
    attempts: int = 0
    error: str | None = None
    truncated: bool = False
    latency_s: float = 0.0
    cached: bool = Field(default=False, description="Answered by the tool's ResultCache, without running it.")


class TurnRecord(_Model):
    """One agent action and what the env made of it."""

    index: int = Field(ge=0, description="0 for the first action.")
    action: str = Field(description="The action text the env parsed.")
    parsed: ParsedAction = Field(default_factory=ParsedAction)
    results: list[ToolResult] = Field(default_factory=list, description="Tool results, then parser errors.")
    calls: list[CallStats] = Field(default_factory=list)
    observation: str = ""
    reward: float = 0.0
    reward_components: dict[str, float] = Field(default_factory=dict)
    agent_latency_s: float = Field(default=0.0, description="Seconds the agent took to act.")
    env_latency_s: float = Field(default=0.0, description="Seconds the env step took (tool calls, reward).")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    agent_metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def tool_errors(self) -> int:
        """Results of this turn that are errors (tool failures and parse errors)."""
        return sum(1 for r in self.results if r.is_error)


class Trajectory(_Model):
    """One episode, as written to `trajectories.jsonl`."""

    schema_version: int = SCHEMA_VERSION
    env_id: str
    agent: str
    model: str | None = None
    task: Task
    sample: int = Field(default=0, ge=0, description="Index of this attempt at the task (pass@k runs).")
    episode_id: str = ""
    seed: int | None = None
    prompt: str = Field(default="", description="The first observation.")
    prompt_messages: list[Message] = Field(default_factory=list, description="The messages after reset.")
    turns: list[TurnRecord] = Field(default_factory=list)
    answer: str | None = None
    reward: float = Field(default=0.0, description="Sum of the turn rewards.")
    reward_components: dict[str, float] = Field(default_factory=dict, description="Per component, summed over turns.")
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    error: str | None = Field(default=None, description="Why the episode stopped early (agent or env failure).")
    started_at: str = Field(default="", description="ISO 8601 UTC start time.")
    duration_s: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        """What a resumed run uses to skip finished work: (task id, sample)."""
        return self.task.id, self.sample

    @property
    def tool_calls(self) -> int:
        """Tool calls the agent made."""
        return sum(len(t.parsed.tool_calls) for t in self.turns)

    @property
    def tool_errors(self) -> int:
        """Error results (failed calls and parse errors)."""
        return sum(t.tool_errors for t in self.turns)

    @property
    def tool_results(self) -> int:
        """All results, errors included."""
        return sum(len(t.results) for t in self.turns)

    def completion_tokens(self) -> int | None:
        """Generated tokens over all turns, or None when the agent never reported them."""
        known = [t.completion_tokens for t in self.turns if t.completion_tokens is not None]
        return sum(known) if known else None

    def prompt_tokens(self) -> int | None:
        """Prompt tokens over all turns, or None when unknown."""
        known = [t.prompt_tokens for t in self.turns if t.prompt_tokens is not None]
        return sum(known) if known else None

    def to_json_line(self, images: ImageStore | None = None) -> str:
        """One line of JSON (no newline inside). Images are base64 inside the line, or, given
        an `ImageStore`, files in it that the line names."""
        if images is None:
            return self.model_dump_json()
        return self.model_dump_json(context={IMAGE_STORE: images})


def iter_trajectory_lines(path: str | Path) -> Iterator[tuple[int, Trajectory | None, str]]:
    """Each line of a JSONL file as (line number, trajectory or None when invalid, raw line).

    Images a line keeps as files are read from the `images/` folder beside the file.
    """
    path = Path(path)
    context = {IMAGE_STORE: ImageStore(path.parent / IMAGES_DIR)}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, Trajectory.model_validate_json(line, context=context), line
            except ValidationError:
                yield lineno, None, line


def _why_invalid(line: str, path: Path) -> str:
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg})"
    try:
        Trajectory.model_validate_json(line, context={IMAGE_STORE: ImageStore(path.parent / IMAGES_DIR)})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"not a valid trajectory ({where + ': ' if where else ''}{first['msg']})"
    return "not a valid trajectory"  # pragma: no cover - it failed a moment ago


def read_trajectories(path: str | Path, *, strict: bool = False) -> list[Trajectory]:
    """Trajectories from a JSONL file.

    Args:
        path: the file (`runs/NAME/trajectories.jsonl`).
        strict: raise on an invalid line instead of skipping it (a run killed mid-write
            may leave one partial last line).

    Raises:
        ValueError: `strict` and a line is not a valid trajectory (the message names the line).
    """
    out: list[Trajectory] = []
    for lineno, traj, line in iter_trajectory_lines(path):
        if traj is None:
            if strict:
                raise ValueError(f"{path}:{lineno}: {_why_invalid(line, Path(path))}")
            continue
        out.append(traj)
    return out
