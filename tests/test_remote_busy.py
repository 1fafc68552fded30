"""A server at its session limit (429 on `POST /sessions`) is waited for, not a failed episode.

A client killed outright (SIGKILL, OOM, a lost node) leaves its sessions on the server until
`--session-ttl`; the client run again must wait for their slots rather than fail every episode
at once. Real `create_app` servers on 127.0.0.1 (uvicorn in a thread), real httpx.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import gymnasium as gym
import httpx
import pytest

pytest.importorskip("starlette", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
pytest.importorskip("uvicorn", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")

from _remote import CALL_ADD, asgi_server, make_env, serving

import toolenv  # noqa: F401 - registers toolenv/Remote-v0
from toolenv.remote import RemoteEnvError, RemoteToolEnv, client
from toolenv.remote.server import create_app


def _sessions(url: str) -> int:
    return int(httpx.get(f"{url}/health").json()["sessions"])


def _take_slot(url: str) -> str:
    """Open a session as a client that then dies would: it holds its slot until deleted or reaped."""
    resp = httpx.post(f"{url}/sessions")
    assert resp.status_code == 201
    return str(resp.json()["session_id"])


class Watched:
    """ASGI middleware: records when each request of `method` `path` (a suffix) came; answers
    those with `status` itself when given (a proxy's rate limiter), and adds `retry_after`
    as a `Retry-After` header to every 429 (as a server or proxy that sends one)."""

    def __init__(
        self, app: Any, method: str, path: str, *, status: int | None = None, retry_after: str | None = None
    ) -> None:
        self.app, self.method, self.path = app, method, path
        self.status, self.retry_after = status, retry_after
        self.times: list[float] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] == self.method and scope["path"].endswith(self.path):
            self.times.append(time.monotonic())
            if self.status is not None:
                headers = [(b"content-type", b"text/plain")]
                if self.retry_after is not None:
                    headers.append((b"retry-after", self.retry_after.encode()))
                await send({"type": "http.response.start", "status": self.status, "headers": headers})
                await send({"type": "http.response.body", "body": b"Too Many Requests"})
                return None

        async def say(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] == 429 and self.retry_after:
                message = {**message, "headers": [*message["headers"], (b"retry-after", self.retry_after.encode())]}
            await send(message)

        return await self.app(scope, receive, say)


def test_the_default_wait_rides_out_a_dead_clients_sessions() -> None:
    """Longer than the server's default TTL plus its reaping and closing: a crashed client's slot frees in it."""
    assert client.DEFAULT_SESSION_WAIT >= 600 + 30 + 2 * 30


def test_a_slot_freed_after_a_second_lets_a_waiting_client_in() -> None:
    with serving(make_env, max_sessions=1) as u:
        held = _take_slot(u)  # a client killed outright: its session holds the only slot
        freeing = threading.Timer(1.0, lambda: httpx.delete(f"{u}/sessions/{held}"))
        freeing.start()
        env = RemoteToolEnv(u)  # the default: wait for a slot
        try:
            started = time.monotonic()
            obs, _ = env.reset(options={"task_id": "t1"})
            waited = time.monotonic() - started
            assert "2+3?" in obs
            assert waited >= 0.9  # it was let in once the slot was free, not before
            assert waited < 60  # and not only after some long timeout (a loaded host is slow)
            env.step(CALL_ADD)
            assert env.step("<answer>5</answer>")[1] == 1.0
        finally:
            freeing.join()
            env.close()
        assert _sessions(u) == 0


def test_a_limit_that_never_frees_fails_after_the_wait_and_says_what_to_do() -> None:
    watched = Watched(create_app(make_env, max_sessions=1), "POST", "/sessions")
    with asgi_server(watched) as u:
        held = _take_slot(u)
        # as `toolenv rollout toolenv/Remote-v0 --env-arg url=... --env-arg session_wait=1.5` builds it
        env = gym.make("toolenv/Remote-v0", url=u, session_wait=1.5).unwrapped
        assert isinstance(env, RemoteToolEnv)
        try:
            tried = len(watched.times)
            started = time.monotonic()
            with pytest.raises(RemoteEnvError) as exc:
                env.reset(options={"task_id": "t1"})
            waited = time.monotonic() - started
            assert exc.value.status == 429
            assert 1.4 <= waited < 30
            assert len(watched.times) - tried >= 3  # it tried again while waiting, with backoff
            message = str(exc.value)
            assert "\n" not in message
            assert "limit of 1 sessions" in message  # the server's own word
            for what_to_do in ("--max-sessions", "--session-ttl", "session_wait"):
                assert what_to_do in message
            assert _sessions(u) == 1  # it made no session of its own
            httpx.delete(f"{u}/sessions/{held}")
            assert "2+3?" in env.reset(options={"task_id": "t1"})[0]  # the next reset gets in
        finally:
            env.close()
        assert _sessions(u) == 0


def test_no_wait_fails_at_once() -> None:
    with serving(make_env, max_sessions=1) as u:
        _take_slot(u)
        env = RemoteToolEnv(u, session_wait=0)
        started = time.monotonic()
        with pytest.raises(RemoteEnvError, match="limit of 1 sessions") as exc:
            env.reset()
        assert exc.value.status == 429 and time.monotonic() - started < 10
        env.close()


def test_retry_after_is_honoured() -> None:
    watched = Watched(create_app(make_env, max_sessions=1), "POST", "/sessions", retry_after="2")
    with asgi_server(watched) as u:
        _take_slot(u)
        env = RemoteToolEnv(u, session_wait=4.5)
        tried = len(watched.times)
        with pytest.raises(RemoteEnvError, match="limit of 1 sessions"):
            env.reset()
        times = watched.times[tried:]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert len(gaps) >= 2
        assert all(gap >= 1.9 for gap in gaps[:-1])  # the last is cut short by the wait's end
        env.close()


async def test_a_429_on_a_step_is_not_waited_for_nor_sent_again() -> None:
    """The server never answers a step 429: one comes from something in front (a rate limiter),
    not the session limit; it fails that step as any other error answer does."""
    watched = Watched(create_app(make_env), "POST", "/step", status=429, retry_after="1")
    with asgi_server(watched) as u:
        env = RemoteToolEnv(u)
        await env.areset(options={"task_id": "t1"})
        started = time.monotonic()
        with pytest.raises(RemoteEnvError, match="answered 429") as exc:
            await env.astep(CALL_ADD)
        assert exc.value.status == 429 and time.monotonic() - started < 10
        assert len(watched.times) == 1  # not sent again
        with pytest.raises(RemoteEnvError, match="this episode was lost"):
            await env.astep(CALL_ADD)
        await env.aclose()


async def test_closing_an_env_cancelled_while_waiting_does_not_wait() -> None:
    """An episode timeout cancels a reset waiting for a slot; closing the env then does not wait too."""
    with serving(make_env, max_sessions=1) as u:
        await asyncio.to_thread(_take_slot, u)
        env = RemoteToolEnv(u, session_wait=600)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(env.areset(options={"task_id": "t1"}), 1.0)
        started = time.monotonic()
        await asyncio.wait_for(env.aclose(), 60)  # a failure guard only
        assert time.monotonic() - started < 10
        assert await asyncio.to_thread(_sessions, u) == 1  # only the dead client's


def test_retry_after_is_read_as_seconds_or_a_date() -> None:
    assert client._retry_after("2") == 2.0
    assert client._retry_after(" 0 ") == 0.0
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 25 <= (client._retry_after(later) or 0) <= 31
    earlier = format_datetime(datetime.now(timezone.utc) - timedelta(seconds=30), usegmt=True)
    assert client._retry_after(earlier) == 0.0
    for bad in (None, "", "soon", "-3", "nan", "1e400"):
        assert client._retry_after(bad) is None


def test_session_wait_must_be_a_wait() -> None:
    for bad in (-1, float("nan"), True, "60"):
        with pytest.raises(ValueError, match="session_wait"):
            RemoteToolEnv("http://127.0.0.1:1", session_wait=bad)  # type: ignore[arg-type]
