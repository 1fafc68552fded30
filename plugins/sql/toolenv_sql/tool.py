"""`SQLTool`: one read-only query on the task's database, answered with a compact table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolenv import Tool, ToolContext, ToolLimits, ToolResult
from toolenv_sql.errors import SQLError
from toolenv_sql.executor import execute
from toolenv_sql.guard import prepare
from toolenv_sql.paths import DATA_DIR, Database, resolve_database
from toolenv_sql.table import format_table, jsonable

__all__ = ["SQLTool"]


class SQLTool(Tool):
    """Run one read-only SQL query on the task's database and see the result table.

    Only SELECT-style queries run (one statement per call); the database cannot be changed.
    """

    name = "sql"
    limits = ToolLimits(timeout=30.0, max_output_chars=8192)

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")

        query: str = Field(
            min_length=1,
            max_length=20_000,
            description="One read-only SQL query: SELECT, WITH ... SELECT, UNION/INTERSECT/EXCEPT or VALUES.",
        )

    def __init__(
        self,
        *,
        dialect: str | None = None,
        root: str | os.PathLike[str] | None = None,
        db_path: str | None = None,
        engine: str | None = None,
        query_timeout: float = 5.0,
        max_rows: int = 50,
        max_count: int | None = 100_000,
        max_chars: int = 4000,
        max_cell_chars: int = 80,
        immutable: bool = True,
        limits: ToolLimits | None = None,
        **limit_overrides: Any,
    ) -> None:
        """Configure the tool.

        Args:
            dialect: the SQL dialect the model writes (e.g. "mysql", "postgres"); transpiled
                to the engine's. None means the engine's own dialect.
            root: directory that task `db_path`s are resolved in and confined to
                (default: the package's bundled data).
            db_path: database used when a task names none.
            engine: "sqlite" or "duckdb"; default by file suffix (or `task.context["engine"]`).
            query_timeout: seconds a query may take before it is stopped (waiting for a free worker counts).
            max_rows: rows kept in the result (`metadata["rows"]`, the table).
            max_count: rows counted at most for the footer and `metadata["row_count"]` (None: all).
                Past it counting stops ("more than 100000 rows", `metadata["row_count_exact"]`
                False): a `SELECT *` on a table of millions of rows answers in milliseconds
                instead of spending seconds (or its whole timeout) counting them.
            max_chars: characters of table text at most.
            max_cell_chars: characters per cell at most.
            immutable: open SQLite files with `immutable=1` (no locks; the file must not change meanwhile).
        """
        if query_timeout <= 0 or max_rows < 0 or max_chars < 200 or max_cell_chars < 4:
            raise ValueError("query_timeout must be > 0, max_rows >= 0, max_chars >= 200 and max_cell_chars >= 4")
        if max_count is not None and max_count < 0:
            raise ValueError(f"max_count must be >= 0 or None, got {max_count}")
        if limits is None and "timeout" not in limit_overrides:
            limit_overrides["timeout"] = query_timeout + 10.0  # the caller's guard stays behind the query's own
        default_cap = type(self).limits.max_output_chars
        if limits is None and "max_output_chars" not in limit_overrides and default_cap and max_chars > default_cap:
            # The table is already cut to `max_chars` with a footer saying so; the caller's cap would
            # cut a hole in its middle under a footer that counts those rows as shown.
            limit_overrides["max_output_chars"] = max_chars
        super().__init__(limits=limits, **limit_overrides)
        self.dialect = dialect
        self.root = Path(root) if root is not None else DATA_DIR
        self.db_path = db_path
        self.engine = engine
        self.query_timeout = query_timeout
        self.max_rows = max_rows
        self.max_count = max_count
        self.max_chars = max_chars
        self.max_cell_chars = max_cell_chars
        self.immutable = immutable

    def database(self, ctx: ToolContext) -> Database:
        """The (path, engine) of the task's database.

        Raises:
            SQLError: no database given, or its path is outside `root`.
        """
        return resolve_database(ctx.task.context, self.root, default_path=self.db_path, default_engine=self.engine)

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        try:
            path, engine = self.database(ctx)
        except SQLError as exc:  # the task's fault, not the query's: no invalid-call penalty
            return ToolResult.error(str(exc), infra_error=True)
        try:
            sql = prepare(args.query, dialect=self.dialect, engine=engine)
            result = await execute(
                path,
                engine,
                sql,
                timeout=self.query_timeout,
                max_rows=self.max_rows,
                count_limit=self.max_count,
                immutable=self.immutable,
            )
        except SQLError as exc:
            return ToolResult.error(str(exc))
        text = format_table(
            result.columns,
            result.rows,
            result.row_count,
            max_chars=self.max_chars,
            max_cell_chars=self.max_cell_chars,
            exact_count=result.exact_count,
        )
        return ToolResult(
            text=text,
            metadata={
                "columns": result.columns,
                "rows": [[jsonable(v) for v in row] for row in result.rows],
                "row_count": result.row_count,
                "row_count_exact": result.exact_count,
                "engine": engine,
                "sql": sql,
            },
        )
