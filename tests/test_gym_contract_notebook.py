"""Sync `reset`/`step` inside a running event loop (a Jupyter or Colab cell), for the single and
the vector env, with tools bound to an event loop: a real HTTP tool on 127.0.0.1 and the code sandbox."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import gymnasium as gym
import httpx
import pytest
from pydantic import BaseModel

import toolenv
from toolenv.vector import ToolVectorEnv

from .conftest import TASKS, Add

ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def test_sync_reset_and_step_work_inside_a_running_loop() -> None:
    async def cell() -> tuple[str, float, bool]:
        env = gym.make("toolenv/ToolEnv-v0", tools=[Add()], tasks=TASKS)
        try:
            env.reset(options={"task_id": "t1"})
            obs, *_ = env.step(ADD)
            _, reward, terminated, _, _ = env.step("<answer>5</answer>")
            return obs, float(reward), terminated
        finally:
            env.close()

    obs, reward, terminated = asyncio.run(cell())
    assert "5" in obs and reward == 1.0 and terminated


def test_vector_sync_reset_and_step_work_inside_a_running_loop() -> None:
    async def cell() -> list[float]:
        venv = ToolVectorEnv([lambda: toolenv.ToolEnv(tools=[Add()], tasks=TASKS[:1]) for _ in range(2)])
        try:
            venv.reset(seed=0)
            venv.step([ADD, ADD])
            _, rewards, *_ = venv.step(["<answer>5</answer>", "<answer>4</answer>"])
            return rewards.tolist()
        finally:
            venv.close()

    assert asyncio.run(cell()) == [1.0, 0.0]


# ---------------------------------------------------------------- a real HTTP tool on 127.0.0.1
@pytest.fixture
def echo_server() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that answers `/echo?x=...` with `x` reversed."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = self.path.rsplit("=", 1)[-1][::-1].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Echo(toolenv.Tool):
    """Reverse a word over HTTP, with one pooled client per event loop (as the search plugin's backend)."""

    name = "echo"

    class Args(BaseModel):
        x: str

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        client = self.clients.get(loop)
        if client is None:
            client = self.clients[loop] = httpx.AsyncClient(base_url=self.url)
        response = await client.get("/echo", params={"x": args.x})
        return toolenv.ToolResult(text=response.text)


def _echo(word: str) -> str:
    return "<tool_call>" + json.dumps({"name": "echo", "arguments": {"x": word}}) + "</tool_call>"


def test_http_tool_mixing_sync_and_async_steps_inside_a_running_loop(echo_server: str) -> None:
    tool = Echo(echo_server)

    async def cell() -> list[str]:
        env = toolenv.ToolEnv(tools=[tool], tasks=TASKS, max_turns=8)
        try:
            env.reset(options={"task_id": "t1"})
            seen = [env.step(_echo("abc"))[0]]  # the private loop, on a helper thread
            seen.append((await env.astep(_echo("def")))[0])  # this cell's loop
            seen.append(env.step(_echo("ghi"))[0])  # the private loop again: its pooled client still works
            return seen
        finally:
            env.close()

    seen = asyncio.run(cell())
    assert ["cba" in seen[0], "fed" in seen[1], "ihg" in seen[2]] == [True, True, True], seen
    assert len(tool.clients) == 2  # one client per loop: the private one kept between the sync steps


# ---------------------------------------------------------------- the code sandbox
def _python(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_code_sandbox_session_survives_sync_and_async_steps_inside_a_running_loop() -> None:
    pytest.importorskip("toolenv_code")

    async def cell() -> list[str]:
        env = gym.make("toolenv/MBPP-v0", parser="hermes", stateful=True, limit=3, max_turns=8)
        try:
            env.reset(seed=0)
            seen = [env.step(_python("x = 41"))[0]]
            seen.append((await env.unwrapped.astep(_python("x += 1; print(x)")))[0])
            seen.append(env.step(_python("print(x * 2)"))[0])
            return seen
        finally:
            env.close()

    seen = asyncio.run(cell())
    assert "42" in seen[1] and "84" in seen[2], seen
