"""The `oracle` agent: plays the env's scripted policy, found through `toolenv.oracles`.

An oracle plugin is `oracle(task, turn, observation) -> str` (sync or async), registered
under the env's name without the namespace (`Spider-v0` for `toolenv/Spider-v0`).
Rolling it out is the end-to-end check that an env, its tools and its reward agree.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from toolenv.agent import Agent, AgentAction, AgentError, EnvInfo
from toolenv.registry import load
from toolenv.types import Message

__all__ = ["OracleAgent"]

OracleFn = Callable[..., Any]


class OracleAgent(Agent):
    """Acts with the scripted policy of the env it is rolled out on.

    Args:
        env: the oracle's name when it differs from the env's (default: taken from `env_info`).
        oracle: a policy function to use instead of a plugin (handy for tests and custom envs).
    """

    name = "oracle"

    def __init__(self, env: str | None = None, oracle: OracleFn | None = None) -> None:
        self.env = env
        self._fn: OracleFn | None = oracle
        self._loaded: dict[str, OracleFn] = {}

    def _oracle(self, env_info: EnvInfo) -> OracleFn:
        if self._fn is not None:
            return self._fn
        name = self.env or env_info.env_name
        if not name:
            raise AgentError("the env has no id; pass env=NAME to name its oracle")
        if name not in self._loaded:
            try:
                self._loaded[name] = load("oracles", name)
            except Exception as exc:
                hint = "" if self.env else "; if the env plays another env's tasks, name that one: --agent-arg env=NAME"
                raise AgentError(f"{exc}{hint}") from exc
        return self._loaded[name]

    async def act(self, observation: str, messages: list[Message], env_info: EnvInfo) -> AgentAction:
        fn = self._oracle(env_info)
        out = fn(env_info.task, env_info.turn, observation)
        if inspect.isawaitable(out):
            out = await out
        if not isinstance(out, str):
            raise AgentError(f"oracle returned {type(out).__name__}, not an action string")
        return AgentAction(text=out)
