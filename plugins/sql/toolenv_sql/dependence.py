"""Whether an answer's rows come from the data: its output columns (read with sqlglot), and its
rows on a copy of the database with some rows removed.

An answer that pastes the gold rows returns them whatever the database holds, even when it names a
table for show (`SELECT 6 FROM singer LIMIT 1`, `SELECT 6 WHERE EXISTS (SELECT 1 FROM singer)`).

`constant_output` finds answers whose every output column is a constant, in every branch that
gives the result: a cheap syntactic check, which misses a paste that reads a column only to cancel
it out (`SELECT 6 + 0 * count(*) FROM singer`).

`perturbed_copy` is for the principled check: run the answer and the gold query on a copy where
rows are gone too, and the paste no longer matches (the idea of Spider's test-suite accuracy,
Zhong et al., 2020, with one derived database). Rows are only removed, never added or changed,
and no row a declared foreign key refers to is removed: values, their types, every uniqueness and
every reference the original holds stay true in the copy, so an answer that differs from the
gold query only where the original's data makes no difference (`LIKE 'France'` for `= 'France'`,
`count(id)` for `count(*)`, a join along a foreign key) matches there too. An answer that
matched the gold rows by coincidence (another question's query) mostly does not.
Copies are built once per database and seed, in a temporary directory removed at exit, from a
read-only connection to the original (which is never written); which rows go depends only on
the seed, each table's name and its rows' rowids.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import hashlib
import os
import random
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from sqlglot import exp

from toolenv_sql.errors import SQLError
from toolenv_sql.executor import sqlite_uri
from toolenv_sql.reads import lowered_query

__all__ = ["REMOVED_FRACTION", "constant_output", "perturbed_copy"]

#: About this share of each table's rows is left out of the copy (fewer where rows a foreign key
#: refers to must stay; one row is always kept).
REMOVED_FRACTION = 0.4

# Copies per (original path, its size and mtime, seed): a database's copy is built once per process.
_COPIES: dict[tuple[str, int, int, int], Path] = {}
_LOCK = threading.Lock()
_DIR: Path | None = None


async def perturbed_copy(path: Path, *, seed: int = 0) -> Path:
    """A copy of the SQLite file at `path` with some rows of each table removed (built on a
    worker thread at the first call for this file and seed, then cached for the process)."""
    stat = os.stat(path)  # a file replaced since (another size or time) gets a copy of its own
    key = (str(path), stat.st_size, stat.st_mtime_ns, seed)
    found = _COPIES.get(key)
    if found is None:
        found = await asyncio.to_thread(_copy_once, key, path, seed)
    return found


def _copy_once(key: tuple[str, int, int, int], path: Path, seed: int) -> Path:
    with _LOCK:  # two episodes scored at once build one copy
        found = _COPIES.get(key)
        if found is None:
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
            found = _directory() / f"{digest}-{path.stem}.sqlite"
            _build(path, found, seed)
            _COPIES[key] = found
    return found


def _directory() -> Path:
    """This process's directory of copies (made at first use, removed at exit)."""
    global _DIR
    if _DIR is None:
        _DIR = Path(tempfile.mkdtemp(prefix="toolenv_sql_perturbed_"))
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def _build(source: Path, target: Path, seed: int) -> None:
    """Copy `source` (opened read-only) to `target`, then remove rows from the copy; the file
    appears at `target` only when complete."""
    part = target.with_name(target.name + ".part")
    part.unlink(missing_ok=True)
    with (
        contextlib.closing(sqlite3.connect(sqlite_uri(source), uri=True)) as src,
        contextlib.closing(sqlite3.connect(part)) as dst,
    ):
        src.backup(dst)
        _remove_rows(dst, seed)
        dst.commit()
    os.replace(part, target)


