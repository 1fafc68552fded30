"""`MCPTool`: one tool of an MCP server as a toolenv `Tool`; `mcp_tools` lists them.

The schema the model sees is the server's own `inputSchema` (auto-generated `title`
keys dropped, as for toolenv's tools); arguments are checked against it before anything
is sent (`toolenv_mcp.args`). Calls go through the server's shared connection
(`toolenv_mcp.connection`) on the background loop (`toolenv_mcp.loop`), under the
tool's `ToolLimits` like any other tool; for a server with `scope="episode"`, through
the connection of the calling episode, which `release` closes when the episode ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fnmatch
import hashlib
import json
import re
import weakref
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

from toolenv import Tool, ToolContext, ToolLimits, ToolResult
from toolenv._schema import strip_titles
from toolenv_mcp import loop
from toolenv_mcp.args import args_model, arguments_of, resolved
from toolenv_mcp.config import MCPServer, load_servers
from toolenv_mcp.connection import (
    Connection,
    acquire,
    acquire_episode,
    describe,
    drop_holder,
    is_current,
    new_holder,
    release,
    release_episode,
)
from toolenv_mcp.errors import MCPHTTPError, MCPServerError
from toolenv_mcp.results import to_tool_result

__all__ = ["MCPTool", "Servers", "amcp_tools", "mcp_tools", "resolve_servers"]

_MAX_NAME = 64
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

#: What `mcp_tools` and the env take as servers: one, several, or an `mcpServers` config (path or mapping).
Servers = Union[MCPServer, Sequence[MCPServer], Mapping[str, Any], str, Path]  # noqa: UP007 - a runtime alias on 3.10


class MCPTool(Tool):
    """One tool of an MCP server, called through the connection shared by every user of the server.

    Built by `mcp_tools` from the server's tool listing (`spec`: `name`, `description`,
    `inputSchema`, ... as the server sent them). Holds one reference to the connection
    until `close()`; a call after `close()` takes a new one.

    With `server.scope == "episode"` the process-wide connection serves only the listing
    (the tool keeps it, so more envs list without another start): calls go through the
    calling episode's own connection, held until `release(ctx)` at the episode's end.
    """

    #: A timeout is the server not answering, not the request being too big.
    timeout_hint = "The MCP server did not answer in time: try the call again, or go on without it."

    def __init__(
        self,
        server: MCPServer,
        spec: Mapping[str, Any],
        *,
        name: str | None = None,
        limits: ToolLimits | None = None,
        **limit_overrides: Any,
    ) -> None:
        super().__init__(limits=limits, **limit_overrides)
        mcp_name = spec.get("name")
        if not isinstance(mcp_name, str) or not mcp_name:
            raise ValueError(f"MCP server {server.label!r} listed a tool without a name: {dict(spec)!r:.200}")
        schema = spec.get("inputSchema") or {"type": "object"}
        if not isinstance(schema, Mapping):
            raise ValueError(f"MCP tool {mcp_name!r} of server {server.label!r}: its inputSchema is not an object")
        self.server = server
        self.mcp_name = mcp_name
        self.spec: dict[str, Any] = json.loads(json.dumps(spec))
        self.input_schema: dict[str, Any] = json.loads(json.dumps(schema))
        self.name = name or function_name(mcp_name)  # type: ignore[misc]
        text = spec.get("description")
        own = text.strip() if isinstance(text, str) else ""
        self.description = own or f"The tool {mcp_name!r} of the MCP server {server.label!r}."  # type: ignore[misc]
        try:
            self.Args = args_model(self.name, self.input_schema)  # type: ignore[misc]
        except ValueError as exc:
            raise ValueError(
                f"MCP tool {mcp_name!r} of server {server.label!r}: {exc}; leave it out with exclude=[{mcp_name!r}]"
            ) from None
        self._parameters = json.dumps(_parameters(self.input_schema))
        self._take_references()

    def _take_references(self) -> None:
        """This tool's own reference to the server's connection, and its own token as a holder of episodes."""
        self._conn: Connection | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._hold()
        self._holder = new_holder()  # this tool, as a holder of episode connections
        if self.server.scope == "episode":  # a tool dropped without close() lets go of its episodes
            weakref.finalize(self, drop_holder, self._holder).atexit = False

    # ------------------------------------------------------------------ Tool API
    def breaker_key(self) -> Hashable:
        """The tools of one MCP server fail together: they share its circuit (by transport settings)."""
        return ("toolenv_mcp", self.server.key)

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        conn = self._connection() if self.server.scope == "process" else self._episode(ctx)
        try:
            result = await loop.call(conn.call_tool(self.mcp_name, arguments_of(args)))
        except MCPHTTPError as exc:  # an HTTP status refused the call: retryable if it says "later"
            return ToolResult.error(str(exc), retryable=exc.retryable, infra_error=True)
        except MCPServerError as exc:  # could not start, or the connection ended mid-call
            return ToolResult.error(str(exc), retryable=True, infra_error=True)
        except Exception as exc:
            if getattr(getattr(exc, "error", None), "code", None) is None:
                raise  # not a JSON-RPC error: the caller reports it as the tool's failure
            return ToolResult.error(
                f"MCP server {self.server.label!r} refused the call to {self.mcp_name!r}: {describe(exc)}"
            )
        return to_tool_result(result, tool=self.name, server=self.server.label, mcp_tool=self.mcp_name)

    async def release(self, ctx: ToolContext) -> None:
        """Scope "episode": let go of the connection of `ctx`'s episode, which has ended.

        The last tool of the server to let go closes it (a stdio server's process is gone
        when this returns). Nothing to do for process-scoped servers.
        """
        if self.server.scope == "episode":
            await _closed([release_episode(self.server, ctx.episode_id, self._holder)])

    async def close(self) -> None:
        """Release this tool's reference (and episode connections); the last one closes each connection."""
        await _closed([self._drop(), *(drop_holder(self._holder) if self.server.scope == "episode" else ())])

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies (`copy.copy`, `copy.deepcopy`, pickle) are tools of their own over the same server.

        A copy holds its own reference to the server's connection and its own episodes, as
        a tool from `mcp_tools` would. A shallow copy (`tool_limits` makes them) shared this
        tool's: closing or collecting either let go of the other's connection, and closing
        one env closed the episode servers of another env built from the same tools.
        """
        state = {k: v for k, v in self.__dict__.items() if k not in _OWN}
        return (_rebuilt, (type(self), self.server, self.spec, self.name, state))

    def __copy__(self) -> MCPTool:
        """A shallow copy (its `Args` model shared, not built again) with references of its own."""
        out = object.__new__(type(self))
        out.__dict__.update({k: v for k, v in self.__dict__.items() if k not in _OWN or k == "Args"})
        out._take_references()
        return out

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema, its parameters being the server's `inputSchema`."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": json.loads(self._parameters),
            },
        }

    # ------------------------------------------------------------------ the connection reference
    def _hold(self) -> Connection:
        conn = self._conn = acquire(self.server)
        finalizer = weakref.finalize(self, release, conn)  # a tool dropped without close()
        finalizer.atexit = False  # at exit the connection module closes everything itself
        self._finalizer = finalizer
        return conn

    def _connection(self) -> Connection:
        conn = self._conn
        if conn is None or not is_current(conn):  # closed, or inherited through a fork
            self._drop()
            conn = self._hold()
        return conn

    def _episode(self, ctx: ToolContext) -> Connection:
        """The connection of `ctx`'s episode, opened by its first call to a tool of this server."""
        return acquire_episode(self.server, ctx.episode_id, self._holder)

    def _drop(self) -> concurrent.futures.Future[None] | None:
        """Give the reference back (once); the future of the connection's closing, if it was the last."""
        finalizer, self._finalizer, self._conn = self._finalizer, None, None
        detached = finalizer.detach() if finalizer is not None else None
        return release(detached[2][0]) if detached is not None else None


