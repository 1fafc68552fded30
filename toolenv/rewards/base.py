"""The reward interface, weighted composition and name lookup.

A reward has two hooks: `turn` (after every step, for per-turn shaping such as
penalties) and `final` (once, when the episode ends). The env reports every
component of every step in `info["reward_components"]`.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from toolenv.episode import Episode, Turn

__all__ = [
    "Reward",
    "RewardSpec",
    "WeightedSum",
    "as_reward",
    "get_reward",
    "record_reward_info",
    "register_reward",
    "reward_info",
    "reward_names",
]


class Reward(abc.ABC):  # noqa: B024 - both hooks are optional; the ABC marks it as a base
    """A scoring rule. Override `final`, `turn`, or both."""

    name: str = ""

    async def turn(self, episode: Episode, turn: Turn) -> float:
        """Reward for one step (default 0)."""
        return 0.0

    async def final(self, episode: Episode) -> float:
        """Reward when the episode ends (default 0)."""
        return 0.0

    async def turn_components(self, episode: Episode, turn: Turn) -> dict[str, float]:
        """Per-step components by name."""
        return {self.name: await _settled(self.turn(episode, turn))}

    async def final_components(self, episode: Episode) -> dict[str, float]:
        """Final components by name."""
        return {self.name: await _settled(self.final(episode))}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class WeightedSum(Reward):
    """Σ wᵢ·rᵢ over named parts; each part's unweighted value is a reported component.

    A part's value is its `turn`/`final`; a part that overrides `turn_components` or
    `final_components` instead is valued at the sum of the components it reports (a nested
    `WeightedSum` at its weighted total), reported under the part's key.
    """

    name = "weighted_sum"

    def __init__(self, parts: Mapping[str, tuple[Reward, float]] | Sequence[tuple[Reward, float]]) -> None:
        # One pass, no comprehension: every env builds its sum (the runner, one env per episode).
        if type(parts) is not list and isinstance(parts, Mapping):  # a list is no Mapping: skip the ABC check
            items, names = list(parts.values()), list(parts.keys())
        else:
            items = list(parts)
            names = [r.name for r, _ in items]
        if len(set(names)) != len(names):
            raise ValueError(f"reward component names must be unique, got {names}")
        self.parts: dict[str, tuple[Reward, float]] = {}
        self._weights: dict[str, float] = {}
        # Each per-step part, and whether it is valued by its own `turn_components` (else `turn`).
        self._per_turn: list[tuple[str, Reward, bool]] = []
        self._own_final: set[str] = set()  # parts valued by their own `final_components`
        self._sync_turn: set[str] = set()  # parts whose `turn` is a plain function
        self._sync_final: set[str] = set()  # parts whose `final` is a plain function
        for k, (r, w) in zip(names, items, strict=True):
            # A bad weight is refused here, not at the first step whose component is non-zero.
            weight = w if type(w) is float and math.isfinite(w) else _weight(k, w)
            self.parts[k] = (r, weight)
            self._weights[k] = weight
            own_turn = _own_components(r, "turn_components")
            # A plain `def turn`/`final` (an easy slip) is scored as it returns; found here, so
            # the parts whose hooks are coroutine functions cost nothing more per step.
            if not inspect.iscoroutinefunction(type(r).turn):
                self._sync_turn.add(k)
            if not inspect.iscoroutinefunction(type(r).final):
                self._sync_final.add(k)
            if type(r).turn is not Reward.turn or own_turn:
                self._per_turn.append((k, r, own_turn))
            if _own_components(r, "final_components"):
                self._own_final.add(k)
        #: False when every step scores 0 for every part (no part overrides `turn`): the env then
        #: takes `zero_components()` instead of awaiting `turn_components` (hot path).
        self.scores_turns = bool(self._per_turn) or type(self).turn_components is not WeightedSum.turn_components

    @staticmethod
    def total(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
        """The weighted sum of `components`.

        Raises:
            ValueError: a component is NaN or infinite (the message names it): such a value
                would poison every average it enters, and JSON has no number for it.
        """
        total = 0.0
        for k, v in components.items():
            if v:  # most per-step components are 0: skip the lookup (hot path)
                if not math.isfinite(v):
                    raise ValueError(f"reward component {k!r} is {v!r}; a reward must be a finite number")
                total += weights.get(k, 0.0) * v
        if not math.isfinite(total):  # finite parts, but a weight is not (or the sum overflows)
            raise ValueError(f"the weighted reward is {total!r} (weights {dict(weights)}); it must be a finite number")
        return float(total)

    @property
    def weights(self) -> dict[str, float]:
        """Weight of each component (a copy)."""
        return dict(self._weights)

    async def turn(self, episode: Episode, turn: Turn) -> float:
        """The weighted total of the parts' per-step rewards (so sums nest)."""
        return self.total(await self.turn_components(episode, turn), self._weights)

    async def final(self, episode: Episode) -> float:
        """The weighted total of the parts' final rewards (so sums nest)."""
        return self.total(await self.final_components(episode), self._weights)

    def weighted(self, components: Mapping[str, float]) -> float:
        """The weighted sum of `components` with this sum's weights."""
        return self.total(components, self._weights)

    def zero_components(self) -> dict[str, float]:
        """Every part at 0."""
        return dict.fromkeys(self.parts, 0.0)

    async def turn_components(self, episode: Episode, turn: Turn) -> dict[str, float]:
        # Rewards that keep the default `turn` score 0 every step: skip them (hot path).
        components = dict.fromkeys(self.parts, 0.0)
        for k, r, own in self._per_turn:
            if own:
                hook = _summed(k, r.turn_components(episode, turn))
            else:
                hook = _settled(r.turn(episode, turn)) if k in self._sync_turn else r.turn(episode, turn)
            v = await (hook if k == r.name else _keyed(episode, k, r.name, hook))
            components[k] = v if type(v) is float else as_reward(k, v)
        return components

    async def final_components(self, episode: Episode) -> dict[str, float]:
        components = {}
        for k, (r, _) in self.parts.items():
            if k in self._own_final:
                hook = _summed(k, r.final_components(episode))
            else:
                hook = _settled(r.final(episode)) if k in self._sync_final else r.final(episode)
            v = await (hook if k == r.name else _keyed(episode, k, r.name, hook))
            components[k] = v if type(v) is float else as_reward(k, v)
        return components


