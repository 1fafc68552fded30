"""Aggregate numbers over a set of trajectories: what `summary.json` holds."""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from toolenv.trajectory import Trajectory

__all__ = ["LatencyStats", "Summary", "SummaryBuilder", "summarize"]


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
    def of(cls, values: Sequence[float] | array[float]) -> LatencyStats | None:
        """Stats of `values`, or None when there are none."""
        if not values:
            return None
        arr = np.frombuffer(values, dtype=np.float64) if isinstance(values, array) else np.asarray(values, np.float64)
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
    pass_at_k: dict[str, float] = Field(
        default_factory=dict,
        description="With several samples per task: the unbiased pass@k (Chen et al., 2021), averaged over "
        "tasks, for k = 1, 2, 4, ... up to the fewest samples a task has, and that number.",
    )
    mean_turns: float = 0.0
    tool_calls_per_episode: float = 0.0
    tool_error_rate: float = Field(default=0.0, description="Error results (failed calls, parse errors) / all results.")
    episode_errors: int = Field(default=0, description="Episodes stopped by an agent or env failure.")
    completed_episodes: int = Field(
        default=0,
        description="Episodes that ended without an `error` (episodes - episode_errors): those the completed_* "
        "metrics are over.",
    )
    completed_mean_reward: float | None = Field(
        default=None,
        description="Mean reward of the completed episodes (None when none completed). An episode a server "
        "failure stopped (a 503 or 429 after the agent's retries) counts in mean_reward as 0; not here.",
    )
    completed_success_rate: float | None = Field(
        default=None, description="Success rate of the completed episodes (None when none completed)."
    )
    completed_pass_at_k: dict[str, float] = Field(
        default_factory=dict,
        description="pass_at_k over the completed episodes: each task's completed samples and successes, for "
        "k up to the fewest completed samples a task has (a task with none left out).",
    )
    reward_errors: int = Field(
        default=0,
        description="Episodes in which a reward part reported an error (a judge that is down) and scored 0: "
        "see each trajectory's reward_info.",
    )
    truncated_rate: float = 0.0
    tool_mix: dict[str, int] = Field(default_factory=dict, description="Calls per tool name.")
    cached_calls: int = Field(default=0, description="Calls a tool's ResultCache answered without running it.")
    refused_calls: int = Field(default=0, description="Calls refused because the tool's circuit breaker was open.")
    infra_errors: int = Field(
        default=0,
        description="Failed calls that were not the model's fault (`ToolResult.is_infra_error`: an outage, "
        "the caller's timeout, an open circuit, a broken task or tool); included in tool_error_rate.",
    )
    agent_retries: int = Field(
        default=0,
        description="Model requests the agent made again (a 429, 5xx, timeout or malformed reply retried), "
        "summed over the recorded turns from `agent_metadata['attempts']`; an episode's failed last request "
        "is in its `error` instead.",
    )
    retried_turns: int = Field(default=0, description="Recorded turns whose model request was retried.")
    truncated_generations: int = Field(
        default=0,
        description="Turns whose generation stopped at max_tokens (`agent_metadata['finish_reason']` "
        "'length'; verl's clip ratio).",
    )
    turns_without_usage: int = Field(
        default=0,
        description="Turns without token counts (a reply without `usage`, or an agent that reports none): "
        "prompt_tokens and completion_tokens leave them out.",
    )
    reward_components: dict[str, float] = Field(default_factory=dict, description="Mean per component.")
    episode_latency_s: LatencyStats | None = None
    agent_latency_s: LatencyStats | None = Field(default=None, description="Per action.")
    tool_latency_s: LatencyStats | None = Field(default=None, description="Per tool call.")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    wall_time_s: float | None = Field(default=None, description="Wall time of the run that wrote this summary.")
    interrupted: bool = Field(
        default=False, description="The run that wrote this summary did not finish (stopped by a signal, or failed)."
    )


