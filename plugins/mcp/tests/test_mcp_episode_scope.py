"""`scope="episode"`: each episode calls a server of its own (a process, or an HTTP session), closed when it ends."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolEnv, ToolVectorEnv
from toolenv_mcp import MCPServer, MCPTool, connection, mcp_tools
from toolenv_mcp.env import make_mcp_env

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process checks")

TASKS = [{"id": "t", "question": "What do you remember?", "answer": "x"}]
STATEFUL = ["remember", "recall", "pid", "die"]
Factory = Callable[..., MCPServer]


def episodic(server: MCPServer) -> MCPServer:
    """The same server with `scope="episode"`."""
    return MCPServer.model_validate({**server.model_dump(), "scope": "episode"})


def tool_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def text(obs: str) -> str:
    """The text of a one-result observation."""
    return obs.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")


def ask(env: ToolEnv, name: str, **arguments: Any) -> str:
    """One tool call in the env's episode; the result's text."""
    return text(env.step(tool_call(name, **arguments))[0])


def held(server: MCPServer) -> list[str]:
    """The episodes holding a connection to `server` in the registry."""
    return [episode for key, episode in connection._episodes if key == server.key]


def test_state_stays_within_an_episode_and_never_crosses_to_the_next(fresh_server: Factory, procs: Any) -> None:
    srv = episodic(fresh_server())
    env = ToolEnv(tools=mcp_tools(srv, include=STATEFUL), tasks=TASKS, max_turns=10)
    env.reset(seed=0)
    assert ask(env, "remember", value="a") == "ok" and ask(env, "remember", value="b") == "ok"
    assert json.loads(ask(env, "recall")) == ["a", "b"]
    first = int(ask(env, "pid"))
    assert int(ask(env, "pid")) == first and procs.alive(first)  # later calls reuse the episode's server
    assert env.step("<answer>x</answer>")[2]  # terminated: the episode's end stopped its server
    assert not procs.alive(first) and held(srv) == []

    env.reset(seed=0)
    assert json.loads(ask(env, "recall")) == []
    second = int(ask(env, "pid"))
    assert second != first
    env.close()
    assert not procs.alive(second) and held(srv) == []


def test_process_scope_keeps_one_server_for_every_episode(fresh_server: Factory, procs: Any) -> None:
    srv = fresh_server()
    assert srv.scope == "process"
    env = ToolEnv(tools=mcp_tools(srv, include=STATEFUL), tasks=TASKS, max_turns=10)
    env.reset(seed=0)
    ask(env, "remember", value="a")
    first = int(ask(env, "pid"))
    env.reset(seed=0)
    assert json.loads(ask(env, "recall")) == ["a"]  # state shared across episodes, as before
    assert int(ask(env, "pid")) == first and procs.alive(first)
    env.close()
    assert not procs.alive(first)


def test_concurrent_episodes_each_have_their_own_server(fresh_server: Factory, procs: Any) -> None:
    srv = episodic(fresh_server())
    vec = ToolVectorEnv([lambda: ToolEnv(tools=mcp_tools(srv, include=STATEFUL), tasks=TASKS) for _ in range(3)])
    vec.reset(seed=0)
    vec.step(tuple(tool_call("remember", value=f"env{i}") for i in range(3)))
    obs, *_ = vec.step((tool_call("recall"),) * 3)
    assert [json.loads(text(o)) for o in obs] == [["env0"], ["env1"], ["env2"]]
    obs, *_ = vec.step((tool_call("pid"),) * 3)
    pids = [int(text(o)) for o in obs]
    assert len(set(pids)) == 3 and all(procs.alive(p) for p in pids)
    vec.close()  # mid-episode: every episode's server goes
    assert not any(procs.alive(p) for p in pids) and held(srv) == []


def test_an_abandoned_episode_stops_its_server(fresh_server: Factory, procs: Any) -> None:
    srv = episodic(fresh_server())
    env = ToolEnv(tools=mcp_tools(srv, include=STATEFUL), tasks=TASKS, max_turns=10)
    env.reset(seed=0)
    first = int(ask(env, "pid"))
    env.reset(seed=0)  # abandons the unfinished episode
    assert not procs.alive(first)
    second = int(ask(env, "pid"))
    assert second != first
    env.close()
    assert not procs.alive(second)


def test_the_episodes_server_dying_mid_call_is_replaced_without_its_state(fresh_server: Factory, procs: Any) -> None:
    srv = episodic(fresh_server())
    env = ToolEnv(tools=mcp_tools(srv, include=STATEFUL), tasks=TASKS, max_turns=10)
    env.reset(seed=0)
    ask(env, "remember", value="a")
    first = int(ask(env, "pid"))
    obs, _, _, _, info = env.step(tool_call("die"))
    result = info["tool_results"][0]
    assert result.is_error and result.retryable
    assert text(obs) == (
        "MCP server 'calc' closed the connection during the call to 'die' (did it crash?); "
        "the next call of this episode starts a new one, without the episode's state so far"
    )
    assert json.loads(ask(env, "recall")) == []
    second = int(ask(env, "pid"))
    assert second != first and procs.wait_gone(first)
    env.close()
    assert not procs.alive(second)


def test_the_episodes_server_killed_between_calls_is_reported_then_replaced(fresh_server: Factory, procs: Any) -> None:
    srv = episodic(fresh_server())
    env = ToolEnv(tools=mcp_tools(srv, include=STATEFUL), tasks=TASKS, max_turns=10)
    env.reset(seed=0)
    ask(env, "remember", value="a")
    first = int(ask(env, "pid"))
    assert env.episode is not None
    conn = connection._episodes[srv.key, env.episode.episode_id].conn
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not conn._lost:  # the connection notices the end of the server's output by itself
        assert time.monotonic() < deadline
        time.sleep(0.01)
    obs, _, _, _, info = env.step(tool_call("recall"))
    assert info["tool_results"][0].is_error and info["tool_results"][0].retryable
    assert text(obs) == (
        "MCP server 'calc' of this episode closed the connection between calls, so this call was not sent "
        "(did it crash?); the next call of this episode starts a new one, without the episode's state so far"
    )
    assert json.loads(ask(env, "recall")) == []
    second = int(ask(env, "pid"))
    assert second != first
    env.close()
    assert not procs.alive(second)


def test_a_server_that_cannot_start_for_an_episode_is_an_error_naming_it(
    fresh_server: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "refuse"
    srv = episodic(fresh_server("notes", MCP_TEST_REFUSE_IF=str(marker)))
    env = ToolEnv(tools=mcp_tools(srv, include=STATEFUL), tasks=TASKS, max_turns=10)  # listed while it starts
    marker.touch()
    env.reset(seed=0)
    obs, _, _, _, info = env.step(tool_call("pid"))
    assert info["tool_results"][0].is_error and info["tool_results"][0].retryable
    assert text(obs).startswith("MCP server 'notes' could not start: ")
    monkeypatch.setattr(connection, "RESTART_COOLDOWN", 0.0)
    marker.unlink()
    assert int(ask(env, "pid")) > 0
    env.close()
    assert held(srv) == []


async def test_tools_called_without_an_env_release_and_close_their_episodes(fresh_server: Factory, procs: Any) -> None:
    srv = episodic(fresh_server())
    tools = await asyncio.to_thread(mcp_tools, srv, include=STATEFUL)
    caller = ToolCaller(tools)
    a, b = ToolContext(Task(), episode_id="a"), ToolContext(Task(), episode_id="b")

    async def pid(ctx: ToolContext) -> int:
        [result], _ = await caller.invoke([ToolCall(name="pid", arguments={})], ctx)
        return int(result.text)

    pid_a, pid_b = await pid(a), await pid(b)
    assert pid_a != pid_b and await pid(a) == pid_a
    await caller.release(a)  # as the env does at the end of episode "a"
    assert not procs.alive(pid_a) and procs.alive(pid_b)
    await caller.aclose()  # "b" never ended: closing the tools stops its server
    assert not procs.alive(pid_b) and held(srv) == []


def test_tools_dropped_without_close_let_their_episodes_servers_go(fresh_server: Factory, procs: Any) -> None:
    srv = episodic(fresh_server())
    tools: list[MCPTool] = mcp_tools(srv, include=["pid"])

    async def pid(caller: ToolCaller) -> int:
        [result], _ = await caller.invoke([ToolCall(name="pid", arguments={})], ToolContext(Task()))
        return int(result.text)

    found = asyncio.run(pid(ToolCaller(tools)))
    del tools
    gc.collect()
    assert procs.wait_gone(found) and held(srv) == []


def test_episodes_over_http_get_sessions_of_their_own(http_url: str) -> None:
    """Over HTTP an episode gets a fresh MCP session; isolation holds because the server keeps per-session state."""
    shared = MCPServer(name="web", url=http_url)
    for scope, second_episode_sees in (("episode", []), ("process", ["x"])):
        srv = shared.model_copy(update={"scope": scope})
        env = ToolEnv(tools=mcp_tools(srv, include=["remember", "recall"]), tasks=TASKS, max_turns=10)
        env.reset(seed=0)
        ask(env, "remember", value="x")
        assert json.loads(ask(env, "recall")) == ["x"]
        env.reset(seed=0)
        assert json.loads(ask(env, "recall")) == second_episode_sees, scope
        env.close()


def test_gym_make_reads_the_scope_from_the_config(tmp_path: Path, fresh_server: Factory, procs: Any) -> None:
    srv = fresh_server()
    config = tmp_path / "mcp.json"
    entry = {"command": srv.command, "args": list(srv.args), "env": srv.env, "scope": "episode"}
    config.write_text(json.dumps({"mcpServers": {"notes": entry}}))
    vec = gym.make_vec("toolenv/MCP-v0", num_envs=2, servers=str(config), tasks=TASKS, include=["pid"])
    vec.reset(seed=0)
    obs, *_ = vec.step((tool_call("pid"),) * 2)
    pids = {int(text(o)) for o in obs}
    assert len(pids) == 2
    vec.close()
    assert not any(procs.alive(p) for p in pids)


def test_the_demo_stays_process_scoped() -> None:
    env = make_mcp_env()
    try:
        assert all(isinstance(t, MCPTool) and t.server.scope == "process" for t in env.tools)
    finally:
        env.close()


def _found_expired(server: MCPServer, within: float = 30.0) -> bool:
    """Whether an episode connection to `server` has heard a 404 for its session (within `within` s)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if any(e.conn._expired for key, e in list(connection._episodes.items()) if key[0] == server.key):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("noticed", [False, True], ids=["at-once", "after-the-sdks-get-stream-found-it"])
