"""`ExecutionMatch`: the predicted SQL scores 1 when it returns the gold query's rows.

Rows are compared as a multiset, or as a list when the gold query's outermost
level has ORDER BY; columns in order, or in any order with `column_order=False`
(as Spider's official evaluation allows). Floats (and DuckDB's decimals) are
rounded to 12 significant digits and 6 decimals so that summation order does not
decide a match. Anything that does not run scores 0; why is kept in
`reward_info`, and a task whose gold query fails is also logged.

Under ORDER BY, rows with equal keys may come in any order, and where a tie crosses the
gold's LIMIT (or OFFSET) any of the tied rows may be the ones kept: SQL leaves both to the
engine's plan, so another index, join order or equivalent query returns them otherwise, and
a list comparison (Spider's) scores that right answer 0 (32 of the 146 ordered Spider dev
gold queries bundled here have such ties, 30 of them at a LIMIT). The keys are read by
running the gold query once more, rewritten with sqlglot to select the ORDER BY terms no
output column holds (a position, an alias or a selected expression is read from its
column), without its OFFSET and with 1,000 more rows in its LIMIT; where that cannot be done
or be trusted (DISTINCT with a key not selected, a LIMIT that is not a number, a term whose
column the engines may resolve otherwise, a rewrite that sqlglot cannot render as parsed, that
fails or disagrees with the gold's own rows) the order is compared as a list, as before.
Keys are compared as values (floats to 12 significant digits, but not to 6 decimals: see
`_key`), so a collation's ties (`COLLATE NOCASE`) still count as different. A row may stand
in for another only if the gold query's own result gives it the same key, so an answer scores
1 only with rows the gold query could have returned under some plan.

Why these defaults, against the evaluations RL recipes copy:

- Spider's test-suite evaluation (`exec_eval.result_eq`): multiset of rows, a list when
  the gold has ORDER BY (anywhere in its text, here only at its outermost level, where
  it decides the result's order), columns in any order. Same here but for the columns
  and for ties under ORDER BY, which Spider's list comparison gets wrong.
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
- An answer must read a table of the database when the gold query does (`require_table`):
  rows pasted as literals (`VALUES ('Joe Sharp', 52), ...`), a constant count (`SELECT 6`)
  or `SELECT 1 WHERE 1 = 0` for an empty gold result return the gold rows without querying
  the data, and a policy that saw them in the SQL tool learns to answer so. Naming a table is
  not enough: an answer whose every output column is a constant (`SELECT 6 FROM singer LIMIT 1`,
  `SELECT 6 WHERE EXISTS (SELECT 1 FROM singer)`) is refused too, unless the gold query's are.
  Spider, BIRD and SkyRL score such answers 1; `require_table=False` does too.
- `test_suite=True` (off by default) borrows Spider's test-suite accuracy (Zhong et al., 2020)
  with one derived database: the answer must match the gold query on a copy of the database
  with rows removed as well, which catches a paste that reads a column only for show and an
  answer that matches by coincidence.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from toolenv._decades import Decades
from toolenv.episode import Episode
from toolenv.rewards import Reward, record_reward_info, register_reward
from toolenv_sql.dependence import constant_output, perturbed_copy
from toolenv_sql.errors import SQLError
from toolenv_sql.executor import QueryResult, execute
from toolenv_sql.guard import is_ordered, prepare
from toolenv_sql.order import OrderKeys, order_keys
from toolenv_sql.paths import DATA_DIR, resolve_database
from toolenv_sql.reads import database_tables, tables_read

__all__ = ["CONSTANT_OUTPUT", "NOT_FROM_DATA", "NO_TABLE_READ", "ExecutionMatch", "clean_sql", "rows_match"]

_FENCE = re.compile(r"^```(.*?)```$", re.DOTALL)
# A fence's info string ("sql", "sqlite", none): the first word, unless it begins the query itself.
_INFO = re.compile(r"^([\w+.-]*)[ \t]*(?:\r?\n)?")
_QUERY_STARTS = frozenset({"select", "with", "values"})
_Row = tuple[Any, ...]
# A run of gold rows [start, end) with equal ORDER BY keys, and the rows tied with it past the
# gold's OFFSET or LIMIT, which may stand in for its own.
_Run = tuple[int, int, list[_Row]]


@dataclass(frozen=True)
class _Gold:
    """A gold query's result, and what its rows are compared with."""

    result: QueryResult
    ordered: bool
    rows: list[_Row]
    #: Each row's ORDER BY key when some are tied (None: none are, or they cannot be read).
    keys: list[Any] | None = None
    before: list[_Row] = field(default_factory=list)
    after: list[_Row] = field(default_factory=list)


