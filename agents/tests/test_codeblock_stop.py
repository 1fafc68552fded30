"""A code-tool model (ToRL, ReTool) that goes on to write an ```` ```output ```` block itself is
inventing its code's result: the `codeblock` format asks the server to stop there."""

from __future__ import annotations

from _strict_openai import reply, strict_server

from toolenv.runner import arollout
from toolenv_agents.openai_compat import OpenAIAgent


async def test_a_text_mode_request_in_a_codeblock_env_stops_at_an_output_block() -> None:
    code = "Let me count.\n```python\nprint(6 * 7)\n```\n"
    with strict_server([reply(code), reply("<answer>\ndef f():\n    return 42\n</answer>")]) as server:
        agent = OpenAIAgent(model="m", base_url=server.url, tool_calling="text", backoff=0.01)
        try:
            result = await arollout("toolenv/HumanEval-v0", agent, n=1)
        finally:
            await agent.aclose()
    assert all("```output" in body["stop"] for body in server.accepted)
    first = result.trajectories[0].turns[0]
    assert [c.arguments for c in first.parsed.tool_calls] == [{"code": "print(6 * 7)"}]
    assert first.observation == "```output\n42\n```"
