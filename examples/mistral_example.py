"""A Mistral style episode: the `mistral` parser reads `[TOOL_CALLS]` in both of its layouts.

Run it:  python examples/mistral_example.py

The prompt lists the tools in `[AVAILABLE_TOOLS]`, as Mistral's templates do. The first turn
calls a tool the way v11+ models write it (Mistral Small 3.2, Magistral, Devstral), the second
the way v3 models do (a JSON list, Mistral 7B v0.3); both end with the `</s>` a decode with
special tokens keeps. Results come back as `[TOOL_RESULTS]` blocks carrying each call's id.
"""

from __future__ import annotations

from typing import Literal

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv
from toolenv.parsers.mistral import MistralParser


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
    # v11+: name, [ARGS], JSON arguments; no id given, so the parser numbers the call.
    'I will convert 100 C first.[TOOL_CALLS]convert[ARGS]{"value": 100, "to": "F"}</s>',
    # v3: a JSON list of calls; the model's 9-character id is kept.
    '[TOOL_CALLS] [{"name": "convert", "arguments": {"value": 212, "to": "C"}, "id": "a1b2c3d4e"}]</s>',
    "100 C is 212 F, and back again. <answer>212</answer></s>",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Convert()],
        tasks=[{"question": "What is 100 degrees Celsius in Fahrenheit?", "answer": "212"}],
        parser=MistralParser(),
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
