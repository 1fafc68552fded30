"""A whole rollout while the model server, the judge and the retriever all misbehave.

One HTTP server on 127.0.0.1 plays the policy model (OpenAI chat completions), an LLM judge
and a Search-R1 retriever. Each role answers on a fixed cycle of faults: HTTP 500, HTTP 429,
a body that is not JSON, JSON of the wrong shape, and a connection closed without a reply,
between good answers. `toolenv.rollout` runs episodes through the OpenAI agent, a search
tool over HTTP and a judge reward against it. The run must finish with every episode
written (as a result or as an error), every file line readable, the retriever's failures
shown to the model as error observations, and a resumed run with `retry_errors` against a
healthy server must keep every line the first run wrote for a finished episode, byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import toolenv
from toolenv.trajectory import read_trajectories

pytest.importorskip("toolenv_search", reason="the retriever is toolenv-search's HTTP backend")
pytest.importorskip("toolenv_agents", reason="the policy is toolenv-agents' OpenAI agent")

from toolenv_agents.openai_compat import OpenAIAgent
from toolenv_search.http_backend import HTTPBackend
from toolenv_search.tool import SearchTool

#: What each role answers, request after request (one cycle per role, so every fault recurs).
CYCLE = ["ok", "500", "ok", "429", "ok", "garbage", "ok", "close", "ok", "badshape", "ok", "ok"]
FAULTS = {"500", "429", "garbage", "close", "badshape"}
EPISODES = 48

SEARCH_CALL = '<tool_call>{"name": "search", "arguments": {"query": "capital of France"}}</tool_call>'
RETRIEVED = {"result": [[{"document": {"id": "d1", "contents": '"Paris"\nParis is the capital of France.'}}]]}


def _completion(text: str) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
    }


class FaultyServer:
    """Counts requests per role and what each was answered with; `healthy` turns faults off."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.answered: Counter[tuple[str, str]] = Counter()
        self.healthy = False
        self.url = ""

    def mode(self, role: str) -> str:
        with self.lock:
            n = self.requests[role]
            self.requests[role] += 1
            mode = "ok" if self.healthy else CYCLE[n % len(CYCLE)]
            self.answered[role, mode] += 1
            return mode

    def faults(self, role: str) -> int:
        return sum(n for (r, mode), n in self.answered.items() if r == role and mode in FAULTS)


def _good_reply(role: str, body: dict[str, Any]) -> dict[str, Any]:
    if role == "retriever":
        return RETRIEVED
    if role == "judge":
        return _completion("yes")
    seen = json.dumps(body.get("messages", []))
    # The policy: search first; answer once a search result (or an error) came back.
    return _completion("<answer>Paris</answer>" if "tool_response" in seen else SEARCH_CALL)


@contextlib.contextmanager
def faulty_server() -> Iterator[FaultyServer]:
    state = FaultyServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path.endswith("/retrieve"):
                role = "retriever"
            else:
                role = "judge" if body.get("model") == "judge" else "policy"
            mode = state.mode(role)
            if mode == "close":  # drop the connection without a reply
                self.close_connection = True
                return
            status, headers, payload = 200, {"Content-Type": "application/json"}, b""
            if mode == "500":
                status, payload = 500, b'{"error": "internal error"}'
            elif mode == "429":
                status, payload = 429, b'{"error": "slow down"}'
                headers["Retry-After"] = "0"
            elif mode == "garbage":
                headers["Content-Type"] = "text/html"
                payload = b"<html>\x00\xff not json"
            elif mode == "badshape":
                payload = b'{"choices": 42, "result": [[{"document": 42}]]}'
            else:
                payload = json.dumps(_good_reply(role, body)).encode()
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _env(url: str) -> toolenv.ToolEnv:
    search = SearchTool(HTTPBackend(url, timeout=5.0, retries=1, backoff=0.0))
    judge = toolenv.rewards.LLMJudge(
        base_url=f"{url}/v1", model="judge", api_key_env=None, retries=1, backoff=0.0, cache_size=0
    )
    tasks = [{"id": f"t{i}", "question": "Capital of France?", "answer": "Paris"} for i in range(EPISODES)]
    return toolenv.ToolEnv(tools=[search], tasks=tasks, reward=judge, max_turns=4)


def _agent(url: str) -> OpenAIAgent:
    return OpenAIAgent(
        "policy", f"{url}/v1", tool_calling="text", api_key_env="TOOLENV_REL_NO_KEY", max_retries=1, backoff=0.0
    )


def test_rel_rollout_goes_on_through_faulty_model_judge_and_retriever(tmp_path: Path) -> None:
    from toolenv.breaker import reset_breakers

    out = tmp_path / "run"
    with faulty_server() as server:
        try:
            first = toolenv.rollout(
                lambda: _env(server.url), _agent(server.url), out=out, concurrency=8, n=EPISODES, seed=0
            )
            injected = {role: server.faults(role) for role in ("policy", "judge", "retriever")}
            path = out / "trajectories.jsonl"
            lines = path.read_text(encoding="utf-8").splitlines()
            trajectories = read_trajectories(path, strict=True)
            # Every episode was written, once, and reads back; the run went on past every fault.
            assert first.new == EPISODES and len(lines) == EPISODES
            assert sorted(t.task.id for t in trajectories) == sorted(f"t{i}" for i in range(EPISODES))
            assert all(count > 0 for count in injected.values()), injected
            finished = [t for t in trajectories if t.error is None]
            failed = [t for t in trajectories if t.error is not None]
            assert len(failed) == first.new_errors
            assert finished, "with one retry, most episodes get through the faults"
            # A retriever failure is an error observation the model reads, and its episode goes on.
            search_errors = [
                (t, i) for t in trajectories for i, turn in enumerate(t.turns) if any(r.is_error for r in turn.results)
            ]
            assert search_errors, "some search calls met a fault twice in a row"
            for t, i in search_errors:
                turn = t.turns[i]
                assert "Search failed" in turn.observation, turn.observation
            # A judge that fails scores 0 and ends no episode; one that answers scores 1.
            assert all(t.reward in (0.0, 1.0) for t in finished)
            assert any(t.reward == 1.0 for t in finished)

            # Resume against a healthy server, retrying the failed episodes: nothing written for a
            # finished episode is lost or changed, and the retried ones now finish.
            server.healthy = True
            kept = {json.loads(line)["task"]["id"]: line for line in lines if json.loads(line)["error"] is None}
            second = toolenv.rollout(
                lambda: _env(server.url),
                _agent(server.url),
                out=out,
                concurrency=8,
                n=EPISODES,
                seed=0,
                retry_errors=True,
            )
            after = path.read_text(encoding="utf-8").splitlines()
            assert second.new == len(failed) and second.new_errors == 0
            assert len(after) == EPISODES
            assert set(kept.values()) <= set(after), "a line of a finished episode was lost or changed"
        finally:
            reset_breakers()
    print(
        f"\n[faults] rollout of {EPISODES} episodes: faults injected {injected} "
        f"({sum(injected.values())} in all); {len(failed)} episodes ended in an error and were "
        f"rerun; {len(search_errors)} search turns saw an error observation"
    )
