"""Action-level shaping: rewards computed on every step (Search-R1++ style penalties, bonuses).

Each rule returns a signed amount (penalties default to negative values), so
`info["reward_components"]` shows the penalty as it was applied; a `{name: weight}`
spec then scales it. Per-call and per-invalid amounts land on the turn where the
action happened; answer avoidance lands on the step that ends the episode.

An invalid action is the model's own fault: a parse error, an unknown tool, arguments that
fail validation, an error the tool puts on the input (a SQL error in the model's query), a
turn without any action. A well-formed call that failed because of the infrastructure (a
result the tool marked `retryable`: a 5xx, a dropped connection; the caller's timeout; a
call refused by an open circuit; an error the tool marks `infra_error`, such as a task whose
database or image is missing) is not: charging it would skew the advantages of every
episode that ran during an outage and teach the policy to stop calling tools.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable

from toolenv.episode import Episode, Turn
from toolenv.rewards.base import Reward, as_reward, register_reward
from toolenv.types import ToolResult

__all__ = [
    "ActionPenalties",
    "AnswerAvoidancePenalty",
    "InvalidCallPenalty",
    "ToolCallPenalty",
    "ToolSuccessBonus",
    "TurnReward",
    "count_invalid",
    "count_tool_successes",
    "is_infra_error",
]


def _amount(reward: str, setting: str, value: object) -> float:
    """`value` as a finite float: a config may give it as text (`"-0.5"`), as weights may be.

    Raises:
        ValueError: it is no number or not finite (it would end a step with an error mid-training).
    """
    amount = _float(value)
    if not math.isfinite(amount):
        raise ValueError(f"{reward}'s {setting} must be a finite number, got {value!r}")
    return amount


def _float(value: object) -> float:
    """`value` as a float (`"2"` and `"-0.5"` from a config too); NaN when it is no number."""
    try:
        return float(value)  # type: ignore[arg-type]  # anything float() takes
    except (TypeError, ValueError):
        return math.nan


def _count(reward: str, setting: str, value: object) -> int:
    """`value` as a whole number >= 0 (`"2"` from a config too).

    Raises:
        ValueError: it is not one.
    """
    n = _float(value)
    if not (math.isfinite(n) and n.is_integer() and n >= 0):
        raise ValueError(f"{reward}'s {setting} must be a whole number >= 0, got {value!r}")
    return int(n)


def _call_results(turn: Turn) -> list[ToolResult]:
    """The results that answer the turn's tool calls (parser errors come after them)."""
    return turn.results[: len(turn.parsed.tool_calls)]


def is_infra_error(result: ToolResult) -> bool:
    """Whether `result` failed for the infrastructure rather than for the call the model wrote:
    marked `retryable` (a 5xx, a dropped connection, the caller's timeout, cancelled work),
    refused by an open circuit breaker (`metadata["circuit_open"]`), or marked by the tool as
    its own or the task's fault (`metadata["infra_error"]`: the task's database or image is
    missing, which no retry mends and no call of the model's could avoid).

    A timeout counts as infrastructure: the caller's timeout cannot tell a slow backend from a
    runaway request, and it marks the result retryable, as it does a 503. A tool that can tell
    reports the input's fault as its own non-retryable error, which is charged (the SQL tool's
    `query_timeout`, a sandbox's time limit on the model's code). A tool that raised is charged
    too: a function tool reports the input's fault by raising (`ValueError("only integers")`).
    """
    return result.is_infra_error


def _tool_faults(turn: Turn, infra_errors: bool) -> int:
    """Failed tool calls of the turn, those that failed for the infrastructure only if `infra_errors`."""
    results = _call_results(turn)
    if infra_errors:
        return sum(r.is_error for r in results)
    return sum(r.is_error and not is_infra_error(r) for r in results)


def count_invalid(
    turn: Turn,
    *,
    parse_errors: bool = True,
    tool_errors: bool = True,
    no_action: bool = True,
    infra_errors: bool = False,
) -> int:
    """Invalid actions in one turn: parse errors, failed tool calls, and a turn that did nothing.

    A call that failed for the infrastructure (`is_infra_error`: retryable, timed out, circuit
    open) is the backend's fault, not the model's, and is not counted unless `infra_errors`.
    """
    n = 0
    parsed = turn.parsed
    if parse_errors:
        n += len(parsed.errors)
    if tool_errors:
        n += _tool_faults(turn, infra_errors)
    if no_action and not parsed.errors and not parsed.tool_calls and parsed.answer is None:
        n += 1
    return n


def count_tool_successes(turn: Turn) -> int:
    """Tool calls in one turn that returned without error."""
    return sum(not r.is_error for r in _call_results(turn))


