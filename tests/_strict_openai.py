"""A chat-completions server on 127.0.0.1 that checks tool messages as OpenAI's API does.

OpenAI refuses (HTTP 400) a `tool` message that answers no call of the assistant message
before it, and an assistant message whose calls are not all answered by the tool messages
right after it. Accepted requests get the next scripted reply; refused ones are kept with
the server's error text, so a test sees what a strict server would have said.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: OpenAI's own wording of the two refusals.
NOT_A_RESPONSE = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
)
UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'."
)


def refusal(messages: list[dict[str, Any]]) -> str | None:
    """Why a strict OpenAI server refuses `messages` (None: it accepts them)."""
    open_ids: set[str] = set()  # the calls of the last assistant message not answered yet
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            if m.get("tool_call_id") not in open_ids:
                return f"{NOT_A_RESPONSE} (messages[{i}])"
            open_ids.discard(m["tool_call_id"])
            continue
        if open_ids:
            return f"{UNANSWERED} Unanswered: {sorted(open_ids)} (messages[{i}])"
        if m.get("role") == "assistant":
            open_ids = {c["id"] for c in m.get("tool_calls") or ()}
    return f"{UNANSWERED} Unanswered: {sorted(open_ids)}" if open_ids else None


def reply(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A chat-completions response with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }


def native_call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    """One `tool_calls` entry of a response, its arguments JSON text as the API sends them."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class StrictServer:
    """Pops one scripted reply per accepted request; `accepted` and `refused` record the requests."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = list(script)
        self.accepted: list[dict[str, Any]] = []
        self.refused: list[tuple[dict[str, Any], str]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                why = refusal(body.get("messages") or [])
                with outer.lock:
                    if why is not None:
                        outer.refused.append((body, why))
                        status, payload = 400, {"error": {"message": why, "type": "invalid_request_error"}}
                    else:
                        outer.accepted.append(body)
                        status = 200 if outer.script else 500
                        payload = outer.script.pop(0) if outer.script else {"error": {"message": "script empty"}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def strict_server(script: list[dict[str, Any]]) -> Iterator[StrictServer]:
    """A `StrictServer` with `script`, shut down on exit."""
    server = StrictServer(script)
    try:
        yield server
    finally:
        server.close()


async def native_rollout(script: list[dict[str, Any]], make_env: Any, **rollout: Any) -> tuple[StrictServer, Any]:
    """One episode of the `openai` agent (native tool calling) against a `StrictServer` with
    `script`: the server (its requests) and the trajectory, after checking no request was refused."""
    from toolenv.runner import arollout
    from toolenv_agents.openai_compat import OpenAIAgent

    with strict_server(script) as server:
        agent = OpenAIAgent(model="m", base_url=server.url, backoff=0.01)
        try:
            result = await arollout(make_env, agent, n=1, **rollout)
        finally:
            await agent.aclose()
    assert server.refused == [], server.refused[0][1]
    return server, result.trajectories[0]
