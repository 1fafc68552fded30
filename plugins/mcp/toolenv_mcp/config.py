"""Which MCP server to talk to: `MCPServer`, and `load_servers` for `mcpServers` JSON configs.

The config format is the one Claude Desktop, Cursor, Cline and most MCP clients read:
`{"mcpServers": {"name": {"command": ..., "args": [...], "env": {...}}}}` for a server
run as a subprocess over stdio, or `{"name": {"url": ..., "headers": {...}}}` for one
reached over streamable HTTP. A bare `{"name": {...}}` mapping is accepted too. toolenv
adds one key of its own: `"scope": "episode"` gives every episode a server of its own.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["MCPServer", "Scope", "load_servers"]

#: Who shares a server's connection: every episode of the process, or only one episode.
Scope = Literal["process", "episode"]

# Keys other clients keep in the same entries (approval lists, UI hints, their own call
# timeout): accepted and ignored, so a config copied from them loads as it is. toolenv's
# own per-tool `timeout` limit applies instead of "timeout".
_CLIENT_KEYS = frozenset({"autoApprove", "alwaysAllow", "disabled", "enabled", "icon", "description", "timeout"})
_HTTP = frozenset({"http", "streamable-http", "streamable_http", "streamableHttp"})
# `${VAR}` and `${VAR:-default}` (Claude Code), `${env:VAR}` (Cursor, VS Code).
_VAR = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# A command-line flag whose value is a secret (`--key`, `--api-token=...`, `--password`).
_SECRET_FLAG = re.compile(r"-{1,2}[\w-]*(?:key|token|secret|password|passwd|credential|auth)[\w-]*", re.IGNORECASE)
_HIDDEN = "***"


class MCPServer(BaseModel):
    """One MCP server: a command run over stdio, or a streamable HTTP endpoint (exactly one).

    Two `MCPServer`s with the same transport settings are the same server: every tool and
    env naming it shares one connection (and one process) per Python process. With
    `scope="episode"` the calls go instead through a connection of each episode's own
    (a fresh process, or a fresh HTTP session), so a stateful server starts clean every episode.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="", description="Label used in messages and in `prefix_server_names` tool names.")
    command: str | None = Field(default=None, description="stdio: the executable to run.")
    args: tuple[str, ...] = Field(default=(), description="stdio: its arguments.")
    env: dict[str, str] = Field(
        default_factory=dict, description="stdio: variables added to the few the MCP SDK passes on (PATH, HOME...)."
    )
    cwd: str | None = Field(default=None, description="stdio: working directory of the process.")
    url: str | None = Field(default=None, description="Streamable HTTP: the endpoint, e.g. http://127.0.0.1:8000/mcp.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Streamable HTTP: headers sent with every request."
    )
    startup_timeout: float = Field(
        default=30.0, gt=0, description="Seconds to wait for the MCP handshake, and again for the tool listing."
    )
    scope: Scope = Field(
        default="process",
        description='"process": one connection shared by every episode; "episode": one per episode, '
        "opened by its first call and closed when it ends (for stateful servers).",
    )

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either `command` (a server run over stdio) or `url` (streamable HTTP), not both")
        if self.command is not None:
            if not self.command.strip():
                raise ValueError("`command` is empty")
            if self.headers:
                raise ValueError("`headers` applies to `url` servers, not to `command` ones")
        else:
            if self.args or self.env or self.cwd is not None:
                raise ValueError("`args`, `env` and `cwd` apply to `command` servers, not to `url` ones")
            if not str(self.url).startswith(("http://", "https://")):
                raise ValueError(f"`url` must start with http:// or https://, got {self.url!r}")
        return self

    @property
    def transport(self) -> str:
        """`"stdio"` or `"http"`."""
        return "stdio" if self.command is not None else "http"

    @property
    def label(self) -> str:
        """The name, or the command line / URL when the server has none (the URL without its
        query, fragment and user info, which may hold a key: labels go into errors and logs)."""
        if self.name:
            return self.name
        if self.command is not None:
            text = " ".join([Path(self.command).name, *_shown_args(self.args)])
        else:
            text = _shown_url(str(self.url))
        return text if len(text) <= 60 else text[:57] + "..."

    def __repr_args__(self) -> Any:
        """As pydantic's, with what may be secret hidden: env and header values, flagged
        arguments' values (`--key ...`), the URL's user info and query."""
        for field, value in super().__repr_args__():
            if field in ("env", "headers"):
                value = dict.fromkeys(value, _HIDDEN)
            elif field == "args":
                value = tuple(_shown_args(value))
            elif field == "url" and value is not None:
                value = _shown_url(value)
            yield field, value

    @property
    def key(self) -> str:
        """What makes two servers the same one: the transport settings, not the label or the scope."""
        return json.dumps(self.model_dump(exclude={"name", "startup_timeout", "scope"}), sort_keys=True)

    @classmethod
    def from_config(cls, source: Mapping[str, Any] | str | Path, *, name: str = "") -> MCPServer:
        """One server from a config: an entry (`{"command": ...}`), or a config file or
        mapping holding servers (the one named `name`, or the only one).

        An entry takes, besides the fields above, `type` / `transport` (`"stdio"`, `"http"`,
        `"streamable-http"`), expands `${VAR}` and `${VAR:-default}` from the environment
        in strings, and ignores other clients' keys (`autoApprove`, `disabled`, ...).

        Raises:
            ValueError: not a valid server, or no single server to pick; the message says which.
        """
        if isinstance(source, (str, Path)) or (isinstance(source, Mapping) and not _is_entry(source)):
            servers = load_servers(source)
            if name:
                if name not in servers:
                    raise ValueError(f"no MCP server {name!r} in the config (it has: {', '.join(servers)})")
                return servers[name]
            if len(servers) != 1:
                raise ValueError(
                    f"the config has {len(servers)} MCP servers ({', '.join(servers)}); pick one with name="
                )
            return next(iter(servers.values()))
        return cls._from_entry(source, name)

    @classmethod
    def _from_entry(cls, entry: Mapping[str, Any], name: str) -> MCPServer:
        """One `mcpServers` entry, checked; errors name the server."""
        where = f"MCP server {name!r}" if name else "MCP server"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: expected an object with `command` or `url`, got {type(entry).__name__}")
        fields = {k: v for k, v in entry.items() if k not in _CLIENT_KEYS}
        kind = fields.pop("type", None) or fields.pop("transport", None)
        fields.pop("transport", None)
        if kind is not None:
            if kind == "sse":
                raise ValueError(
                    f"{where}: the SSE transport is not supported (MCP deprecated it); "
                    "use the server's streamable HTTP endpoint (often .../mcp) with `url`"
                )
            if kind == "stdio" and "command" not in fields:
                raise ValueError(f"{where}: type 'stdio' needs `command`")
            if kind in _HTTP and "url" not in fields:
                raise ValueError(f"{where}: type {kind!r} needs `url`")
            if kind != "stdio" and kind not in _HTTP:
                raise ValueError(f"{where}: unknown type {kind!r} (expected 'stdio' or 'http')")
        try:
            fields = {k: _expand(v, where) for k, v in fields.items()}
            return cls.model_validate({"name": name, **fields})
        except ValidationError as exc:
            raise ValueError(f"{where}: {_describe(exc)}") from None

    def __str__(self) -> str:
        return f"MCPServer({self.label!r}, {self.transport})"


