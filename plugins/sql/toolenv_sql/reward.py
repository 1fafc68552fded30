"""`ExecutionMatch`: the predicted SQL scores 1 when it returns the gold query's rows.

Rows are compared as a multiset, or as a list when the gold query's outermost
level has ORDER BY; columns in order, or in any order with `column_order=False`
(as Spider's official evaluation allows). Floats (and DuckDB's decimals) are
rounded to 12 significant digits and 6 decimals so that summation order does not
decide a match. Anything that does not run scores 0; why is kept in
`reward_info`, and a task whose gold query fails is also logged.

Why these defaults, against the evaluations RL recipes copy:

- Spider's test-suite evaluation (`exec_eval.result_eq`): multiset of rows, a list when
  the gold has ORDER BY (anywhere in its text, here only at its outermost level, where
  it decides the result's order), columns in any order. Same here but for the columns.
- BIRD (`set(pred) == set(gold)`) and SkyRL-gym's SQL env (`grading.grade(..., "multiset")`,
  from ReViSQL: each row's values sorted as text, rows in any order): rows never
  ordered; BIRD also ignores duplicates, SkyRL ignores which column a value is in.
  Duplicates count here: a question asking for each row wants each row, and a reward
  that never changes with DISTINCT never teaches when it is needed.
- Column order counts by default (as BIRD's), as a question that names its columns
  wants them in that order; `column_order=False` gives Spider's leniency.
- Nothing compares values as text (as SkyRL does, where 1 and 1.0 differ): 1 = 1.0,
  NULL = NULL, NaN = NaN, text is case- and space-sensitive. Known limits of the
  rounding: values less than 1e-6 apart may match (6 decimals), and an integer
  of 13+ digits differs from the same value as a float (rounded to 12 digits).
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from toolenv.episode import Episode
from toolenv.rewards import Reward, record_reward_info, register_reward
from toolenv_sql.errors import SQLError
from toolenv_sql.executor import QueryResult, execute
from toolenv_sql.guard import is_ordered, prepare
from toolenv_sql.paths import DATA_DIR, resolve_database

__all__ = ["ExecutionMatch", "clean_sql", "rows_match"]

_FENCE = re.compile(r"^```(.*?)```$", re.DOTALL)
# A fence's info string ("sql", "sqlite", none): the first word, unless it begins the query itself.
_INFO = re.compile(r"^([\w+.-]*)[ \t]*(?:\r?\n)?")
_QUERY_STARTS = frozenset({"select", "with", "values"})
# Gold results per (engine, path, sql); gold queries are fixed, so they run once per process.
_GOLD: dict[tuple[str, str, str], tuple[QueryResult, bool]] = {}
_GOLD_CACHE_SIZE = 20_000

_log = logging.getLogger(__name__)


def clean_sql(text: str) -> str:
    """The SQL in an answer: without a surrounding ``` fence (and its language tag) or single
    backticks, and without trailing semicolons.

    A comment after the last semicolon may stay: the guard (`prepare`) drops it.
    """
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
        info = _INFO.match(text)
        if info is not None and info.group(1).lower() not in _QUERY_STARTS:  # ```SELECT …``` has no tag
            text = text[info.end() :]
        text = text.strip()
    elif len(text) > 2 and text[0] == text[-1] == "`" and "`" not in text[1:-1]:
        text = text[1:-1].strip()  # `SELECT …`: a quoted name alone is never a query
    return text.rstrip(";").strip()


_NAN = float("nan")  # one object, so that NaN rows can match (a dict finds a key by identity first)


def _float(value: float) -> float:
    """`value` to 12 significant digits, then 6 decimals: the last bits that summation order
    decides go (6 decimals alone keep every bit of a value past 1e9)."""
    if value != value:
        return _NAN
    return round(float(f"{value:.12g}"), 6)


def _number(value: Any) -> Any:
    """A float as `_float` gives it; a DuckDB `Decimal` as the int or float it equals (Python
    never finds `Decimal("0.3")` equal to the double 0.3); anything else as it is."""
    if isinstance(value, Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return _float(float(value))
    return _float(value) if isinstance(value, float) else value


def _value(value: Any) -> Any:
    """`value` as compared: numbers as `_number` gives them; DuckDB's lists, structs and maps
    (Python lists and dicts, which cannot be counted) as tuples of their items, compared alike."""
    if isinstance(value, (float, Decimal)):
        return _number(value)
    if isinstance(value, list):
        return tuple(_value(v) for v in value)
    if isinstance(value, dict):
        return tuple((_value(k), _value(v)) for k, v in value.items())
    return value


def _normal(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_value(v) for v in row)


def _equal(p: list[tuple[Any, ...]], g: list[tuple[Any, ...]], ordered: bool) -> bool:
    if ordered:
        return p == g
    return len(p) == len(g) and Counter(p) == Counter(g)


def _column_orders(p: list[tuple[Any, ...]], g: list[tuple[Any, ...]], ordered: bool) -> Iterator[tuple[int, ...]]:
    """Orders of `p`'s columns under which `p` equals `g`, found column by column: a column is
    placed only where the rows cut to the columns placed so far still equal `g`'s cut there
    (one of several identical columns is tried)."""
    width = len(g[0])
    columns = [tuple(row[j] for row in p) for j in range(width)]
    chosen: list[int] = []

    def walk(i: int) -> Iterator[tuple[int, ...]]:
        if i == width:
            yield tuple(chosen)
            return
        gold_cut = [row[: i + 1] for row in g]
        tried: set[tuple[Any, ...]] = set()
        for j in range(width):
            if j in chosen or columns[j] in tried:
                continue
            tried.add(columns[j])
            chosen.append(j)
            if _equal([tuple(row[k] for k in chosen) for row in p], gold_cut, ordered):
                yield from walk(i + 1)
            chosen.pop()

    return walk(0)


def rows_match(
    predicted: Sequence[Sequence[Any]],
    gold: Sequence[Sequence[Any]],
    *,
    ordered: bool,
    column_order: bool = True,
) -> bool:
    """Equal as lists (`ordered`) or as multisets of rows; with `column_order=False`, under
    some order of the predicted columns."""
    p, g = [_normal(r) for r in predicted], [_normal(r) for r in gold]
    if _equal(p, g, ordered):
        return True
    if column_order or not p or len(p) != len(g) or len(p[0]) != len(g[0]):
        return False
    return next(_column_orders(p, g, ordered), None) is not None


class ExecutionMatch(Reward):
    """1.0 when the answer's SQL returns the same rows as `task.context["gold_sql"]` on the task's database.

    `reward_info(episode)["execution_match"]` holds `score` and `error` (why it is 0: the
    answer's SQL error, or a task fault such as a gold query that fails or a gold result too
    large to compare, which are logged as warnings too).

    Args:
        dialect: the dialect the model writes (transpiled to the engine's), as for `SQLTool`.
        root: directory task `db_path`s are confined to (default: the bundled data).
        timeout: seconds each query may run.
        column_order: False lets the answer's columns come in any order, as Spider's official
            evaluation does (`SELECT age, name` for `SELECT name, age`); True (the default)
            wants them in the gold query's order, as BIRD's does.
    """

    name = "execution_match"

    def __init__(
        self,
        *,
        dialect: str | None = None,
        root: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
        column_order: bool = True,
    ) -> None:
        self.dialect = dialect
        self.column_order = column_order
        self.root = Path(root) if root is not None else DATA_DIR
        self.timeout = timeout
        self.task_faults = 0  # episodes scored 0 because of their task (logged at the 1st, 10th, 100th, ...)
        self._next_warning = 1

    async def final(self, episode: Episode) -> float:
        if episode.answer is None:
            return self._score(episode, 0.0, "no answer")
        task = episode.task
        gold_sql = task.context.get("gold_sql") or next(iter(task.answers), None)
        if not isinstance(gold_sql, str):
            return self._task_fault(episode, "the task has no gold query (task.context['gold_sql'])")
        try:
            path, engine = resolve_database(task.context, self.root)
            gold, ordered = await self._gold(path, engine, gold_sql)
        except SQLError as exc:
            return self._task_fault(episode, f"the gold query failed: {exc}")
        if gold.truncated:  # only a prefix of its rows was kept: nothing can be said to match it
            return self._task_fault(
                episode, f"the gold result is too large to compare ({gold.row_count} rows, past the bytes kept)"
            )
        try:
            sql = prepare(clean_sql(episode.answer), dialect=self.dialect, engine=engine)
            # One row past the gold count is enough to know a longer result differs.
            predicted = await execute(
                path, engine, sql, timeout=self.timeout, max_rows=len(gold.rows) + 1, count_all=False
            )
        except SQLError as exc:
            return self._score(episode, 0.0, str(exc))
        # A truncated result has rows past those kept (past the count, or the bytes kept): more than the gold's.
        matched = not predicted.truncated and rows_match(
            predicted.rows, gold.rows, ordered=ordered, column_order=self.column_order
        )
        return self._score(episode, float(matched), None)

    def _score(self, episode: Episode, score: float, error: str | None) -> float:
        record_reward_info(episode, self.name, score=score, error=error)
        return score

    def _task_fault(self, episode: Episode, error: str) -> float:
        """Score 0 for a fault of the task, not the answer, and say so in the log: every answer to
        such a task scores 0, and a training run would otherwise learn from those zeros unawares."""
        self.task_faults += 1
        if self.task_faults >= self._next_warning:
            self._next_warning *= 10
            _log.warning(
                "execution_match: task %r cannot be scored (%d such episode(s) so far; each scores 0): %s",
                episode.task.id,
                self.task_faults,
                error,
            )
        return self._score(episode, 0.0, error)

    async def _gold(self, path: Path, engine: str, gold_sql: str) -> tuple[QueryResult, bool]:
        key = (engine, str(path), gold_sql)
        found = _GOLD.get(key)
        if found is None:
            result = await execute(path, engine, gold_sql.strip().rstrip(";"), timeout=max(self.timeout, 60.0))
            found = (result, is_ordered(gold_sql, engine))
            if len(_GOLD) >= _GOLD_CACHE_SIZE:
                _GOLD.clear()
            _GOLD[key] = found
        return found


register_reward("execution_match", ExecutionMatch)
