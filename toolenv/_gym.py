"""Registration of toolenv's env IDs with Gymnasium.

`import toolenv` must stay fast, and importing Gymnasium (with NumPy) alone takes
longer than that budget, so registration runs when Gymnasium is imported: at
once if it already is, otherwise from a one-shot import hook. Either way
`gym.make("toolenv/...")` works in whatever order the two are imported.
Python has no public post-import hook, hence the small finder below.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["install", "register_envs"]

NAMESPACE = "toolenv"
_done = False


def make_vector(entry_point: str, num_envs: int = 1, **kwargs: Any) -> Any:
    """Gymnasium `vector_entry_point` for any toolenv env: a concurrent ToolVectorEnv."""
    from toolenv.vector import ToolVectorEnv

    return ToolVectorEnv.from_entry_point(entry_point, num_envs=num_envs, **kwargs)


def register_envs() -> list[str]:
    """Register the core ids (`toolenv/ToolEnv-v0`, `toolenv/Remote-v0`) and every `toolenv.envs`
    plugin; returns the IDs (idempotent)."""
    global _done
    from gymnasium.envs.registration import register, registry

    from toolenv.registry import entries

    ids = []
    core = [("ToolEnv-v0", "toolenv.env:ToolEnv"), ("Remote-v0", "toolenv.remote.client:RemoteToolEnv")]
    for name, value in [*core, *((e.name, e.value) for e in entries("envs"))]:
        env_id = f"{NAMESPACE}/{name}"
        ids.append(env_id)
        if env_id in registry:
            continue
        register(
            id=env_id,
            entry_point=value,
            vector_entry_point=functools.partial(make_vector, value),
            disable_env_checker=False,
        )
    _done = True
    return ids


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        register_envs()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "gymnasium":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Register now if Gymnasium is loaded, otherwise when it is."""
    if "gymnasium" in sys.modules:
        register_envs()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
