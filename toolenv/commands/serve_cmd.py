"""`toolenv serve ENV_ID [--host H] [--port P] [--env-arg K=V ...]`: serve an env over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import socket
from typing import TYPE_CHECKING

from toolenv._threads import DaemonThreadExecutor
from toolenv.commands.rollout_cmd import _kv

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("toolenv.remote")

#: The log levels uvicorn knows (another one failed only after the server printed its URL).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

#: Seconds a stop waits for steps in flight before cancelling them.
DEFAULT_GRACEFUL_TIMEOUT = 30.0

HELP = "Serve an env over HTTP for RemoteToolEnv / toolenv/Remote-v0 clients (needs toolenv[serve])."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `toolenv serve`."""
    from toolenv.remote.sessions import DEFAULT_CLOSE_TIMEOUT, DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL

    parser.add_argument("env_id", metavar="ENV_ID", help="a registered env id, e.g. toolenv/Spider-v0")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--env-arg",
        action="append",
        type=_kv,
        default=[],
        metavar="KEY=VALUE",
        help="a gym.make keyword (max_turns=6, parser=tags...; tools as 'module:Name' references); repeatable",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        help=f"envs alive at once, one per client session (default {DEFAULT_MAX_SESSIONS})",
    )
    parser.add_argument(
        "--session-ttl",
        type=float,
        default=DEFAULT_SESSION_TTL,
        metavar="SECONDS",
        help=(
            "close a session (and cancel its call) when its client sent no request this long "
            f"(default {DEFAULT_SESSION_TTL:g})"
        ),
    )
    parser.add_argument(
        "--graceful-timeout",
        type=float,
        default=DEFAULT_GRACEFUL_TIMEOUT,
        metavar="SECONDS",
        help="on Ctrl-C or SIGTERM, wait this long for steps in flight, then cancel them and close "
        f"every session (default {DEFAULT_GRACEFUL_TIMEOUT:g})",
    )
    parser.add_argument(
        "--close-timeout",
        type=float,
        default=DEFAULT_CLOSE_TIMEOUT,
        metavar="SECONDS",
        help="wait this long for an env's close (a DELETE, an expiry, and the stop closing every session "
        f"at once); one still running is then left behind, logged with its session (default {DEFAULT_CLOSE_TIMEOUT:g})",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        type=str.lower,
        choices=LOG_LEVELS,
        help="uvicorn log level (default warning)",
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket with TCP_NODELAY, which the connections it accepts inherit
    (uvicorn sets it only on sockets it binds itself; without it a small response can
    wait ~40 ms for a delayed ACK)."""
    try:
        # The address family is the host's: an IPv6 address (`::1`, `::`) is bound as one,
        # a name that has an IPv4 address (`localhost`) as IPv4, as before.
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        families = [info[0] for info in found]
        family = socket.AF_INET if socket.AF_INET in families else families[0]
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _left_behind(executor: DaemonThreadExecutor) -> None:
    """Log the calls still running in threads once the server has stopped (it exits without them)."""
    calls = executor.running()
    if calls:
        log.error(
            "exiting with %d call(s) still running in a thread, left behind: %s",
            len(calls),
            ", ".join(f"{name} (running {seconds:.1f} s)" for name, seconds in calls),
        )


def _server(config: uvicorn.Config) -> uvicorn.Server:
    """A `uvicorn.Server` whose loop runs blocking calls on a `DaemonThreadExecutor`, so a call
    stuck in a thread cannot hold the process after the stop (logged by name instead)."""
    import uvicorn

    executor = DaemonThreadExecutor()

    class Server(uvicorn.Server):
        async def serve(self, sockets: list[socket.socket] | None = None) -> None:
            asyncio.get_running_loop().set_default_executor(executor)
            await super().serve(sockets)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # Logged here, with the sessions closed: after `serve` uvicorn may re-raise SIGTERM,
            # which ends the process at once.
            await super().shutdown(sockets)
            _left_behind(executor)

    return Server(config)


def run(args: argparse.Namespace) -> int:
    """Build one env first (a bad id or argument fails here), bind, then serve until Ctrl-C."""
    try:
        import uvicorn

        from toolenv.remote.server import create_app
    except ImportError as exc:
        raise RuntimeError(f"serving needs Starlette and uvicorn ({exc}): pip install 'toolenv[serve]'") from None
    from toolenv.integrations.verl.envs import make_env

    if args.max_sessions < 1:
        raise ValueError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    if not args.graceful_timeout >= 0:
        raise ValueError(f"--graceful-timeout must be a number of seconds >= 0, got {args.graceful_timeout}")
    if not args.close_timeout >= 0:
        raise ValueError(f"--close-timeout must be a number of seconds >= 0, got {args.close_timeout}")
    if not args.session_ttl > 0:
        raise ValueError(f"--session-ttl must be a positive number of seconds, got {args.session_ttl}")
    factory = functools.partial(make_env, args.env_id, dict(args.env_arg))
    app = create_app(
        factory,
        env_id=args.env_id,
        max_sessions=args.max_sessions,
        session_ttl=args.session_ttl,
        close_timeout=args.close_timeout,
    )
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {args.env_id} on http://{shown}:{port} (Ctrl-C to stop)", flush=True)
    # Keep-alive outlasts a model's turn, so a client steps on one connection.
    # A step stuck in a tool with no timeout would otherwise hold a stop (SIGTERM from Slurm or
    # Kubernetes, Ctrl-C) for ever: uvicorn waits for requests in flight without a limit.
    config = uvicorn.Config(
        app, log_level=args.log_level, timeout_keep_alive=75, timeout_graceful_shutdown=args.graceful_timeout
    )
    try:
        _server(config).run(sockets=[sock])  # on Ctrl-C: closes every session, then re-raises it
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0
