"""MCP tools in envs: episodes, one server process shared across envs and event loops, `toolenv/MCP-v0`, HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import toolenv
from toolenv import ToolEnv, ToolVectorEnv
from toolenv.checker import check_env
from toolenv_mcp import MCPServer, MCPServerError, amcp_tools, mcp_tools
from toolenv_mcp.env import make_mcp_env

TASKS = [{"id": "sum", "question": "What is 2+3?", "answer": "5"}]
Factory = Callable[..., MCPServer]


def tool_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_an_episode_with_mcp_tools(server: MCPServer) -> None:
    env = ToolEnv(tools=mcp_tools(server, include=["add", "echo"]), tasks=TASKS)
    obs, info = env.reset(seed=0)
    assert '"name": "add"' in obs and "What is 2+3?" in obs
    obs, reward, terminated, truncated, info = env.step("I will add. " + tool_call("add", a=2, b=3))
    assert obs == "<tool_response>\n5\n</tool_response>"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_results"][0].metadata["mcp_tool"] == "add"
    obs, reward, terminated, truncated, info = env.step(tool_call("add", a=2, b="3"))
    assert "Invalid arguments for tool 'add': b: '3' is not of type 'integer'" in obs
    obs, reward, terminated, truncated, info = env.step("<answer>5</answer>")
    assert (reward, terminated) == (1.0, True)
    env.close()


def test_the_env_passes_toolenvs_checker(server: MCPServer) -> None:
    env = ToolEnv(tools=mcp_tools(server, include=["add", "echo"]), tasks=TASKS)
    failed = [r for r in check_env(env) if not r.ok]
    assert not failed, failed
    env.close()


def test_envs_in_different_event_loops_share_one_server_process(fresh_server: Factory, procs: Any) -> None:
    srv = fresh_server()
    pid_call = tool_call("pid")

    sync_env = ToolEnv(tools=mcp_tools(srv, include=["pid", "add"]), tasks=TASKS)  # its private loop
    vec = ToolVectorEnv([lambda: ToolEnv(tools=mcp_tools(srv, include=["pid"]), tasks=TASKS) for _ in range(3)])
    sync_env.reset(seed=0)
    vec.reset(seed=0)
    pids = {sync_env.step(pid_call)[0]}
    obs, *_ = vec.step((pid_call,) * 3)  # three envs, one loop, concurrent calls
    pids.update(obs)

    async def in_another_loop() -> str:
        env = ToolEnv(tools=await amcp_tools(srv, include=["pid"]), tasks=TASKS)
        await env.areset(seed=0)
        obs, *_ = await env.astep(pid_call)
        await env.aclose()
        return obs

    found: list[str] = []
    thread = threading.Thread(target=lambda: found.append(asyncio.run(in_another_loop())))  # as verl's workers do
    thread.start()
    thread.join(30)
    pids.update(found)
    assert len(pids) == 1, pids
    pid = int(pids.pop().removeprefix("<tool_response>\n").removesuffix("\n</tool_response>"))
    assert procs.alive(pid)

    sync_env.close()
    assert procs.alive(pid)  # the vector env still uses it
    vec.close()
    assert not procs.alive(pid)  # the last user closed it: no process left behind


def test_gym_make_from_a_config_file(tmp_path: Path, fresh_server: Factory) -> None:
    srv = fresh_server()
    config = tmp_path / "mcp.json"
    entry = {"command": srv.command, "args": list(srv.args), "env": srv.env}
    config.write_text(json.dumps({"mcpServers": {"calc": entry}}))
    env = gym.make(
        "toolenv/MCP-v0", servers=str(config), tasks=TASKS, prefix_server_names=True, exclude=["die"], timeout=5
    )
    inner = env.unwrapped
    assert isinstance(inner, ToolEnv)
    names = [t.name for t in inner.tools]
    assert names[:2] == ["calc__add", "calc__echo"] and "calc__die" not in names
    assert all(t.limits.timeout == 5 for t in inner.tools)
    env.reset(seed=0)
    obs, *_ = env.step(tool_call("calc__add", a=2, b=3))
    assert obs == "<tool_response>\n5\n</tool_response>"
    assert env.step("<answer>5</answer>")[1] == 1.0
    env.close()

    vec = gym.make_vec("toolenv/MCP-v0", num_envs=2, servers=str(config), tasks=TASKS, include=["pid"])
    vec.reset(seed=0)
    obs, *_ = vec.step((tool_call("pid"),) * 2)
    assert obs[0] == obs[1] and obs[0].startswith("<tool_response>\n")
    vec.close()


def test_the_env_factory_options(server: MCPServer) -> None:
    env = make_mcp_env({"calc": server}, TASKS * 3, include=["add"], limit=2, max_turns=2, retries=1)
    assert len(env.tasks) == 2 and env.max_turns == 2
    assert [t.name for t in env.tools] == ["add"] and env.tools[0].limits.retries == 1
    env.close()

    @toolenv.tool(name="echo", description="Shout.")
    def extra(text: str) -> str:
        return text.upper()

    with pytest.raises(ValueError, match=r"MCP tools \['echo'\] have the names of tools passed in `tools`"):
        make_mcp_env(server, include=["echo"], tools=[extra])
    both = make_mcp_env(server, include=["echo"], prefix="mcp_", tools=[extra])
    assert [t.name for t in both.tools] == ["echo", "mcp_echo"]
    both.close()


def test_with_no_servers_the_env_is_the_bundled_demo() -> None:
    """`gym.make("toolenv/MCP-v0")` runs the demo shop server on its own tasks; its oracle solves them."""
    from toolenv_mcp.demo import demo_tasks, mcp_oracle

    env = make_mcp_env()
    try:
        assert [t.name for t in env.tools] == ["price", "multiply"] and env.tasks == demo_tasks()
        for i, task in enumerate(env.tasks):
            obs, _ = env.reset(options={"task_index": i})
            for turn in range(3):
                obs, reward, term, trunc, info = env.step(mcp_oracle(task, turn, obs))
                assert not any(r.is_error for r in info["tool_results"]), obs
            assert term and reward == 1.0, (task.id, info["answer"])
        # Other tasks on the demo server: the caller's tasks win.
        mine = make_mcp_env(tasks=[{"question": "Price of milk?", "answer": "1.1"}])
        assert [t.question for t in mine.tasks] == ["Price of milk?"]
        mine.close()
    finally:
        env.close()


def test_a_server_over_streamable_http(http_url: str) -> None:
    srv = MCPServer(name="web", url=http_url, headers={"X-Toolenv-Test": "1"})
    tools = mcp_tools(srv, include=["add", "sleep", "calls", "image"], timeout=0.5)
    env = ToolEnv(tools=tools, tasks=TASKS, max_turns=10)
    env.reset(seed=0)
    before = env.step(tool_call("calls"))[0]
    assert env.step(tool_call("add", a=2, b=3))[0] == "<tool_response>\n5\n</tool_response>"
    assert "unknown argument(s) 'c'" in env.step(tool_call("add", a=2, b=3, c=1))[0]
    start = time.monotonic()
    obs, _, _, _, info = env.step(tool_call("sleep", seconds=30))
    assert time.monotonic() - start < 5 and "timed out after 0.5 s" in obs
    assert env.step(tool_call("add", a=1, b=1))[0] == "<tool_response>\n2\n</tool_response>"
    after = env.step(tool_call("calls"))[0]
    served = int(after.split("\n")[1]) - int(before.split("\n")[1])
    assert served == 3  # add, sleep, add: the invalid call never arrived
    env.close()


def test_an_unreachable_http_server_is_one_readable_line() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    srv = MCPServer(name="gone", url=f"http://127.0.0.1:{port}/mcp", startup_timeout=10)
    with pytest.raises(MCPServerError, match=r"^MCP server 'gone' could not start: ") as info:
        mcp_tools(srv)
    assert "\n" not in str(info.value)


def test_an_http_server_refusing_the_handshake_says_its_status() -> None:
    """A wrong token is the usual reason: the MCP SDK's own message ("Server returned an error
    response") does not say that the server answered 401."""
    import http.server

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = b'{"error": "invalid_token"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_DELETE = do_POST

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        srv = MCPServer(name="docs", url=f"http://127.0.0.1:{httpd.server_port}/mcp", headers={"Authorization": "x"})
        with pytest.raises(MCPServerError) as info:
            mcp_tools(srv)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
    message = str(info.value)
    assert message.startswith("MCP server 'docs' could not start: it answered HTTP 401 Unauthorized, check its headers")
    assert "\n" not in message