_OWN = frozenset({"Args", "_conn", "_finalizer", "_holder"})  # what a copy makes anew (`__reduce__`)


def _rebuilt(
    cls: type[MCPTool], server: MCPServer, spec: Mapping[str, Any], name: str, state: dict[str, Any]
) -> MCPTool:
    """A copy of an `MCPTool`: built anew from the server's listing of it, then given the original's settings."""
    tool = cls(server, spec, name=name)
    tool.__dict__.update(state)
    return tool


async def _closed(closings: Iterable[concurrent.futures.Future[None] | None]) -> None:
    """Wait for connections to close; shielded, as cancelling the wait would cancel a closing halfway."""
    for closing in closings:
        if closing is not None:
            await asyncio.shield(asyncio.wrap_future(closing))


def resolve_servers(servers: Servers) -> dict[str, MCPServer]:
    """`{name: MCPServer}` from one server, several, a mapping, or an `mcpServers` config file."""
    if isinstance(servers, MCPServer):
        return {servers.label: servers}
    if isinstance(servers, (str, Path)):
        return load_servers(servers)
    if isinstance(servers, Mapping):
        return load_servers(servers)
    found = list(servers)
    if not found or not all(isinstance(s, MCPServer) for s in found):
        raise TypeError("servers must be an MCPServer, a list of them, an mcpServers mapping, or a config file path")
    named: dict[str, MCPServer] = {}
    for server in found:
        if named.get(server.label, server) != server:
            raise ValueError(f"two MCP servers are labelled {server.label!r}; give them distinct names (name=...)")
        named[server.label] = server
    return named


