"""Search environments with toolenv-search: one tool, swappable backends.

1. `gym.make("toolenv/HotpotQA-v0")` runs on the bundled BM25 index (no network).
2. The same env talks to a retrieval server (the Search-R1 API) by swapping the
   backend; here the server is started in-process on 127.0.0.1, the way
   `toolenv serve-search` runs it for many rollout workers.

Run: python examples/search_example.py
"""

from __future__ import annotations

import socket
import threading
import time

import gymnasium as gym
import uvicorn

import toolenv
from toolenv_search import BM25Backend, create_app, hotpotqa_oracle, make_hotpotqa_env


def run_oracle(env: toolenv.ToolEnv, n: int) -> float:
    """Play the scripted oracle on the first n tasks; return the mean reward."""
    total = 0.0
    for task in env.tasks[:n]:
        obs, _ = env.reset(options={"task_id": task.id})
        turn, done = 0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(hotpotqa_oracle(task, turn, obs))
            done, turn = terminated or truncated, turn + 1
            if turn == 1:
                print(f"  search -> {obs[:100]}...")
        total += float(reward)
    return total / n


def main() -> None:
    env = gym.make("toolenv/HotpotQA-v0")
    obs, _ = env.reset(seed=0)
    print("prompt:", obs[-120:].strip())
    print("bm25 oracle reward:", run_oracle(env.unwrapped, 3))

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(BM25Backend()), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    remote = make_hotpotqa_env(backend="http", backend_options={"url": f"http://127.0.0.1:{port}"})
    print("http oracle reward:", run_oracle(remote, 3))
    remote.close()
    server.should_exit = True


if __name__ == "__main__":
    main()
