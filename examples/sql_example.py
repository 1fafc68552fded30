"""Text-to-SQL environments with toolenv-sql.

1. `gym.make("toolenv/Chinook-v0")`: the model explores the database with
   `<sql>…</sql>` (results come back in `<information>`), then answers with
   `<answer>SQL</answer>`, scored by execution match.
2. The same tool guards the database: a write comes back as an error observation.
3. `SQLTool` on your own SQLite file, with the model writing MySQL.

Run: python examples/sql_example.py
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from pathlib import Path

import gymnasium as gym

import toolenv
from toolenv import Task, ToolCall, ToolCaller, ToolContext
from toolenv_sql import SQLTool


def play_chinook() -> None:
    env = gym.make("toolenv/Chinook-v0")
    obs, info = env.reset(seed=0, options={"task_id": "spiderman-train-chinook_1-000"})
    print("question:", obs.rsplit("Question:", 1)[1].strip())
    obs, reward, *_ = env.step("Let me look first. <sql>SELECT COUNT(*) AS albums FROM Album</sql>")
    print("observation:\n" + obs)
    obs, reward, *_ = env.step("<sql>DELETE FROM Album</sql>")
    print("a write attempt ->", obs)
    obs, reward, _, _, info = env.step("<answer>SELECT COUNT(*) FROM Album</answer>")
    print("reward:", reward, "components:", info["reward_components"])
    env.close()


async def own_database() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "shop.sqlite"
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE orders (id INTEGER, customer TEXT, total REAL)")
            conn.executemany(
                "INSERT INTO orders VALUES (?, ?, ?)", [(1, "ann", 9.5), (2, "bob", 20.0), (3, "ann", 4.25)]
            )
        conn.close()
        tool = SQLTool(root=tmp, dialect="mysql", max_rows=10)
        caller = ToolCaller([tool])
        query = "SELECT `customer`, SUM(`total`) AS spent FROM `orders` GROUP BY `customer` ORDER BY spent DESC"
        ctx = ToolContext(Task(context={"db_path": "shop.sqlite"}))
        [result], _ = await caller.invoke([ToolCall(name="sql", arguments={"query": query})], ctx)
        print("MySQL transpiled to SQLite:", result.metadata["sql"])
        print(result.text)


def main() -> None:
    assert toolenv.__version__
    play_chinook()
    asyncio.run(own_database())


if __name__ == "__main__":
    main()