def test_an_episodes_http_session_the_server_forgot_is_reported_then_replaced(
    restartable_http: Any, noticed: bool
) -> None:
    """The 404 comes either to the call, or first to the SDK's GET stream reconnecting (a second
    after it broke) while the episode is idle: the model hears the same thing either way."""
    srv = MCPServer(name="web", url=restartable_http.url, scope="episode")
    env = ToolEnv(tools=mcp_tools(srv, include=["remember", "recall"]), tasks=TASKS, max_turns=10)
    try:
        env.reset(seed=0)
        assert ask(env, "remember", value="a") == "ok"
        restartable_http.restart(quick=noticed)  # the episode's session is gone with the old process
        if noticed:  # the SDK's GET stream reconnects a second after it broke, to the new server
            assert _found_expired(srv)
        obs, _, _, _, info = env.step(tool_call("recall"))
        result = info["tool_results"][0]
        assert result.is_error and result.retryable
        assert text(obs) == (
            "MCP server 'web' no longer knows the session (HTTP 404: did it restart?), so the call to 'recall' "
            "was not run; the next call of this episode starts a new session, without the episode's state so far"
        )
        assert json.loads(ask(env, "recall")) == []
        assert ask(env, "remember", value="b") == "ok" and json.loads(ask(env, "recall")) == ["b"]
    finally:
        env.close()


