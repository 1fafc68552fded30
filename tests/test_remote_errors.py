"""What a RemoteToolEnv says when what answers at its URL is not (only) the toolenv server.

Real servers on 127.0.0.1 (uvicorn in a thread), real httpx.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
pytest.importorskip("uvicorn", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")

from _remote import asgi_server, make_env

from toolenv.remote import RemoteEnvError, RemoteToolEnv


def _redirecting(app: Any, status: int, where: str) -> Any:
    """`app` behind a front that redirects every request (plain HTTP to HTTPS, an old path to a new one)."""
    from starlette.responses import RedirectResponse

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            response = RedirectResponse(f"{where}{scope['path']}", status_code=status)
            await response(scope, receive, send)
            return
        await app(scope, receive, send)

    return asgi


@pytest.mark.parametrize("status", [301, 307, 308])
def test_a_url_that_redirects_says_where_to(status: int) -> None:
    from toolenv.remote.server import create_app

    app = _redirecting(create_app(make_env), status, "https://envs.example/v2")
    where = rf"redirects to https://envs\.example/v2/metadata \({status}\)"
    with asgi_server(app) as u, pytest.raises(RemoteEnvError, match=where) as exc:
        RemoteToolEnv(u)
    assert exc.value.status == status
    assert "RemoteToolEnv" in str(exc.value)


@contextlib.contextmanager
def _unreachable() -> Iterator[str]:
    """A URL whose connections are never made, as a host that is down (its packets dropped): a
    listening socket that never accepts, its backlog full, so that further handshakes hang."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    for _ in range(3):
        conn = socket.socket()
        conn.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            conn.connect(("127.0.0.1", port))
        queued.append(conn)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for conn in queued:
            conn.close()
        server.close()


def test_a_host_that_is_down_is_a_clear_error_soon_not_after_the_request_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import toolenv.remote.client as client

    monkeypatch.setattr(client, "CONNECT_TIMEOUT", 1.0, raising=False)
    with _unreachable() as u:
        started = time.monotonic()
        # A long request timeout, for tools that run long: it is no reason to wait as long for a connection.
        with pytest.raises(RemoteEnvError, match=r"cannot reach the toolenv server at .*: no connection within 1 s"):
            RemoteToolEnv(u, timeout=30)
        assert time.monotonic() - started < 10