class SummaryBuilder:
    """A summary built one trajectory at a time.

    The runner adds each trajectory as its episode ends, while other episodes wait on
    their tools, so the closing summary only computes the percentiles. Rewards and latencies
    are kept as C doubles (8 bytes each, a quarter of a list of floats): a long run adds one
    per turn and one per tool call, and the percentiles are exact.
    """

    def __init__(self) -> None:
        self.episodes = 0
        self._env_ids: set[str] = set()
        self._agents: set[str] = set()
        self._rewards: array[float] = array("d")
        self._successes = 0
        self._turns = 0
        self._calls = 0
        self._results = 0
        self._result_errors = 0
        self._episode_errors = 0
        self._reward_errors = 0
        self._truncated = 0
        self._mix: dict[str, int] = {}
        self._cached = 0
        self._refused = 0
        self._infra = 0
        self._components: dict[str, float] = {}
        self._durations: array[float] = array("d")
        self._agent_latencies: array[float] = array("d")
        self._tool_latencies: array[float] = array("d")
        self._prompt_tokens: int | None = None
        self._completion_tokens: int | None = None
        self._tasks: dict[tuple[str, str], list[int]] = {}  # (env id, task id) -> [samples, successes]
        # The same over the episodes without an error: server failures kept apart from the model's.
        self._completed_rewards: array[float] = array("d")
        self._completed_successes = 0
        self._completed_tasks: dict[tuple[str, str], list[int]] = {}
        self._retries = 0
        self._retried_turns = 0
        self._length_cut = 0
        self._no_usage = 0

    def add(self, traj: Trajectory) -> None:
        """Count one trajectory in."""
        self.episodes += 1
        self._env_ids.add(traj.env_id)
        self._agents.add(traj.agent)
        self._rewards.append(traj.reward)
        self._successes += traj.success
        counts = self._tasks.setdefault((traj.env_id, traj.task.id), [0, 0])
        counts[0] += 1
        counts[1] += traj.success
        self._episode_errors += traj.error is not None
        if traj.error is None:
            self._completed_rewards.append(traj.reward)
            self._completed_successes += traj.success
            done = self._completed_tasks.setdefault((traj.env_id, traj.task.id), [0, 0])
            done[0] += 1
            done[1] += traj.success
        self._reward_errors += traj.reward_error is not None
        self._truncated += traj.truncated
        self._durations.append(traj.duration_s)
        comps = self._components
        for k, v in traj.reward_components.items():
            comps[k] = comps.get(k, 0.0) + v
        self._turns += len(traj.turns)
        mix = self._mix
        agent_latencies, tool_latencies = self._agent_latencies, self._tool_latencies
        for turn in traj.turns:  # plain loops: a generator per turn cost more than the counting
            for c in turn.parsed.tool_calls:
                mix[c.name] = mix.get(c.name, 0) + 1
            self._calls += len(turn.parsed.tool_calls)
            self._results += len(turn.results)
            for r in turn.results:
                if r.is_error:
                    self._result_errors += 1
                    if r.metadata.get("circuit_open"):
                        self._refused += 1
                    if r.is_infra_error:
                        self._infra += 1
            agent_latencies.append(turn.agent_latency_s)
            for stats in turn.calls:
                tool_latencies.append(stats.latency_s)
                if stats.cached:
                    self._cached += 1
            if turn.prompt_tokens is not None:
                self._prompt_tokens = (self._prompt_tokens or 0) + turn.prompt_tokens
            if turn.completion_tokens is not None:
                self._completion_tokens = (self._completion_tokens or 0) + turn.completion_tokens
            if turn.prompt_tokens is None or turn.completion_tokens is None:
                self._no_usage += 1
            if turn.agent_metadata:
                self._count_metadata(turn.agent_metadata)

    def _count_metadata(self, metadata: dict[str, Any]) -> None:
        """Count a turn's retries and cut generation, as the `openai` agent records them (the
        `transformers` agent records `finish_reason` too); other agents' keys are left alone."""
        attempts = metadata.get("attempts")
        if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 1:
            self._retries += attempts - 1
            self._retried_turns += 1
        if metadata.get("finish_reason") == "length":
            self._length_cut += 1

    def build(self, *, wall_time_s: float | None = None, interrupted: bool = False) -> Summary:
        """The summary of everything added so far (an empty builder gives zeros)."""
        n = self.episodes
        if not n:
            return Summary(wall_time_s=wall_time_s, interrupted=interrupted)
        rewards = np.asarray(self._rewards, dtype=np.float64)
        return Summary(
            episodes=n,
            env_ids=sorted(self._env_ids),
            agents=sorted(self._agents),
            mean_reward=float(rewards.mean()),
            std_reward=float(rewards.std()),
            success_rate=self._successes / n,
            pass_at_k=_pass_at_k(list(self._tasks.values())),
            mean_turns=self._turns / n,
            tool_calls_per_episode=self._calls / n,
            tool_error_rate=self._result_errors / self._results if self._results else 0.0,
            episode_errors=self._episode_errors,
            **self._completed(),
            reward_errors=self._reward_errors,
            truncated_rate=self._truncated / n,
            tool_mix=dict(Counter(self._mix).most_common()),
            cached_calls=self._cached,
            refused_calls=self._refused,
            infra_errors=self._infra,
            agent_retries=self._retries,
            retried_turns=self._retried_turns,
            truncated_generations=self._length_cut,
            turns_without_usage=self._no_usage,
            reward_components={k: v / n for k, v in sorted(self._components.items())},
            episode_latency_s=LatencyStats.of(self._durations),
            agent_latency_s=LatencyStats.of(self._agent_latencies),
            tool_latency_s=LatencyStats.of(self._tool_latencies),
            prompt_tokens=self._prompt_tokens,
            completion_tokens=self._completion_tokens,
            wall_time_s=wall_time_s,
            interrupted=interrupted,
        )

    def _completed(self) -> dict[str, Any]:
        """The `completed_*` fields: the metrics over the episodes without an error."""
        done = len(self._completed_rewards)
        if not done:
            return {"completed_episodes": 0}
        return {
            "completed_episodes": done,
            "completed_mean_reward": float(np.asarray(self._completed_rewards, dtype=np.float64).mean()),
            "completed_success_rate": self._completed_successes / done,
            "completed_pass_at_k": _pass_at_k(list(self._completed_tasks.values())),
        }


def _pass_at_k(tasks: list[list[int]]) -> dict[str, float]:
    """Mean over tasks of `1 - C(n - c, k) / C(n, k)` (n samples, c successes), as a product
    (Chen et al.'s stable form; the binomials of large n overflow a float)."""
    fewest = min((n for n, _ in tasks), default=0)
    if fewest < 2:
        return {}
    ks = sorted({*(1 << i for i in range(fewest.bit_length()) if 1 << i <= fewest), fewest})

    def estimate(n: int, c: int, k: int) -> float:
        if n - c < k:
            return 1.0
        return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))

    return {str(k): sum(estimate(n, c, k) for n, c in tasks) / len(tasks) for k in ks}


def summarize(trajs: Iterable[Trajectory], *, wall_time_s: float | None = None, interrupted: bool = False) -> Summary:
    """The summary of `trajs` (an empty run gives zeros)."""
    builder = SummaryBuilder()
    for t in trajs:
        builder.add(t)
    return builder.build(wall_time_s=wall_time_s, interrupted=interrupted)
