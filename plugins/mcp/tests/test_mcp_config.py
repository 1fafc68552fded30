"""`MCPServer` and `load_servers`: the mcpServers config convention and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from toolenv_mcp import MCPServer, load_servers


def test_a_server_is_stdio_or_http_never_both() -> None:
    stdio = MCPServer(command="python", args=["server.py"], env={"K": "v"})
    http = MCPServer(url="http://127.0.0.1:8000/mcp", headers={"Authorization": "Bearer t"})
    assert (stdio.transport, http.transport) == ("stdio", "http")
    assert stdio.args == ("server.py",) and stdio.label == "python server.py"
    with pytest.raises(ValidationError, match="either `command`"):
        MCPServer(command="python", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValidationError, match="either `command`"):
        MCPServer()
    with pytest.raises(ValidationError, match="apply to `command` servers"):
        MCPServer(url="http://127.0.0.1:1/mcp", args=["x"])
    with pytest.raises(ValidationError, match="`headers` applies to `url`"):
        MCPServer(command="python", headers={"a": "b"})
    with pytest.raises(ValidationError, match="must start with http"):
        MCPServer(url="ftp://example/mcp")
    with pytest.raises(ValidationError, match="Extra inputs"):
        MCPServer(command="python", cmd="typo")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="frozen"):
        stdio.command = "other"  # type: ignore[misc]


def test_the_name_is_a_label_not_part_of_the_identity() -> None:
    a = MCPServer(name="a", command="python", args=["s.py"])
    b = MCPServer(name="b", command="python", args=["s.py"], startup_timeout=5)
    assert a.key == b.key
    assert a.key != MCPServer(command="python", args=["s.py"], env={"X": "1"}).key


def test_load_servers_reads_the_standard_file(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    config = {
        "mcpServers": {
            "calc": {"command": "python", "args": ["calc.py"], "env": {"MODE": "fast"}, "autoApprove": ["add"]},
            "web": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"X-Key": "k"}},
            "streamable": {"transport": "streamable-http", "url": "http://127.0.0.1:9/other"},
            "off": {"command": "nope", "disabled": True},
        }
    }
    path.write_text(json.dumps(config))
    servers = load_servers(path)
    assert list(servers) == ["calc", "web", "streamable"]
    assert servers["calc"] == MCPServer(name="calc", command="python", args=["calc.py"], env={"MODE": "fast"})
    assert servers["web"].headers == {"X-Key": "k"} and servers["web"].name == "web"
    assert load_servers(str(path)) == servers
    assert load_servers(config) == servers
    assert load_servers(config["mcpServers"]) == servers  # the bare mapping


def test_from_config_takes_an_entry_or_picks_one_server(tmp_path: Path) -> None:
    entry = {"type": "stdio", "command": "python", "args": ["calc.py"], "alwaysAllow": []}
    assert MCPServer.from_config(entry, name="calc") == MCPServer(name="calc", command="python", args=["calc.py"])
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"mcpServers": {"calc": entry}}))
    assert MCPServer.from_config(path).name == "calc"
    two = {"mcpServers": {"calc": entry, "web": {"url": "http://127.0.0.1:9/mcp"}}}
    assert MCPServer.from_config(two, name="web").url == "http://127.0.0.1:9/mcp"
    with pytest.raises(ValueError, match=r"the config has 2 MCP servers \(calc, web\); pick one with name="):
        MCPServer.from_config(two)
    with pytest.raises(ValueError, match=r"no MCP server 'db' in the config \(it has: calc, web\)"):
        MCPServer.from_config(two, name="db")
    with pytest.raises(ValueError, match=r"^MCP server: give either `command`"):
        MCPServer.from_config({"args": ["x"]})


def test_load_servers_takes_server_objects() -> None:
    srv = MCPServer(command="python")
    assert load_servers({"mine": srv}) == {"mine": srv.model_copy(update={"name": "mine"})}


def test_environment_variables_are_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLENV_MCP_TOKEN", "s3cret")
    monkeypatch.delenv("TOOLENV_MCP_UNSET", raising=False)
    servers = load_servers(
        {
            "web": {
                "url": "http://127.0.0.1:${TOOLENV_MCP_UNSET:-8000}/mcp",
                "headers": {"Authorization": "Bearer ${TOOLENV_MCP_TOKEN}"},
            }
        }
    )
    assert servers["web"].url == "http://127.0.0.1:8000/mcp"
    assert servers["web"].headers == {"Authorization": "Bearer s3cret"}
    with pytest.raises(ValueError, match=r"MCP server 'x': environment variable TOOLENV_MCP_UNSET is not set"):
        load_servers({"x": {"command": "run", "args": ["${TOOLENV_MCP_UNSET}"]}})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"calc": {"command": "python", "url": "http://127.0.0.1/mcp"}}, "MCP server 'calc': give either `command`"),
        ({"calc": {"comand": "python"}}, "MCP server 'calc': .*comand: Extra inputs are not permitted"),
        ({"calc": {"type": "sse", "url": "http://127.0.0.1/sse"}}, "SSE transport is not supported"),
        ({"calc": {"type": "websocket", "url": "ws://x"}}, "unknown type 'websocket'"),
        ({"calc": {"type": "stdio", "url": "http://127.0.0.1/mcp"}}, "type 'stdio' needs `command`"),
        ({"calc": ["python"]}, "MCP server 'calc': expected an object"),
        ({"calc": {"command": "x", "disabled": True}}, "no enabled MCP servers"),
        ({"mcpServers": []}, "`mcpServers` must be an object"),
        ({}, "no enabled MCP servers"),
    ],
)
def test_config_errors_name_the_server(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_servers(config)


def test_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"mcpServers": {')
    with pytest.raises(ValueError, match=r"bad.json: not valid JSON"):
        load_servers(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"mcpServers": {"calc": {"args": ["x"]}}}))
    with pytest.raises(ValueError, match=r"MCP server 'calc': give either .* in .*wrong.json"):
        load_servers(wrong)
    with pytest.raises(FileNotFoundError):
        load_servers(tmp_path / "missing.json")


def test_importing_toolenv_or_the_plugin_does_not_import_the_sdk() -> None:
    code = (
        "import sys, toolenv, toolenv_mcp\n"
        "toolenv_mcp.load_servers({'a': {'command': 'x'}})\n"
        "print('mcp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_scope_is_read_from_an_entry_and_is_not_part_of_the_identity() -> None:
    servers = load_servers(
        {
            "mcpServers": {
                "notes": {"command": "python", "args": ["notes.py"], "scope": "episode"},
                "calc": {"command": "c"},
            }
        }
    )
    assert servers["notes"].scope == "episode" and servers["calc"].scope == "process"
    assert servers["notes"].key == MCPServer(command="python", args=["notes.py"]).key  # lists through one connection
    with pytest.raises(ValueError, match=r"MCP server 'notes': scope: Input should be 'process' or 'episode'"):
        load_servers({"notes": {"command": "python", "scope": "task"}})


def test_cursor_and_vs_code_env_references_are_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLENV_MCP_TOKEN", "s3cret")
    monkeypatch.delenv("TOOLENV_MCP_UNSET", raising=False)
    servers = load_servers(
        {
            "gh": {"command": "gh-mcp", "env": {"GITHUB_TOKEN": "${env:TOOLENV_MCP_TOKEN}"}},
            "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${env:TOOLENV_MCP_TOKEN}"}},
        }
    )
    # before: the literal "${env:TOOLENV_MCP_TOKEN}" was sent as the token
    assert servers["gh"].env == {"GITHUB_TOKEN": "s3cret"}
    assert servers["web"].headers == {"Authorization": "Bearer s3cret"}
    with pytest.raises(ValueError, match=r"environment variable TOOLENV_MCP_UNSET is not set"):
        load_servers({"x": {"command": "run", "env": {"K": "${env:TOOLENV_MCP_UNSET}"}}})


def test_servers_with_one_label_are_not_silently_merged() -> None:
    from toolenv_mcp.tool import resolve_servers

    a = MCPServer(command="python", args=["server.py"], env={"REGION": "eu"})
    b = MCPServer(command="python", args=["server.py"], env={"REGION": "us"})
    with pytest.raises(ValueError, match=r"two MCP servers are labelled 'python server.py'; give them distinct names"):
        resolve_servers([a, b])  # before: `a` was dropped without a word
    assert list(resolve_servers([a.model_copy(update={"name": "eu"}), b])) == ["eu", "python server.py"]
    assert list(resolve_servers([a, a])) == ["python server.py"]  # the same server twice is one server


def test_a_url_servers_label_keeps_no_key_from_its_url() -> None:
    """Labels go into error messages, logs and trajectories: a key in the URL's query or user
    info must not."""
    server = MCPServer(url="https://user:s3cret@mcp.example.com:8443/mcp?api_key=s3cret#frag")
    assert server.label == "https://mcp.example.com:8443/mcp"
    assert "s3cret" not in server.label
    assert MCPServer(url="http://[::1]:9000/mcp").label == "http://[::1]:9000/mcp"


def test_secrets_stay_out_of_labels_and_reprs() -> None:
    """A label goes into every error the model reads (and the saved trajectories), a repr into
    logs and tracebacks: a key passed as an argument (`--key ...`, as Smithery's CLI takes it),
    a header or an env value was shown in full."""
    stdio = MCPServer(
        command="npx",
        args=["-y", "@smithery/cli", "run", "@a/b", "--key", "sk-arg-1", "--api-token=sk-arg-2"],
        env={"GITHUB_TOKEN": "sk-env-3"},
    )
    assert stdio.label.startswith("npx -y @smithery/cli run @a/b --key ")
    web = MCPServer(name="docs", url="http://127.0.0.1:1/mcp", headers={"Authorization": "Bearer sk-head-4"})
    shown = " ".join([stdio.label, repr(stdio), repr(web), str(stdio), str(web)])
    for secret in ("sk-arg-1", "sk-arg-2", "sk-env-3", "sk-head-4"):
        assert secret not in shown
    assert "GITHUB_TOKEN" in repr(stdio) and "Authorization" in repr(web)  # which keys: yes; their values: no
    assert MCPServer(command="python", args=["server.py", "--port", "8000"]).label == "python server.py --port 8000"
