"""The MCP plugin against a hand-written server (`mcp_raw_server.py`, over stdio): paginated
listings, output schemas, spec-valid tool names the OpenAI API refuses; stdio servers
started where `sys.stderr` is no file (a notebook)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

from toolenv import Task, Tool, ToolCall, ToolCaller, ToolContext
from toolenv.checker import check_tool_schema
from toolenv_mcp import MCPServer, mcp_tools
from toolenv_mcp.tool import function_name

RAW_SERVER = Path(__file__).resolve().with_name("mcp_raw_server.py")


def raw_server(
    log: Path, *, scope: str = "process", name: str = "raw", changes: bool = False, junk: bool = False
) -> MCPServer:
    return MCPServer(
        name=name,
        command=sys.executable,
        args=(str(RAW_SERVER),),
        env={
            "RAW_MCP_LOG": str(log),
            **({"RAW_MCP_CHANGES": "1"} if changes else {}),
            **({"RAW_MCP_JUNK": "1"} if junk else {}),
        },
        scope=scope,  # type: ignore[arg-type]
    )


def close_tools(tools: Iterable[Tool]) -> None:
    async def go() -> None:
        for t in tools:
            await t.close()

    asyncio.run(go())


def requests(log: Path) -> list[tuple[int, str, dict[str, object]]]:
    """(pid, method, params) of every request the raw servers received, in order."""
    out = []
    for line in log.read_text(encoding="utf-8").splitlines():
        pid, method, params = line.split(" ", 2)
        out.append((int(pid), method, json.loads(params)))
    return out


def test_an_episodes_session_lists_every_page_once_before_its_first_call(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    tools = {t.name: t for t in mcp_tools(raw_server(log, scope="episode"))}
    b, first = tools["b"], tools["first"]

    async def episode(ctx: ToolContext) -> list[str]:
        texts = []
        for tool in (b, first, b):  # `b` is on the last page and declares an outputSchema
            result = await tool.run(tool.Args.model_validate({}), ctx)
            assert not result.is_error, result.text
            texts.append(result.text)
        for tool in tools.values():
            await tool.release(ctx)
        return texts

    async def main() -> None:
        for n in range(2):
            texts = await episode(ToolContext(Task(), episode_id=f"ep{n}"))
            assert texts == ['{"v": 1}', "first {}", '{"v": 1}']

    try:
        asyncio.run(main())
    finally:
        close_tools(tools.values())
    by_pid: dict[int, list[tuple[str, dict[str, object]]]] = {}
    for pid, method, params in requests(log):
        by_pid.setdefault(pid, []).append((method, params))
    episodes = [reqs for reqs in by_pid.values() if any(m == "tools/call" for m, _ in reqs)]
    assert len(episodes) == 2
    for reqs in episodes:
        methods = [m for m, _ in reqs if m in ("tools/list", "tools/call")]
        # every page listed once, then the calls: no listing after (or for) a call
        assert methods == ["tools/list"] * 3 + ["tools/call"] * 3, methods


def test_tool_names_mcp_allows_become_function_names_the_openai_api_accepts(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    tools = mcp_tools(raw_server(log))
    try:
        assert [t.name for t in tools] == ["first", "files_read", "b"]
        read = next(t for t in tools if t.name == "files_read")
        assert read.mcp_name == "files.read" and read.schema()["function"]["name"] == "files_read"
        for tool in tools:
            check_tool_schema(tool)  # toolenv's checker holds names to the OpenAI API's pattern
        result = asyncio.run(read.run(read.Args.model_validate({"path": "x"}), ToolContext(Task())))
        assert (result.text, result.metadata["mcp_tool"]) == ('files.read {"path": "x"}', "files.read")
        prefixed = mcp_tools(raw_server(log, name="my server"), prefix_server_names=True, include=["files.read"])
        assert [t.name for t in prefixed] == ["my_server__files_read"]
        close_tools(prefixed)
    finally:
        close_tools(tools)
    assert ("tools/call", {"name": "files.read", "arguments": {"path": "x"}}) in [(m, p) for _, m, p in requests(log)]


def test_long_tool_names_are_cut_to_64_characters_and_stay_apart() -> None:
    long_a, long_b = "x" * 100 + ".a", "x" * 100 + ".b"
    names = [function_name(n) for n in (long_a, long_b)]
    assert all(len(n) == 64 and re.fullmatch(r"[A-Za-z0-9_-]+", n) for n in names)
    assert names[0] != names[1]
    assert function_name("ok_name-1") == "ok_name-1"


def test_stdio_servers_start_where_sys_stderr_is_not_a_file(tmp_path: Path) -> None:
    """In a notebook (ipykernel's stream) or under a `StringIO` capturing it, `sys.stderr` has no
    file descriptor for the server to inherit: the servers start, their stderr going to the process's."""
    test_server = RAW_SERVER.with_name("mcp_test_server.py")
    script = textwrap.dedent(
        f"""
        import asyncio, io, sys
        sys.stderr = io.StringIO()
        from toolenv import Task, ToolContext
        from toolenv_mcp import MCPServer, MCPServerError, mcp_tools

        tools = mcp_tools(MCPServer(name="raw", command=sys.executable, args=[{str(RAW_SERVER)!r}]))
        first = tools[0]
        print(asyncio.run(first.run(first.Args.model_validate({{}}), ToolContext(Task()))).text)
        refusing = MCPServer(command=sys.executable, args=[{str(test_server)!r}], env={{"MCP_TEST_REFUSE_IF": "/"}})
        try:
            mcp_tools(refusing)
        except MCPServerError as exc:
            print("refused:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "first {}"
    assert lines[1].startswith("refused: MCP server ") and "could not start" in lines[1]
    assert "fileno" not in done.stdout
    assert "mcp_test_server: refusing to start" in done.stderr  # the server's stderr, on the process's


def test_a_tool_list_changed_notification_makes_the_session_list_again(tmp_path: Path) -> None:
    """A server that changes its tools sends `notifications/tools/list_changed`, after which MCP
    says a client lists them again. Ignored, the session kept checking `b`'s results against
    the output schema it had listed before, and refused every result of the changed `b`."""
    log = tmp_path / "requests.log"
    tools = {t.name: t for t in mcp_tools(raw_server(log, changes=True))}
    ctx = ToolContext(Task(id="t", question="q"), "ep", "c1", 1, {})

    async def call(name: str) -> tuple[bool, str]:
        tool = tools[name]
        result = await tool.run(tool.Args.model_validate({"path": "a.txt"} if name == "files_read" else {}), ctx)
        return result.is_error, result.text

    async def go() -> list[tuple[bool, str]]:
        return [await call(name) for name in ("b", "change", "b", "b", "files_read")]

    try:
        outcomes = asyncio.run(go())
    finally:
        close_tools(tools.values())
    assert outcomes[:4] == [(False, '{"v": 1}'), (False, "changed"), (False, '{"w": "x"}'), (False, '{"w": "x"}')]
    assert outcomes[4][0] and "refused the call to 'files.read'" in outcomes[4][1]  # removed: a clear error
    listings = [m for _, m, p in requests(log) if m == "tools/list" and not p.get("cursor")]
    assert len(listings) == 2  # by mcp_tools (the session it kept), and once after the change, not per call


def test_the_tool_list_changed_notification_is_recognised_as_either_sdk_delivers_it() -> None:
    """mcp 2.x hands `message_handler` the notification itself; mcp 1.x (which the plugin
    supports too) wraps it in `ServerNotification`, a pydantic `RootModel`. Checked only as the
    bare class, the notification was ignored under mcp 1.x: the session never listed again."""
    from mcp import types
    from pydantic import RootModel

    from toolenv_mcp.connection import _tools_changed_notice

    class ServerNotification(RootModel[types.ToolListChangedNotification]):  # mcp 1.x's shape
        pass

    notice = types.ToolListChangedNotification(method="notifications/tools/list_changed")
    assert _tools_changed_notice(notice)
    assert _tools_changed_notice(ServerNotification(notice))
    other = types.ResourceListChangedNotification(method="notifications/resources/list_changed")
    assert not _tools_changed_notice(other) and not _tools_changed_notice(RuntimeError("transport"))


def test_bytes_that_are_not_utf8_on_stdout_do_not_wedge_the_session(tmp_path: Path) -> None:
    """The MCP SDK decodes a stdio server's output strictly: one byte that is not UTF-8 (a
    progress bar, a file's raw bytes in a result) stopped its reader for good, and every call
    after it hung until its timeout (and the session was replaced, losing the server's state).
    Decoded with replacement characters, the junk line is skipped as any non-JSON line is, and a
    result holding such a byte arrives."""
    log = tmp_path / "requests.log"
    tools = {t.name: t for t in mcp_tools(raw_server(log, junk=True), timeout=10)}
    caller = ToolCaller(tools.values())
    ctx = ToolContext(Task(id="t", question="q"), "ep", "c1", 1, {})

    async def go() -> list[tuple[bool, str]]:
        out = []
        for name in ("first", "first", "b"):
            (result,), _ = await caller.invoke([ToolCall(name=name, arguments={}, id="1")], ctx)
            out.append((result.is_error, result.text))
        return out

    try:
        outcomes = asyncio.run(go())
    finally:
        close_tools(tools.values())
    assert outcomes == [(False, "first \ufffd"), (False, "first \ufffd"), (False, '{"v": 1}')]
    pids = {pid for pid, method, _ in requests(log) if method == "tools/call"}
    assert len(pids) == 1  # one server all along: none was replaced