def mcp_tools(
    servers: Servers,
    *,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    prefix: str = "",
    prefix_server_names: bool = False,
    limits: ToolLimits | None = None,
    **limit_overrides: Any,
) -> list[MCPTool]:
    """The tools of one or more MCP servers, as toolenv tools.

    Works inside or outside a running event loop (the listing runs on the background
    loop; `amcp_tools` is the non-blocking twin).

    Args:
        servers: an `MCPServer`, several, an `mcpServers` mapping, or the path of such a JSON file.
        include: tool names or fnmatch patterns to keep (the MCP name or the prefixed one).
        exclude: tool names or patterns to leave out.
        prefix: put before every tool name.
        prefix_server_names: name tools `server__tool`, to tell apart same-named tools of several servers.
        limits: `ToolLimits` for every tool; `limit_overrides` (`timeout=...`, ...) change single fields.

    Raises:
        MCPServerError: a server could not be started or listed (one readable line).
        ValueError: two tools would have one name, a pattern matches nothing, or a schema is invalid.
    """
    named = resolve_servers(servers)
    conns = [acquire(s) for s in named.values()]
    try:
        listings = loop.run_sync(_list_all(conns))
        return _build(named, listings, include, exclude, prefix, prefix_server_names, limits, limit_overrides)
    finally:
        for conn in conns:  # the tools hold their own references
            release(conn)


async def amcp_tools(
    servers: Servers,
    *,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    prefix: str = "",
    prefix_server_names: bool = False,
    limits: ToolLimits | None = None,
    **limit_overrides: Any,
) -> list[MCPTool]:
    """`mcp_tools` without blocking the running event loop."""
    named = resolve_servers(servers)
    conns = [acquire(s) for s in named.values()]
    try:
        listings = await loop.call(_list_all(conns))
        return _build(named, listings, include, exclude, prefix, prefix_server_names, limits, limit_overrides)
    finally:
        for conn in conns:
            release(conn)


async def _list_all(conns: list[Connection]) -> list[list[dict[str, Any]]]:
    """Every server's listing, started together; the first failure raised as one readable line."""
    results = await asyncio.gather(*(c.list_tools() for c in conns), return_exceptions=True)
    listings: list[list[dict[str, Any]]] = []
    for conn, result in zip(conns, results, strict=True):
        if isinstance(result, MCPServerError):
            raise MCPServerError(str(result))
        if isinstance(result, BaseException):
            raise MCPServerError(f"MCP server {conn.label!r} could not list its tools: {describe(result)}")
        listings.append(result)
    return listings


