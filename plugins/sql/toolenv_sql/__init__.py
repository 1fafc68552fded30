"""toolenv-sql: a read-only SQL tool (SQLite, DuckDB) and the Spider / Chinook text-to-SQL envs.

Importing the package is cheap; the envs module (which loads task files) is
imported by its entry points on first use.
"""

from toolenv_sql.errors import SQLError
from toolenv_sql.executor import QueryResult, execute, run_query
from toolenv_sql.guard import prepare
from toolenv_sql.paths import DATA_DIR
from toolenv_sql.tool import SQLTool

__all__ = ["DATA_DIR", "QueryResult", "SQLError", "SQLTool", "execute", "prepare", "run_query"]
