"""Aggregate numbers over a set of trajectories: what `summary.json` holds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from toolenv.trajectory import Trajectory

__all__ = ["LatencyStats", "Summary", "summarize"]


class LatencyStats(BaseModel):
    """Seconds: mean and percentiles."""

    model_config = ConfigDict(extra="forbid")

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencyStats | None:
        """Stats of `values`, or None when there are none."""
        if not values:
            return None
        arr = np.asarray(values, dtype=np.float64)
        p50, p90, p99 = (float(x) for x in np.percentile(arr, [50, 90, 99]))
        return cls(count=len(arr), mean=float(arr.mean()), p50=p50, p90=p90, p99=p99, max=float(arr.max()))


class Summary(BaseModel):
    """The summary table of a run."""

    model_config = ConfigDict(extra="forbid")

    episodes: int = 0
    env_ids: list[str] = Field(default_factory=list)
    agents: list[str] = Field(default_factory=list)
    mean_reward: float = 0.0
    std_reward: float = 0.0
    success_rate: float = 0.0
    mean_turns: float = 0.0
    tool_calls_per_episode: float = 0.0
    tool_error_rate: float = Field(default=0.0, description="Error results (failed calls, parse errors) / all results.")
    episode_errors: int = Field(default=0, description="Episodes stopped by an agent or env failure.")
    truncated_rate: float = 0.0
    tool_mix: dict[str, int] = Field(default_factory=dict, description="Calls per tool name.")
    reward_components: dict[str, float] = Field(default_factory=dict, description="Mean per component.")
    episode_latency_s: LatencyStats | None = None
    agent_latency_s: LatencyStats | None = Field(default=None, description="Per action.")
    tool_latency_s: LatencyStats | None = Field(default=None, description="Per tool call.")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    wall_time_s: float | None = Field(default=None, description="Wall time of the run that wrote this summary.")
    interrupted: bool = False


def summarize(trajs: Sequence[Trajectory], *, wall_time_s: float | None = None, interrupted: bool = False) -> Summary:
    """The summary of `trajs` (an empty run gives zeros)."""
    if not trajs:
        return Summary(wall_time_s=wall_time_s, interrupted=interrupted)
    n = len(trajs)
    rewards = np.asarray([t.reward for t in trajs], dtype=np.float64)
    results = sum(t.tool_results for t in trajs)
    mix: Counter[str] = Counter(c.name for t in trajs for turn in t.turns for c in turn.parsed.tool_calls)
    comps: Counter[str] = Counter()
    for t in trajs:
        comps.update(t.reward_components)
    prompt = [p for p in (t.prompt_tokens() for t in trajs) if p is not None]
    completion = [c for c in (t.completion_tokens() for t in trajs) if c is not None]
    return Summary(
        episodes=n,
        env_ids=sorted({t.env_id for t in trajs}),
        agents=sorted({t.agent for t in trajs}),
        mean_reward=float(rewards.mean()),
        std_reward=float(rewards.std()),
        success_rate=sum(t.success for t in trajs) / n,
        mean_turns=sum(len(t.turns) for t in trajs) / n,
        tool_calls_per_episode=sum(t.tool_calls for t in trajs) / n,
        tool_error_rate=(sum(t.tool_errors for t in trajs) / results) if results else 0.0,
        episode_errors=sum(t.error is not None for t in trajs),
        truncated_rate=sum(t.truncated for t in trajs) / n,
        tool_mix=dict(mix.most_common()),
        reward_components={k: v / n for k, v in sorted(comps.items())},
        episode_latency_s=LatencyStats.of([t.duration_s for t in trajs]),
        agent_latency_s=LatencyStats.of([turn.agent_latency_s for t in trajs for turn in t.turns]),
        tool_latency_s=LatencyStats.of([c.latency_s for t in trajs for turn in t.turns for c in turn.calls]),
        prompt_tokens=sum(prompt) if prompt else None,
        completion_tokens=sum(completion) if completion else None,
        wall_time_s=wall_time_s,
        interrupted=interrupted,
    )
