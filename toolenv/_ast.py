"""`ast.parse` one thread at a time.

CPython 3.11 keeps the AST constructor's recursion depth in state that every thread shares, so
two `ast.parse` at once (a sync tool on a worker thread while the env parses a pythonic call,
graders on a thread pool) can fail with "SystemError: AST constructor recursion depth mismatch"
(gh-106905; a CI run hit it). No library serialises this for us; an uncontended lock costs
well under a microsecond, so it is taken on every version.
"""

from __future__ import annotations

import ast
import threading
from typing import Any, Literal, overload

__all__ = ["literal_eval", "parse"]

_LOCK = threading.Lock()


@overload
def parse(source: str, mode: Literal["exec"] = "exec") -> ast.Module: ...
@overload
def parse(source: str, mode: Literal["eval"]) -> ast.Expression: ...
def parse(source: str, mode: Literal["exec", "eval"] = "exec") -> ast.Module | ast.Expression:
    """`ast.parse(source, mode=mode)`, while no other thread of this process parses."""
    with _LOCK:
        tree = ast.parse(source, mode=mode)
    assert isinstance(tree, (ast.Module, ast.Expression))
    return tree


def literal_eval(text: str) -> Any:
    """`ast.literal_eval(text)`, its parse taking turns as `parse` does."""
    return ast.literal_eval(parse(text.lstrip(" \t"), mode="eval"))
