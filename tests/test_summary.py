"""`summarize` and `SummaryBuilder`: every field of the summary, against numbers worked out by hand."""

from __future__ import annotations

import pytest

from toolenv.report.console import summary_rows
from toolenv.report.summary import Summary, SummaryBuilder, summarize
from toolenv.trajectory import CallStats, Trajectory, TurnRecord
from toolenv.types import ParsedAction, Task, ToolCall, ToolResult


def _turn(
    calls: list[str],
    errors: int,
    *,
    latencies: list[float],
    agent_s: float,
    prompt: int | None = None,
    completion: int | None = None,
    components: dict[str, float] | None = None,
) -> TurnRecord:
    results = [ToolResult(text="ok", name=c) for c in calls[errors:]]
    results += [ToolResult(text="bad", name=c, is_error=True) for c in calls[:errors]]
    return TurnRecord(
        index=0,
        action="a",
        parsed=ParsedAction(tool_calls=[ToolCall(name=c, arguments={}) for c in calls]),
        results=results,
        calls=[CallStats(name=c, latency_s=s) for c, s in zip(calls, latencies)],
        agent_latency_s=agent_s,
        prompt_tokens=prompt,
        completion_tokens=completion,
        reward_components=components or {},
    )


def _trajectories() -> list[Trajectory]:
    t1 = Trajectory(
        env_id="toolenv/A-v0",
        agent="x",
        task=Task(id="1", question="q"),
        reward=1.0,
        success=True,
        terminated=True,
        duration_s=1.0,
        reward_components={"exact_match": 1.0, "format": 0.5},
        turns=[
            _turn(["search", "search"], 1, latencies=[0.1, 0.3], agent_s=0.5, prompt=10, completion=3),
            _turn(["sql"], 0, latencies=[0.2], agent_s=0.7, prompt=20, completion=4),
        ],
    )
    t2 = Trajectory(
        env_id="toolenv/B-v0",
        agent="y",
        task=Task(id="2", question="q"),
        reward=0.0,
        truncated=True,
        duration_s=3.0,
        reward_components={"exact_match": 0.0},
        turns=[_turn(["sql"], 1, latencies=[0.4], agent_s=0.9)],
    )
    t3 = Trajectory(
        env_id="toolenv/A-v0",
        agent="x",
        task=Task(id="3", question="q"),
        reward=0.5,
        duration_s=2.0,
        error="agent failed on turn 0: boom",
    )
    return [t1, t2, t3]


def test_every_field_of_the_summary() -> None:
    s = summarize(_trajectories(), wall_time_s=7.0, interrupted=True)
    assert s.episodes == 3
    assert s.env_ids == ["toolenv/A-v0", "toolenv/B-v0"] and s.agents == ["x", "y"]
    assert s.mean_reward == pytest.approx(0.5)
    assert s.std_reward == pytest.approx((((0.5**2) + (0.5**2) + 0) / 3) ** 0.5)
    assert s.success_rate == pytest.approx(1 / 3)
    assert s.mean_turns == pytest.approx(1.0)  # 2 + 1 + 0 turns
    assert s.tool_calls_per_episode == pytest.approx(4 / 3)
    assert s.tool_error_rate == pytest.approx(2 / 4)  # 2 error results of 4
    assert s.episode_errors == 1 and s.truncated_rate == pytest.approx(1 / 3)
    assert s.tool_mix == {"search": 2, "sql": 2} and (s.cached_calls, s.refused_calls) == (0, 0)
    assert s.reward_components == {"exact_match": pytest.approx(1 / 3), "format": pytest.approx(0.5 / 3)}
    assert s.episode_latency_s is not None
    assert (s.episode_latency_s.count, s.episode_latency_s.mean, s.episode_latency_s.max) == (3, 2.0, 3.0)
    assert s.episode_latency_s.p50 == pytest.approx(2.0)
    assert s.agent_latency_s is not None and s.agent_latency_s.count == 3
    assert s.agent_latency_s.mean == pytest.approx(0.7)
    assert s.tool_latency_s is not None and s.tool_latency_s.count == 4
    assert s.tool_latency_s.mean == pytest.approx(0.25) and s.tool_latency_s.max == pytest.approx(0.4)
    assert s.prompt_tokens == 30 and s.completion_tokens == 7  # t2 never reported tokens
    assert s.wall_time_s == 7.0 and s.interrupted is True


