"""A Gemma 4 episode: tool calls in Gemma's `<|tool_call>call:NAME{...}<tool_call|>` format.

Run it:  python examples/gemma4_example.py

Gemma 4 writes arguments in its own notation: bare keys, strings between `<|"|>` tokens,
numbers and `true`/`false`/`null` as they are. The first turn makes two calls one after
another and ends with `<|tool_response>`, where Gemma hands over to the tools; the second
passes a list; the third answers. Each result comes back as a `<|tool_response>` block.
"""

from __future__ import annotations

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv

POPULATION = {"Paris": 2_102_650, "Lyon": 513_275}


class Population(toolenv.Tool):
    """The population of a French city."""

    name = "population"

    class Args(BaseModel):
        city: str = Field(description="the city's name")

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, Population.Args)
        if args.city not in POPULATION:
            return toolenv.ToolResult.error(f"unknown city {args.city!r}; known: {', '.join(POPULATION)}")
        return toolenv.ToolResult(text=str(POPULATION[args.city]))


class Add(toolenv.Tool):
    """Add numbers."""

    name = "add"

    class Args(BaseModel):
        numbers: list[int] = Field(description="the numbers to add")

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, Add.Args)
        return toolenv.ToolResult(text=str(sum(args.numbers)))


TURNS = [
    'Let me look both up.<|tool_call>call:population{city:<|"|>Paris<|"|>}<tool_call|>'
    '<|tool_call>call:population{city:<|"|>Lyon<|"|>}<tool_call|><|tool_response>',
    "<|tool_call>call:add{numbers:[2102650,513275]}<tool_call|><|tool_response>",
    "Paris and Lyon have 2615925 inhabitants together. <answer>2615925</answer><turn|>",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Population(), Add()],
        tasks=[{"question": "How many people live in Paris and Lyon together?", "answer": "2615925"}],
        parser="gemma4",
    )
    obs, _ = env.reset(seed=0)
    print(obs)
    for turn in TURNS:
        obs, reward, terminated, truncated, info = env.step(turn)
        for call in info["action"].tool_calls:
            print(f"--- {call.id}: {call.name}({call.arguments!r})")
        print(f"--- observation: {obs!r}")
    print(f"reward={reward} terminated={terminated} answer={info['answer']!r}")
    env.close()


if __name__ == "__main__":
    main()
