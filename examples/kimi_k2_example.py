"""A Kimi K2 style episode: the `kimi_k2` parser reads Moonshot's special-token tool calls.

Run it:  python examples/kimi_k2_example.py

The prompt declares the tools as a JSON list, as Kimi's chat template does. The first turn
reasons (as K2-Thinking does), then calls a tool inside `<|tool_calls_section_begin|>`; each
call's id is `functions.NAME:INDEX`, and the env keeps it as the call's id. The second turn
makes two calls at once. Each result comes back as the template writes a tool message:
`## Return of <id>` in a turn of its own. A trainer must decode these replies with
`skip_special_tokens=False` (the parser's `special_tokens` is True).
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


TURNS = [
    # K2-Thinking: reasoning, a line of text, then one call in the tool-calls section.
    "<think>I should convert 100 C to F.</think>Converting."
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.convert:0<|tool_call_argument_begin|>"
    '{"value": 100, "to": "F"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>',
    # Two calls in one turn, numbered 0 and 1.
    "<|tool_calls_section_begin|>"
    '<|tool_call_begin|>functions.convert:0<|tool_call_argument_begin|>{"value": 212, "to": "C"}<|tool_call_end|>'
    '<|tool_call_begin|>functions.convert:1<|tool_call_argument_begin|>{"value": 0, "to": "F"}<|tool_call_end|>'
    "<|tool_calls_section_end|><|im_end|>",
    "100 C is 212 F, and back again. <answer>212</answer><|im_end|>",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Convert()],
        tasks=[{"question": "What is 100 degrees Celsius in Fahrenheit?", "answer": "212"}],
        parser="kimi_k2",
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
