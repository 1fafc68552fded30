"""The read-only gate: sqlglot parses every query first and only single read queries pass.

This is the first of three layers (then the engine's own read-only open and, for
SQLite, an authorizer); it exists to give the model a precise message rather than
an engine error, and to transpile other dialects to the engine's.
"""

from __future__ import annotations

import functools
import logging

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, SqlglotError, TokenError

from toolenv_sql.errors import SQLError
from toolenv_sql.syntax import clip, parse_problem, token_problem

__all__ = ["DENIED_FUNCTIONS", "is_ordered", "ordered_level", "parse_read_query", "prepare"]

#: Functions that reach outside the database (files, extensions); denied in every dialect.
DENIED_FUNCTIONS = frozenset(
    {
        "load_extension",
        "fts3_tokenizer",
        "readfile",
        "writefile",
        "edit",
        "read_csv",
        "read_csv_auto",
        "read_parquet",
        "read_json",
        "read_json_auto",
        "read_text",
        "read_blob",
    }
)

# Statement kinds that change data or schema, or step outside one query; found anywhere in the tree.
_WRITES: tuple[tuple[type[exp.Expr], str], ...] = (
    (exp.Insert, "INSERT"),
    (exp.Update, "UPDATE"),
    (exp.Delete, "DELETE"),
    (exp.Merge, "MERGE"),
    (exp.Create, "CREATE"),
    (exp.Drop, "DROP"),
    (exp.Alter, "ALTER"),
    (exp.TruncateTable, "TRUNCATE"),
    (exp.Into, "SELECT ... INTO"),
    (exp.Copy, "COPY"),
    (exp.Attach, "ATTACH"),
    (exp.Detach, "DETACH"),
    (exp.Pragma, "PRAGMA"),
    (exp.Set, "SET"),
    (exp.Use, "USE"),
    (exp.Transaction, "BEGIN"),
    (exp.Commit, "COMMIT"),
    (exp.Rollback, "ROLLBACK"),
    (exp.LoadData, "LOAD DATA"),
    (exp.Analyze, "ANALYZE"),
    (exp.Command, "a command"),
)