def _own_components(reward: Reward, hook: str) -> bool:
    """True when `reward` reports its score through its own `hook` (`turn_components` or
    `final_components`) rather than through `turn`/`final`: a `WeightedSum`'s `turn`/`final`
    already total its components, and the base's hooks only wrap `turn`/`final`."""
    return getattr(type(reward), hook) is not getattr(Reward, hook) and not isinstance(reward, WeightedSum)


async def _summed(key: str, components: Awaitable[Mapping[str, object]]) -> float:
    """The sum of a part's own components (its value, as the base's one component is): the
    sum reports a part by its key, so the part's several components become one."""
    # Not `math.fsum`: it raises on inf + -inf, where `total` names the NaN component.
    return sum((as_reward(f"{key}.{k}", v) for k, v in (await components).items()), 0.0)


async def _settled(value: object) -> Any:
    """What a reward hook gave: awaited when awaitable, else as it is (a plain `def final`)."""
    return await value if inspect.isawaitable(value) else value


_MISSING: Any = object()


async def _keyed(episode: Episode, key: str, name: str, hook: Awaitable[object]) -> object:
    """Await a part's `hook`, moving the details it records under its own `name` to its component
    `key` (a `WeightedSum({key: (reward, weight)})`): reward info is by component, like the
    components, and two parts of one name (two judges) do not overwrite each other's."""
    info = episode.reward_info
    before = info.get(name, _MISSING)
    value = await hook
    after = info.get(name, _MISSING)
    if after is not before and after is not _MISSING:
        info[key] = after
        if before is _MISSING:
            del info[name]
        else:
            info[name] = before
    return value