class ToolCallPenalty(Reward):
    """`per_call` for every tool call of a turn (a cost on tool use), beyond `free_calls` per episode."""

    def __init__(self, per_call: float = -1.0, *, free_calls: int = 0, name: str = "tool_call_penalty") -> None:
        self.per_call = _amount(name, "per_call", per_call)
        self.free_calls = _count(name, "free_calls", free_calls)
        self.name = name

    async def turn(self, episode: Episode, turn: Turn) -> float:
        before = sum(len(t.parsed.tool_calls) for t in episode.turns[:-1]) if episode.turns else 0
        now = len(turn.parsed.tool_calls)
        charged = max(0, before + now - self.free_calls) - max(0, before - self.free_calls)
        return self.per_call * charged if charged else 0.0  # not -0.0 in logs and trajectories


class InvalidCallPenalty(Reward):
    """`per_invalid` for each parse error, failed tool call and (optionally) turn without any action.

    A call that failed for the infrastructure (a 5xx, a timeout, an open circuit) is not charged
    unless `infra_errors=True` (see `count_invalid`).
    """

    def __init__(
        self,
        per_invalid: float = -1.0,
        *,
        parse_errors: bool = True,
        tool_errors: bool = True,
        no_action: bool = True,
        infra_errors: bool = False,
        name: str = "invalid_call_penalty",
    ) -> None:
        self.per_invalid = _amount(name, "per_invalid", per_invalid)
        self.parse_errors = parse_errors
        self.tool_errors = tool_errors
        self.no_action = no_action
        self.infra_errors = infra_errors
        self.name = name

    async def turn(self, episode: Episode, turn: Turn) -> float:
        n = count_invalid(
            turn,
            parse_errors=self.parse_errors,
            tool_errors=self.tool_errors,
            no_action=self.no_action,
            infra_errors=self.infra_errors,
        )
        return self.per_invalid * n if n else 0.0


class AnswerAvoidancePenalty(Reward):
    """`penalty` when the episode ended without a non-empty answer (reported on the last step):
    it ran out of turns, or answered `<answer></answer>`, which would otherwise dodge the penalty."""

    def __init__(self, penalty: float = -1.0, *, name: str = "answer_avoidance_penalty") -> None:
        self.penalty = _amount(name, "penalty", penalty)
        self.name = name

    async def final(self, episode: Episode) -> float:
        answer = episode.answer
        return self.penalty if answer is None or not answer.strip() else 0.0


class ActionPenalties(Reward):
    """The three penalties above as one component, each with its own signed amount.

    Use the separate rewards instead when each should be its own reported component.
    """

    def __init__(
        self,
        per_call: float = 0.0,
        per_invalid: float = -0.5,
        no_answer: float = -1.0,
        *,
        name: str = "penalties",
    ) -> None:
        self.calls = ToolCallPenalty(_amount(name, "per_call", per_call))
        self.invalid = InvalidCallPenalty(_amount(name, "per_invalid", per_invalid))
        self.avoidance = AnswerAvoidancePenalty(_amount(name, "no_answer", no_answer))
        self.name = name

    async def turn(self, episode: Episode, turn: Turn) -> float:
        return await self.calls.turn(episode, turn) + await self.invalid.turn(episode, turn)

    async def final(self, episode: Episode) -> float:
        return await self.avoidance.final(episode)


class ToolSuccessBonus(Reward):
    """`per_success` for every tool call that succeeded in a turn, at most `max_per_turn` calls counted."""

    def __init__(
        self, per_success: float = 1.0, *, max_per_turn: int | None = None, name: str = "tool_success"
    ) -> None:
        self.per_success = _amount(name, "per_success", per_success)
        self.max_per_turn = None if max_per_turn is None else _count(name, "max_per_turn", max_per_turn)
        self.name = name

    async def turn(self, episode: Episode, turn: Turn) -> float:
        n = count_tool_successes(turn)
        if self.max_per_turn is not None:
            n = min(n, self.max_per_turn)
        return self.per_success * n if n else 0.0


TurnFn = Callable[[Episode, Turn], "float | Awaitable[float]"]


class TurnReward(Reward):
    """A per-step reward from a function `fn(episode, turn) -> float` (sync or async)."""

    def __init__(self, fn: TurnFn, *, name: str = "turn_reward") -> None:
        self.fn = fn
        self.name = name

    async def turn(self, episode: Episode, turn: Turn) -> float:
        value = self.fn(episode, turn)
        if inspect.isawaitable(value):
            value = await value
        return as_reward(self.name, value)


register_reward("tool_call_penalty", ToolCallPenalty)
register_reward("invalid_call_penalty", InvalidCallPenalty)
register_reward("answer_avoidance_penalty", AnswerAvoidancePenalty)
register_reward("penalties", ActionPenalties)
register_reward("tool_success", ToolSuccessBonus)
