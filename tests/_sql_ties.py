"""What the SQL plugin's ORDER BY-ties tests share: the singers table and a one-turn score."""

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


def score(path: Path, gold: str, answer: str, **overrides: Any) -> float:
    """The reward of a one-turn episode answering `answer` to a task whose gold query is `gold`."""
    from toolenv_sql.envs import make_spider_env

    task = Task(id="t", question="q", context={"db_path": path.name, "gold_sql": gold})
    overrides.setdefault("require_table", False)  # the answers are the expected rows, typed in
    env = make_spider_env(tasks=[task], root=path.parent, **overrides)
    env.reset(options={"task": task})
    _, reward, terminated, _, _ = env.step(f"<answer>{answer}</answer>")
    assert terminated
    env.close()
    return float(reward)


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
