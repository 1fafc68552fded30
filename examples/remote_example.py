"""An env served over HTTP and stepped from a client: `toolenv serve` and `RemoteToolEnv` in one script.

Run it:  python examples/remote_example.py   (needs: pip install 'toolenv[serve]')

The server runs in a thread on a free port of 127.0.0.1; in real use it is its own process,
usually on another machine (the tools' machine):

    toolenv serve toolenv/Spider-v0 --host 0.0.0.0 --port 8000      # on the CPU machine
    env = gym.make("toolenv/Remote-v0", url="http://cpu-host:8000")  # on the GPU machine
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

import toolenv
from toolenv.remote.server import create_app


@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def make_env() -> toolenv.ToolEnv:
    """The served env: built once per client session, on the server."""
    return toolenv.ToolEnv(tools=[add], tasks=[{"id": "sum", "question": "2+3?", "answer": "5"}], max_turns=4)


@contextlib.contextmanager
def serving() -> Iterator[str]:
    """The server on a free loopback port, in a thread; yields its URL."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(make_env), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True  # closes every session left, then stops
        thread.join()


def main() -> None:
    with serving() as url:
        env = toolenv.RemoteToolEnv(url)  # or gym.make("toolenv/Remote-v0", url=url)
        print(f"server {url}: parser={env.parser.name} tools={[s['function']['name'] for s in env.tool_schemas()]}")
        obs, info = env.reset(seed=0)
        print(obs)
        for action in ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "<answer>5</answer>"]:
            obs, reward, terminated, truncated, info = env.step(action)
            print(f"> {action}\n{obs}")
        assert env.episode is not None  # mirrored from the server's replies, as a local env's would be
        print(f"reward={reward} terminated={terminated} turns={len(env.episode.turns)} episode={info['episode_stats']}")
        env.close()  # deletes the session: the server closes that env's tools


if __name__ == "__main__":
    main()