# Gold results per (engine, path, sql); gold queries are fixed, so they run once per process.
_GOLD: dict[tuple[str, str, str], _Gold] = {}
_GOLD_CACHE_SIZE = 20_000
# Rows read past a gold query's LIMIT to find those tied with its last row (fewer tied rows are
# then known, never more: a right answer may still score 0, a wrong one never 1).
_TIED_PAST_LIMIT = 1000

_log = logging.getLogger(__name__)

#: `reward_info` error of an answer that reads no table while the gold query does.
NO_TABLE_READ = (
    "the answer reads no table of the database, so it returns the same rows whatever the data holds; "
    "query the tables (require_table=False allows such answers)"
)
#: `reward_info` error of an answer whose every output column is a constant (`SELECT 6 FROM singer`)
#: while the gold query's are not.
CONSTANT_OUTPUT = (
    "the answer's rows do not come from the data: every column it returns is a constant, whatever the "
    "tables hold; select the values from the tables (require_table=False allows such answers)"
)
#: `reward_info` error of an answer that matches the gold rows, but not on a copy of the database
#: with rows removed, where the gold query is run too (`test_suite=True`).
NOT_FROM_DATA = (
    "the answer's rows do not come from the data: it returns the gold query's rows on the database, "
    "but not on a copy with some rows removed, where both were run; compute them from the tables "
    "(test_suite=False skips this check)"
)
# Which rows the perturbed copy leaves out (fixed, so that an answer scores the same in every run).
_PERTURB_SEED = 0
# Databases no copy could be made of (warned about once each).
_NO_COPY: set[str] = set()


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


def _key(key: Any) -> Any:
    """An ORDER BY key as compared: floats to 12 significant digits, so that keys apart only in
    their last bits are tied (an equivalent query may sum in another order and swap them), but
    not to 6 decimals as values are: keys under 5e-7 would all be 0, and any row "tied" for the
    smallest. DuckDB's decimals are exact, and compared so."""
    if isinstance(key, float):
        return _NAN if key != key else float(f"{key:.12g}")
    if isinstance(key, (tuple, list)):
        return tuple(_key(k) for k in key)
    if isinstance(key, dict):
        return tuple((_key(k), _key(v)) for k, v in key.items())
    return key


def _runs(
    keys: Sequence[Any], before: Sequence[Sequence[Any]], after: Sequence[Sequence[Any]], size: int
) -> list[_Run]:
    """The runs of `size` gold rows that may come in another order: equal keys next to each
    other, and the first and last run with the rows tied with them past the OFFSET and LIMIT."""
    if len(keys) != size:
        raise ValueError(f"rows_match got {len(keys)} keys for {size} gold rows; give one key per gold row.")
    normal = [_key(k) for k in keys]
    runs: list[_Run] = []
    start = 0
    for end in range(1, size + 1):
        if end == size or normal[end] != normal[start]:
            spare = [_normal(r) for r in (before if start == 0 else ())]
            spare += [_normal(r) for r in (after if end == size else ())]
            if end - start > 1 or spare:
                runs.append((start, end, spare))
            start = end
    return runs


