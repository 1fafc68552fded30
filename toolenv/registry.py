"""Plugin discovery through entry points, lazily: listing reads metadata, loading imports.

Groups: `toolenv.tools` (a Tool subclass or a factory returning a Tool),
`toolenv.envs` (a factory returning a ToolEnv; the entry-point name is the env
name, registered as `toolenv/<name>`), `toolenv.agents` (an Agent factory), `toolenv.oracles` (per-env scripted policy
`oracle(task, turn, observation) -> action`, named like the env).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

__all__ = ["GROUPS", "PluginEntry", "PluginError", "entries", "find", "load", "load_tool"]

Kind = Literal["tools", "envs", "agents", "oracles"]
GROUPS: dict[str, str] = {
    "tools": "toolenv.tools",
    "envs": "toolenv.envs",
    "agents": "toolenv.agents",
    "oracles": "toolenv.oracles",
}


class PluginError(Exception):
    """A plugin could not be found or loaded; the message names the distribution."""


@dataclass(frozen=True)
class PluginEntry:
    """One advertised plugin, known from metadata alone (nothing imported)."""

    kind: str
    name: str
    value: str
    dist: str

    def load(self) -> Any:
        """Import the plugin object.

        Raises:
            PluginError: the import failed; the message names the distribution and the target.
        """
        try:
            return metadata.EntryPoint(self.name, self.value, GROUPS[self.kind]).load()
        except Exception as exc:
            raise PluginError(
                f"{self.kind[:-1]} {self.name!r} from distribution {self.dist} ({self.value}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


def _dist_label(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "<unknown distribution>"


def entries(kind: Kind) -> list[PluginEntry]:
    """All advertised plugins of a kind, sorted by name (duplicates included)."""
    if kind not in GROUPS:
        raise ValueError(f"unknown plugin kind {kind!r}; expected one of {sorted(GROUPS)}")
    found = {PluginEntry(kind, ep.name, ep.value, _dist_label(ep)) for ep in metadata.entry_points(group=GROUPS[kind])}
    return sorted(found, key=lambda e: (e.name, e.dist))


def find(kind: Kind, name: str) -> PluginEntry:
    """The one entry named `name`.

    Raises:
        PluginError: no such plugin, or two distributions advertise the name.
    """
    matches = [e for e in entries(kind) if e.name == name]
    if not matches:
        known = ", ".join(sorted({e.name for e in entries(kind)})) or "none installed"
        raise PluginError(f"no {kind[:-1]} named {name!r} (known: {known})")
    if len(matches) > 1:
        who = "; ".join(f"{e.dist} ({e.value})" for e in matches)
        raise PluginError(f"{kind[:-1]} {name!r} is provided by {len(matches)} distributions: {who}")
    return matches[0]


def load(kind: Kind, name: str) -> Any:
    """Import and return the plugin object named `name`."""
    return find(kind, name).load()


def load_tool(name: str, **kwargs: Any) -> Any:
    """Instantiate the tool plugin `name` with `kwargs`.

    Raises:
        PluginError: unknown, duplicated or broken plugin, or the object does not build a Tool.
    """
    from toolenv._tool import Tool

    obj = load("tools", name)
    if isinstance(obj, Tool) and kwargs:
        raise PluginError(
            f"tool plugin {name!r} is a ready-made tool instance: it takes no arguments "
            f"(got {', '.join(sorted(kwargs))})"
        )
    tool = obj if isinstance(obj, Tool) else obj(**kwargs)
    if not isinstance(tool, Tool):
        raise PluginError(f"tool plugin {name!r} built {type(tool).__name__}, not a toolenv.Tool")
    return tool
