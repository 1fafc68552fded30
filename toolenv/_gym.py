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
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolenv.registry import PluginEntry

__all__ = ["install", "register_envs"]

NAMESPACE = "toolenv"
_done = False


_CORE = {"ToolEnv-v0": "toolenv.env:ToolEnv", "Remote-v0": "toolenv.remote.client:RemoteToolEnv"}
_ENV_PREFIX, _VECTOR_PREFIX = "env_", "vector_"
_plugins: dict[str, list[PluginEntry]] = {}  # env plugins by name, as the last registration read them


def make_vector(entry_point: str, num_envs: int = 1, **kwargs: Any) -> Any:
    """Gymnasium `vector_entry_point` for any toolenv env: a concurrent ToolVectorEnv."""
    from toolenv.vector import ToolVectorEnv

    return ToolVectorEnv.from_entry_point(entry_point, num_envs=num_envs, **kwargs)


def _factory(name: str) -> Any:
    """The env factory of `toolenv/<name>`, loaded as `toolenv.registry` loads plugins: a plugin
    that fails to import, or a name two distributions advertise, is a PluginError naming them."""
    from importlib import metadata

    from toolenv.registry import find

    if name in _CORE:
        return metadata.EntryPoint(name, _CORE[name], "toolenv.envs").load()
    found = _plugins.get(name, [])
    return (found[0] if len(found) == 1 else find("envs", name)).load()


def _make_env_named(name: str, **kwargs: Any) -> Any:
    """Entry point of `toolenv/<name>` where its name cannot go in a string (it holds a colon)."""
    return _factory(name)(**kwargs)


def _make_vector_named(name: str, num_envs: int = 1, **kwargs: Any) -> Any:
    """The vector entry point of `toolenv/<name>`: a ToolVectorEnv of its factory."""
    from toolenv.vector import ToolVectorEnv

    return ToolVectorEnv.from_entry_point(_factory(name), num_envs=num_envs, **kwargs)


def __getattr__(attr: str) -> Any:
    """`toolenv._gym:env_<name>` and `toolenv._gym:vector_<name>`, the entry points of plugin env
    `toolenv/<name>`: strings, as `EnvSpec.to_json` needs (it refuses callables), that Gymnasium
    resolves with `getattr` into the plugin's factory (loaded by `_factory`) and its vector env."""
    if attr.startswith(_ENV_PREFIX):
        return _factory(attr[len(_ENV_PREFIX) :])
    if attr.startswith(_VECTOR_PREFIX):
        return functools.partial(_make_vector_named, attr[len(_VECTOR_PREFIX) :])
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def register_envs() -> list[str]:
    """Register the core ids (`toolenv/ToolEnv-v0`, `toolenv/Remote-v0`) and every `toolenv.envs`
    plugin; returns the IDs (idempotent).

    This runs inside `import gymnasium` (or `import toolenv`), so a plugin Gymnasium refuses (a
    name that is no env id, an unversioned name next to a versioned one) is warned of, not raised.
    A plugin that fails to import, or a name two distributions advertise, fails at `gym.make`
    with a PluginError naming the distributions.
    """
    global _done
    from toolenv.registry import entries

    ids = [_register(name, [("toolenv", value)]) for name, value in _CORE.items()]
    plugins: dict[str, list[PluginEntry]] = {}
    for e in entries("envs"):
        plugins.setdefault(e.name, []).append(e)
    _plugins.update(plugins)
    ids += [_register(name, [(e.dist, e.value) for e in found]) for name, found in plugins.items()]
    _done = True
    return [i for i in ids if i is not None]


def _register(name: str, found: list[tuple[str, str]]) -> str | None:
    """Register `toolenv/<name>` for the `(distribution, entry point)` pairs advertising it;
    its id, or None (and a warning) when Gymnasium refuses it."""
    from gymnasium.envs.registration import register, registry

    env_id = f"{NAMESPACE}/{name}"
    if env_id in registry:
        return env_id
    entry_point: Any = _CORE.get(name, f"{__name__}:{_ENV_PREFIX}{name}")
    vector: Any = f"{__name__}:{_VECTOR_PREFIX}{name}"
    if ":" in name:  # Gymnasium splits these strings at their one colon
        entry_point = functools.partial(_make_env_named, name)
        vector = functools.partial(_make_vector_named, name)
    try:
        register(id=env_id, entry_point=entry_point, vector_entry_point=vector, disable_env_checker=False)
    except Exception as exc:  # noqa: BLE001 - one plugin's bad name must not break importing Gymnasium
        where = ", ".join(f"{dist} ({value})" for dist, value in found)
        warnings.warn(
            f"toolenv env {name!r} from {where} is not registered with Gymnasium: {type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return env_id


def _register_on_import() -> None:
    """`register_envs` inside an import, where a failure (a distribution's unreadable entry
    points) is warned of: it must not make `import gymnasium` or `import toolenv` fail."""
    try:
        register_envs()
    except Exception as exc:  # noqa: BLE001 - see above; an explicit `register_envs()` still raises
        warnings.warn(
            f"toolenv could not register its envs with Gymnasium ({type(exc).__name__}: {exc}); "
            "gym.make('toolenv/...') may not find them",
            RuntimeWarning,
            stacklevel=2,
        )


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _register_on_import()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "gymnasium":
            return None
        sys.meta_path.remove(self)
        # Gymnasium as the other finders find it: not only on `sys.path` (an editable install
        # of Gymnasium, or a bundler, has a finder of its own).
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Register now if Gymnasium is loaded, otherwise when it is."""
    if "gymnasium" in sys.modules:
        _register_on_import()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
