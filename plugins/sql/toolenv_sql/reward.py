"""`ExecutionMatch`: the predicted SQL scores 1 when it returns the gold query's rows.

Rows are compared as a multiset, or as a list when the gold query's outermost
level has ORDER BY. Floats are rounded to 6 decimals so that summation order
does not decide a match. Anything that does not run scores 0.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolenv.episode import Episode
from toolenv.rewards import Reward, register_reward
from toolenv_sql.errors import SQLError
from toolenv_sql.executor import execute
from toolenv_sql.guard import is_ordered, prepare
from toolenv_sql.paths import DATA_DIR, resolve_database

__all__ = ["ExecutionMatch", "clean_sql", "rows_match"]

_FENCE = re.compile(r"^```[\w-]*\s*\n?(.*?)\n?```$", re.DOTALL)
# Gold results per (engine, path, sql); gold queries are fixed, so they run once per process.
_GOLD: dict[tuple[str, str, str], tuple[list[tuple[Any, ...]], bool]] = {}
_GOLD_CACHE_SIZE = 20_000


def clean_sql(text: str) -> str:
    """The SQL in an answer: without a surrounding ``` fence and trailing semicolons.

    A comment after the last semicolon may stay: the guard (`prepare`) drops it.
    """
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    return text.rstrip(";").strip()


def _normal(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


def rows_match(predicted: Sequence[Sequence[Any]], gold: Sequence[Sequence[Any]], *, ordered: bool) -> bool:
    """Equal as lists (`ordered`) or as multisets of rows."""
    p, g = [_normal(r) for r in predicted], [_normal(r) for r in gold]
    if ordered:
        return p == g
    return len(p) == len(g) and Counter(p) == Counter(g)


class ExecutionMatch(Reward):
    """1.0 when the answer's SQL returns the same rows as `task.context["gold_sql"]` on the task's database.

    Args:
        dialect: the dialect the model writes (transpiled to the engine's), as for `SQLTool`.
        root: directory task `db_path`s are confined to (default: the bundled data).
        timeout: seconds each query may run.
    """

    name = "execution_match"

    def __init__(
        self, *, dialect: str | None = None, root: str | os.PathLike[str] | None = None, timeout: float = 10.0
    ) -> None:
        self.dialect = dialect
        self.root = Path(root) if root is not None else DATA_DIR
        self.timeout = timeout

    async def final(self, episode: Episode) -> float:
        if episode.answer is None:
            return 0.0
        task = episode.task
        gold_sql = task.context.get("gold_sql") or next(iter(task.answers), None)
        if not isinstance(gold_sql, str):
            return 0.0
        try:
            path, engine = resolve_database(task.context, self.root)
            gold_rows, ordered = await self._gold(path, engine, gold_sql)
            sql = prepare(clean_sql(episode.answer), dialect=self.dialect, engine=engine)
            # One row past the gold count is enough to know a longer result differs.
            predicted = await execute(
                path, engine, sql, timeout=self.timeout, max_rows=len(gold_rows) + 1, count_all=False
            )
        except SQLError:
            return 0.0
        return float(rows_match(predicted.rows, gold_rows, ordered=ordered))

    async def _gold(self, path: Path, engine: str, gold_sql: str) -> tuple[list[tuple[Any, ...]], bool]:
        key = (engine, str(path), gold_sql)
        found = _GOLD.get(key)
        if found is None:
            result = await execute(path, engine, gold_sql.strip().rstrip(";"), timeout=max(self.timeout, 60.0))
            found = (result.rows, is_ordered(gold_sql, engine))
            if len(_GOLD) >= _GOLD_CACHE_SIZE:
                _GOLD.clear()
            _GOLD[key] = found
        return found


register_reward("execution_match", ExecutionMatch)
