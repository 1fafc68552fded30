"""The env factory `toolenv/MCP-v0`: a `ToolEnv` whose tools are those of MCP servers.

`gym.make("toolenv/MCP-v0", servers="mcp.json", tasks="tasks.jsonl")`: the tasks are yours,
and so is the reward (`exact_match` by default). With no `servers`, the env runs the bundled
demo (`toolenv_mcp.demo`): a shop's MCP server and questions about its prices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from toolenv import Task, ToolEnv, ToolLimits, load_tasks
from toolenv_mcp.demo import DEMO_SERVERS, demo_tasks
from toolenv_mcp.tool import Servers, mcp_tools

__all__ = ["make_mcp_env"]


def make_mcp_env(
    servers: Servers | None = None,
    tasks: str | Path | Iterable[Task | Mapping[str, Any]] = (),
    *,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    prefix: str = "",
    prefix_server_names: bool = False,
    limits: ToolLimits | None = None,
    limit: int | None = None,
    **overrides: Any,
) -> ToolEnv:
    """A `ToolEnv` over the tools of `servers`.

    Args:
        servers: an `mcpServers` JSON file's path, the mapping itself, or `MCPServer`s; None:
            the demo shop server (and its tasks, when `tasks` is empty).
        tasks: Tasks, dicts, or a JSONL path (as `ToolEnv` takes them).
        include, exclude, prefix, prefix_server_names, limits: as for `mcp_tools`.
        limit: keep the first N tasks.
        overrides: `ToolLimits` fields for every MCP tool (`timeout=10`, `retries=1`, ...),
            extra `tools` to offer beside the MCP ones, and any `ToolEnv` keyword
            (`parser`, `reward`, `max_turns`, `system_prompt`, ...).

    Raises:
        ValueError: tool names clash (the message suggests `prefix_server_names=True`).
        MCPServerError: a server could not be started.
    """
    if servers is None:
        servers = DEMO_SERVERS
        if not tasks:
            tasks = demo_tasks()
    limit_overrides = {k: overrides.pop(k) for k in list(overrides) if k in ToolLimits.model_fields}
    extra = list(overrides.pop("tools", ()))
    if limit is not None:
        tasks = load_tasks(tasks)[: int(limit)]  # type: ignore[arg-type]
    tools = mcp_tools(
        servers,
        include=include,
        exclude=exclude,
        prefix=prefix,
        prefix_server_names=prefix_server_names,
        limits=limits,
        **limit_overrides,
    )
    try:
        taken = {t.name for t in extra}
        clash = sorted(t.name for t in tools if t.name in taken)
        if clash:
            raise ValueError(
                f"MCP tools {clash} have the names of tools passed in `tools`; pass prefix=... or "
                "prefix_server_names=True to tell them apart"
            )
        return ToolEnv(tools=[*extra, *tools], tasks=tasks, **overrides)
    except BaseException:
        for t in tools:
            t._drop()
        raise