def _shown_args(args: tuple[str, ...]) -> list[str]:
    """`args` with the values of secret-looking flags (`--key sk-...`, `--api-token=...`) hidden."""
    shown: list[str] = []
    for arg in args:
        flag, eq, _ = arg.partition("=")
        if eq and _SECRET_FLAG.fullmatch(flag):
            arg = f"{flag}={_HIDDEN}"
        elif shown and _SECRET_FLAG.fullmatch(shown[-1]):
            arg = _HIDDEN
        shown.append(arg)
    return shown


def _shown_url(text: str) -> str:
    """The URL without its user info, query and fragment (which may hold a key)."""
    url = urllib.parse.urlsplit(text)
    host = url.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = host + (f":{url.port}" if url.port is not None else "")
    return urllib.parse.urlunsplit((url.scheme, netloc, url.path, "", ""))


def load_servers(source: str | Path | Mapping[str, Any]) -> dict[str, MCPServer]:
    """The servers of an `mcpServers` config: a JSON file's path, or the parsed mapping.

    Entries with `"disabled": true` (or `"enabled": false`) are left out. Values may also
    be `MCPServer`s already.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not valid JSON, not a config, or an entry is invalid (the message names it).
    """
    origin = ""
    if isinstance(source, (str, Path)):
        path = Path(source)
        origin = f" in {path}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    else:
        data = source
    if not isinstance(data, Mapping):
        raise ValueError(f"an MCP config must be a JSON object{origin}, got {type(data).__name__}")
    entries = data.get("mcpServers", data)
    if not isinstance(entries, Mapping):
        raise ValueError(f"`mcpServers`{origin} must be an object mapping names to servers")
    servers: dict[str, MCPServer] = {}
    for name, entry in entries.items():
        if isinstance(entry, MCPServer):
            servers[name] = entry if entry.name else entry.model_copy(update={"name": name})
            continue
        if isinstance(entry, Mapping) and (entry.get("disabled") is True or entry.get("enabled") is False):
            continue
        try:
            servers[name] = MCPServer._from_entry(entry, str(name))
        except ValueError as exc:
            raise ValueError(f"{exc}{origin}") from None
    if not servers:
        raise ValueError(f"no enabled MCP servers{origin}")
    return servers


def _is_entry(mapping: Mapping[str, Any]) -> bool:
    """True for one server's entry, as opposed to a config naming servers."""
    return any(k in mapping for k in ("command", "args", "env", "cwd", "url", "headers", "type", "transport"))


def _expand(value: Any, where: str) -> Any:
    """`value` with `${VAR}`, `${VAR:-default}`, `${env:VAR}` read from the environment, in strings at any depth."""
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            var, default = match.group(1), match.group(2)
            found = os.environ.get(var)
            if found is None and default is None:
                raise ValueError(f"{where}: environment variable {var} is not set (used as ${{{var}}})")
            return found if found is not None else default

        return _VAR.sub(sub, value)
    if isinstance(value, list):
        return [_expand(v, where) for v in value]
    if isinstance(value, Mapping):
        return {k: _expand(v, where) for k, v in value.items()}
    return value


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)
