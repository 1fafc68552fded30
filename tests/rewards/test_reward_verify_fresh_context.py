"""`ToolVerified` checks in a context of its own: the policy's state and sessions never reach it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

import toolenv
from toolenv.rewards import ToolVerified, reward_info

pytest.importorskip("toolenv_code", reason="the stateful `python` tool is the code plugin's")

from toolenv_code import PythonTool
from toolenv_code.sandbox import SandboxPool

TASK = {"question": "Give a Python expression equal to 6*7.", "answer": "42"}


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


#: The policy's call: every later `print` in this interpreter writes "True".
POISON = _call('import builtins, sys\nbuiltins.print = lambda *a, **k: sys.stdout.write("True\\n")')

EQUALS_42 = ToolVerified(
    "python",
    build_args=lambda ep: {"code": f"print(({ep.answer}) == 42)"},
    judge=lambda r: float(r.text.strip() == "True"),
    name="verified",
)


@pytest.fixture
def pool() -> Iterator[SandboxPool]:
    """A pool of one server of its own, so its live sessions are this test's alone."""
    pool = SandboxPool(size=1)
    try:
        yield pool
    finally:
        pool.close()


def _live(pool: SandboxPool) -> list[str]:
    return [sid for server in pool.stats() for sid in server["sessions"]]


def _episode(pool: SandboxPool, actions: list[str], reward: Any = EQUALS_42) -> tuple[dict[str, Any], toolenv.ToolEnv]:
    env = toolenv.ToolEnv(
        tools=[PythonTool(stateful=True, pool=pool)], parser="hermes", tasks=[TASK], reward=reward, max_turns=4
    )
    env.reset(seed=0)
    info: dict[str, Any] = {}
    for action in actions:
        *_, info = env.step(action)
    return info, env


def test_a_policy_that_rewires_print_in_its_session_does_not_pass_the_check(pool: SandboxPool) -> None:
    """The policy replaced `print` in its stateful session, then answered `1 + 1`: the check ran
    in that same session and printed "True" whatever it compared, so a wrong answer scored 1."""
    info, env = _episode(pool, [POISON, "<answer>1 + 1</answer>"])
    try:
        assert info["reward_components"]["verified"] == 0.0
        assert info["reward_info"]["verified"]["tool_output"] == "False"
    finally:
        env.close()


def test_a_right_answer_still_verifies_and_sees_none_of_the_policys_variables(pool: SandboxPool) -> None:
    info, env = _episode(pool, [_call("x = 6 * 7"), "<answer>6 * 7</answer>"])
    try:
        assert info["reward_components"]["verified"] == 1.0
        assert info["reward_info"]["verified"]["tool_output"] == "True"
    finally:
        env.close()
    # An answer that names the policy's variable fails: the check's interpreter never had it.
    info, env = _episode(pool, [_call("x = 6 * 7"), "<answer>x</answer>"])
    try:
        assert info["reward_components"]["verified"] == 0.0
        assert "NameError" in info["reward_info"]["verified"]["error"]
    finally:
        env.close()


class Watched(PythonTool):
    """The code tool, noting the pool's live sessions each time a context is released."""

    def __init__(self, pool: SandboxPool) -> None:
        super().__init__(stateful=True, pool=pool)
        self.seen: list[tuple[str, list[str]]] = []

    async def release(self, ctx: toolenv.ToolContext) -> None:
        self.seen.append((ctx.episode_id, sorted(_live(self.pool))))
        await super().release(ctx)


def test_the_check_leaves_no_sandbox_session_behind(pool: SandboxPool) -> None:
    """The check runs in a session of its own, closed right after it; the episode's closes with
    the episode, and no sandbox process of either is left."""
    tool = Watched(pool)
    env = toolenv.ToolEnv(tools=[tool], parser="hermes", tasks=[TASK], reward=EQUALS_42, max_turns=4)
    try:
        env.reset(seed=0)
        env.step(_call("y = 1"))
        *_, info = env.step("<answer>6 * 7</answer>")
        assert info["reward_components"]["verified"] == 1.0
        episode_id = env.episode.episode_id  # type: ignore[union-attr]
        assert len(tool.seen) == 2, tool.seen  # the check's context, then the episode's
        (check_id, open_at_check), (last_id, open_at_end) = tool.seen
        assert check_id != episode_id and open_at_check == sorted([check_id, episode_id])
        assert last_id == episode_id and open_at_end == [episode_id]  # the check's is gone already
        assert _live(pool) == []
    finally:
        env.close()


class Counter(toolenv.Tool):
    """Counts calls in the context's state; records each run and release with its context."""

    name = "counter"

    class Args(BaseModel):
        pass

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, int]] = []

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
        self.events.append(("run", ctx.episode_id, ctx.state["calls"]))
        return toolenv.ToolResult(text=str(ctx.state["calls"]))

    async def release(self, ctx: toolenv.ToolContext) -> None:
        self.events.append(("release", ctx.episode_id, ctx.state.get("calls", 0)))


def test_the_check_runs_in_fresh_state_and_releases_it_before_the_episode() -> None:
    tool = Counter()
    check = ToolVerified("counter", lambda ep: {}, judge=lambda r: float(r.text == "1"), name="fresh")
    env = toolenv.ToolEnv(tools=[tool], parser="hermes", tasks=[TASK], reward=check)
    env.reset(seed=0)
    env.step('<tool_call>{"name": "counter", "arguments": {}}</tool_call>')
    _, reward, terminated, _, _ = env.step("<answer>42</answer>")
    episode = env.episode
    assert episode is not None and terminated
    assert reward == 1.0, reward_info(episode)["fresh"]  # the check counted from 0, not from the policy's 1
    (check_id,) = {e[1] for e in tool.events} - {episode.episode_id}
    assert tool.events == [
        ("run", episode.episode_id, 1),
        ("run", check_id, 1),
        ("release", check_id, 1),  # the check's state, freed right after it
        ("release", episode.episode_id, 1),  # the episode's, untouched by the check
    ]
    assert episode.state == {"calls": 1} and episode.tool_calls == 1
    env.close()
