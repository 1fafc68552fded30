"""Tool objects that several `toolenv serve` sessions share.

A `tools` reference to a Tool *instance* (`"module:name"`, an `@toolenv.tool` function too)
gives every session's env that same object, as a vector env's envs share theirs (one set of
limits, per-episode state in `ctx.state`). Ending one session must not close it under the
others: the last session that holds it closes it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from _remote import serving

from toolenv.integrations.verl.envs import make_env
from toolenv.remote import RemoteToolEnv

pytest.importorskip("toolenv_code", reason="the shared tool is the code plugin's stateful python tool")
from toolenv_code import PythonTool


class CountingPython(PythonTool):
    """The real stateful python tool, counting its closes."""

    closes = 0

    async def close(self) -> None:
        self.closes += 1
        await super().close()


#: One instance, referenced as `"<this module>:PYTHON"`: every session's env holds this object.
PYTHON = CountingPython(stateful=True)


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _factory() -> Any:
    kwargs = {"tools": [f"{__name__}:PYTHON"], "tasks": [{"question": "q", "answer": "42"}], "max_turns": 8}
    return functools.partial(make_env, "toolenv/ToolEnv-v0", kwargs)


def test_ending_one_session_leaves_a_shared_tool_open_for_the_others() -> None:
    """A stateful code tool given as an instance: session A's end (a DELETE) closed the tool,
    which ended session B's interpreter mid-episode (its variables gone). (Session A has
    the env the server described itself with; B's was built for it.)"""
    PYTHON.closes = 0
    with serving(_factory()) as url:
        a, b = RemoteToolEnv(url), RemoteToolEnv(url)
        a.reset(seed=0)
        b.reset(seed=0)
        b.step(_call("x = 41"))
        a.step(_call("y = 1"))
        a.close()  # DELETE: session A's env is closed
        assert PYTHON.closes == 0
        obs, *_ = b.step(_call("print(x + 1)"))
        assert "42" in obs and "restarted" not in obs
        b.close()
        assert PYTHON.closes == 1  # the last session holding it closes it
    assert PYTHON.closes == 1  # and the server's stop does not close it again


def test_a_stop_closes_a_shared_tool_once_after_every_session() -> None:
    PYTHON.closes = 0
    with serving(_factory()) as url:
        envs = [RemoteToolEnv(url) for _ in range(3)]
        for env in envs:
            env.reset(seed=0)
            env.step(_call("z = 1"))
        assert PYTHON.closes == 0
    assert PYTHON.closes == 1
