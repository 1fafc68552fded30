"""Many episodes across every installed env leave no file descriptors, threads or processes behind.

Each env (and each option variant of one, `rel_support.OPTION_VARIANTS`) first
plays its working set of tasks once, because heavy resources (the code sandbox
server, search indexes, per-database handles) are shared process-wide on purpose
and may be cached per task. The baseline is taken after
that; then `TOOLENV_REL_EPISODES` episodes (5,000, in CI too)
cycle over the same tasks, played by oracles with a malformed turn first, on
envs built and closed in batches: anything that grows now grows per episode.
After the last close, open fds, threads and child processes must return to the
baseline; resident memory growth is reported and bounded. The SQL executor's
pool threads and their cached connections are counted apart: which pool thread
runs a query is up to the scheduler, so a thread may open its first connection
to a database after the baseline; the bound there is one connection per thread
and database file, which a leak (a connection per query or episode) breaks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rel_support import (
    CORE,
    EPISODES,
    env_names,
    gauges,
    make_env,
    needs_proc,
    open_fds,
    option_variants,
    oracle,
    sandbox_only,
    settle,
)

import toolenv

BATCH = 10  # episodes per env instance: construction and close are exercised too
WORKING_SET = 20  # distinct tasks per env
MALFORMED = '<tool_call>{"name": "nope", "arguments": {</tool_call><answer'


def core_policy(task: toolenv.Task, turn: int, observation: str) -> str:
    if turn == 0:
        return '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    return f"<answer>{task.answers[0]}</answer>"


def play(env: toolenv.ToolEnv, policy: Callable[..., str], index: int) -> None:
    """One episode: a malformed turn, then the oracle until the episode ends (the working set
    wraps round an env with fewer tasks: `task_index` past the last one is refused)."""
    obs, _ = env.reset(options={"task_index": index % len(env.tasks)})
    assert env.episode is not None
    _, _, term, trunc, info = env.step(MALFORMED)
    assert any(r.is_error for r in info["tool_results"]) and not term
    for turn in range(8):
        obs, _, term, trunc, _ = env.step(policy(env.episode.task, turn, obs))
        if term or trunc:
            return
    raise AssertionError("the oracle did not finish the episode")


@needs_proc
def test_rel_no_leaks_across_episodes() -> None:
    names = [*env_names(), *option_variants()]
    policies = {n: (core_policy if n == CORE else oracle(n)) for n in names}
    names = [n for n in names if policies[n] is not None]
    kwargs = {n: {"max_turns": 10, **sandbox_only(n)} for n in names}
    for n in names:  # warm-up: process-wide pools and per-task caches fill here, once
        env = make_env(n, **kwargs[n])
        for i in range(WORKING_SET):
            play(env, policies[n], i)
        env.close()
    baseline = gauges()
    per_env = -(-EPISODES // len(names))  # rounded up: at least EPISODES in all
    played = 0
    t0 = time.perf_counter()
    peak_fds = baseline["fds"]
    for n in names:
        for start in range(0, per_env, BATCH):
            env = make_env(n, **kwargs[n])
            for i in range(start, min(per_env, start + BATCH)):
                play(env, policies[n], i % WORKING_SET)
                played += 1
            peak_fds = max(peak_fds, open_fds())
            env.close()
    elapsed = time.perf_counter() - t0
    after = settle(baseline)
    growth = after["rss_mb"] - baseline["rss_mb"]
    print(
        f"\n[leaks] {played} episodes over {len(names)} envs in {elapsed:.1f} s: "
        f"fds {baseline['fds']}->{after['fds']} (peak {peak_fds}), threads {baseline['threads']}->{after['threads']}, "
        f"children {len(baseline['children'])}->{len(after['children'])}, "
        f"database connections {sum(baseline['db_fds'].values())}->{sum(after['db_fds'].values())} "
        f"on {after['sql_threads']} pool threads, "
        f"RSS {baseline['rss_mb']:.0f}->{after['rss_mb']:.0f} MiB ({growth:+.1f})"
    )
    assert played >= EPISODES
    assert after["fds"] <= baseline["fds"], "file descriptors leaked"
    assert after["threads"] <= baseline["threads"], "threads leaked"
    assert after["children"] <= baseline["children"], f"child processes leaked: {after['children']}"
    # Each pool thread, the calling thread's inline queries, and any other long-lived thread
    # that ran queries before (e.g. the SkyRL adapter's event-loop thread, when its tests ran
    # first in this process): per-thread caches, bounded; a leak would grow with the episodes.
    per_db_bound = after["sql_threads"] + 1 + max(0, baseline["threads"] - 1)
    assert all(n <= per_db_bound for n in after["db_fds"].values()), f"database connections leaked: {after['db_fds']}"
    # Bounded: a few kB per episode at most (caches are bounded; trajectories are not kept).
    assert growth < 64 + played * 0.02, f"RSS grew {growth:.1f} MiB over {played} episodes"


@needs_proc
def test_rel_vector_env_close_releases_everything() -> None:
    """A 64-env ToolVectorEnv of the core env: its loop, threads and fds go away on close."""
    env = make_env(CORE)
    env.reset(seed=0)
    env.close()
    baseline = gauges()
    for _ in range(3):
        venv = toolenv.ToolVectorEnv([lambda: make_env(CORE, max_turns=3)] * 64)
        venv.reset(seed=0)
        for _ in range(4):
            venv.step(['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'] * 64)
        venv.close()
    after = settle(baseline)
    assert after["fds"] <= baseline["fds"] and after["threads"] <= baseline["threads"]
    assert after["children"] <= baseline["children"]
