"""toolenv: typed tool-use environments for training and evaluating LLM agents.

The public API is re-exported here and loaded on first use, so `import toolenv`
stays fast; env IDs are registered with Gymnasium when Gymnasium is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toolenv import _gym

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "ActionParser": "toolenv.parsers",
    "Agent": "toolenv.agent",
    "AgentAction": "toolenv.agent",
    "Episode": "toolenv.episode",
    "CacheStats": "toolenv.result_cache",
    "ExactMatch": "toolenv.rewards",
    "Message": "toolenv.types",
    "ParsedAction": "toolenv.types",
    "PluginError": "toolenv.registry",
    "RemoteEnvError": "toolenv.remote",
    "RemoteToolEnv": "toolenv.remote",
    "ResultCache": "toolenv.result_cache",
    "Reward": "toolenv.rewards",
    "SessionGoneError": "toolenv.remote",
    "Task": "toolenv.types",
    "TokenF1": "toolenv.rewards",
    "Tool": "toolenv._tool",
    "ToolCall": "toolenv.types",
    "ToolCallRecord": "toolenv.caller",
    "ToolCaller": "toolenv.caller",
    "ToolContext": "toolenv._tool",
    "ToolEnv": "toolenv.env",
    "ToolImage": "toolenv.types",
    "ToolLimits": "toolenv._tool",
    "ToolResult": "toolenv.types",
    "ToolVectorEnv": "toolenv.vector",
    "Trajectory": "toolenv.trajectory",
    "Turn": "toolenv.episode",
    "UnicodeText": "toolenv.spaces",
    "WeightedSum": "toolenv.rewards",
    "get_parser": "toolenv.parsers",
    "get_reward": "toolenv.rewards",
    "load_tasks": "toolenv.types",
    "load_tool": "toolenv.registry",
    "rollout": "toolenv.runner",
    "export_chat": "toolenv.export",
    "gen0_threshold_for": "toolenv.gc_tuning",
    "tool": "toolenv._tool",
    "tuned_gc": "toolenv.gc_tuning",
}

__all__ = [
    "ActionParser",
    "Agent",
    "AgentAction",
    "CacheStats",
    "Episode",
    "ExactMatch",
    "Message",
    "ParsedAction",
    "PluginError",
    "RemoteEnvError",
    "RemoteToolEnv",
    "ResultCache",
    "Reward",
    "SessionGoneError",
    "Task",
    "TokenF1",
    "Tool",
    "ToolCall",
    "ToolCallRecord",
    "ToolCaller",
    "ToolContext",
    "ToolEnv",
    "ToolImage",
    "ToolLimits",
    "ToolResult",
    "ToolVectorEnv",
    "Trajectory",
    "Turn",
    "UnicodeText",
    "WeightedSum",
    "__version__",
    "export_chat",
    "gen0_threshold_for",
    "get_parser",
    "get_reward",
    "load_tasks",
    "load_tool",
    "rollout",
    "tool",
    "tuned_gc",
]

if TYPE_CHECKING:
    from toolenv._tool import Tool, ToolContext, ToolLimits, tool
    from toolenv.agent import Agent, AgentAction
    from toolenv.caller import ToolCaller, ToolCallRecord
    from toolenv.env import ToolEnv
    from toolenv.episode import Episode, Turn
    from toolenv.export import export_chat
    from toolenv.gc_tuning import gen0_threshold_for, tuned_gc
    from toolenv.parsers import ActionParser, get_parser
    from toolenv.registry import PluginError, load_tool
    from toolenv.remote import RemoteEnvError, RemoteToolEnv, SessionGoneError
    from toolenv.result_cache import CacheStats, ResultCache
    from toolenv.rewards import ExactMatch, Reward, TokenF1, WeightedSum, get_reward
    from toolenv.runner import rollout
    from toolenv.spaces import UnicodeText
    from toolenv.trajectory import Trajectory
    from toolenv.types import Message, ParsedAction, Task, ToolCall, ToolImage, ToolResult, load_tasks
    from toolenv.vector import ToolVectorEnv


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        return _submodule(name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _submodule(name: str) -> Any:
    """The submodule `toolenv.<name>`, imported on first access: the docs call
    `toolenv.rewards.reward_names()` after a plain `import toolenv`, which imports none."""
    if not name.startswith("__"):  # dunders (`__wrapped__`, `__path__`...) are looked up by tools
        try:
            return importlib.import_module(f"{__name__}.{name}")  # the import binds it in globals()
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":  # the submodule exists; something it imports does not
                raise
    raise AttributeError(f"module 'toolenv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


_gym.install()