def _remove_rows(conn: sqlite3.Connection, seed: int) -> None:
    """Delete up to `REMOVED_FRACTION` of each table's rows, chosen by `seed` and the table's
    name, but never a row that a declared foreign key of a remaining row refers to.

    A reference that holds in the original holds in the copy: an answer that joins a table the
    gold query does not (`count(*)` of `singer_in_concert` joined with `singer`) is equivalent
    to it there too. Tables are thinned referring ones first, so that a parent row whose
    children are gone may go too. Triggers are dropped first: they only act on writes, and one
    could undo a deletion or refuse it.
    """
    conn.execute("PRAGMA foreign_keys = OFF")  # no deletion cascades (SQLite's default, unless built otherwise)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {_quote(name)}")
    names = [
        n
        for (n,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    ]
    references = _references(conn, names)
    for name in _children_first(names, references):
        try:
            rowids = [r for (r,) in conn.execute(f"SELECT rowid FROM {_quote(name)} ORDER BY rowid")]
        except sqlite3.OperationalError:  # a WITHOUT ROWID or virtual table: left as it is
            continue
        if len(rowids) < 2:
            continue
        count = min(len(rowids) - 1, max(1, round(len(rowids) * REMOVED_FRACTION)))
        kept = _referenced(conn, name, references.get(name.lower(), []))
        order = random.Random(f"{seed}\0{name}").sample(rowids, len(rowids))
        chosen = [r for r in order if r not in kept][:count]
        conn.executemany(f"DELETE FROM {_quote(name)} WHERE rowid = ?", [(r,) for r in chosen])


# A foreign key, as the parent sees it: the child table, its columns, and the parent's columns they name.
_Reference = tuple[str, list[str], list[str]]


def _references(conn: sqlite3.Connection, names: list[str]) -> dict[str, list[_Reference]]:
    """The declared foreign keys of `names`, per parent table (lower case); a key naming no
    column of a parent without a primary key cannot be followed, and is left out."""
    found: dict[str, list[_Reference]] = {}
    for child in names:
        keys: dict[int, tuple[str, list[str], list[str | None]]] = {}
        for row in conn.execute(f"PRAGMA foreign_key_list({_quote(child)})"):
            key_id, parent, column, target = row[0], row[2], row[3], row[4]
            keys.setdefault(key_id, (parent, [], []))[1].append(column)
            keys[key_id][2].append(target)
        for parent, columns, targets in keys.values():
            resolved = _primary_key(conn, parent) if None in targets else [str(t) for t in targets]
            if resolved and len(resolved) == len(columns):
                found.setdefault(parent.lower(), []).append((child, columns, resolved))
    return found


def _primary_key(conn: sqlite3.Connection, table: str) -> list[str]:
    rows = conn.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
    return [row[1] for row in sorted((r for r in rows if r[5]), key=lambda r: r[5])]


def _children_first(names: list[str], references: dict[str, list[_Reference]]) -> list[str]:
    """`names`, each table before the tables it refers to (as far as cycles allow)."""
    parents: dict[str, set[str]] = {n.lower(): set() for n in names}
    for parent, refs in references.items():
        for child, _, _ in refs:
            if child.lower() != parent:
                parents.setdefault(child.lower(), set()).add(parent)
    ordered: list[str] = []
    remaining = list(names)
    while remaining:
        # A table no remaining table refers to goes next; in a cycle, the first by name.
        free = [n for n in remaining if not any(n.lower() in parents[m.lower()] for m in remaining if m != n)]
        chosen = free[0] if free else remaining[0]
        ordered.append(chosen)
        remaining.remove(chosen)
    return ordered


def _referenced(conn: sqlite3.Connection, table: str, references: list[_Reference]) -> set[int]:
    """The rowids of `table`'s rows that a row of a referring table names."""
    found: set[int] = set()
    for child, columns, targets in references:
        match = " AND ".join(f"c.{_quote(c)} = p.{_quote(t)}" for c, t in zip(columns, targets, strict=True))
        sql = (
            f"SELECT p.rowid FROM {_quote(table)} AS p WHERE EXISTS (SELECT 1 FROM {_quote(child)} AS c WHERE {match})"
        )
        try:
            found.update(r for (r,) in conn.execute(sql))
        except sqlite3.OperationalError:  # a key naming a column that does not exist: nothing to keep
            continue
    return found


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# ---------------------------------------------------------------------------- constant output

# What a name in a FROM clause stands for: a query (a CTE, a derived table, VALUES) with its
# column names and the CTEs its own body sees, or None for a table of the database, a recursive
# CTE's own name inside its body, or anything not understood (all data).
_Source = tuple[exp.Expr, list[str], Mapping[str, "_Source"]] | None
_Scope = Mapping[str, _Source]
# Aggregates whose value over rows of one constant is that constant, however many rows there are.
_SAME_VALUE_AGGREGATES = (exp.Min, exp.Max, exp.Avg, exp.AnyValue, exp.First, exp.Last, exp.Median, exp.Mode)


@functools.lru_cache(maxsize=4096)
def constant_output(sql: str, dialect: str) -> bool:
    """Whether every column `sql` returns is a constant in every branch that gives its rows:
    literals or expressions of them, also through CTEs, derived tables and scalar subqueries
    (`SELECT 6 FROM singer`, `WITH s AS (SELECT 6 AS n FROM singer) SELECT n FROM s`).

    A column of a table, an aggregate that counts a table's rows (`count(*)`, `sum(1)`, but not
    `max(6)`), a window function and anything not understood count as data, so a query is called
    constant only when it surely is; False when `sql` does not parse. Names are lower-cased
    first, as the engines match them.
    """
    try:
        tree = lowered_query(sql, dialect)
    except SQLError:
        return False
    return _constant_query(tree, {})


def _constant_query(query: exp.Expr, ctes: _Scope) -> bool:
    """Whether every output column of `query` is a constant (`ctes`: the CTEs in scope)."""
    if isinstance(query, exp.Subquery):
        return _constant_query(query.this, ctes)
    if isinstance(query, exp.Except):  # its rows are the left side's
        return _constant_query(query.left, _with_ctes(query, ctes))
    if isinstance(query, exp.Intersect):  # its rows are in both sides: one constant side fixes them
        inner = _with_ctes(query, ctes)
        return _constant_query(query.left, inner) or _constant_query(query.right, inner)
    if isinstance(query, exp.SetOperation):  # UNION: rows come from every side
        inner = _with_ctes(query, ctes)
        return _constant_query(query.left, inner) and _constant_query(query.right, inner)
    if isinstance(query, exp.Values):
        return all(_constant_expr(e, {}, ctes) for e in query.expressions)
    if isinstance(query, exp.Select):
        inner = _with_ctes(query, ctes)
        sources = _sources(query, inner)
        return all(_constant_projection(e, sources, inner) for e in query.expressions)
    return False


def _with_ctes(query: exp.Expr, ctes: _Scope) -> _Scope:
    """`ctes` and those `query`'s WITH defines. Each body sees the CTEs before it; its own name
    there is data (a recursive CTE's rows are not known from its text, and a non-recursive one
    reads the table of that name)."""
    with_ = query.args.get("with_") or query.args.get("with")
    if not isinstance(with_, exp.With):
        return ctes
    scope = dict(ctes)
    for cte in with_.expressions:
        name = cte.alias_or_name
        body_scope = {**scope, name: None}
        scope[name] = (cte.this, _columns(cte.this, cte.args.get("alias")), body_scope)
    return scope


def _columns(query: exp.Expr, alias: exp.Expr | None) -> list[str]:
    """The output column names of `query`, as `alias` renames them (`c(n)`, `AS x(a)`)."""
    if isinstance(alias, exp.TableAlias) and alias.columns:
        return [c.name for c in alias.columns]
    while isinstance(query, (exp.Subquery, exp.SetOperation)):
        query = query.this if isinstance(query, exp.Subquery) else query.left
    if isinstance(query, exp.Select):
        return [e.alias_or_name for e in query.expressions]
    return []


def _sources(select: exp.Select, ctes: _Scope) -> dict[str, _Source]:
    """What each name in `select`'s FROM and JOINs stands for."""
    found: dict[str, _Source] = {}
    from_ = select.args.get("from_") or select.args.get("from")
    items = ([from_.this] if isinstance(from_, exp.From) else []) + [j.this for j in select.args.get("joins") or []]
    for item in items:
        name = item.alias_or_name
        if isinstance(item, exp.Table) and not item.args.get("db") and item.name in ctes:
            found[name] = ctes[item.name]
        elif isinstance(item, (exp.Subquery, exp.Values)):
            query = item.this if isinstance(item, exp.Subquery) else item
            found[name] = (query, _columns(query, item.args.get("alias")), ctes)
        else:
            found[name] = None  # a table of the database, a table function, ...: data
    return found


def _constant_projection(expr: exp.Expr, sources: Mapping[str, _Source], ctes: _Scope) -> bool:
    """Whether an output column of a SELECT is a constant; `*` is, when every source's columns are."""
    if _is_star(expr):
        qualifier = expr.table if isinstance(expr, exp.Column) else ""
        chosen = [s for n, s in sources.items() if not qualifier or n == qualifier]
        return bool(chosen) and all(s is not None and _constant_query(s[0], s[2]) for s in chosen)
    return _constant_expr(expr, sources, ctes)


def _constant_expr(expr: exp.Expr, sources: Mapping[str, _Source], ctes: _Scope) -> bool:
    """Whether `expr`, in a SELECT reading `sources`, has the same value whatever the tables hold."""
    if isinstance(expr, exp.Column):
        return _constant_column(expr, sources, ctes)
    if isinstance(expr, _SAME_VALUE_AGGREGATES):  # `max(6)` is 6 over any rows (NULL over none)
        return all(_constant_expr(e, sources, ctes) for e in _children(expr))
    if isinstance(expr, (exp.AggFunc, exp.Window)):
        # Over rows a table decides, an aggregate counts them (`count(*)`, `sum(1)`, and `count(*)`
        # of `(SELECT 6 FROM singer)` too); over a query that reads no table it is a constant.
        data = any(s is None or any(True for _ in s[0].find_all(exp.Table)) for s in sources.values())
        return not data and all(_constant_expr(e, sources, ctes) for e in _children(expr) if not _is_star(e))
    if isinstance(expr, (exp.Subquery, exp.Select, exp.SetOperation)):
        return _constant_query(expr, ctes)
    if isinstance(expr, (exp.Exists, exp.Anonymous, exp.Star)):
        return False  # whether rows exist, or a function sqlglot does not know (maybe an aggregate)
    return all(_constant_expr(e, sources, ctes) for e in _children(expr))


def _children(expr: exp.Expr) -> list[exp.Expr]:
    """`expr`'s direct sub-expressions."""
    found: list[exp.Expr] = []
    for value in expr.args.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expr):
                found.append(item)
    return found


