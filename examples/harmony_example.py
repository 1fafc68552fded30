"""A gpt-oss style episode: the Harmony parser reads channels and function recipients.

Run it:  python examples/harmony_example.py

The prompt lists the tools as Harmony's TypeScript `namespace functions`; the model's
turns are Harmony messages (reasoning in `analysis`, a call in `commentary` addressed
`to=functions.NAME`, the answer in `final`); results come back as tool messages.
"""

from __future__ import annotations

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


# Two model turns as gpt-oss writes them (the server may drop the <|call|> stop token; both parse).
TURNS = [
    "<|channel|>analysis<|message|>I should convert 100 C to F.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.convert <|constrain|>json<|message|>{"value": 100, "to": "F"}'
    "<|call|>",
    "<|channel|>analysis<|message|>The tool says 212 F.<|end|>"
    "<|start|>assistant<|channel|>final<|message|><answer>212</answer><|return|>",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Convert()],
        tasks=[{"question": "What is 100 degrees Celsius in Fahrenheit?", "answer": "212"}],
        parser="harmony",
        max_turns=4,
    )
    obs, _ = env.reset(seed=0)
    print(obs)
    for turn in TURNS:
        obs, reward, terminated, truncated, info = env.step(turn)
        print(f"--- calls: {[c.name for c in info['action'].tool_calls]} observation: {obs!r}")
    print(f"reward={reward} terminated={terminated} answer={info['answer']!r}")
    env.close()


if __name__ == "__main__":
    main()
