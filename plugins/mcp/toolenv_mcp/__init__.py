"""toolenv-mcp: the tools of any MCP server (stdio or streamable HTTP) as toolenv tools.

`mcp_tools(server)` lists a server's tools as `MCPTool`s for a `ToolEnv`;
`gym.make("toolenv/MCP-v0", servers=...)` builds the env in one line. Importing the
package does not import the MCP SDK: that happens on the first connection.
"""

from toolenv_mcp.config import MCPServer, load_servers
from toolenv_mcp.errors import MCPConnectionLost, MCPServerError
from toolenv_mcp.tool import MCPTool, amcp_tools, mcp_tools

__all__ = ["MCPConnectionLost", "MCPServer", "MCPServerError", "MCPTool", "amcp_tools", "load_servers", "mcp_tools"]
