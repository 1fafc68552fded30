"""Plugin discovery through entry points, lazily: listing reads metadata, loading imports.

Groups: `toolenv.tools` (a Tool subclass or a factory returning a Tool),
`toolenv.envs` (a factory returning a ToolEnv; the entry-point name is the env
name, registered as `toolenv/<name>`), `toolenv.agents` (an Agent factory), `toolenv.oracles` (per-env scripted policy
`oracle(task, turn, observation) -> action`, named like the env).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from toolenv._ast import parse

__all__ = [
    "GROUPS",
    "PluginEntry",
    "PluginError",
    "entries",
    "find",
    "import_reference",
    "load",
    "load_tool",
    "plugin_reward_modules",
    "plugin_rewards",
    "resolve_tool",
    "resolve_tools",
    "resolved_tools",
]

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
        # A tool can be named by its reference instead (what `tools=` takes), which no other claims.
        refs = " or ".join(repr(e.value.replace(" ", "")) for e in matches)
        hint = f"; name the one you mean as 'module:Name': {refs}" if kind == "tools" else ""
        raise PluginError(f"{kind[:-1]} {name!r} is provided by {len(matches)} distributions: {who}{hint}")
    return matches[0]


def load(kind: Kind, name: str) -> Any:
    """Import and return the plugin object named `name`."""
    return find(kind, name).load()


def _plugin_built(name: str, kwargs: Mapping[str, Any]) -> Any:
    """What the tool plugin `name` is, or builds with `kwargs` (its class or factory called)."""
    from toolenv._tool import Tool

    obj = load("tools", name)
    if isinstance(obj, Tool) and kwargs:
        raise PluginError(
            f"tool plugin {name!r} is a ready-made tool instance: it takes no arguments "
            f"(got {', '.join(sorted(kwargs))}); set its limits with the env's "
            f"tool_limits={{{name!r}: {{...}}}} instead"
        )
    return obj if isinstance(obj, Tool) else obj(**kwargs)


def load_tool(name: str, **kwargs: Any) -> Any:
    """Instantiate the tool plugin `name` with `kwargs`.

    Raises:
        PluginError: unknown, duplicated or broken plugin, or the object does not build a Tool.
    """
    from toolenv._tool import Tool

    tool = _plugin_built(name, kwargs)
    if not isinstance(tool, Tool):
        raise PluginError(f"tool plugin {name!r} built {type(tool).__name__}, not a toolenv.Tool")
    return tool


def import_reference(ref: str, what: str) -> Any:
    """The object a `"module:Name"` reference names (`Name` may be dotted: `"pkg.mod:Cls.attr"`),
    its module imported now: how a command line, a config or a dataset row names a tool or a
    reward defined outside toolenv. `what` names the kind in the error.

    Raises:
        ValueError: the module or the name cannot be imported.
    """
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:  # ValueError: no module name (":Name")
        raise ValueError(f"cannot import {what} {ref!r}: {exc}") from None
    return obj


#: The keys of a tool entry that gives its reference with arguments, as a verl tool config does.
_ENTRY_KEYS = ("tool", "tool_kwargs")


def _entry(ref: Mapping[str, Any], kwargs: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`{"tool": ref, "tool_kwargs": {...}}` as its reference and arguments (`kwargs` over its own):
    how text (a command line, YAML, JSON) gives a tool its constructor's arguments."""
    unknown = sorted(str(k) for k in ref if k not in _ENTRY_KEYS)
    if "tool" not in ref or unknown:
        wrong = f"unknown key(s) {', '.join(map(repr, unknown))}" if unknown else "no 'tool' key"
        raise ValueError(
            f"a tool entry {dict(ref)!r} has {wrong}: write {{'tool': 'module:Name' or a plugin name, "
            "'tool_kwargs': {...its arguments}}"
        )
    own = ref.get("tool_kwargs") or {}
    if not isinstance(own, Mapping):
        raise ValueError(f"a tool entry's 'tool_kwargs' must be a mapping of arguments, got {own!r}")
    return ref["tool"], {**own, **kwargs}


def _reference_built(ref: Any, kwargs: Mapping[str, Any]) -> Any:
    """What a tool reference names, built: a Tool as it is, a plugin's or a `"module:Name"`
    class or factory called with `kwargs` (a ready-made instance takes none), or an entry
    `{"tool": reference, "tool_kwargs": {...}}` that gives the arguments itself. Not yet checked."""
    from toolenv._tool import Tool

    if isinstance(ref, Tool):
        return ref
    if isinstance(ref, Mapping):
        ref, kwargs = _entry(ref, kwargs)
        if isinstance(ref, Mapping):
            raise ValueError(f"a tool entry's 'tool' must be a reference, not another entry: {ref!r}")
        return _reference_built(ref, kwargs)
    if not isinstance(ref, str) or not ref:
        raise ValueError(f"a tool reference must be 'module:Name' or a plugin name, got {ref!r}")
    if ":" not in ref:
        return _plugin_built(ref, kwargs)
    obj = import_reference(ref, "tool")
    if isinstance(obj, Tool) and kwargs:
        got = ", ".join(sorted(kwargs))
        raise ValueError(f"tool {ref!r} is a tool instance: it takes no arguments (got {got})")
    return obj if isinstance(obj, Tool) else obj(**kwargs)


