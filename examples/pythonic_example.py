"""A Llama 3.2 / Llama 4 style episode: tool calls written as a Python list of calls.

Run it:  python examples/pythonic_example.py

The model writes `[name(param=value, ...)]` with Python literals as values. The first turn
makes two calls in one list, as Llama 3.2 writes them; the second wraps its list in Llama 4's
`<|python_start|>`/`<|python_end|>` markers and passes a list literal; the third answers.
"""

from __future__ import annotations

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers.pythonic import PythonicParser

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
    '[population(city="Paris"), population(city="Lyon")]',
    "<|python_start|>[add(numbers=[2102650, 513275])]<|python_end|>",
    "Paris and Lyon have 2615925 inhabitants together. <answer>2615925</answer>",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Population(), Add()],
        tasks=[{"question": "How many people live in Paris and Lyon together?", "answer": "2615925"}],
        parser=PythonicParser(),
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
