"""A Llama 3.1/3.2/3.3 style episode: JSON tool calls, `{"name": ..., "parameters": {...}}`.

Run it:  python examples/llama3_json_example.py

The first turn calls two functions at once, after `<|python_tag|>` and separated by `;` (the
tag is optional: decoding with skip_special_tokens=True drops it, and the calls read the
same). Each result comes back as one `{"output": ...}` line, in call order.
"""

from __future__ import annotations

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers.llama3_json import Llama3JSONParser

TEMPERATURES = {"Paris": 21, "Oslo": 9}


class GetWeather(toolenv.Tool):
    """Current temperature in a city, in degrees Celsius."""

    name = "get_weather"

    class Args(BaseModel):
        city: str = Field(description="the city, e.g. Paris")

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, GetWeather.Args)
        if args.city not in TEMPERATURES:
            return toolenv.ToolResult.error(f"No weather for {args.city!r}; try one of {sorted(TEMPERATURES)}.")
        return toolenv.ToolResult(text=f"{TEMPERATURES[args.city]} C")


TURNS = [
    "I'll look up both cities.\n"
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eom_id|>',
    "Paris is 21 C and Oslo is 9 C, so Paris is warmer by <answer>12</answer> degrees.",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[GetWeather()],
        tasks=[{"question": "How many degrees warmer is Paris than Oslo right now?", "answer": "12"}],
        parser=Llama3JSONParser(),
    )
    obs, _ = env.reset(seed=0)
    print(obs)
    for turn in TURNS:
        obs, reward, terminated, truncated, info = env.step(turn)
        for call in info["action"].tool_calls:
            print(f"--- {call.id} {call.name}({call.arguments!r})")
        print(f"--- observation: {obs!r}")
    print(f"reward={reward} terminated={terminated} answer={info['answer']!r}")
    env.close()


if __name__ == "__main__":
    main()
