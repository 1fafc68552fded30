"""toolenv-search: a `search` tool with swappable backends and the HotpotQA environment.

Backends share one interface (`SearchBackend`): `BM25Backend` (local bm25s index,
the default), `HTTPBackend` (a Search-R1 retrieval server) and
`DuckDuckGoBackend` (live web search, cached). Heavy modules load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "BM25Backend",
    "DuckDuckGoBackend",
    "HTTPBackend",
    "Passage",
    "SearchBackend",
    "SearchError",
    "SearchTool",
    "create_app",
    "format_passages",
    "hotpotqa_oracle",
    "make_backend",
    "make_hotpotqa_env",
    "nq_open_tasks",
]

_EXPORTS: dict[str, str] = {
    "BM25Backend": "toolenv_search.bm25",
    "DuckDuckGoBackend": "toolenv_search.web",
    "HTTPBackend": "toolenv_search.http_backend",
    "Passage": "toolenv_search.backend",
    "SearchBackend": "toolenv_search.backend",
    "SearchError": "toolenv_search.backend",
    "SearchTool": "toolenv_search.tool",
    "create_app": "toolenv_search.server",
    "format_passages": "toolenv_search.tool",
    "hotpotqa_oracle": "toolenv_search.envs",
    "make_backend": "toolenv_search.backends",
    "make_hotpotqa_env": "toolenv_search.envs",
    "nq_open_tasks": "toolenv_search.envs",
}

if TYPE_CHECKING:
    from toolenv_search.backend import Passage, SearchBackend, SearchError
    from toolenv_search.backends import make_backend
    from toolenv_search.bm25 import BM25Backend
    from toolenv_search.envs import hotpotqa_oracle, make_hotpotqa_env, nq_open_tasks
    from toolenv_search.http_backend import HTTPBackend
    from toolenv_search.server import create_app
    from toolenv_search.tool import SearchTool, format_passages
    from toolenv_search.web import DuckDuckGoBackend


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolenv_search' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