def _constant_column(column: exp.Column, sources: Mapping[str, _Source], ctes: _Scope) -> bool:
    """Whether `column` reads a constant column of a query in FROM (a column of a table is data)."""
    qualifier = column.table
    candidates = [s for n, s in sources.items() if not qualifier or n == qualifier]
    known = [s for s in candidates if s is not None]
    if not candidates or len(known) < len(candidates):
        return False  # a table's column, an outer query's, or one not resolved: data
    if len(known) == 1 and _constant_query(known[0][0], known[0][2]):
        return True  # any column of a constant query (`v.column1` of `(VALUES (6)) AS v`)
    found = [(query, columns.index(column.name), seen) for query, columns, seen in known if column.name in columns]
    return len(found) == 1 and _constant_output_at(*found[0])


def _constant_output_at(query: exp.Expr, index: int, ctes: _Scope) -> bool:
    """Whether output column `index` of `query` is a constant in every branch that gives rows."""
    if isinstance(query, exp.Subquery):
        return _constant_output_at(query.this, index, ctes)
    if isinstance(query, exp.Except):
        return _constant_output_at(query.left, index, _with_ctes(query, ctes))
    if isinstance(query, exp.Intersect):
        inner = _with_ctes(query, ctes)
        return _constant_output_at(query.left, index, inner) or _constant_output_at(query.right, index, inner)
    if isinstance(query, exp.SetOperation):
        inner = _with_ctes(query, ctes)
        return _constant_output_at(query.left, index, inner) and _constant_output_at(query.right, index, inner)
    if isinstance(query, exp.Values):
        rows = [row.expressions if isinstance(row, exp.Tuple) else [row] for row in query.expressions]
        return all(index < len(row) and _constant_expr(row[index], {}, ctes) for row in rows)
    if isinstance(query, exp.Select):
        inner = _with_ctes(query, ctes)
        projections = query.expressions
        if any(_is_star(e) for e in projections):
            return False  # which column `index` is depends on the sources' widths: not followed
        return index < len(projections) and _constant_expr(projections[index], _sources(query, inner), inner)
    return False


def _is_star(expr: exp.Expr) -> bool:
    """`*` or `t.*`."""
    return isinstance(expr, exp.Star) or (isinstance(expr, exp.Column) and isinstance(expr.this, exp.Star))
