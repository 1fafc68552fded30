"""`mcp_tools` against a real MCP server over stdio: listing, validation, results, faults, process lifetime."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolResult
from toolenv.checker import check_tool_rejects_bad_arguments, check_tool_schema
from toolenv_mcp import MCPServer, MCPServerError, MCPTool, amcp_tools, connection, mcp_tools

ALL = [
    "add",
    "echo",
    "fail",
    "sleep",
    "image",
    "structured",
    "resources",
    "die",
    "pid",
    "calls",
    "remember",
    "recall",
    "barrier",
    "refuse",
    "hog",
]
Factory = Callable[..., MCPServer]


async def call(tools: list[MCPTool], name: str, **arguments: Any) -> ToolResult:
    """One call through toolenv's caller, as an env makes it (validation, limits, guard)."""
    [result], _ = await ToolCaller(tools).invoke([ToolCall(name=name, arguments=arguments)], ToolContext(Task()))
    return result


async def close(tools: list[MCPTool]) -> None:
    for t in tools:
        await t.close()


async def pid_of(tools: list[MCPTool]) -> int:
    result = await call(tools, "pid")
    assert not result.is_error, result.text
    return int(result.text)


async def test_listing_names_descriptions_and_the_servers_schema(server: MCPServer) -> None:
    tools = await amcp_tools(server)
    try:
        assert [t.name for t in tools] == ALL
        add = tools[0]
        assert isinstance(add, MCPTool) and add.mcp_name == "add" and add.server == server
        assert add.description == "Add two integers."
        assert add.schema() == {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
        assert add.input_schema["properties"]["a"] == {"title": "A", "type": "integer"}  # the server's, verbatim
        assert add.flat_schema()["function"]["parameters"]["properties"]["b"] == {"type": "integer"}
        for t in tools:
            check_tool_schema(t)
        await asyncio.to_thread(check_tool_rejects_bad_arguments, add)
    finally:
        await close(tools)


def test_include_exclude_and_prefix(server: MCPServer) -> None:
    tools = mcp_tools(server, include=["add", "e*"], prefix="calc_")
    assert [t.name for t in tools] == ["calc_add", "calc_echo"]
    assert [t.mcp_name for t in tools] == ["add", "echo"]
    others = mcp_tools(
        server, exclude=["die", "s*", "calc_[ae]*", "re[mcf]*", "barrier", "hog"], prefix="calc_"
    )  # MCP or prefixed
    assert [t.name for t in others] == ["calc_fail", "calc_image", "calc_resources", "calc_pid", "calc_calls"]
    named = mcp_tools(server, include="add", prefix_server_names=True)
    assert [t.name for t in named] == ["calc__add"]
    with pytest.raises(
        ValueError, match=r"include='ad' matches no MCP tool \(the servers have: add, barrier, calls, die"
    ):
        mcp_tools(server, include=["ad"])
    with pytest.raises(ValueError, match="exclude='nope' matches no MCP tool"):
        mcp_tools(server, exclude=["nope"])
    asyncio.run(close([*tools, *others, *named]))


def test_name_collisions_suggest_a_prefix(server: MCPServer, fresh_server: Factory) -> None:
    other = fresh_server("calc2")
    with pytest.raises(ValueError, match=r"two MCP tools would be named 'add' \(servers 'calc' and 'calc2'\).*prefix_"):
        mcp_tools({"calc": server, "calc2": other}, include=["add"])
    tools = mcp_tools({"calc": server, "calc2": other}, include=["add"], prefix_server_names=True)
    assert [t.name for t in tools] == ["calc__add", "calc2__add"]
    results = asyncio.run(call(tools, "calc2__add", a=1, b=1))
    assert results.text == "2"
    asyncio.run(close(tools))


def test_server_names_that_read_the_same_in_tool_names_say_to_rename_one(fresh_server: Factory) -> None:
    # "a.b" and "a_b" both prefix their tools "a_b__": the error said to pass prefix_server_names=True,
    # which was passed already.
    with pytest.raises(ValueError) as info:
        mcp_tools([fresh_server("a.b"), fresh_server("a_b")], include=["add"], prefix_server_names=True)
    message = str(info.value)
    assert "'a_b__add'" in message and "prefix_server_names=True" not in message
    assert "rename" in message


async def test_calls_and_results(server: MCPServer) -> None:
    tools = await amcp_tools(server)
    try:
        added = await call(tools, "add", a=2, b=3)
        assert (added.text, added.is_error, added.name) == ("5", False, "add")
        assert added.metadata == {"mcp_server": "calc", "mcp_tool": "add", "structured_content": {"result": 5}}
        assert (await call(tools, "echo", text="héllo\nworld")).text == "héllo\nworld"
        structured = await call(tools, "structured")
        assert structured.text == '{"answer": 42, "unit": "m"}' and not structured.is_error
        assert (await call(tools, "resources")).text == "hi\n[resource link: file:///big.csv (big.csv)]"
        image = await call(tools, "image", width=5, height=7)
        assert image.text.startswith("an image:")
        if pytest.importorskip("PIL"):
            assert [(im.width, im.height, im.mime) for im in image.images] == [(5, 7, "image/png")]
            assert image.images[0].to_pil().getpixel((0, 0)) == (255, 0, 0)
    finally:
        await close(tools)


async def test_invalid_arguments_never_reach_the_server(server: MCPServer) -> None:
    tools = await amcp_tools(server)
    try:
        before = (await call(tools, "calls")).text
        wrong = await call(tools, "add", a="two", b=3)
        missing = await call(tools, "add", a=2)
        unknown = await call(tools, "add", a=2, b=3, c=4)
        assert wrong.is_error and wrong.text == (
            "Invalid arguments for tool 'add': a: 'two' is not of type 'integer'. Expected arguments: a, b."
        )
        assert missing.is_error and missing.text == (
            "Invalid arguments for tool 'add': b: Field required. Expected arguments: a, b."
        )
        assert unknown.is_error and unknown.text == (
            "Invalid arguments for tool 'add': unknown argument(s) 'c'. Expected arguments: a, b."
        )
        assert (await call(tools, "calls")).text == before
        await call(tools, "add", a=1, b=1)
        assert int((await call(tools, "calls")).text) == int(before) + 1
    finally:
        await close(tools)


async def test_a_lone_surrogate_in_the_arguments_is_refused_and_the_server_lives_on(fresh_server: Factory) -> None:
    """A model may write half of a UTF-16 pair as an escape (`"\\ud83d"`): JSON parses it into
    a string that UTF-8 cannot encode. Sent as it was, the MCP SDK failed to serialize the
    request inside its transport, the session died, and the shared server was restarted: every
    episode's calls in flight on it failed, and its state was gone. It is refused instead."""
    import json

    tools = await amcp_tools(fresh_server(), include=["echo", "pid", "calls"])
    try:
        pid = await pid_of(tools)
        before = (await call(tools, "calls")).text
        text = json.loads('"smile \\ud83d"')
        refused = await call(tools, "echo", text=text)
        assert refused.is_error and refused.text == (
            "Invalid arguments for tool 'echo': text: 'smile \\ud83d' is not valid Unicode "
            "(a lone surrogate, '\\ud83d'). Expected arguments: text."
        )
        assert (await call(tools, "calls")).text == before  # not sent
        assert await pid_of(tools) == pid  # the server lives on
        assert (await call(tools, "echo", text="smile \U0001f600")).text == "smile \U0001f600"
    finally:
        await close(tools)


async def test_a_failing_tool_is_an_error_observation(server: MCPServer) -> None:
    tools = await amcp_tools(server, include=["fail", "add"])
    try:
        failed = await call(tools, "fail", message="no disk")
        assert failed.is_error and not failed.retryable and "fail: no disk" in failed.text
        assert (await call(tools, "add", a=1, b=2)).text == "3"
    finally:
        await close(tools)


async def test_a_server_error_with_code_32000_is_a_refusal_not_a_crash(fresh_server: Factory, procs: Any) -> None:
    """JSON-RPC leaves -32000 to servers ("Server error"), and the MCP SDK also gives it to
    calls whose connection closed. A server refusing a call with it was taken for dead: the
    call read "closed the connection ... (did it crash?)" and the next call killed the
    process (and every call in flight on it) to start another, its state lost."""
    tools = await amcp_tools(fresh_server(), include=["refuse", "pid", "add"])
    try:
        first = await pid_of(tools)
        refused = await call(tools, "refuse", code=-32000, message="too busy, try later")
        assert refused.is_error and "too busy, try later" in refused.text
        assert "closed the connection" not in refused.text
        assert await pid_of(tools) == first and procs.alive(first)
        assert (await call(tools, "add", a=1, b=2)).text == "3"
    finally:
        await close(tools)


async def test_a_hanging_call_times_out_and_the_server_keeps_serving(server: MCPServer) -> None:
    tools = await amcp_tools(server, include=["sleep", "add"], timeout=0.5)
    assert tools[0].limits.timeout == 0.5
    try:
        start = time.monotonic()
        hung = await call(tools, "sleep", seconds=30)
        assert time.monotonic() - start < 5
        assert hung.is_error and hung.retryable and hung.text.startswith("Tool 'sleep' timed out after 0.5 s")
        assert hung.text.endswith("The MCP server did not answer in time: try the call again, or go on without it.")
        assert (await call(tools, "add", a=4, b=4)).text == "8"
        assert (await call(tools, "sleep", seconds=0)).text == "slept 0.0"
    finally:
        await close(tools)


async def test_a_wedged_server_is_replaced_after_a_call_times_out(
    fresh_server: Factory, procs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose event loop is stuck (a model's input sent a tool into a busy loop)
    answers nothing, not even the cancellation of the timed-out call: every later call of
    every episode timed out too, for good. Now the session is pinged after a call is
    cancelled, and one that does not answer is stopped; the next call starts a new server."""
    monkeypatch.setattr(connection, "PING_TIMEOUT", 1.0)
    tools = await amcp_tools(fresh_server(), include=["hog", "pid", "add"], timeout=0.5)
    try:
        first = await pid_of(tools)
        hung = await call(tools, "hog", seconds=3600)
        assert hung.is_error and "timed out after 0.5 s" in hung.text
        deadline = time.monotonic() + 15
        # A call sent before the ping's verdict (1 s) meets the stuck server too; none after it.
        while (added := await call(tools, "add", a=1, b=2)).is_error:
            assert "timed out" in added.text or "closed the connection" in added.text
            assert time.monotonic() < deadline, "every call still meets the stuck server"
        assert added.text == "3"
        assert await pid_of(tools) != first and procs.wait_gone(first)
    finally:
        await close(tools)


async def test_a_slow_call_that_times_out_leaves_a_healthy_server_alone(fresh_server: Factory) -> None:
    """The ping after a timed-out call is answered: the server and its calls in flight go on."""
    tools = await amcp_tools(fresh_server(), include=["sleep", "pid", "add"], timeout=0.5)
    try:
        first = await pid_of(tools)
        assert "timed out" in (await call(tools, "sleep", seconds=30)).text
        assert (await call(tools, "add", a=2, b=2)).text == "4"
        assert await pid_of(tools) == first
    finally:
        await close(tools)


async def test_a_server_that_dies_mid_call_is_restarted(fresh_server: Factory, procs: Any) -> None:
    tools = await amcp_tools(fresh_server(), include=["die", "pid", "add"])
    try:
        first = await pid_of(tools)
        died = await call(tools, "die")
        assert died.is_error and died.retryable
        assert died.text == (
            "MCP server 'calc' closed the connection during the call to 'die' (did it crash?); "
            "it is restarted on the next call"
        )
        assert (await call(tools, "add", a=1, b=2)).text == "3"
        second = await pid_of(tools)
        assert second != first and procs.wait_gone(first)
    finally:
        await close(tools)
    assert procs.wait_gone(second)


async def test_a_server_killed_while_idle_is_restarted_before_the_next_call(fresh_server: Factory) -> None:
    tools = await amcp_tools(fresh_server(), include=["pid", "add"])
    try:
        first = await pid_of(tools)
        os.kill(first, signal.SIGKILL)
        conn = tools[0]._conn
        assert conn is not None
        deadline = time.monotonic() + 10
        while not conn._lost:  # the connection notices the end of the server's output by itself
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        result = await call(tools, "add", a=2, b=2)
        assert (result.text, result.is_error) == ("4", False)
        assert await pid_of(tools) != first
    finally:
        await close(tools)


async def test_a_server_that_cannot_restart_gives_error_results(
    fresh_server: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "refuse"
    tools = await amcp_tools(fresh_server(MCP_TEST_REFUSE_IF=str(marker)), include=["die", "add"])
    conn = tools[0]._conn
    assert conn is not None
    try:
        marker.touch()
        assert (await call(tools, "die")).retryable
        again = await call(tools, "add", a=1, b=1)
        assert again.is_error and again.retryable
        assert again.text.startswith("MCP server 'calc' could not start: ")
        starts = conn.starts
        assert (await call(tools, "add", a=1, b=1)).text == again.text
        assert conn.starts == starts  # within the cool-down the failure is reported, not retried
        monkeypatch.setattr(connection, "RESTART_COOLDOWN", 0.0)
        marker.unlink()
        assert (await call(tools, "add", a=1, b=1)).text == "2"
    finally:
        await close(tools)


async def test_a_server_down_opens_one_circuit_for_all_its_tools(fresh_server: Factory, tmp_path: Path) -> None:
    from toolenv.breaker import reset_breakers

    reset_breakers()
    marker = tmp_path / "refuse"
    server = fresh_server(MCP_TEST_REFUSE_IF=str(marker))
    tools = await amcp_tools(server, include=["die", "add", "echo"], breaker_threshold=2, breaker_cooldown=60)
    try:
        assert (await call(tools, "add", a=1, b=2)).text == "3"
        marker.touch()
        assert (await call(tools, "die")).retryable  # the server dies and cannot come back
        assert (await call(tools, "add", a=1, b=1)).text.startswith("MCP server 'calc' could not start: ")
        refused = await call(tools, "echo", text="hi")  # another tool of the same server
        assert refused.is_error and refused.metadata == {"circuit_open": True}
        assert refused.text.startswith("Tool 'echo' is unavailable: its last 2 calls failed (MCP server 'calc'")
        assert tools[0].breaker_key() == tools[2].breaker_key() == ("toolenv_mcp", server.key)
    finally:
        await close(tools)
        reset_breakers()


def test_a_server_that_cannot_start_raises_one_readable_line() -> None:
    missing = MCPServer(name="ghost", command="toolenv-mcp-no-such-command")
    with pytest.raises(MCPServerError) as info:
        mcp_tools(missing)
    assert str(info.value).startswith("MCP server 'ghost' could not start: FileNotFoundError: ")
    assert "\n" not in str(info.value)
    quits = MCPServer(name="quits", command=sys.executable, args=["-c", "import sys; sys.exit(3)"])
    with pytest.raises(MCPServerError, match=r"^MCP server 'quits' could not start: it closed the connection"):
        mcp_tools(quits)
    silent = MCPServer(
        name="silent", command=sys.executable, args=["-c", "import time; time.sleep(30)"], startup_timeout=0.5
    )
    with pytest.raises(MCPServerError, match=r"could not start: no answer to the MCP handshake within 0.5 s"):
        mcp_tools(silent)


async def test_close_stops_the_process_and_a_later_call_starts_another(fresh_server: Factory, procs: Any) -> None:
    tools = await amcp_tools(fresh_server(), include=["pid", "add"])
    first = await pid_of(tools)
    await tools[0].close()
    assert procs.alive(first)  # `add` still holds the connection
    await tools[1].close()
    await tools[1].close()  # idempotent
    assert not procs.alive(first)
    second = await pid_of(tools)  # a closed tool reconnects when used again
    assert second != first
    await close(tools)
    assert not procs.alive(second)


def test_tools_dropped_without_close_let_the_process_go(fresh_server: Factory, procs: Any) -> None:
    tools = mcp_tools(fresh_server(), include=["pid"])
    pid = asyncio.run(pid_of(tools))
    del tools
    gc.collect()
    assert procs.wait_gone(pid)


async def test_sync_listing_works_inside_a_running_loop(server: MCPServer) -> None:
    tools = mcp_tools(server, include=["add"])  # blocks this loop briefly; the listing runs on the MCP loop
    assert (await call(tools, "add", a=20, b=22)).text == "42"
    await close(tools)


# A server that answers the MCP handshake and then nothing else (a server stuck in its listing).
MUTE_AFTER_HANDSHAKE = """
import json, os, sys
open(sys.argv[1], "w").write(str(os.getpid()))
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "mute", "version": "1"}}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def test_a_server_that_never_lists_its_tools_fails_the_listing(tmp_path: Path, procs: Any) -> None:
    pid_file = tmp_path / "pid"
    mute = MCPServer(
        name="mute", command=sys.executable, args=["-c", MUTE_AFTER_HANDSHAKE, str(pid_file)], startup_timeout=1
    )
    with pytest.raises(MCPServerError, match=r"^MCP server 'mute' did not list its tools within 1 s"):
        mcp_tools(mute)  # blocked forever before
    assert procs.wait_gone(int(pid_file.read_text()))  # released: its process is stopped


async def test_the_async_listing_is_bounded_too(tmp_path: Path) -> None:
    mute = MCPServer(
        name="mute", command=sys.executable, args=["-c", MUTE_AFTER_HANDSHAKE, str(tmp_path / "pid")], startup_timeout=1
    )
    with pytest.raises(MCPServerError, match=r"did not list its tools within 1 s"):
        await asyncio.wait_for(amcp_tools(mute), 60)


def test_copies_are_tools_of_their_own(fresh_server: Factory) -> None:
    """Copies (`tool_limits` makes shallow ones; pickle for TRL and multiprocessing) hold their
    own reference to the server: closing a copy leaves the original's server running."""
    import copy
    import pickle

    tools = mcp_tools(fresh_server(), include=["pid"], timeout=7.0)
    before = asyncio.run(call(tools, "pid")).text
    for copied in (copy.copy(tools[0]), copy.deepcopy(tools[0]), pickle.loads(pickle.dumps(tools[0]))):
        assert (copied.name, copied.mcp_name, copied.limits.timeout) == ("pid", "pid", 7.0)
        assert asyncio.run(call([copied], "pid")).text == before  # the same server process
        asyncio.run(copied.close())
    assert asyncio.run(call(tools, "pid")).text == before
    asyncio.run(close(tools))


def test_an_env_of_mcp_tools_pickles_and_its_copy_steps(fresh_server: Factory) -> None:
    """A whole env pickles (AsyncVectorEnv and multiprocessing send envs so): the env's tool
    caller held each tool's `Args.model_validate`, a bound method of a class built at run time,
    which pickle cannot find by name."""
    import pickle

    import toolenv

    tools = mcp_tools(fresh_server(), include=["add"])
    env = toolenv.ToolEnv(tools=tools, tasks=[{"question": "2+3?", "answer": "5"}])
    copied = pickle.loads(pickle.dumps(env))
    try:
        copied.reset(seed=0)
        obs = copied.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')[0]
        assert "5" in obs, obs
        assert copied.caller.tools["add"] is copied.tools[0]  # one copy of each tool, shared as in the original
    finally:
        copied.close()
        env.close()
