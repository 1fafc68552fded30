"""The SQL tool on DuckDB databases, whose queries run in worker processes: many episodes leave no
worker, zombie or descriptor behind, and a worker killed mid-query is an error observation.

The env is the Spider env's factory on a DuckDB file of this test's (the bundled databases
are SQLite). Episodes of four concurrent lanes keep several workers busy at once; envs are
built and closed in batches. The plugin's own tests cover the worker pool itself (memory
bombs, stuck workers, forks); here it is driven through envs, as a training run drives it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rel_support import gauges, make_env, needs_proc, settle, zombie_children

import toolenv

duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install 'toolenv-sql[duckdb]')")
duckdb_worker = pytest.importorskip("toolenv_sql.duckdb_worker", reason="toolenv-sql is not installed")
pytestmark = [
    needs_proc,
    pytest.mark.skipif(not duckdb_worker.AVAILABLE, reason="DuckDB runs in-process here (no RLIMIT_AS)"),
]

LANES = 4
EPISODES = 400  # 100 per lane, each a query turn and an answer turn (and the answer's gold query)
BATCH = 10
SLOW = "SELECT count(*) FROM items a, items b, items c, items d WHERE a.id + b.id + c.id + d.id = 7"


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rel-duck")
    conn = duckdb.connect(str(root / "shop.duckdb"))
    conn.execute("CREATE TABLE items AS SELECT range AS id, 'item' || range::VARCHAR AS name FROM range(500)")
    conn.close()
    return root


def tasks() -> list[toolenv.Task]:
    out = []
    for i in range(1, 6):
        gold = f"SELECT count(*) FROM items WHERE id < {i * 100}"
        out.append(
            toolenv.Task(
                id=f"duck-{i}",
                question=f"How many items have an id below {i * 100}?",
                answer=gold,
                context={"db_path": "shop.duckdb", "gold_sql": gold},
            )
        )
    return out


def duck_env(root: Path, **kwargs: Any) -> toolenv.ToolEnv:
    return make_env("Spider-v0", root=str(root), tasks=tasks(), **{"max_turns": 10, **kwargs})


async def lane(root: Path, lane_id: int, episodes: int) -> int:
    played = 0
    for start in range(0, episodes, BATCH):
        env = duck_env(root)
        for i in range(start, min(episodes, start + BATCH)):
            await env.areset(options={"task_index": (lane_id + i) % 5})
            assert env.episode is not None
            gold = env.episode.task.answers[0]
            _, _, _, _, info = await env.astep(f"<sql>{gold}</sql>")
            assert not info["tool_results"][0].is_error, info["tool_results"][0].text
            _, reward, terminated, _, _ = await env.astep(f"<answer>{gold}</answer>")
            assert terminated and reward == 1.0
            played += 1
        await env.aclose()
    return played


def test_rel_duckdb_episodes_leave_no_workers_zombies_or_fds(shop: Path) -> None:
    async def run(episodes: int) -> int:
        return sum(await asyncio.gather(*(lane(shop, i, episodes) for i in range(LANES))))

    asyncio.run(run(BATCH))  # warm-up: the workers start (up to the pool's size)
    baseline = gauges()
    workers_before = duckdb_worker.worker_pids()
    played = asyncio.run(run(EPISODES // LANES))
    after = settle(baseline)
    workers = duckdb_worker.worker_pids()
    print(
        f"\n[leaks] DuckDB: {played} episodes on {LANES} lanes: workers {len(workers_before)}->{len(workers)}, "
        f"fds {baseline['fds']}->{after['fds']}, children {len(baseline['children'])}->{len(after['children'])}, "
        f"zombies {len(zombie_children())}"
    )
    assert played == EPISODES
    assert after["fds"] <= baseline["fds"], "file descriptors leaked"
    assert after["threads"] <= baseline["threads"], "threads leaked"
    assert len(after["children"]) <= len(baseline["children"]), f"worker processes leaked: {after['children']}"
    assert set(workers) <= after["children"] and len(workers) <= duckdb_worker._pool_now().size
    assert zombie_children() == set()


def _busy_worker(timeout: float = 60.0) -> int:
    """The pid of the worker that is running a query now (state R in /proc), waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in duckdb_worker.worker_pids():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state == "R":
                return int(pid)
        time.sleep(0.01)
    raise AssertionError("no DuckDB worker started the query")


def test_rel_duckdb_worker_killed_mid_query_is_an_error_observation(shop: Path) -> None:
    """SIGKILL (the OOM killer's) to the worker running the model's query: the step returns an
    error result, the episode goes on, the next query and the answer's grading work, and the
    dead worker is reaped."""
    env = duck_env(shop, query_timeout=60.0)
    env.reset(options={"task_index": 0})
    env.step("<sql>SELECT 1</sql>")  # a worker is up
    baseline = gauges()
    outcome: list[Any] = []
    stepper = threading.Thread(target=lambda: outcome.append(env.step(f"<sql>{SLOW}</sql>")))
    stepper.start()
    victim = _busy_worker()
    os.kill(victim, signal.SIGKILL)
    stepper.join(120)
    assert not stepper.is_alive(), "the step did not return after its worker died"
    ((obs, _, terminated, truncated, info),) = outcome
    (result,) = info["tool_results"]
    assert result.is_error and not terminated and not truncated, result.text
    assert "ran longer than" not in result.text  # the death ended the call, not the 60 s limit
    _, _, _, _, info = env.step("<sql>SELECT count(*) FROM items</sql>")
    assert "500" in info["tool_results"][0].text
    _, reward, terminated, _, _ = env.step("<answer>SELECT count(*) FROM items WHERE id < 100</answer>")
    assert terminated and reward == 1.0
    env.close()
    after = settle(baseline)
    assert victim not in duckdb_worker.worker_pids() and victim not in after["children"]
    assert zombie_children() == set()
    assert after["fds"] <= baseline["fds"]
    print(f"\n[faults] DuckDB worker killed mid-query: {result.text[:120]!r}")
