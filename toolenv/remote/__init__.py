"""Envs over HTTP: `toolenv serve` runs any env as a server, `RemoteToolEnv` steps it from afar.

Only the client is imported here (it needs httpx, a core dependency); the server,
`toolenv.remote.server`, needs the `serve` extra (Starlette and uvicorn).
"""

from __future__ import annotations

from toolenv.remote.client import RemoteEnvError, RemoteToolEnv, SessionGoneError

__all__ = ["RemoteEnvError", "RemoteToolEnv", "SessionGoneError"]
