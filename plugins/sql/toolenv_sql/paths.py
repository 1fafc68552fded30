"""Where databases live: the bundled data directory and task paths confined to a root."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolenv_sql.errors import SQLError

__all__ = ["DATA_DIR", "ENGINES", "Database", "engine_for", "resolve_database", "resolve_db_path"]

#: The databases and question files shipped with the package.
DATA_DIR = Path(__file__).resolve().parent / "data"

#: Engines the executor knows.
ENGINES = ("sqlite", "duckdb")

_DUCKDB_SUFFIXES = {".duckdb", ".ddb"}

Database = tuple[Path, str]


def resolve_db_path(db_path: str | os.PathLike[str], root: Path) -> Path:
    """`db_path` (relative to `root`, or absolute inside it) as an existing file under `root`.

    Symlinks and `..` are resolved first, so no task path can point outside the root.
    Accepted paths are cached (resolving costs more than a typical query).

    Raises:
        SQLError: the path escapes `root` or is not a file.
    """
    return _resolve(os.fspath(db_path), os.fspath(root))


@functools.lru_cache(maxsize=1024)
def _resolve(db_path: str, root: str) -> Path:
    base = Path(root).resolve()
    raw = Path(db_path)
    candidate = (raw if raw.is_absolute() else base / raw).resolve()
    if not candidate.is_relative_to(base):
        raise SQLError(f"Database path {str(db_path)!r} is outside the allowed database root; refusing to open it.")
    if not candidate.is_file():
        raise SQLError(f"Database {str(db_path)!r} does not exist.")
    return candidate


def engine_for(path: Path, engine: str | None = None) -> str:
    """The engine to open `path` with: `engine` if given, else by suffix (.duckdb/.ddb → duckdb)."""
    chosen = engine or ("duckdb" if path.suffix.lower() in _DUCKDB_SUFFIXES else "sqlite")
    if chosen not in ENGINES:
        raise SQLError(f"Unknown SQL engine {chosen!r}; expected one of {', '.join(ENGINES)}.")
    return chosen


def resolve_database(
    context: Mapping[str, Any], root: Path, *, default_path: str | None = None, default_engine: str | None = None
) -> Database:
    """The (path, engine) a task's context names (`db_path`, optional `engine`).

    Raises:
        SQLError: no database given, or the path is not allowed.
    """
    db_path = context.get("db_path", default_path)
    if not isinstance(db_path, (str, os.PathLike)) or not str(db_path):
        raise SQLError("This task names no database (task.context['db_path'] is missing).")
    path = resolve_db_path(db_path, root)
    engine = context.get("engine", default_engine)
    return path, engine_for(path, engine if isinstance(engine, str) else None)