class _DropCommandFallback(logging.Filter):
    """Drop sqlglot's "Falling back to parsing as a 'Command'" warning.

    Such statements are rejected here anyway with a clear observation; the warning
    would echo every EXPLAIN/VACUUM a model writes into the training logs.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_DropCommandFallback())

_ALLOWED = "Only read queries are allowed (SELECT, WITH ... SELECT, UNION/INTERSECT/EXCEPT, VALUES)"


def _kind(node: exp.Expr) -> str:
    for cls, label in _WRITES:
        if isinstance(node, cls):
            if isinstance(node, exp.Command):
                return str(node.this).upper() or label
            return label
    return type(node).__name__.upper()


# A query that lists the tables and their columns, per engine (DuckDB reads `sqlite_master` too, but
# information_schema gives each column's type); each runs as written in MySQL and Postgres too.
_SCHEMA_QUERIES = {
    "sqlite": "SELECT name, sql FROM sqlite_master WHERE type = 'table'",
    "duckdb": "SELECT table_name, column_name, data_type FROM information_schema.columns",
}


#: SQLite's PRAGMAs that only read the schema: a model exploring the database writes them, and
#: is answered with the query that reads the schema (not told that it tried to write).
_SCHEMA_PRAGMAS = frozenset(
    ("table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list")
)


def _pragma_name(tree: exp.Pragma) -> str:
    """The PRAGMA's name, lower case: `table_info` of `PRAGMA main.table_info(t)` (sqlglot reads
    the call as `table_info = t`)."""
    node = tree.this
    if isinstance(node, exp.EQ):
        node = node.this
    if isinstance(node, exp.Dot):
        node = node.expression
    return str(node.name if isinstance(node, exp.Expr) else node).lower()


def _schema_statement(tree: exp.Expr) -> str | None:
    """The keyword (SHOW, DESCRIBE, a schema PRAGMA) when `tree` asks for the schema that way, as
    MySQL, DuckDB and SQLite do; else None.

    They are reads, but no query sqlglot can check and transpile (SQLite has neither SHOW nor
    DESCRIBE), so they are refused with what to run instead rather than as writes.
    """
    if isinstance(tree, exp.Pragma) and _pragma_name(tree) in _SCHEMA_PRAGMAS:
        return f"PRAGMA {_pragma_name(tree)}"
    if isinstance(tree, exp.Show):
        return "SHOW"
    if isinstance(tree, exp.Describe) and isinstance(tree.this, exp.Table):  # not EXPLAIN <query>
        return "DESCRIBE"
    if isinstance(tree, exp.Command) and str(tree.this).upper() in ("SHOW", "DESCRIBE", "DESC"):
        return str(tree.this).upper()
    return None


def _refuse_schema_statement(keyword: str, engine: str | None) -> None:
    """Refuse SHOW/DESCRIBE with the query that reads the schema on `engine` (SQLite's when unknown)."""
    query = _SCHEMA_QUERIES.get(engine or "sqlite", _SCHEMA_QUERIES["sqlite"])
    raise SQLError(
        f"{keyword} is not supported here: read the schema in the question if it is given there, or run: {query}"
    )


def _refuse_pragma(fname: str, engine: str | None) -> None:
    if fname.removeprefix("pragma_") in _SCHEMA_PRAGMAS:
        _refuse_schema_statement(f"{fname}()", engine)
    raise SQLError(
        f"PRAGMA functions are not allowed: {fname}() is refused like a PRAGMA statement. "
        "Query the tables themselves (the schema is in sqlite_master)."
    )


def parse_read_query(sql: str, dialect: str) -> exp.Expr:
    """The one read query in `sql`, parsed in `dialect`.

    Raises:
        SQLError: empty input, a syntax error, several statements, or anything but a read query.
    """
    return _parse_read_query(sql, dialect)[0]


def _parse_read_query(sql: str, dialect: str, engine: str | None = None) -> tuple[exp.Expr, str]:
    """`parse_read_query`, plus the query's text without the semicolons and comments that follow it.

    `engine` (the one the query will run on, when known) picks the schema query SHOW and
    DESCRIBE are answered with.
    """
    reader = Dialect.get_or_raise(dialect)  # an unknown name is a configuration error: ValueError
    try:
        tokens = reader.tokenize(sql)
        parsed = reader.parser().parse(tokens, sql)
    except TokenError as exc:
        raise SQLError(f"SQL syntax error ({dialect}): {token_problem(exc, sql, reader)}") from None
    except ParseError as exc:
        raise SQLError(f"SQL syntax error ({dialect}): {parse_problem(exc)}") from None
    except SqlglotError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SQLError(f"SQL syntax error ({dialect}): {clip(first, 200)}") from None
    # A comment after the last `;` comes back as a Semicolon node that only carries the
    # comment: it is not a statement.
    statements = [s for s in parsed if s is not None and not isinstance(s, exp.Semicolon)]
    if not statements:
        raise SQLError("The query is empty. Write one SELECT statement.")
    if len(statements) > 1:
        raise SQLError(
            f"Only one SQL statement per call is allowed; found {len(statements)}. Run them one call at a time."
        )
    tree = statements[0]
    keyword = _schema_statement(tree)
    if keyword is not None:
        _refuse_schema_statement(keyword, engine)
    if not isinstance(tree, (exp.Query, exp.Values)):
        raise SQLError(f"{_ALLOWED}; this is {_kind(tree)}. The database is read-only.")
    for node in tree.walk():
        if isinstance(node, exp.Table) and node.name.lower().startswith("pragma_"):
            # SQLite reads `FROM pragma_x` (no parentheses) as the table-valued function; the
            # authorizer would refuse it with a bare "not authorized".
            _refuse_pragma(node.name.lower(), engine)
        if isinstance(node, tuple(cls for cls, _ in _WRITES)):
            raise SQLError(f"{_ALLOWED}; the query contains {_kind(node)}. The database is read-only.")
        if isinstance(node, exp.Func):
            fname = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            if fname in DENIED_FUNCTIONS:
                raise SQLError(f"The function {fname}() is not allowed: queries may only read this database.")
            if fname.startswith("pragma_"):
                _refuse_pragma(fname, engine)
    # Everything up to the last real token: trailing semicolons, whitespace and comments go.
    last = max((t.end for t in tokens if t.token_type.name != "SEMICOLON"), default=len(sql) - 1)
    return tree, sql[: last + 1].strip()


def prepare(sql: str, *, dialect: str | None, engine: str) -> str:
    """The SQL to run on `engine` (see `_prepare`); results are cached, as models repeat queries."""
    return _prepare(sql, dialect, engine)


@functools.lru_cache(maxsize=4096)
def _prepare(sql: str, dialect: str | None, engine: str) -> str:
    """The SQL to run on `engine`: checked, and transpiled when the model writes another dialect.

    In the engine's own dialect the text runs as written (minus the semicolons and
    comments after it), so sqlglot's re-rendering can never change a query's meaning.

    Raises:
        SQLError: see `parse_read_query`; also when transpiling fails.
    """
    source = dialect or engine
    tree, text = _parse_read_query(sql, source, engine)
    if source == engine:
        return text
    try:
        return tree.sql(dialect=engine)
    except SqlglotError as exc:
        raise SQLError(f"Could not translate the query from {source} to {engine}: {exc}") from None


def ordered_level(sql: str, dialect: str) -> exp.Expr | None:
    """The query's outermost level (inside parentheses that add nothing) when it has ORDER BY,
    whose row order is then part of the result; None when it has none or does not parse."""
    try:
        tree = parse_read_query(sql, dialect)
    except SQLError:
        return None
    while isinstance(tree, exp.Subquery) and tree.args.get("order") is None:
        tree = tree.this
    return tree if tree.args.get("order") is not None else None


def is_ordered(sql: str, dialect: str) -> bool:
    """True when the query's outermost level has ORDER BY (its row order is then part of the result)."""
    return ordered_level(sql, dialect) is not None
