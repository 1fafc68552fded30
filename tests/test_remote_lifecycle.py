"""A RemoteToolEnv's server session over its life: dropped unclosed, a server restarted under it.

Real `create_app` servers on 127.0.0.1 (uvicorn in a thread), real httpx, real subprocesses.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
pytest.importorskip("uvicorn", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")

from _remote import CALL_ADD, asgi_server, make_env, serving

from toolenv.remote import RemoteEnvError, RemoteToolEnv

HERE = Path(__file__).parent


def _sessions(url: str) -> int:
    return int(httpx.get(f"{url}/health").json()["sessions"])


def _wait_for_sessions(url: str, n: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while _sessions(url) != n:
        assert time.monotonic() < deadline, f"the server never got to {n} sessions (it has {_sessions(url)})"
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------- an env dropped unclosed
def test_a_dropped_env_frees_its_session_and_says_it_was_not_closed() -> None:
    with serving(make_env, max_sessions=1) as u:
        env = RemoteToolEnv(u)
        env.reset(options={"task_id": "t1"})
        assert _sessions(u) == 1
        with pytest.warns(ResourceWarning, match=r"unclosed RemoteToolEnv .*call env\.close\(\)"):
            del env
            gc.collect()
        _wait_for_sessions(u, 0)  # the slot is free again long before the session TTL
        other = RemoteToolEnv(u)
        assert "2+3?" in other.reset(options={"task_id": "t1"})[0]
        other.close()


async def test_an_env_dropped_inside_an_event_loop_frees_its_session_without_blocking_it() -> None:
    """The server holds the session's DELETE until the drop has returned: a drop that waited for
    its answer (blocking the loop it happened in) would return only after the hold."""
    from toolenv.remote.server import create_app

    arrived, held, answered = threading.Event(), threading.Event(), threading.Event()

    def holding(app: Any) -> Any:
        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["method"] == "DELETE":
                arrived.set()
                await asyncio.to_thread(held.wait, 30)
                await app(scope, receive, send)
                answered.set()
                return
            await app(scope, receive, send)

        return asgi

    with asgi_server(holding(create_app(make_env, max_sessions=1))) as u:
        env = RemoteToolEnv(u)
        await env.areset(options={"task_id": "t1"})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del env
            gc.collect()
        assert not answered.is_set()  # the drop returned with its release still unanswered
        assert arrived.wait(30)  # the release was sent, from a thread of its own
        held.set()
        _wait_for_sessions(u, 0)


def test_a_closed_env_or_one_without_a_session_warns_nothing_when_dropped() -> None:
    with serving(make_env) as u:
        closed, idle = RemoteToolEnv(u), RemoteToolEnv(u)
        closed.reset(options={"task_id": "t1"})
        closed.close()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            del closed, idle
            gc.collect()
        assert not [w for w in seen if "RemoteToolEnv" in str(w.message)]


def test_a_dropped_copy_frees_its_own_session_not_the_originals() -> None:
    import copy

    with serving(make_env) as u:
        env = RemoteToolEnv(u)
        env.reset(options={"task_id": "t1"})
        twin = copy.deepcopy(env)
        twin.reset(options={"task_id": "t2"})
        assert _sessions(u) == 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del twin
            gc.collect()
        _wait_for_sessions(u, 1)
        assert env.step("<answer>5</answer>")[1] == 1.0  # the original's session lives on
        env.close()
        _wait_for_sessions(u, 0)


_EXIT_SCRIPT = """
import sys
from toolenv.remote import RemoteToolEnv
env = RemoteToolEnv(sys.argv[1])  # the default timeout: 300 s
env.reset(options={"task_id": "t1"})
print("ready", flush=True)
"""


def _exit_with_an_open_env(url: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a process that opens a session and exits without closing its env; and how long it took."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, url], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "ready" in done.stdout, done.stderr
    return done, time.monotonic() - started


def test_an_env_still_open_at_interpreter_exit_frees_its_session() -> None:
    with serving(make_env) as u:
        _exit_with_an_open_env(u)
        _wait_for_sessions(u, 0, within=2.0)


def _deletes_hang(app: Any) -> Any:
    """`app`, but a DELETE never gets an answer (a server stuck, or a proxy that holds requests)."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "DELETE":
            await asyncio.sleep(3600)
        await app(scope, receive, send)

    return asgi


def test_a_server_that_does_not_answer_the_release_does_not_hold_interpreter_exit() -> None:
    from toolenv.remote.server import create_app

    with serving(make_env) as u:
        _, usual = _exit_with_an_open_env(u)
    with asgi_server(_deletes_hang(create_app(make_env)), graceful_timeout=0.5) as u:
        _, took = _exit_with_an_open_env(u)
    # A few seconds more at most, not the env's 300 s request timeout.
    assert took < usual + 5, f"exit took {took:.1f} s, {usual:.1f} s when the server answers"


# ---------------------------------------------------------------------- a server restarted under a client
def test_a_server_restarted_with_another_env_is_a_clear_error_not_a_silent_switch() -> None:
    port = _free_port()
    with serving(make_env, port=port) as u:
        env = RemoteToolEnv(u, timeout=10)
        env.reset(options={"task_id": "t1"})
        env.step(CALL_ADD)
    # The same address, now serving an env with other limits: the client's mirror of it is wrong.
    with serving(lambda: make_env(max_turns=1), port=port) as u2:
        assert u2 == u
        with pytest.raises(RemoteEnvError, match=rf"the server at {u} now serves another env.*RemoteToolEnv") as exc:
            env.reset(options={"task_id": "t1"})
        assert exc.value.status == 409
        with pytest.raises(RemoteEnvError, match="now serves another env"):
            env.reset()  # still, not a silent switch on the next try
        assert _sessions(u2) == 0  # nothing was opened on the new env for this client
        env.close()  # quiet: the old session is simply gone
        fresh = RemoteToolEnv(u2)
        assert fresh.max_turns == 1
        fresh.reset()
        fresh.close()


def test_a_server_restarted_with_the_same_env_is_picked_up_at_the_next_reset() -> None:
    port = _free_port()
    with serving(make_env, port=port) as u:
        env = RemoteToolEnv(u, timeout=10)
        env.reset(options={"task_id": "t1"})
    with serving(make_env, port=port) as u2:
        assert "2+3?" in env.reset(options={"task_id": "t1"})[0]
        assert env.step("<answer>5</answer>")[1] == 1.0
        env.close()
        _wait_for_sessions(u2, 0)


def test_a_client_built_for_another_env_is_refused_over_raw_http() -> None:
    with serving(make_env) as u:
        meta = httpx.get(f"{u}/metadata")
        fingerprint = meta.headers["Toolenv-Env"]
        assert fingerprint
        ok = httpx.post(f"{u}/sessions", headers={"Toolenv-Env": fingerprint})
        assert ok.status_code == 201
        refused = httpx.post(f"{u}/sessions", headers={"Toolenv-Env": "another"})
        assert refused.status_code == 409 and refused.json()["type"] == "EnvChanged"
        assert "another env" in refused.json()["error"]
        assert httpx.post(f"{u}/sessions").status_code == 201  # a client that does not say is served as before
        # The metadata and health stay readable: a client reads them to build itself anew.
        assert httpx.get(f"{u}/health", headers={"Toolenv-Env": "another"}).status_code == 200
        assert httpx.get(f"{u}/metadata", headers={"Toolenv-Env": "another"}).headers["Toolenv-Env"] == fingerprint
