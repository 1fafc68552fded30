"""The episode numbers the trainer integrations report: SkyRL's env metrics, TRL's
`episode_metrics` and verl's `reward_extra_info` count the same things the same way.

A failed call and a parse error are counted apart (`tool_errors` is then at most `tool_calls`,
a failure rate); the parser's own results carry the name `"parser"`. `infra_errors` counts the
failed calls that were not the model's fault (an outage, a broken task), so a dashboard tells a
backend going down from a policy getting worse. `answered` is a non-empty answer: an empty
`<answer></answer>` is no answer to the rewards, and must not look like one on a dashboard.
"""

from __future__ import annotations

from collections.abc import Iterable

from toolenv.episode import Turn
from toolenv.types import ToolResult

__all__ = [
    "EPISODE_COUNTS",
    "answered",
    "component_sums",
    "failed_calls",
    "failed_reset",
    "infra_errors",
    "parse_errors",
]

#: The counts reported for every episode, at 0 after a failed reset: a trainer averages each key
#: over the samples that have it, so a key left out would leave the failed samples out of its average.
EPISODE_COUNTS = (
    "return",
    "turns",
    "tool_calls",
    "tool_errors",
    "infra_errors",
    "parse_errors",
    "answered",
    "terminated",
    "truncated",
)


def failed_calls(results: Iterable[ToolResult]) -> int:
    """Error results of tool calls: the parser's own (name `"parser"`) are not calls."""
    return sum(1 for r in results if r.is_error and r.name != "parser")


def infra_errors(results: Iterable[ToolResult]) -> int:
    """Failed tool calls that were not the model's fault (`ToolResult.is_infra_error`)."""
    return sum(1 for r in results if r.name != "parser" and r.is_infra_error)


def answered(answer: str | None) -> float:
    """1.0 for a non-empty answer, as `answer_avoidance_penalty` reads one; else 0.0."""
    return float(answer is not None and bool(answer.strip()))


def parse_errors(results: Iterable[ToolResult]) -> int:
    """The parser's error results: calls it could not read, a turn with no call and no answer."""
    return sum(1 for r in results if r.is_error and r.name == "parser")


def failed_reset() -> dict[str, float]:
    """The numbers of a sample whose reset failed: every count 0, `env_error` 1."""
    return {**dict.fromkeys(EPISODE_COUNTS, 0.0), "env_error": 1.0}


def component_sums(turns: Iterable[Turn], start: dict[str, float] | None = None) -> dict[str, float]:
    """Each reward component summed over `turns` (added to `start`, a copy of which is returned)."""
    sums = dict(start or {})
    for turn in turns:
        for k, v in turn.reward_components.items():
            sums[k] = sums.get(k, 0.0) + v
    return sums