def as_reward(name: str, value: object) -> float:
    """A reward function's `value` as a float (a numpy or torch scalar is not JSON serialisable).

    Raises:
        TypeError: `value` is not a number (e.g. None from a missing `return`); the message names `name`.
    """
    if isinstance(value, str | bytes) or value is None:
        raise TypeError(f"reward component {name!r} is {value!r}; a reward must be a number")
    try:
        return float(value)  # type: ignore[arg-type]  # int, bool, numpy and torch scalars
    except (TypeError, ValueError):
        raise TypeError(f"reward component {name!r} is {value!r}; a reward must be a number") from None


def _weight(name: str, value: object) -> float:
    """`value` as a finite float.

    Raises:
        ValueError: it is not a number (or a numeric string) or not finite; the message names `name`.
    """
    try:
        weight = float(value)  # type: ignore[arg-type]  # anything float() takes, e.g. "0.5" from a config
    except (TypeError, ValueError):
        weight = math.nan
    if not math.isfinite(weight):
        raise ValueError(f"the weight of {name!r} must be a finite number, got {value!r}")
    return weight


def reward_info(episode: Episode) -> dict[str, dict[str, Any]]:
    """Details rewards left about an episode (judge replies, errors), by component name.

    The env reports them as `info["reward_info"]` when the episode ends.
    """
    return episode.reward_info


def record_reward_info(episode: Episode, name: str, /, **data: Any) -> None:
    """Store details of component `name` for this episode (replacing earlier ones).

    `episode` and `name` are positional-only, so the details may hold fields of those names.
    """
    reward_info(episode)[name] = data


#: A name, a Reward, `{name: weight or settings}`, or a list of names, Rewards, `(reward, weight)`
#: pairs and `{"name": ..., "weight": ..., **settings}` mappings (see `get_reward`).
RewardSpec = (
    str
    | Reward
    | Mapping[str, float | Mapping[str, Any]]
    | Sequence[Reward | str | tuple[Reward | str, float] | Mapping[str, Any]]
)

_FACTORIES: dict[str, Callable[..., Reward]] = {}


def register_reward(name: str, factory: Callable[..., Reward], *, replace: bool = False) -> None:
    """Make `factory` available by name in `reward=` specs.

    Registering the same factory again (a module imported twice, or reloaded) is a no-op.
    `replace=True` replaces another factory of the name on purpose.

    Raises:
        ValueError: `name` is registered by another factory (the message names both): a plugin
            would otherwise silently change how every env scores under that name.
    """
    held = _FACTORIES.get(name)
    if held is not None and not replace and _origin(held) != _origin(factory):
        raise ValueError(
            f"reward {name!r} is already registered by {_described(held)}; {_described(factory)} cannot "
            "register it too: register it under another name, or pass replace=True to replace it on purpose"
        )
    _FACTORIES[name] = factory


def _origin(factory: Callable[..., Reward]) -> tuple[str, str] | Callable[..., Reward]:
    """What identifies a factory across a reload of its module: its `module:qualname`, or the
    object itself when it has none (a lambda's or a local's qualname is not unique)."""
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return factory
    return module, qualname


def _described(factory: Callable[..., Reward]) -> str:
    """`module:qualname (distribution version)` of a factory, for an error message."""
    module = getattr(factory, "__module__", None) or "?"
    label = f"{module}:{getattr(factory, '__qualname__', type(factory).__name__)}"
    try:
        from importlib import metadata

        dists = metadata.packages_distributions().get(module.split(".")[0], [])
    except Exception:  # noqa: BLE001 - broken metadata: the message just names no distribution
        dists = []
    if dists:
        label += f" (distribution {dists[0]} {_version(dists[0])})"
    return label