class _StatusServer:
    """A minimal streamable HTTP MCP server on 127.0.0.1 whose tool calls answer `status` (200: a result).

    Plain JSON responses, no SSE: the handshake and the listing succeed, so a test can make
    the server refuse calls later in the session, as a server whose token was revoked (401)
    or a proxy whose backend is down (502, 503) does.
    """

    def __init__(self) -> None:
        import http.server

        self.status = 200
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def reply(self, code: int, body: Any = None, headers: tuple[tuple[str, str], ...] = ()) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(code)
                if body is not None:
                    self.send_header("Content-Type", "application/json")
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                method, rid = message.get("method"), message.get("id")
                if rid is None:
                    return self.reply(202)
                if method == "initialize":
                    version = message["params"]["protocolVersion"]
                    info = {"name": "status", "version": "0"}
                    result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
                    return self.reply(200, {"jsonrpc": "2.0", "id": rid, "result": result}, (("Mcp-Session-Id", "s1"),))
                if method == "tools/list":
                    tools = [{"name": "t", "inputSchema": {"type": "object"}}]
                    return self.reply(200, {"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})
                if method == "ping" or owner.status == 200:
                    result = {} if method == "ping" else {"content": [{"type": "text", "text": "ok"}]}
                    return self.reply(200, {"jsonrpc": "2.0", "id": rid, "result": result})
                data = b"no"
                self.send_response(owner.status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.reply(405)

            def do_DELETE(self) -> None:
                self.reply(200)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/mcp"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


async def test_an_http_status_refusing_a_call_is_named() -> None:
    """A token revoked mid-run (401), or a proxy whose backend is down (503): the MCP SDK
    reports either as "Server returned an error response", and the model (and whoever reads
    the trajectories) could not tell a bad token from a bad argument. A 503 is worth a
    retry; a 401 is not. The session is not thrown away: once the server answers again, so do the calls."""
    from toolenv import Task, ToolCall, ToolCaller, ToolContext

    server = _StatusServer()
    tools = await amcp_tools(MCPServer(name="docs", url=server.url, headers={"Authorization": "Bearer x"}))
    try:
        conn = tools[0]._conn
        assert conn is not None
        caller = ToolCaller(tools)

        async def call() -> Any:
            [result], _ = await caller.invoke([ToolCall(name="t", arguments={})], ToolContext(Task()))
            return result

        assert (await call()).text == "ok"
        starts = conn.starts
        server.status = 401
        refused = await call()
        assert refused.is_error and not refused.retryable
        assert refused.text.startswith(
            "MCP server 'docs' refused the call to 't': it answered HTTP 401 Unauthorized, check its headers (a token?)"
        ), refused.text
        server.status = 503
        unavailable = await call()
        assert unavailable.is_error and unavailable.retryable
        assert unavailable.text.startswith(
            "MCP server 'docs' refused the call to 't': it answered HTTP 503 Service Unavailable"
        ), unavailable.text
        server.status = 200
        assert ((await call()).text, conn.starts) == ("ok", starts)
    finally:
        for t in tools:
            await t.close()
        server.stop()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX process checks")
def test_the_registry_forgets_closed_servers(fresh_server: Factory) -> None:
    from toolenv_mcp import connection

    srv = fresh_server()
    tools = mcp_tools(srv, include=["add"])
    assert connection._connections[srv.key].refs == 1
    asyncio.run(tools[0].close())
    assert srv.key not in connection._connections


def test_a_restarted_http_server_gets_a_new_session(restartable_http: Any) -> None:
    srv = MCPServer(name="web", url=restartable_http.url)
    env = ToolEnv(tools=mcp_tools(srv, include=["add"]), tasks=TASKS, max_turns=10)
    try:
        env.reset(seed=0)
        assert env.step(tool_call("add", a=2, b=3))[0] == "<tool_response>\n5\n</tool_response>"
        restartable_http.restart()  # a new server process: it knows no session
        # The server answers 404 to the old session id; MCP says start a new session. Before,
        # every later call was "refused ... Session not found", for good.
        assert env.step(tool_call("add", a=1, b=2))[0] == "<tool_response>\n3\n</tool_response>"
        assert env.step(tool_call("add", a=2, b=2))[0] == "<tool_response>\n4\n</tool_response>"
        more = mcp_tools(srv, include=["add"])  # listing through the shared connection works too
        asyncio.run(more[0].close())
    finally:
        env.close()


async def test_results_over_a_megabyte_come_back_over_http(http_url: str) -> None:
    """A screenshot or a page of text is often over 1 MiB: the MCP SDK's default cap on one
    SSE event. Such a result failed as "closed the connection ... (did it crash?)", and the
    session (an episode's state with it) was thrown away; over stdio it came back whole."""
    from toolenv import Task, ToolContext

    [echo] = await amcp_tools(MCPServer(name="web", url=http_url), include=["echo"])
    try:
        conn = echo._conn
        assert conn is not None
        big = "x" * (3 * 1024 * 1024)
        result = await echo.run(echo.Args.model_validate({"text": big}), ToolContext(Task()))
        assert not result.is_error, result.text
        assert result.text == big
        starts = conn.starts
        small = await echo.run(echo.Args.model_validate({"text": "hi"}), ToolContext(Task()))
        assert (small.text, conn.starts) == ("hi", starts)  # the same session: it was never lost
    finally:
        await echo.close()


async def test_more_than_a_hundred_calls_in_flight_over_http(http_url: str) -> None:
    """Streamable HTTP answers each call on a connection of its own, and httpx pools at most
    100 per client: the 101st call waited for a free one (a vector env of 128 episodes ran
    100 at a time), and one that waited 30 s for it failed the whole session, every call
    in flight with it, as "closed the connection ... (did it crash?)". Over stdio no such cap."""
    from toolenv import Task, ToolCall, ToolCaller, ToolContext

    tools = await amcp_tools(MCPServer(name="web", url=http_url), include=["barrier", "add"], timeout=20)
    try:
        caller = ToolCaller(tools)
        calls = [ToolCall(name="barrier", arguments={"key": "hundred", "n": 120}) for _ in range(120)]
        results, _ = await caller.invoke(calls, ToolContext(Task()))  # each returns once all 120 have arrived
        assert {r.text for r in results} == {"120 in"}
        [added], _ = await caller.invoke([ToolCall(name="add", arguments={"a": 1, "b": 2})], ToolContext(Task()))
        assert added.text == "3"
    finally:
        for t in tools:
            await t.close()
