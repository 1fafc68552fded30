from __future__ import annotations

import toolenv

EXPECTED = {
    "ActionParser",
    "Episode",
    "ExactMatch",
    "Message",
    "ParsedAction",
    "PluginError",
    "Reward",
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
    "Turn",
    "UnicodeText",
    "WeightedSum",
    "__version__",
    "get_parser",
    "get_reward",
    "load_tasks",
    "load_tool",
    "tool",
    "tuned_gc",
    "gen0_threshold_for",
}


def test_all_is_pinned() -> None:
    assert set(toolenv.__all__) >= EXPECTED
    extra = set(toolenv.__all__) - EXPECTED
    # Names added by later modules must be added here on purpose.
    assert extra <= {
        "Agent",
        "AgentAction",
        "CacheStats",
        "RemoteEnvError",
        "RemoteToolEnv",
        "SessionGoneError",
        "ResultCache",
        "Trajectory",
        "export_chat",
        "rollout",
    }, extra


def test_every_export_resolves() -> None:
    for name in toolenv.__all__:
        assert getattr(toolenv, name) is not None, name
