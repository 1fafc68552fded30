"""Where toolenv-search keeps what it builds or fetches (BM25 indexes, the web-result cache)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["CACHE_ENV", "default_cache_dir"]

CACHE_ENV = "TOOLENV_CACHE_DIR"


def default_cache_dir() -> Path:
    """`$TOOLENV_CACHE_DIR`, else the user cache dir (`$XDG_CACHE_HOME/toolenv` on Linux)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path(platformdirs.user_cache_dir("toolenv", appauthor=False))
