"""Which tables of a database a query reads, so that an answer that never queries the data can be told apart.

A query that reads no table (`VALUES ('Joe', 52)`, `SELECT 6`, `SELECT 1 WHERE 1 = 0`) returns the
same rows whatever the database holds: after seeing a result in the SQL tool, a policy can paste
it back as literals and match the gold query's rows without answering the question.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.scope import traverse_scope

from toolenv_sql.errors import SQLError
from toolenv_sql.executor import execute
from toolenv_sql.guard import parse_read_query

__all__ = ["database_tables", "lowered_query", "tables_read"]

# The tables and views a user query can read, per engine (the schema's own tables are not data).
_TABLES_QUERIES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')",
    "duckdb": "SELECT table_name FROM information_schema.tables",
}
# Table names per (engine, path): a database's tables are fixed while it is scored.
_TABLES: dict[tuple[str, str], frozenset[str]] = {}
_TABLES_CACHE_SIZE = 1024

_log = logging.getLogger(__name__)


async def database_tables(path: Path, engine: str, *, timeout: float) -> frozenset[str]:
    """The names of the tables and views of the database at `path`, lower case (cached per process).

    Raises:
        SQLError: the database cannot be read.
    """
    key = (engine, str(path))
    found = _TABLES.get(key)
    if found is None:
        result = await execute(path, engine, _TABLES_QUERIES[engine], timeout=timeout, count_all=False)
        found = frozenset(str(row[0]).lower() for row in result.rows)
        if len(_TABLES) >= _TABLES_CACHE_SIZE:
            _TABLES.clear()
        _TABLES[key] = found
    return found


def lowered_query(sql: str, dialect: str) -> exp.Expr:
    """The one read query in `sql`, parsed, with every name lower-cased, as SQLite and DuckDB
    match identifiers (quoted or not) case-insensitively.

    Raises:
        SQLError: `sql` is not one read query.
    """
    tree = parse_read_query(sql, dialect)
    for identifier in tree.find_all(exp.Identifier):
        identifier.set("this", identifier.this.lower())
    return tree


@functools.lru_cache(maxsize=4096)
def tables_read(sql: str, dialect: str) -> frozenset[str] | None:
    """The names (lower case) of the tables `sql` reads, in subqueries and CTEs too; a CTE's own
    name is not a table, even when it is spelt like one. None when `sql` does not parse.

    Names are lower-cased before scopes are resolved, as SQLite and DuckDB match identifiers
    case-insensitively (quoted or not): `WITH SINGER AS (SELECT 6) SELECT * FROM singer` reads
    the CTE, not the table.
    """
    try:
        tree = lowered_query(sql, dialect)
    except SQLError:
        return None
    try:
        return frozenset(
            source.name
            for scope in traverse_scope(tree)
            for source in scope.sources.values()
            if isinstance(source, exp.Table) and source.name
        )
    except SqlglotError as exc:
        # Scopes not resolved: every table node counts (CTE names too), so no answer is refused wrongly.
        _log.debug("execution_match: scopes of %r not resolved (%s); every table name counts", sql, exc)
        return frozenset(table.name for table in tree.find_all(exp.Table) if table.name)