def _build(
    named: Mapping[str, MCPServer],
    listings: list[list[dict[str, Any]]],
    include: Iterable[str] | None,
    exclude: Iterable[str] | None,
    prefix: str,
    prefix_server_names: bool,
    limits: ToolLimits | None,
    limit_overrides: Mapping[str, Any],
) -> list[MCPTool]:
    candidates: list[tuple[MCPServer, dict[str, Any], str]] = []
    for (key, server), listing in zip(named.items(), listings, strict=True):
        head = prefix + (_safe(server.name or key) + "__" if prefix_server_names else "")
        candidates += [(server, spec, function_name(head + str(spec.get("name", "")))) for spec in listing]
    chosen = _select(candidates, include, exclude)
    owners: dict[str, MCPServer] = {}
    mcp_names: dict[str, str] = {}
    for server, spec, name in chosen:
        if name in owners:
            both = sorted({owners[name].label, server.label})
            if len(both) == 1:  # two names of one server that read the same as function names
                raise ValueError(
                    f"two MCP tools of server {both[0]!r} would be named {name!r} "
                    f"({mcp_names[name]!r} and {spec.get('name')!r}); leave one out with exclude=[...]"
                )
            raise ValueError(
                f"two MCP tools would be named {name!r} (servers {both[0]!r} and {both[1]!r}); "
                + _apart(prefix_server_names)
            )
        owners[name], mcp_names[name] = server, str(spec.get("name"))
    tools: list[MCPTool] = []
    try:
        for server, spec, name in chosen:
            tools.append(MCPTool(server, spec, name=name, limits=limits, **limit_overrides))
    except BaseException:
        for built in tools:
            built._drop()
        raise
    return tools


def _apart(prefix_server_names: bool) -> str:
    """How to tell two servers' same-named tools apart: prefix them, or (prefixed already, their
    names reading the same as function names, `a.b` and `a_b`) rename a server."""
    if prefix_server_names:
        return "rename one of the servers (their names read the same in tool names)"
    return "pass prefix_server_names=True or a prefix=... to tell them apart"


def _select(
    candidates: list[tuple[MCPServer, dict[str, Any], str]],
    include: Iterable[str] | None,
    exclude: Iterable[str] | None,
) -> list[tuple[MCPServer, dict[str, Any], str]]:
    """The candidates `include` keeps and `exclude` does not drop; a pattern matching nothing is an error."""

    def matches(pattern: str, spec: Mapping[str, Any], name: str) -> bool:
        return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(str(spec.get("name", "")), pattern)

    keep = None if include is None else [include] if isinstance(include, str) else list(include)
    drop = [] if exclude is None else [exclude] if isinstance(exclude, str) else list(exclude)
    known = ", ".join(sorted(name for _, _, name in candidates)) or "none"
    for kind, patterns in (("include", keep or []), ("exclude", drop)):
        for pattern in patterns:
            if not any(matches(pattern, spec, name) for _, spec, name in candidates):
                raise ValueError(f"{kind}={pattern!r} matches no MCP tool (the servers have: {known})")
    return [
        (server, spec, name)
        for server, spec, name in candidates
        if (keep is None or any(matches(p, spec, name) for p in keep)) and not any(matches(p, spec, name) for p in drop)
    ]


def function_name(name: str) -> str:
    """`name` as a function name the OpenAI API accepts: 1 to 64 ASCII letters, digits, `_` or `-`.

    MCP allows tool names of up to 128 characters, with dots (`files.read`); the OpenAI
    API (and toolenv's checker) refuse those. Other characters become `_`; a longer name
    keeps its first 55 and a hash of the whole, so two long names stay apart.
    """
    if _FUNCTION_NAME.fullmatch(name):
        return name
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name) or "tool"
    if len(safe) > _MAX_NAME:
        safe = f"{safe[: _MAX_NAME - 9]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return safe


def _safe(name: str) -> str:
    """A server name usable in a tool name (letters, digits, `_`, `-`)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "server"


def _parameters(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters part of the function schema: the input schema without auto-generated titles."""
    params: dict[str, Any] = strip_titles(dict(resolved(schema, schema)))  # a top-level `$ref`: its target
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    params.setdefault("required", [])
    return params
