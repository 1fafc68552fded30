"""What the SQL plugin's reward tests share: a one-turn episode's reward, the ties tests' singers table."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from toolenv import Task

# Ages tie at 30 (Ann, Bob, Eve) and at 40 (Dan, Fay); Cy alone is youngest; names are distinct.
SINGERS = [
    ("Ann", 30, "UK"),
    ("Cy", 20, "US"),
    ("Bob", 30, "US"),
    ("Dan", 40, "UK"),
    ("Eve", 30, "UK"),
    ("Fay", 40, "US"),
]


def play(task: Task, answer: str, **overrides: Any) -> tuple[float, dict[str, Any]]:
    """The reward and `reward_info` of a one-turn Spider-env episode answering `answer` to `task`."""
    from toolenv_sql.envs import make_spider_env

    env = make_spider_env(tasks=[task], **overrides)
    env.reset(options={"task": task})
    _, reward, terminated, _, info = env.step(f"<answer>{answer}</answer>")
    assert terminated
    env.close()
    return float(reward), info["reward_info"]


def score(path: Path, gold: str, answer: str, **overrides: Any) -> float:
    """The reward of a one-turn episode answering `answer` to a task whose gold query is `gold`."""
    task = Task(id="t", question="q", context={"db_path": path.name, "gold_sql": gold})
    overrides.setdefault("require_table", False)  # the answers are the expected rows, typed in
    return play(task, answer, root=path.parent, **overrides)[0]


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """What `sql` returns on the SQLite or DuckDB file `path`, read directly."""
    if path.suffix == ".duckdb":
        import duckdb

        conn = duckdb.connect(str(path), read_only=True)
        try:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
        finally:
            conn.close()
    with sqlite3.connect(path) as conn:
        found = conn.execute(sql).fetchall()
    conn.close()
    return found
