"""The `openai` agent's limits against real HTTP servers on 127.0.0.1: `timeout` bounds a whole
attempt, `stream` is refused, a 429 storm says what to lower, `rate_limit` spaces requests across
episodes, and each turn's metadata splits its latency into queue, backoff and request time."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from _tools import Add

import toolenv
from toolenv.runner import arollout
from toolenv_agents.openai_compat import OpenAIAgent

ANSWER = json.dumps(
    {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "<answer>5</answer>"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    }
).encode()

#: A reply plan: (status, body, seconds before each body piece, pieces) for the request numbered n (from 0).
Plan = Callable[[int], tuple[int, bytes, float, int]]


class Server:
    """Answers each POST by `plan(n)`, headers at once and the body in pieces; records arrival times."""

    def __init__(self, plan: Plan) -> None:
        self.arrivals: list[float] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    n = len(outer.arrivals)
                    outer.arrivals.append(time.monotonic())
                status, body, gap, pieces = plan(n)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                step = len(body) // pieces + 1
                try:
                    for i in range(0, len(body), step):
                        time.sleep(gap)
                        self.wfile.write(body[i : i + step])
                        self.wfile.flush()
                except OSError:  # the client gave up on the reply
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Plan], Server]]:
    servers: list[Server] = []

    def start(plan: Plan) -> Server:
        servers.append(Server(plan))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def make_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Add()], tasks=[{"id": "t1", "question": "2+3?", "answer": "5"}], parser="hermes")


def tasks(n: int) -> list[dict[str, str]]:
    return [{"id": f"t{i}", "question": "2+3?", "answer": "5"} for i in range(n)]


async def test_timeout_bounds_a_reply_that_trickles_in(serve: Callable[[Plan], Server]) -> None:
    """Headers at once, then the body in 8 pieces 0.7 s apart (5.6 s): each read is quick, the
    attempt is not. httpx's timeout limits each read; `timeout` must limit the attempt."""
    server = serve(lambda n: (200, ANSWER, 0.7, 8))
    agent = OpenAIAgent(model="m", base_url=server.url, timeout=1, max_retries=1, backoff=0.01)
    start = time.monotonic()
    res = await arollout(make_env, agent, n=1)
    took = time.monotonic() - start
    err = res.trajectories[0].error or ""
    assert took < 2 * 2, f"two attempts of timeout=1 took {took:.1f} s"  # loosely: 2 s, not 5.6
    assert len(server.arrivals) == 2, "a timed-out attempt is retried as timeouts are"
    assert "failed after 2 attempt(s)" in err
    assert "did not answer within 1 s" in err and "timeout=1" in err and "--agent-arg timeout=N" in err, err


async def test_a_trickle_within_the_timeout_succeeds(serve: Callable[[Plan], Server]) -> None:
    server = serve(lambda n: (200, ANSWER, 0.1, 4))
    agent = OpenAIAgent(model="m", base_url=server.url, timeout=5, max_retries=0)
    res = await arollout(make_env, agent, n=1)
    assert res.trajectories[0].error is None and res.trajectories[0].reward == 1.0


def test_stream_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"stream.*one JSON reply"):
        OpenAIAgent(model="m", base_url="http://127.0.0.1:9/v1", extra_body={"stream": True})
    OpenAIAgent(model="m", base_url="http://127.0.0.1:9/v1", extra_body={"stream": False})  # what it does anyway


async def test_429_storm_says_to_lower_the_load(serve: Callable[[Plan], Server]) -> None:
    server = serve(lambda n: (429, b'{"error": "rate limited"}', 0.0, 1))
    agent = OpenAIAgent(model="m", base_url=server.url, max_retries=2, backoff=0.01)
    res = await arollout(make_env, agent, n=1)
    err = res.trajectories[0].error or ""
    assert "failed after 3 attempt(s)" in err and "HTTP 429" in err
    assert "--agent-arg max_concurrency=N" in err and "now 32" in err and "rate_limit" in err, err


async def test_503_storm_does_not_blame_the_load(serve: Callable[[Plan], Server]) -> None:
    server = serve(lambda n: (503, b'{"error": "down"}', 0.0, 1))
    agent = OpenAIAgent(model="m", base_url=server.url, max_retries=1, backoff=0.01)
    res = await arollout(make_env, agent, n=1)
    err = res.trajectories[0].error or ""
    assert "HTTP 503" in err and "max_concurrency" not in err


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True])
def test_rate_limit_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="rate_limit"):
        OpenAIAgent(model="m", base_url="http://127.0.0.1:9/v1", rate_limit=bad)


async def test_rate_limit_spaces_requests_across_episodes(serve: Callable[[Plan], Server]) -> None:
    """12 episodes at once, `rate_limit=5`: the server never sees more than 5 requests a second."""
    server = serve(lambda n: (200, ANSWER, 0.0, 1))
    agent = OpenAIAgent(model="m", base_url=server.url, rate_limit=5, max_concurrency=12)
    res = await arollout(lambda: make_env(), agent, tasks=tasks(12), concurrency=12)
    assert res.summary.success_rate == 1.0
    times = sorted(server.arrivals)
    assert len(times) == 12
    busiest = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert busiest <= 6, f"{busiest} requests within one second at rate_limit=5"  # 5, plus timing slack
    assert times[-1] - times[0] >= 11 * 0.2 * 0.8  # 12 requests at 5/s span 2.2 s


async def test_latency_metadata_splits_queue_backoff_and_request(serve: Callable[[Plan], Server]) -> None:
    """One slot, three episodes, 0.4 s a reply: the later ones wait for the slot (`queue_s`), which
    the server's time (`request_s`) does not include."""
    server = serve(lambda n: (200, ANSWER, 0.4, 1))
    agent = OpenAIAgent(model="m", base_url=server.url, max_concurrency=1)
    res = await arollout(lambda: make_env(), agent, tasks=tasks(3), concurrency=3)
    turns = [t.turns[0] for t in res.trajectories]
    meta = [t.agent_metadata for t in turns]
    assert max(m["queue_s"] for m in meta) >= 0.6  # the third waited for two replies
    for turn, m in zip(turns, meta, strict=True):
        assert 0.35 <= m["request_s"] < 0.8 and m["backoff_s"] == 0
        assert m["queue_s"] + m["request_s"] <= turn.agent_latency_s + 0.05


async def test_latency_metadata_counts_backoff(serve: Callable[[Plan], Server]) -> None:
    server = serve(lambda n: (503, b'{"error": "busy"}', 0.0, 1) if n == 0 else (200, ANSWER, 0.0, 1))
    agent = OpenAIAgent(model="m", base_url=server.url, max_retries=1, backoff=0.4)
    res = await arollout(make_env, agent, n=1)
    turn = res.trajectories[0].turns[0]
    m = turn.agent_metadata
    assert m["attempts"] == 2 and 0.19 <= m["backoff_s"] <= 0.45  # 0.4 s with jitter (x0.5..1)
    assert m["request_s"] < 0.3 and m["backoff_s"] + m["request_s"] <= turn.agent_latency_s + 0.05