def test_an_empty_run_gives_zeros() -> None:
    s = summarize([], wall_time_s=1.0)
    assert s == Summary(wall_time_s=1.0)
    assert s.prompt_tokens is None and s.episode_latency_s is None


def test_builder_adds_as_it_goes_and_matches_summarize() -> None:
    trajs = _trajectories()
    b = SummaryBuilder()
    assert b.build() == Summary()
    for t in trajs:
        b.add(t)
    assert b.episodes == 3
    assert b.build(wall_time_s=7.0, interrupted=True) == summarize(trajs, wall_time_s=7.0, interrupted=True)
    # Building does not consume: more trajectories can come and a later build counts them.
    b.add(trajs[0])
    assert b.build().episodes == 4 and b.build().tool_mix == {"search": 4, "sql": 3}


def test_cached_and_refused_calls_are_counted_and_shown() -> None:
    from toolenv.report.console import summary_rows

    turn = TurnRecord(
        index=0,
        action="a",
        parsed=ParsedAction(tool_calls=[ToolCall(name="search", arguments={}) for _ in range(3)]),
        results=[
            ToolResult(text="ok", name="search"),
            ToolResult(text="ok", name="search"),
            ToolResult(
                text="Tool 'search' is unavailable", name="search", is_error=True, metadata={"circuit_open": True}
            ),
        ],
        calls=[CallStats(name="search"), CallStats(name="search", cached=True), CallStats(name="search", attempts=0)],
    )
    s = summarize([Trajectory(env_id="e", agent="a", task=Task(id="1", question="q"), turns=[turn])] * 2)
    assert (s.cached_calls, s.refused_calls) == (2, 2)
    rows = dict(summary_rows(s))
    assert rows["calls answered by a cache"] == "2" and rows["calls refused (circuit open)"] == "2"
    assert s.infra_errors == 2 and rows["failed calls not the model's fault"] == "2"  # a refusal is one
    assert "calls answered by a cache" not in dict(summary_rows(summarize(_trajectories())))


def test_the_builder_keeps_eight_bytes_per_latency() -> None:
    """A long run adds millions of latencies (one per turn and one per tool call); the builder
    keeps each as a C double, not as a Python float object in a list (32 bytes each)."""
    import tracemalloc

    calls = ["search"] * 50
    traj = Trajectory(
        env_id="toolenv/A-v0",
        agent="x",
        task=Task(id="1", question="q"),
        duration_s=1.0,
        turns=[_turn(calls, 0, latencies=[0.001 * i for i in range(50)], agent_s=0.5) for _ in range(20)],
    )
    line = traj.model_dump_json()  # each episode read afresh, as a resume or a run makes them
    builder = SummaryBuilder()
    builder.add(traj)  # the first add allocates what every add shares
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(100):
            builder.add(Trajectory.model_validate_json(line))  # then dropped, as the runner does
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    kept = 100 * (20 * 50 + 20 + 2)  # tool latencies, agent latencies, a duration and a reward per episode
    assert grown < 12 * kept, f"{grown / kept:.1f} bytes per latency kept"
    summary = builder.build()
    assert summary.tool_latency_s is not None and summary.tool_latency_s.count == 101 * 1000
    assert summary.tool_latency_s.max == pytest.approx(0.049) and summary.agent_latency_s is not None
    assert summary.agent_latency_s.count == 101 * 20 and summary.episode_latency_s is not None
    assert summary.episode_latency_s.p50 == 1.0 and summary.episodes == 101


def _sampled(task: str, sample: int, success: bool, env_id: str = "toolenv/A-v0") -> Trajectory:
    return Trajectory(
        env_id=env_id, agent="x", task=Task(id=task, question="q"), sample=sample, success=success, duration_s=1.0
    )


