"""The bundled text-to-SQL task sets: Spider dev (10 databases) and Chinook, as toolenv Tasks.

Each question carries its database schema (the CREATE statements), so the model
needs nothing else; `context` holds the database path (relative to the data
directory) and the gold SQL. Loaded once per process.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from pathlib import Path

from toolenv import Task
from toolenv_sql.executor import sqlite_uri
from toolenv_sql.paths import DATA_DIR

__all__ = ["CHINOOK_DIR", "SPIDER_DIR", "chinook_tasks", "render_question", "spider_tasks", "sqlite_schema"]

SPIDER_DIR = DATA_DIR / "spider_dev_sample"
CHINOOK_DIR = DATA_DIR / "chinook"


@functools.cache
def sqlite_schema(path: Path) -> str:
    """The CREATE TABLE/VIEW statements of a SQLite file, in creation order."""
    with sqlite3.connect(sqlite_uri(path), uri=True) as conn:
        rows = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type IN ('table', 'view') AND sql IS NOT NULL "
            "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
    conn.close()
    return "\n".join(f"{sql.strip()};" for (sql,) in rows)


def render_question(question: str, db_id: str, schema: str, engine: str = "SQLite") -> str:
    """The text the model sees: the database's schema, then the question."""
    return f"Database `{db_id}` ({engine}) has this schema:\n{schema}\n\nQuestion: {question}"


def _split_group(db_id: str, gold_sql: str) -> str:
    """What a train/test split keeps together (`metadata["split_group"]`): Spider asks most
    questions twice, in other words, with one gold query; split by task id, 69 of 80 held-out
    tasks had their twin in training."""
    return f"{db_id}\n{' '.join(gold_sql.lower().split()).rstrip(' ;')}"


def _load(questions: Path, db_path: str, source: str) -> tuple[Task, ...]:
    tasks = []
    with questions.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            rel = db_path.format(db_id=row["db_id"])
            tasks.append(
                Task(
                    id=row["id"],
                    question=render_question(row["question"], row["db_id"], sqlite_schema(DATA_DIR / rel)),
                    answer=row["query"],
                    context={"db_path": rel, "db_id": row["db_id"], "gold_sql": row["query"], "engine": "sqlite"},
                    metadata={
                        "source": source,
                        "nl_question": row["question"],
                        "split_group": _split_group(row["db_id"], row["query"]),
                    },
                )
            )
    return tuple(tasks)


@functools.cache
def spider_tasks() -> tuple[Task, ...]:
    """The 697 Spider dev questions over the 10 bundled databases."""
    return _load(SPIDER_DIR / "questions.jsonl", "spider_dev_sample/database/{db_id}/{db_id}.sqlite", "spider-dev")


@functools.cache
def chinook_tasks() -> tuple[Task, ...]:
    """The 84 Spider-derived questions over the Chinook database."""
    return _load(CHINOOK_DIR / "questions.jsonl", "chinook/Chinook_Sqlite.sqlite", "spiderman-chinook")