def test_an_episodes_http_session_survives_a_server_error_with_code_32000(http_url: str) -> None:
    """Over HTTP the MCP SDK gives -32000 to a call whose response stream broke, and servers
    use it for their own errors; one such refusal threw the episode's session (its state) away."""
    srv = MCPServer(name="web", url=http_url, scope="episode")
    env = ToolEnv(tools=mcp_tools(srv, include=["remember", "recall", "refuse"]), tasks=TASKS, max_turns=10)
    try:
        env.reset(seed=0)
        assert ask(env, "remember", value="kept") == "ok"
        refused = ask(env, "refuse", code=-32000, message="not now")
        assert "not now" in refused and "closed the connection" not in refused
        assert json.loads(ask(env, "recall")) == ["kept"]
    finally:
        env.close()


def test_envs_given_one_tool_list_and_tool_limits_keep_their_episodes(fresh_server: Factory, procs: Any) -> None:
    """`tool_limits` gives each env copies of the tools: closing one env must not stop the
    episode servers of another (the copies shared one holder of episode connections)."""
    srv = episodic(fresh_server())
    tools = mcp_tools(srv, include=STATEFUL)
    limits = {"*": {"timeout": 20.0}}
    first = ToolEnv(tools=tools, tasks=TASKS, max_turns=10, tool_limits=limits)
    second = ToolEnv(tools=tools, tasks=TASKS, max_turns=10, tool_limits=limits)
    try:
        second.reset(seed=0)
        assert ask(second, "remember", value="kept") == "ok"
        pid = int(ask(second, "pid"))
        first.reset(seed=0)
        assert ask(first, "remember", value="other") == "ok"
        first.close()
        assert procs.alive(pid)
        assert json.loads(ask(second, "recall")) == ["kept"]
        assert int(ask(second, "pid")) == pid
    finally:
        first.close()
        second.close()
        asyncio.run(_close_all(tools))
    assert not procs.alive(pid) and held(srv) == []


async def _close_all(tools: list[MCPTool]) -> None:
    for t in tools:
        await t.close()
