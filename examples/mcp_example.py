"""Tools served by an MCP server, in toolenv envs.

1. `mcp_tools(MCPServer(...))` starts an MCP server over stdio (the plugin's demo shop,
   `toolenv_mcp/demo_server.py`, a dozen lines of the MCP SDK) and turns its tools into
   toolenv tools; the process stays up across calls and episodes.
2. `gym.make("toolenv/MCP-v0", servers=...)` does the same from an `mcpServers` config,
   the format Claude Desktop and Cursor use.

Run: python examples/mcp_example.py   (needs: pip install -e plugins/mcp)
"""

from __future__ import annotations

import json
import sys
from typing import Any

import gymnasium as gym

import toolenv
from toolenv_mcp import MCPServer, mcp_tools

SERVER = ["-m", "toolenv_mcp.demo_server"]
TASKS = [{"id": "bread", "question": "How much do 3 loaves of bread cost, in euros?", "answer": "6.75"}]


def call(name: str, **arguments: Any) -> str:
    """A tool call in the hermes format the env parses by default."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def with_mcp_tools() -> None:
    shop = MCPServer(name="shop", command=sys.executable, args=SERVER)
    env = toolenv.ToolEnv(tools=mcp_tools(shop), tasks=TASKS, max_turns=6)
    print("tools:", [t.name for t in env.tools])
    env.reset(seed=0)
    for action in [
        call("price", item="bread"),
        call("price", item="caviar"),  # the server's own error
        call("multiply", a="2.25", b=3),  # refused before it reaches the server: a is a number
        call("multiply", a=2.25, b=3),
        "<answer>6.75</answer>",
    ]:
        obs, reward, terminated, truncated, info = env.step(action)
        print(f"> {action}\n{obs}")
    print(f"reward={reward} terminated={terminated}")
    env.close()  # the last user of the server: its process ends here


def with_gym_make() -> None:
    config = {"mcpServers": {"shop": {"command": sys.executable, "args": SERVER}}}
    env = gym.make("toolenv/MCP-v0", servers=config, tasks=TASKS, prefix_server_names=True, timeout=10)
    env.reset(seed=0)
    obs, *_ = env.step(call("shop__price", item="milk"))
    print("gym.make tools:", [t.name for t in env.unwrapped.tools])  # type: ignore[attr-defined]
    print("shop__price(milk) ->", obs)
    env.close()


def main() -> None:
    with_mcp_tools()
    with_gym_make()


if __name__ == "__main__":
    main()
