"""Fixtures of the MCP plugin tests: real MCP servers (mcp_test_server.py) over stdio and over HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from toolenv import Tool
from toolenv_mcp import MCPServer, mcp_tools

SERVER_SCRIPT = Path(__file__).resolve().with_name("mcp_test_server.py")


def stdio_server(name: str = "calc", **env: str) -> MCPServer:
    """The test server over stdio; distinct `env` values make distinct servers (own processes)."""
    return MCPServer(name=name, command=sys.executable, args=(str(SERVER_SCRIPT),), env=env)


def close_tools(tools: Iterable[Tool]) -> None:
    async def go() -> None:
        for t in tools:
            await t.close()

    asyncio.run(go())


class Procs:
    """Watching server processes: psutil when installed, else /proc."""

    @staticmethod
    def alive(pid: int) -> bool:
        """True while the process runs (a zombie counts as gone)."""
        try:
            import psutil
        except ImportError:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except FileNotFoundError:
                return False
            except OSError:  # pragma: no cover - no /proc: not Linux
                pytest.skip("needs psutil or /proc to watch processes")
            return stat.rsplit(")", 1)[1].split()[0] != "Z"
        try:
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return False

    def wait_gone(self, pid: int, within: float = 10.0) -> bool:
        """Poll until the process is gone (for ends that happen in the background)."""
        deadline = time.monotonic() + within
        while self.alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


@pytest.fixture
def procs() -> Procs:
    return Procs()


@pytest.fixture(scope="module")
def server() -> Iterator[MCPServer]:
    """The stdio test server, kept running for the module by an anchor set of tools."""
    srv = stdio_server("calc", TOOLENV_MCP_TEST="shared")
    anchor = mcp_tools(srv, include=["pid"])
    yield srv
    close_tools(anchor)


@pytest.fixture
def fresh_server(request: pytest.FixtureRequest) -> Callable[..., MCPServer]:
    """A factory of stdio servers with their own process (unique to the test)."""
    count = 0

    def make(name: str = "calc", **env: str) -> MCPServer:
        nonlocal count
        count += 1
        return stdio_server(name, TOOLENV_MCP_TEST=f"{request.node.nodeid}#{count}", **env)

    return make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http_server(port: int, *, ready: Path | None = None) -> subprocess.Popen[bytes]:
    """The test server over streamable HTTP on 127.0.0.1:`port`, as a subprocess, once it accepts
    connections; with `ready`, at once: it creates that file when it has imported everything,
    then binds the port the moment it is free (see `RestartableHTTPServer.restart`)."""
    quick = ["--when-free", str(ready)] if ready is not None else []
    proc = subprocess.Popen([sys.executable, str(SERVER_SCRIPT), "--http", str(port), *quick], env=dict(os.environ))
    if ready is None:
        wait_listening(proc, port)
    return proc


def wait_listening(proc: subprocess.Popen[bytes], port: int) -> None:
    """Wait until `proc` accepts connections on 127.0.0.1:`port` (at most 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the HTTP test server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the HTTP test server did not start") from None
            time.sleep(0.05)


def stop_http_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The test server over streamable HTTP on 127.0.0.1, as a subprocess; yields its endpoint URL."""
    port = free_port()
    proc = start_http_server(port)
    yield f"http://127.0.0.1:{port}/mcp"
    stop_http_server(proc)


class RestartableHTTPServer:
    """The HTTP test server on a port of its own, which a test can restart (a new process, no sessions)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = start_http_server(self.port)

    def restart(self, *, quick: bool = False) -> None:
        """A new server process on the same port. `quick`: the new one is started (its imports
        done) before the old one stops, and takes the port the moment it is free, so that a
        client reconnecting a second later (the MCP SDK's GET stream) meets the new server."""
        if not quick:
            stop_http_server(self.proc)
            self.proc = start_http_server(self.port)
            return
        with tempfile.TemporaryDirectory() as folder:
            ready = Path(folder) / "ready"
            new = start_http_server(self.port, ready=ready)
            deadline = time.monotonic() + 30
            while not ready.exists():  # its imports, while the old one still serves
                if new.poll() is not None or time.monotonic() > deadline:
                    new.kill()
                    raise RuntimeError("the new HTTP test server did not get ready")
                time.sleep(0.02)
        stop_http_server(self.proc)
        self.proc = new
        wait_listening(new, self.port)


@pytest.fixture
def restartable_http() -> Iterator[RestartableHTTPServer]:
    server = RestartableHTTPServer()
    yield server
    stop_http_server(server.proc)