def _equal(p: list[_Row], g: list[_Row], ordered: bool, runs: list[_Run] | None = None) -> bool:
    """`p` equals `g`: as a multiset, as a list, or as a list but within `runs`, where `p` may
    hold any rows of the run and its spare rows, in any order."""
    if not ordered:
        return len(p) == len(g) and Counter(p) == Counter(g)
    if p == g:
        return True
    if not runs or len(p) != len(g):
        return False
    done = 0
    for start, end, spare in runs:
        if p[done:start] != g[done:start] or Counter(p[start:end]) - Counter(g[start:end] + spare):
            return False
        done = end
    return p[done:] == g[done:]


def _column_orders(p: list[_Row], g: list[_Row], ordered: bool, runs: list[_Run] | None) -> Iterator[tuple[int, ...]]:
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
        runs_cut = None if runs is None else [(s, e, [row[: i + 1] for row in spare]) for s, e, spare in runs]
        tried: set[tuple[Any, ...]] = set()
        for j in range(width):
            if j in chosen or columns[j] in tried:
                continue
            tried.add(columns[j])
            chosen.append(j)
            if _equal([tuple(row[k] for k in chosen) for row in p], gold_cut, ordered, runs_cut):
                yield from walk(i + 1)
            chosen.pop()

    return walk(0)


