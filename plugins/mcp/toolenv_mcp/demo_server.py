"""The demo MCP server of `toolenv/MCP-v0`: a shop's price list and a calculator.

It speaks MCP over stdin/stdout (`python -m toolenv_mcp.demo_server`); `gym.make("toolenv/MCP-v0")`
with no `servers` starts it, and so does examples/mcp_example.py. Written with the MCP
Python SDK (`MCPServer` in mcp 2.x, the same class as `FastMCP` in mcp 1.x), as a server of
your own would be.
"""

from __future__ import annotations

try:  # mcp 2.x
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP  # type: ignore[no-redef, attr-defined, unused-ignore]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef, import-not-found, unused-ignore]

from toolenv_mcp.demo import PRICES

app = FastMCP("shop", log_level="WARNING")


@app.tool()
def price(item: str) -> float:
    """The unit price of an item, in euros."""
    if item not in PRICES:
        raise ToolError(f"no item {item!r}; the shop sells {', '.join(sorted(PRICES))}")
    return PRICES[item]


@app.tool()
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return round(a * b, 10)


if __name__ == "__main__":
    app.run()