def _version(dist: str) -> str:
    """The installed version of `dist`, or "" when its metadata cannot be read."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def reward_names() -> list[str]:
    """Names accepted in reward specs."""
    return sorted(_FACTORIES)


def _plugin_factory(name: str) -> Callable[..., Reward] | None:
    """The factory a plugin registers as `name` when its module is imported (`toolenv list`
    shows it, read from the plugin's source): that module is imported now, so every reward
    `toolenv list` names works in a spec before the plugin's env was made."""
    from toolenv.registry import plugin_reward_modules, plugin_rewards

    for row in plugin_rewards(set(_FACTORIES)):
        if row["name"] == name:
            importlib.import_module(row["target"])
            return _FACTORIES.get(name)
    # Not found in the source (a name that is no string literal: `register_reward(NAME, ...)`):
    # import the plugin modules that call `register_reward`.
    for module in plugin_reward_modules():
        with contextlib.suppress(Exception):  # a broken plugin says so when its tool or env is used
            importlib.import_module(module)
        if name in _FACTORIES:
            return _FACTORIES[name]
    return None


def _known_names() -> str:
    """Every reward name a spec takes: registered ones and those plugins register (`toolenv list`)."""
    from toolenv.registry import plugin_rewards

    return ", ".join(sorted({*_FACTORIES, *(row["name"] for row in plugin_rewards(set(_FACTORIES)))}))


def _referenced_factory(ref: str) -> Callable[..., Reward]:
    """What a `"module:Name"` reference names, as a factory: a Reward class or a function
    (what `register_reward` takes), or a Reward instance (made into a factory of no settings).
    It is imported now, so a reward of the user's own reaches a config, the CLI or verl's
    env_kwargs (plain strings) in a process that never registered it.

    Raises:
        ValueError: it cannot be imported, or it is neither a Reward nor callable.
    """
    from toolenv.registry import import_reference  # the resolver `tools=` references use

    obj = import_reference(ref, "reward")
    if isinstance(obj, Reward):
        return lambda: obj
    if not callable(obj):
        raise ValueError(
            f"reward reference {ref!r} is {type(obj).__name__}, "
            "not a Reward, a Reward class or a function returning one"
        )
    return obj  # type: ignore[no-any-return]


#: How a reward of the user's own becomes reachable by name (the end of the "unknown reward" error).
_REACH_YOUR_OWN = (
    "a reward of your own: name it 'module:Name' (its Reward class, instance or factory, imported then), "
    "or call register_reward in a package with a toolenv.envs or toolenv.tools entry point"
)


def _by_name(name: str, /, *, key: str | None = None, **settings: Any) -> Reward:
    """The reward registered as `name` (or a `"module:Name"` reference), made with `settings`
    (a config's keyword arguments). A `key` (the component's name in the spec) is also the
    reward's own `name` when its factory takes one and the settings give none.

    Raises:
        ValueError: an unknown name, a reference that names no reward, or settings the factory
            does not take.
    """
    referenced = ":" in name and name not in _FACTORIES  # a registered name wins, even with a colon
    # apart from the call: its own KeyError is its own
    factory = _referenced_factory(name) if referenced else _FACTORIES.get(name) or _plugin_factory(name)
    if factory is None:
        raise ValueError(f"unknown reward {name!r}; known rewards: {_known_names()}; {_REACH_YOUR_OWN}")
    signature = _signature(factory) if settings or key is not None else None
    if key is not None and "name" not in settings and signature is not None and "name" in signature.parameters:
        settings["name"] = key  # its log lines and reward info then say which of two judges
    if settings and signature is not None:
        try:
            signature.bind(**settings)
        except TypeError:
            takes = [p.name for p in signature.parameters.values() if p.kind in _KEYWORDS]
            # `name` is the registered name in a list item: a component is named by `key`.
            shown = ", ".join(t for t in takes if t != "name") or "none"
            raise ValueError(
                f"reward {name!r} takes no setting(s) {sorted(set(settings) - set(takes))}; "
                f"its settings: {shown}; and `key` names the component"
            ) from None
    reward = factory(**settings)
    if referenced and not isinstance(reward, Reward):  # a reference may name any callable (a Tool class)
        raise ValueError(f"reward reference {name!r} built {type(reward).__name__}, not a toolenv.Reward")
    return reward


_KEYWORDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _signature(factory: Callable[..., Reward]) -> inspect.Signature | None:
    """The factory's signature; None for a builtin or C callable (the call itself then says)."""
    try:
        return inspect.signature(factory)
    except (TypeError, ValueError):
        return None


#: A spec's part: `(component key, reward, weight)`.
_Part = tuple[str, Reward, Any]


def _configured(name: str, entry: Mapping[str, Any]) -> _Part:
    """A part from a config mapping: `weight` (default 1), `key` (the component's name, default
    the reward's own: two judges in one spec need two) and the factory's settings."""
    settings = {str(k): v for k, v in entry.items()}
    weight = settings.pop("weight", 1.0)
    if "key" not in settings:
        reward = _by_name(name, **settings)
        return reward.name, reward, weight
    key = settings.pop("key")
    if not isinstance(key, str) or not key:
        raise ValueError(f"the key of reward {name!r} must be a non-empty string naming its component, got {key!r}")
    return key, _by_name(name, key=key, **settings), weight


def _spec_item(item: object) -> _Part:
    """A list spec's item as a part: a name or a Reward weighs 1."""
    if isinstance(item, str | Reward):
        reward = _by_name(item) if isinstance(item, str) else item
        return reward.name, reward, 1.0
    if isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str | Reward):
        r, w = item
        reward = _by_name(r) if isinstance(r, str) else r
        return reward.name, reward, w
    if isinstance(item, Mapping) and isinstance(item.get("name"), str):
        return _configured(item["name"], {k: v for k, v in item.items() if k != "name"})
    raise ValueError(
        f"reward spec item {item!r} must be a name, a Reward, a (reward, weight) pair "
        "or a mapping with a 'name' (and 'weight', 'key' and the reward's settings)"
    )


