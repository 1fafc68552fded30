"""The state of one episode as rewards and reports see it."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from toolenv._tool import ToolContext
from toolenv.caller import ToolCaller, ToolCallRecord
from toolenv.types import Message, ParsedAction, Task, ToolCall, ToolResult

__all__ = ["Episode", "Turn"]


class _EpisodeIds:
    """32 hex digits: a random per-process prefix and a counter.

    As unique as `uuid4().hex` within a run (and across forked workers: a child draws a new
    prefix) at a tenth of its cost, which is a fifth of a reset.
    """

    def __init__(self) -> None:
        self.renew()
        os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):016x}"


new_episode_id = _EpisodeIds()


@dataclass(slots=True)
class Turn:
    """One model turn: the raw action, what was parsed, and what the tools returned."""

    action: str
    parsed: ParsedAction
    results: list[ToolResult] = field(default_factory=list)
    records: list[ToolCallRecord] = field(default_factory=list)
    observation: str = ""
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)


@dataclass
class Episode:
    """Everything that happened since `reset`; rewards read it, the env appends to it."""

    task: Task
    episode_id: str
    caller: ToolCaller
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    answer: str | None = None
    reward_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    released: bool = False
    #: The final reward's components once the env has scored the episode's end (an answer,
    #: its `max_turns`, or `atruncate`); they are also in the last turn's, when there is one.
    final_components: dict[str, float] | None = None

    def context(self) -> ToolContext:
        """A tool context for the current turn."""
        return ToolContext(task=self.task, episode_id=self.episode_id, turn=len(self.turns), state=self.state)

    async def call_tool(self, name: str, /, **arguments: Any) -> ToolResult:
        """Call one of the env's tools outside the model's turns, in the episode's own context
        (the state and sessions its calls left). A check the policy must not influence runs in
        a fresh context instead, as `ToolVerified` does.

        `name` is positional-only, so a tool may take an argument called `name`.
        """
        results, _ = await self.caller.invoke([ToolCall(name=name, arguments=arguments, id="verify")], self.context())
        return results[0]

    @property
    def tool_calls(self) -> int:
        """Tool calls made so far."""
        return sum(len(t.parsed.tool_calls) for t in self.turns)

    @property
    def tool_errors(self) -> int:
        """Error results so far: failed tool calls, parse errors and turns with no action."""
        return sum(1 for t in self.turns for r in t.results if r.is_error)