def rows_match(
    predicted: Sequence[Sequence[Any]],
    gold: Sequence[Sequence[Any]],
    *,
    ordered: bool,
    column_order: bool = True,
    keys: Sequence[Any] | None = None,
    before: Sequence[Sequence[Any]] = (),
    after: Sequence[Sequence[Any]] = (),
) -> bool:
    """Equal as lists (`ordered`) or as multisets of rows; with `column_order=False`, under
    some order of the predicted columns.

    `keys`, one per gold row (its ORDER BY key), let `ordered` rows with equal keys next to
    each other come in any order. `before` and `after` are rows past the gold's OFFSET and
    LIMIT tied with its first and last row: any of them may stand in for a row of that tie.
    """
    p, g = [_normal(r) for r in predicted], [_normal(r) for r in gold]
    runs = _runs(keys, before, after, len(g)) if ordered and keys is not None else None
    if _equal(p, g, ordered, runs):
        return True
    if column_order or not p or len(p) != len(g) or len(p[0]) != len(g[0]):
        return False
    return next(_column_orders(p, g, ordered, runs), None) is not None


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
        require_table: True (the default) scores 0 an answer that reads no table of the database
            (literals, `SELECT 6`, `SELECT 1 WHERE 1 = 0`), or whose every output column is a
            constant (`SELECT 6 FROM singer LIMIT 1`), when the gold query reads a table, as it
            would match without querying the data; False scores it by its rows, as Spider does.
        test_suite: True also runs the gold query and an answer that matched it on a copy of a
            SQLite database with some rows removed (`toolenv_sql.dependence.perturbed_copy`), and
            scores 1 only if they match there too: it refuses pastes the syntactic check lets by
            (`SELECT 6 + 0 * count(*) FROM singer`) and answers that matched by coincidence
            (another question's query). Off by default, as it changes the score of such wrong
            but matching queries, which Spider's execution accuracy counts right. Needs
            `require_table`; DuckDB databases are not copied.
    """

    name = "execution_match"

    def __init__(
        self,
        *,
        dialect: str | None = None,
        root: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
        column_order: bool = True,
        require_table: bool = True,
        test_suite: bool = False,
    ) -> None:
        self.dialect = dialect
        self.column_order = column_order
        self.require_table = require_table
        self.test_suite = test_suite
        self.root = Path(root) if root is not None else DATA_DIR
        self.timeout = timeout
        self.task_faults = 0  # episodes scored 0 because of their task (logged at the 1st, 10th, 100th, ...)
        self._warnings = Decades()

    async def final(self, episode: Episode) -> float:
        if episode.answer is None:
            return self._score(episode, 0.0, "no answer")
        task = episode.task
        gold_sql = task.context.get("gold_sql") or next(iter(task.answers), None)
        if not isinstance(gold_sql, str):
            return self._task_fault(episode, "the task has no gold query (task.context['gold_sql'])")
        try:
            path, engine = resolve_database(task.context, self.root)
            gold = await self._gold(path, engine, gold_sql)
        except SQLError as exc:
            return self._task_fault(episode, f"the gold query failed: {exc}")
        if gold.result.truncated:  # only a prefix of its rows was kept: nothing can be said to match it
            return self._task_fault(
                episode,
                f"the gold result is too large to compare ({gold.result.row_count} rows, past the bytes kept)",
            )
        try:
            sql = prepare(clean_sql(episode.answer), dialect=self.dialect, engine=engine)
            # One row past the gold count is enough to know a longer result differs.
            predicted = await execute(
                path, engine, sql, timeout=self.timeout, max_rows=len(gold.rows) + 1, count_all=False
            )
        except SQLError as exc:
            return self._score(episode, 0.0, str(exc))
        checked = False  # whether the answer must get its rows from the data (the gold query reads a table)
        if self.require_table:
            try:
                tables = await database_tables(path, engine, timeout=max(self.timeout, 60.0))
            except SQLError as exc:
                return self._task_fault(episode, f"the database's tables cannot be listed: {exc}")
            checked = _reads_table(gold_sql, engine, tables)
            if checked and not _reads_table(sql, engine, tables, unknown=True):
                return self._score(episode, 0.0, NO_TABLE_READ)
        matched = self._matches(predicted, gold)
        if matched and checked:  # only a match needs to show its rows come from the data
            error = await self._data_error(path, engine, gold_sql, sql)
            if error is not None:
                return self._score(episode, 0.0, error)
        return self._score(episode, float(matched), None)

    def _matches(self, predicted: QueryResult, gold: _Gold) -> bool:
        """Whether `predicted` returns `gold`'s rows (a truncated result has rows past those kept,
        past the count or the bytes kept: more than the gold's)."""
        return not predicted.truncated and rows_match(
            predicted.rows,
            gold.rows,
            ordered=gold.ordered,
            column_order=self.column_order,
            keys=gold.keys,
            before=gold.before,
            after=gold.after,
        )

    async def _data_error(self, path: Path, engine: str, gold_sql: str, sql: str) -> str | None:
        """Why the answer's rows, which match the gold's, do not come from the data (None: they do,
        as far as the checks tell): its columns are all constants, or (`test_suite`) it does not
        match the gold query on a copy of the database with rows removed."""
        if constant_output(sql, engine) and not constant_output(gold_sql.strip().rstrip(";"), engine):
            return CONSTANT_OUTPUT
        if self.test_suite and engine == "sqlite":
            return await self._perturbed_error(path, engine, gold_sql, sql)
        return None

    async def _perturbed_error(self, path: Path, engine: str, gold_sql: str, sql: str) -> str | None:
        """Why the answer, which matched the gold rows, does not match them on a copy of the
        database with rows removed (None when it does, or when the gold query cannot be run there:
        the match on the database itself then stands)."""
        try:
            copy = await perturbed_copy(path, seed=_PERTURB_SEED)
            gold = await self._gold(copy, engine, gold_sql)
        except (OSError, sqlite3.Error) as exc:  # the copy cannot be made: say so once per database
            if str(path) not in _NO_COPY:
                _NO_COPY.add(str(path))
                _log.warning("execution_match: no copy of %s for test_suite (%s); scored on it alone", path, exc)
            return None
        except SQLError as exc:
            _log.debug("execution_match: gold query %r fails on the copy (%s); scored on the database", gold_sql, exc)
            return None
        if gold.result.truncated:
            return None
        try:
            predicted = await execute(
                copy, engine, sql, timeout=self.timeout, max_rows=len(gold.rows) + 1, count_all=False
            )
        except SQLError as exc:
            return f"{NOT_FROM_DATA} (it fails there: {exc})"
        return None if self._matches(predicted, gold) else NOT_FROM_DATA

    def _score(self, episode: Episode, score: float, error: str | None) -> float:
        record_reward_info(episode, self.name, score=score, error=error)
        return score

    def _task_fault(self, episode: Episode, error: str) -> float:
        """Score 0 for a fault of the task, not the answer, and say so in the log: every answer to
        such a task scores 0, and a training run would otherwise learn from those zeros unawares."""
        self.task_faults += 1
        if self._warnings.due(self.task_faults):
            _log.warning(
                "execution_match: task %r cannot be scored (%d such episode(s) so far; each scores 0): %s",
                episode.task.id,
                self.task_faults,
                error,
            )
        return self._score(episode, 0.0, error)

    async def _gold(self, path: Path, engine: str, gold_sql: str) -> _Gold:
        key = (engine, str(path), gold_sql)
        found = _GOLD.get(key)
        if found is None:
            timeout = max(self.timeout, 60.0)
            result = await execute(path, engine, gold_sql.strip().rstrip(";"), timeout=timeout)
            found = _Gold(result, is_ordered(gold_sql, engine), result.rows)
            order = (
                order_keys(gold_sql, engine, past=_TIED_PAST_LIMIT) if found.ordered and not result.truncated else None
            )
            if order is not None:
                found = await _with_ties(found, path, engine, order, timeout)
            if len(_GOLD) >= _GOLD_CACHE_SIZE:
                _GOLD.clear()
            _GOLD[key] = found
        return found


def _reads_table(sql: str, engine: str, tables: frozenset[str], *, unknown: bool = False) -> bool:
    """Whether `sql` reads one of `tables`; `unknown` when sqlglot cannot parse it (the check is
    then off for a gold query, and an answer is scored by its rows)."""
    read = tables_read(sql.strip().rstrip(";"), engine)
    return unknown if read is None else not read.isdisjoint(tables)


async def _with_ties(gold: _Gold, path: Path, engine: str, order: OrderKeys, timeout: float) -> _Gold:
    """`gold` with each row's ORDER BY key and the rows tied past its OFFSET and LIMIT, read by
    running the query again with its keys selected, without its OFFSET and past its LIMIT
    (through the guard and the read-only executor, as any query); `gold` as it is (compared
    strictly as a list) when that fails or does not agree with the gold's own rows."""
    width = len(gold.result.columns)
    if any(j is not None and not -width <= j < width for j in order.terms):
        return gold
    end = None if order.limit is None else order.offset + order.limit
    if end is None and not order.offset and None not in order.terms:
        rows = gold.result.rows  # the keys are output columns: nothing to run again
    else:
        try:
            sql = prepare(order.sql, dialect=None, engine=engine)
            max_rows = None if end is None else end + _TIED_PAST_LIMIT
            rows = (await execute(path, engine, sql, timeout=timeout, max_rows=max_rows, count_all=False)).rows
        except SQLError as exc:
            _log.debug(
                "execution_match: cannot read the ORDER BY keys of %r (%s); order compared strictly", order.sql, exc
            )
            return gold
    keyed = [(_key(order.key(row, width)), tuple(row[:width])) for row in rows]
    window = keyed[order.offset : end]
    if not window:
        return gold
    keys = [k for k, _ in window]
    before = [row for k, row in keyed[: order.offset] if k == keys[0]]
    after = [row for k, row in keyed[len(keyed) if end is None else end :] if k == keys[-1]]
    if len(set(keys)) == len(keys) and not before and not after:
        return gold  # no ties: the list comparison is the whole story
    rows = [row for _, row in window]
    # The gold's own rows must pass: a rewrite that changed the query's meaning is not trusted.
    if not rows_match(gold.result.rows, rows, ordered=True, keys=keys, before=before, after=after):
        _log.debug(
            "execution_match: the ORDER BY keys of %r disagree with its rows; order compared strictly", order.sql
        )
        return gold
    return replace(gold, rows=rows, keys=keys, before=before, after=after)


register_reward("execution_match", ExecutionMatch)