def _summed_parts(parts: list[_Part]) -> WeightedSum:
    """The sum of a spec's parts, keyed by component.

    Raises:
        ValueError: two parts of one key, with how to name them apart.
    """
    keys = [k for k, _, _ in parts]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(
            f"reward component names must be unique, got {keys}: name each of {twice} apart with a `key` "
            f"(a config's list item {{name: {twice[0]}, key: {twice[0]}_b, ...}}) or give a Reward object its "
            f"own name (e.g. name='{twice[0]}_b')"
        )
    return WeightedSum({k: (r, w) for k, r, w in parts})


def get_reward(spec: RewardSpec) -> WeightedSum:
    """Normalise a spec to a `WeightedSum`.

    Accepts a name (`"f1"`), a Reward, a `{name: weight}` mapping, or a list whose items are
    `(reward or name, weight)` pairs or bare names/Rewards (weight 1), as a YAML config writes
    `[f1, [format, 0.2]]`. A config passes settings to a named reward's factory with a mapping:
    `{tool_call_penalty: {weight: 0.1, free_calls: 2}}`, or in a list
    `{name: tool_call_penalty, weight: 0.1, free_calls: 2}` (weight defaults to 1). A component
    is keyed by its reward's name, or by a mapping's `key`: two rewards of one registered name
    (two judges) read `[{name: judge, model: a}, {name: judge, key: judge_b, model: b}]`.

    Raises:
        ValueError: an unknown name, a malformed item, a setting the reward does not take, a
            weight that is not a finite number, or two components of one key.
    """
    if type(spec) is str:  # the usual spec, first: the ABC checks below cost more than the rest
        return WeightedSum([(_by_name(spec), 1.0)])
    if isinstance(spec, WeightedSum):
        return spec
    if isinstance(spec, Reward):
        return WeightedSum([(spec, 1.0)])
    if isinstance(spec, str):
        return WeightedSum([(_by_name(spec), 1.0)])
    if isinstance(spec, Mapping):
        return _summed_parts([_configured(k, w) if isinstance(w, Mapping) else _weighed(k, w) for k, w in spec.items()])
    if not isinstance(spec, Sequence):
        raise TypeError(f"a reward spec is a name, a Reward, a mapping or a list, got {type(spec).__name__}")
    return _summed_parts([_spec_item(item) for item in spec])


def _weighed(name: str, weight: Any) -> _Part:
    """A `{name: weight}` entry as a part."""
    reward = _by_name(name)
    return reward.name, reward, weight
