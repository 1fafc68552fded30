"""Train any toolenv environment with verl (PPO/GRPO) through verl's public extension points.

- `ToolEnvAgentLoop`: a verl `AgentLoopBase` that runs one toolenv episode per sample.
- `ToolEnvBaseTool`: any toolenv `Tool` as a verl `BaseTool` (for verl's own `tool_agent` loop).
- `build_rows` / `write_parquet` (and `toolenv verl-data`): verl's parquet dataset from an env.
- `compute_score`: score a decoded response with the env's reward, for scoring outside the loop.

Names load on first use so that the parquet builder does not import verl.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "ToolEnvAgentLoop": "toolenv.integrations.verl.agent_loop",
    "ToolEnvBaseTool": "toolenv.integrations.verl.base_tool",
    "abuild_rows": "toolenv.integrations.verl.data",
    "build_rows": "toolenv.integrations.verl.data",
    "write_parquet": "toolenv.integrations.verl.data",
    "compute_score": "toolenv.integrations.verl.reward",
    "acompute_score": "toolenv.integrations.verl.reward",
    "make_env": "toolenv.integrations.verl.envs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolenv.integrations.verl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