def test_pass_at_k_is_the_unbiased_estimate_over_tasks() -> None:
    """With several samples per task, pass@k (Chen et al., 2021): per task 1 - C(n-c, k)/C(n, k),
    averaged over tasks, for k = 1, 2, 4, ... up to the fewest samples a task has, and that count."""
    import math

    outcomes = {"a": [True, False, False, False, False], "b": [False] * 5, "c": [True, True, False, True, False]}
    trajs = [_sampled(t, i, ok) for t, oks in outcomes.items() for i, ok in enumerate(oks)]
    summary = summarize(trajs)

    def expected(k: int) -> float:
        per_task = [1 - math.comb(5 - sum(oks), k) / math.comb(5, k) for oks in outcomes.values()]
        return sum(per_task) / len(per_task)

    assert list(summary.pass_at_k) == ["1", "2", "4", "5"]
    for k in (1, 2, 4, 5):
        assert summary.pass_at_k[str(k)] == pytest.approx(expected(k))
    assert summary.pass_at_k["1"] == pytest.approx(summary.success_rate)  # pass@1 is the success rate here
    assert summary.pass_at_k["5"] == pytest.approx(2 / 3)  # two of three tasks solved at least once
    # A task run once more than the others counts with its own n; k stops at the fewest samples.
    summary = summarize([*trajs, _sampled("a", 5, True)])
    assert list(summary.pass_at_k) == ["1", "2", "4", "5"]
    one_more = 1 - math.comb(6 - 2, 2) / math.comb(6, 2)
    assert summary.pass_at_k["2"] == pytest.approx((one_more + 0 + (1 - math.comb(2, 2) / math.comb(5, 2))) / 3)
    # The same task id in two envs is two tasks; one sample per task gives no pass@k.
    assert summarize([_sampled("a", 0, True), _sampled("a", 0, False, "toolenv/B-v0")]).pass_at_k == {}
    rows = dict(summary_rows(summary))
    assert rows["pass@k"] == ", ".join(f"pass@{k} {summary.pass_at_k[k]:.1%}" for k in ("1", "2", "4", "5"))


def test_the_printed_table_shows_names_with_brackets_as_written() -> None:
    """The tool mix names the tools as the model wrote them: a name like `[/x]` or `[red]sql` is
    text in Rich's table, not markup (a closing tag that matches none raised MarkupError and
    ended `toolenv rollout` after its run; an opening one vanished from the table)."""
    import io

    from toolenv.report.console import print_summary

    turn = TurnRecord(
        index=0, action="a", parsed=ParsedAction(tool_calls=[ToolCall(name="[/x]"), ToolCall(name="[red]sql")])
    )
    s = summarize([Trajectory(env_id="e", agent="a", task=Task(id="1", question="q"), turns=[turn])])
    out = io.StringIO()
    print_summary(s, title="[bold]run", stream=out)
    text = out.getvalue()
    assert "[/x] 1" in text and "[red]sql 1" in text and "[bold]run" in text


def test_episodes_with_a_reward_error_are_shown_when_there_are_any() -> None:
    from toolenv.report.console import summary_rows

    failed = Trajectory(
        env_id="e", agent="a", task=Task(id="1", question="q"), reward_info={"judge": {"error": "HTTP 500"}}
    )
    s = summarize([failed, *_trajectories()])
    assert s.reward_errors == 1 and dict(summary_rows(s))["episodes with a reward error"] == "1"
    assert "episodes with a reward error" not in dict(summary_rows(summarize(_trajectories())))


def test_infra_errors_are_counted_apart_from_the_models_faults() -> None:
    """A run's summary tells an outage or a broken task from the policy's own bad calls: both
    count in tool_error_rate, only the former in infra_errors."""
    from toolenv.report.console import summary_rows

    results = [
        ToolResult(text="syntax error", name="sql", is_error=True),  # the model's query
        ToolResult(text="HTTP 503", name="search", is_error=True, retryable=True),
        ToolResult(text="no such database", name="sql", is_error=True, metadata={"infra_error": True}),
        ToolResult(text="ok", name="sql", metadata={"infra_error": True}),  # not an error: not counted
    ]
    turn = TurnRecord(
        index=0,
        action="a",
        parsed=ParsedAction(tool_calls=[ToolCall(name=r.name, arguments={}) for r in results]),
        results=results,
    )
    s = summarize([Trajectory(env_id="e", agent="a", task=Task(id="1", question="q"), turns=[turn])])
    assert s.infra_errors == 2 and s.tool_error_rate == 0.75
    assert dict(summary_rows(s))["failed calls not the model's fault"] == "2"
    assert "failed calls not the model's fault" not in dict(summary_rows(summarize(_trajectories())))
