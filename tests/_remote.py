"""Helpers of the remote-env tests: small real tools and tasks, and real servers on 127.0.0.1.

Importable by `toolenv serve` subprocesses too (with this folder on PYTHONPATH):
`--env-arg 'tools=["_remote:add", "_remote:swatch"]'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
from pydantic import BaseModel

import toolenv
from toolenv.agent import AgentAction, EnvInfo

COLORS = {"red": (220, 40, 40), "blue": (40, 80, 220)}


@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@toolenv.tool(timeout=None)
async def hang(seconds: float) -> str:
    """Wait, as a tool stuck on a dead backend does (no timeout of its own)."""
    await asyncio.sleep(seconds)
    return "woke"


class StuckClose(toolenv.Tool):
    """Echo a word. Its `close` never returns, as a teardown stuck on a dead backend does."""

    name = "echo"

    class Args(BaseModel):
        word: str

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=args.word)

    async def close(self) -> None:
        await asyncio.Event().wait()


def _wait_for_ever() -> None:
    threading.Event().wait()


class HeldUntilClosed(toolenv.Tool):
    """Wait until the tool is closed, swallowing every cancellation, as a call blocked on a
    subprocess's pipe does (only killing the process, in `close`, ends it). Counts its closes."""

    name = "wait"
    limits = toolenv.ToolLimits(timeout=None)

    class Args(BaseModel):
        pass

    CALL = '<tool_call>{"name": "wait", "arguments": {}}</tool_call>'

    def __init__(self) -> None:
        super().__init__()
        self.closes = 0
        self.started, self.cancelled = threading.Event(), threading.Event()
        self._closed: asyncio.Event | None = None

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        closed = self._closed = self._closed or asyncio.Event()
        self.started.set()
        while not closed.is_set():
            try:
                await closed.wait()
            except asyncio.CancelledError:
                self.cancelled.set()  # and waits on
        return toolenv.ToolResult(text="closed")

    async def close(self) -> None:
        self.closes += 1
        if self._closed is not None:
            self._closed.set()


class Counted(toolenv.Tool):
    """Echo a word, counting the closes."""

    name = "count"

    class Args(BaseModel):
        word: str

    def __init__(self) -> None:
        super().__init__()
        self.closes = 0

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=args.word)

    async def close(self) -> None:
        self.closes += 1


class StuckRelease(toolenv.Tool):
    """Echo a word. Its `release` (at an episode's end) never returns, as a cleanup stuck on a dead backend."""

    name = "stuck_release"

    class Args(BaseModel):
        word: str

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=args.word)

    async def release(self, ctx: toolenv.ToolContext) -> None:
        await asyncio.Event().wait()


class StuckThreadClose(StuckClose):
    """Echo a word. Its `close` runs a sync teardown in a thread (`asyncio.to_thread`) that never
    returns, as a client library's blocking `close()` on a dead backend does; unlike a coroutine,
    the thread cannot be cancelled."""

    async def close(self) -> None:
        await asyncio.to_thread(_wait_for_ever)


_NEVER = threading.Event()


@toolenv.tool(timeout=0.2)
def stuck_sync(word: str) -> str:
    """Echo a word, never: a sync call stuck in its thread past its timeout (a thread cannot be stopped)."""
    _NEVER.wait()
    return word


@toolenv.tool
def swatch(color: str) -> toolenv.ToolResult:
    """Show a colour swatch (an image)."""
    from PIL import Image

    rgb = COLORS.get(color)
    if rgb is None:
        return toolenv.ToolResult.error(f"unknown colour {color!r}")
    return toolenv.ToolResult(
        text=f"a {color} swatch", images=[toolenv.ToolImage.from_pil(Image.new("RGB", (8, 6), rgb))]
    )


TASKS: list[dict[str, Any]] = [
    {"id": "t1", "question": "2+3?", "answer": "5", "context": {"call": ["add", {"a": 2, "b": 3}]}},
    {"id": "t2", "question": "10+4?", "answer": "14", "context": {"call": ["add", {"a": 10, "b": 4}]}},
    {
        "id": "t3",
        "question": "Show blue; what colour?",
        "answer": "blue",
        "context": {"call": ["swatch", {"color": "blue"}]},
    },
    {"id": "t4", "question": "Capital of France?", "answer": ["Paris", "paris, france"]},
]

CALL_ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
CALL_SWATCH = '<tool_call>{"name": "swatch", "arguments": {"color": "blue"}}</tool_call>'


def make_env(**overrides: Any) -> Any:
    """`toolenv/ToolEnv-v0` with `add` and `swatch`, exact match, 4 turns (a `gym.make` result)."""
    kwargs: dict[str, Any] = {
        "tools": [add, swatch],
        "tasks": TASKS,
        "reward": "exact_match",
        "max_turns": 4,
        "task_order": "sequential",
    }
    kwargs.update(overrides)
    return gym.make("toolenv/ToolEnv-v0", **kwargs)


class Scripted(toolenv.Agent):
    """Calls the tool named in the task's context, then answers with the gold answer."""

    name = "scripted"

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        task = env_info.task
        if env_info.turn == 0 and "call" in task.context:
            name, args = task.context["call"]
            text = env_info.parser.format_call(name, args) if env_info.parser else None
            return AgentAction(text=text or json.dumps({"name": name, "arguments": args}))
        return AgentAction(text=f"<answer>{task.answers[0] if task.answers else ''}</answer>")


@contextlib.contextmanager
def serving(
    factory: Callable[[], Any] = make_env, *, graceful_timeout: float | None = None, port: int = 0, **options: Any
) -> Iterator[str]:
    """A real uvicorn server of `create_app(factory, **options)` in a thread; yields its URL.
    `graceful_timeout`: seconds its stop waits for requests in flight (`toolenv serve --graceful-timeout`);
    `port`: the port to listen on (0: any free one)."""
    from toolenv.remote.server import create_app

    with asgi_server(create_app(factory, **options), graceful_timeout=graceful_timeout, port=port) as url:
        yield url


def older_server(app: Any, *, features: bytes | None, bodies: list[bytes] | None = None, deaf: bool = False) -> Any:
    """`app` (an ASGI app) as a server of an older toolenv: its `Toolenv-Features` answer header
    is `features` (None: no header at all); with `deaf`, it never hears the client's own header;
    each request body is kept in `bodies`."""
    from toolenv.remote.wire import FEATURES_HEADER

    name = FEATURES_HEADER.lower().encode()

    def without(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return [h for h in headers if h[0].lower() != name]

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def hear() -> Any:
            message = await receive()
            if bodies is not None and message["type"] == "http.request" and message.get("body"):
                bodies.append(message["body"])
            return message

        async def say(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = without(message["headers"]) + ([] if features is None else [(name, features)])
                message = {**message, "headers": headers}
            await send(message)

        await app({**scope, "headers": without(scope["headers"])} if deaf else scope, hear, say)

    return asgi


@contextlib.contextmanager
def asgi_server(app: Any, *, graceful_timeout: float | None = None, port: int = 0) -> Iterator[str]:
    """Any ASGI app served by uvicorn on 127.0.0.1 (on `port`, 0: any free one) in a thread; yields its URL."""
    import uvicorn

    from toolenv.commands.serve_cmd import bind_socket

    sock = bind_socket("127.0.0.1", port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", log_config=None, timeout_graceful_shutdown=graceful_timeout)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