def _not_a_tool(ref: Any, built: str, hint: str = "") -> Exception:
    """The error of a reference that built something else than tools (a PluginError for a plugin)."""
    what = "tool plugin" if isinstance(ref, str) and ":" not in ref else "tool reference"
    message = f"{what} {ref!r} built {built}, not a toolenv.Tool{hint}"
    return PluginError(message) if what == "tool plugin" else ValueError(message)


def resolve_tool(ref: Any, **kwargs: Any) -> Any:
    """A Tool from a reference: a Tool, `"module:Name"` (class, factory or instance), a plugin
    name (what a command line, a YAML config or a dataset row can hold), or an entry
    `{"tool": reference, "tool_kwargs": {...}}`. `kwargs` go to the class or factory (over an
    entry's own); a ready-made instance takes none. A factory that builds several tools is for
    `resolve_tools`.

    Raises:
        ValueError: not a reference, or it cannot be imported or builds no Tool.
        PluginError: an unknown or broken tool plugin.
    """
    from toolenv._tool import Tool

    built = _reference_built(ref, kwargs)
    if not isinstance(built, Tool):
        several = _tool_list(built) is not None
        hint = ": a factory of several tools goes in a `tools` list (or through resolve_tools)" if several else ""
        raise _not_a_tool(ref, type(built).__name__, hint)
    return built


def _tool_list(built: Any) -> list[Any] | None:
    """`built` as a list when it is a sequence (list, tuple...) whose items are all Tools, else None."""
    from toolenv._tool import Tool

    if isinstance(built, Sequence) and not isinstance(built, str | bytes):
        items = list(built)
        return items if all(isinstance(t, Tool) for t in items) else None
    return None


def resolve_tools(ref: Any, **kwargs: Any) -> list[Any]:
    """The Tools a reference gives, as `resolve_tool` reads it: one Tool, or each tool of a
    list (or other sequence) its factory builds, in order (`mcp_tools(...)` returns such a list):
    how a `tools` list of references takes a factory of several tools.

    Raises:
        ValueError: not a reference, it cannot be imported, or it builds anything but Tools
            (the error names the first item that is not one).
        PluginError: an unknown or broken tool plugin.
    """
    from toolenv._tool import Tool

    built = _reference_built(ref, kwargs)
    if isinstance(built, Tool):
        return [built]
    items = _tool_list(built)
    if items is not None:
        return items
    if isinstance(built, Sequence) and not isinstance(built, str | bytes):
        index, item = next((i, t) for i, t in enumerate(built) if not isinstance(t, Tool))
        raise _not_a_tool(ref, f"a {type(built).__name__} whose item {index} is {type(item).__name__}")
    raise _not_a_tool(ref, type(built).__name__)


def resolved_tools(env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`env_kwargs` with the references in `tools` made into tools (`resolve_tools`: a factory of
    several tools gives each, in its place): each call builds its own, so every env made with the
    result has tools of its own, but for a reference to a Tool instance, which is that same
    object every time."""
    kwargs = dict(env_kwargs)
    if isinstance(kwargs.get("tools"), list | tuple):
        kwargs["tools"] = [tool for ref in kwargs["tools"] for tool in resolve_tools(ref)]
    return kwargs


def _registered_rewards(package: str, *, literal_only: bool = True) -> list[tuple[str | None, str]]:
    """(name, module) of each `register_reward("name", ...)` call in a package's source, read
    without importing it (a plugin registers its rewards when its env module is imported).
    With `literal_only=False`, also calls whose name is no string literal, with the name None."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[tuple[str | None, str]] = []
    for folder in spec.submodule_search_locations:
        for file in sorted(Path(folder).rglob("*.py")):
            try:
                source = file.read_text(encoding="utf-8")
                if "register_reward(" not in source:  # most files: no need to parse them
                    continue
                tree = parse(source)
            except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
                continue
            module = ".".join((package, *file.relative_to(folder).with_suffix("").parts))
            for node in ast.walk(tree):
                if not (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "register_reward"
                    and node.args
                ):
                    continue
                first = node.args[0]
                literal = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
                if literal is not None or not literal_only:
                    found.append((literal, module.removesuffix(".__init__")))
    return found


def _plugin_packages() -> dict[str, str]:
    """The top-level package of each `toolenv.envs`/`toolenv.tools` entry point, with its distribution."""
    packages: dict[str, str] = {}
    for kind in ("envs", "tools"):
        for e in entries(kind):
            packages.setdefault(e.value.split(":")[0].split(".")[0].strip(), e.dist)
    return packages


def plugin_reward_modules() -> list[str]:
    """The modules of plugin packages that call `register_reward` (its name a string literal or
    not), unimported: importing them registers every reward the plugins register."""
    modules: dict[str, None] = {}
    for package in sorted(_plugin_packages()):
        for _, module in _registered_rewards(package, literal_only=False):
            modules.setdefault(module, None)
    return list(modules)


def plugin_rewards(known: set[str]) -> list[dict[str, str]]:
    """Rewards that plugin distributions register (`name`, `dist`, the `target` module that
    registers it when imported), read from their source: no plugin is imported."""
    rows: list[dict[str, str]] = []
    seen = set(known)
    for package, dist in sorted(_plugin_packages().items()):
        for name, module in _registered_rewards(package):
            if name is not None and name not in seen:
                seen.add(name)
                rows.append({"name": name, "dist": dist, "target": module})
    return sorted(rows, key=lambda r: r["name"])
