"""HotpotQA-v0 with native tool calling: the agent gives the model the search tool through the
API's `tools`, so the prompt must not also teach Search-R1's `<search>` tags (two call formats
at once). A text-mode agent still reads Search-R1's prompt, word for word."""

from __future__ import annotations

import gymnasium as gym
from _strict_openai import native_call, native_rollout, reply

import toolenv
from toolenv_search.envs import SEARCH_R1_PROMPT, TOOL_CALL_PROMPT

QUESTION_AT = SEARCH_R1_PROMPT.index("{question}")


def test_a_native_reset_asks_for_the_search_tool_not_tags() -> None:
    env = gym.make("toolenv/HotpotQA-v0")
    try:
        plain, info = env.reset(seed=0)
        assert plain.startswith(SEARCH_R1_PROMPT[:QUESTION_AT]) and "<search>" in plain
        native, info = env.reset(seed=0, options={"native_tools": True})
        user = [m.content for m in info["messages"] if m.role == "user"]
        assert len(user) == 1 and user[0] == native
        assert "<search>" not in native and "<information>" not in native
        assert native.startswith(TOOL_CALL_PROMPT[: TOOL_CALL_PROMPT.index("{question}")])
        assert native.endswith(plain[QUESTION_AT:])  # the same question
        again, _ = env.reset(seed=0)  # the flag is the latest reset's, not sticky
        assert again == plain
    finally:
        env.close()


async def test_the_openai_agent_in_native_mode_sends_one_call_format() -> None:
    def make() -> toolenv.ToolEnv:
        return gym.make("toolenv/HotpotQA-v0", limit=1).unwrapped  # type: ignore[no-any-return]

    script = [
        reply(None, [native_call("search", {"query": "Bath Maine"}, "call_1")]),
        reply("<answer> Bath </answer>"),
    ]
    server, traj = await native_rollout(script, make)
    assert len(server.accepted) == 2
    first = server.accepted[0]
    assert [t["function"]["name"] for t in first["tools"]] == ["search"]
    assert not any("<search>" in str(m.get("content")) for m in first["messages"]), first["messages"]
    assert any("call the search tool" in str(m.get("content")) for m in first["messages"])
    turn = traj.turns[0]
    assert [c.name for c in turn.parsed.tool_calls] == ["search"] and not turn.results[0].is_error
