"""A DeepSeek style episode: the `deepseek_v3` parser reads DeepSeek-V3's and V3.1's tool calls.

Run it:  python examples/deepseek_example.py

The prompt lists the tools the way DeepSeek-V3.1's model card does. The first turn reasons,
then calls a tool the way DeepSeek-V3 (and R1) write it: `function`, the name, and the
arguments in a fenced JSON block, between special-token markers. The second calls it the way
V3.1 does (no type, no fence). Results come back in `<｜tool▁output▁begin｜>` blocks, as the
template writes tool messages. A trainer must decode these replies with
`skip_special_tokens=False` (the parser's `special_tokens` is True).
"""

from __future__ import annotations

import io
import sys
from typing import Literal

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv


class Convert(toolenv.Tool):
    """Convert a temperature between Celsius and Fahrenheit."""

    name = "convert"

    class Args(BaseModel):
        value: float = Field(description="the temperature to convert")
        to: Literal["C", "F"] = Field(description="the unit to convert to")

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, Convert.Args)
        out = args.value * 9 / 5 + 32 if args.to == "F" else (args.value - 32) * 5 / 9
        return toolenv.ToolResult(text=f"{out:g} {args.to}")


TURNS = [
    # DeepSeek-V3 / R1: reasoning the prompt opened, then a call with its name on a line and fenced JSON.
    "I should convert 100 C.</think>"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>convert\n"
    '```json\n{"value": 100, "to": "F"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
    # DeepSeek-V3.1: the name, then the JSON arguments.
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>convert<｜tool▁sep｜>{"value": 212, "to": "C"}<｜tool▁call▁end｜>'
    "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
    "100 C is 212 F, and back again. <answer>212</answer><｜end▁of▁sentence｜>",
]


def main() -> None:
    if isinstance(sys.stdout, io.TextIOWrapper):  # the markers are not ASCII: print them on any console
        sys.stdout.reconfigure(errors="backslashreplace")
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Convert()],
        tasks=[{"question": "What is 100 degrees Celsius in Fahrenheit?", "answer": "212"}],
        parser="deepseek_v3",
        max_turns=4,
    )
    obs, _ = env.reset(seed=0)
    print(obs)
    for turn in TURNS:
        obs, reward, terminated, truncated, info = env.step(turn)
        calls = [(c.name, c.arguments, c.id) for c in info["action"].tool_calls]
        print(f"--- calls: {calls} observation: {obs!r}")
    print(f"reward={reward} terminated={terminated} answer={info['answer']!r}")
    env.close()


if __name__ == "__main__":
    main()
