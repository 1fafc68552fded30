"""A chat-completions judge server on 127.0.0.1 that answers from a script and records what it
got, shared by the judge tests (tests/ is on pytest's `pythonpath`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: bytes | str | dict[str, Any] = ""
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    #: A judge model's reply made from the request's last message (a prompt-dependent judge).
    reply_to: Callable[[str], str] | None = None


def completion(text: str) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
    }


class FakeServer:
    """A chat-completions server that answers from a script and records what it got."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                request = {"path": self.path, "headers": dict(self.headers), "body": json.loads(raw)}
                owner.requests.append(request)
                reply = owner.script.pop(0) if len(owner.script) > 1 else owner.script[0]
                body = reply.body
                if reply.reply_to is not None:  # made as the request arrives, from this request
                    body = completion(reply.reply_to(request["body"]["messages"][-1]["content"]))
                if reply.delay:
                    time.sleep(reply.delay)
                data = (
                    json.dumps(body).encode()
                    if isinstance(body, dict)
                    else body.encode()
                    if isinstance(body, str)
                    else body
                )
                try:
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 512  # many judge calls connect at once

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
