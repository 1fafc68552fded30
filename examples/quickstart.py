"""Quick start: a typed tool, a Gymnasium env, one episode by hand."""

from __future__ import annotations

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv


class Add(toolenv.Tool):
    """Add two integers."""

    name = "add"

    class Args(BaseModel):
        a: int = Field(description="first addend")
        b: int = Field(description="second addend")

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, Add.Args)
        return toolenv.ToolResult(text=str(args.a + args.b))


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Add()],
        tasks=[{"question": "2+3?", "answer": "5"}],
        parser="hermes",
        reward="exact_match",
        max_turns=4,
    )
    obs, info = env.reset(seed=0)
    print(obs)
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    )
    print(obs)
    obs, reward, terminated, truncated, info = env.step("<answer>5</answer>")
    print(f"reward={reward} terminated={terminated} components={info['reward_components']}")
    assert reward == 1.0 and terminated
    env.close()


if __name__ == "__main__":
    main()
