"""A Muse Glimmer style episode: the `muse_glimmer` parser reads ATEM calls addressed to a tool.

Run it:  python examples/muse_glimmer_example.py

The prompt is the template's tool section, word for word, with its list of valid recipients.
Each reply starts inside the header the generation prompt opened (`<|start|>assistant`): a
message `to=self` is reasoning (kept in the turn's text, never read for calls), a message to a
tool holds an `<atem:function_calls>` block, and a message `to=user` is the reply. Values are
read by the tool's argument types: `days` is an int, the city stays text. The second turn calls
`max_of.max_of`, as the prompt's `"max_of.*"` recipient invites: bound to the env's tools, the
parser reads it as `max_of`. A trainer must decode these replies with `skip_special_tokens=False`
(the parser's `special_tokens` is True).
"""

from __future__ import annotations

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv

FORECASTS = {"paris": [18, 21, 17], "lyon": [22, 24, 20]}


class Forecast(toolenv.Tool):
    """The forecast high, in degrees Celsius, for the next days in a city."""

    name = "forecast"

    class Args(BaseModel):
        city: str = Field(description="the city")
        days: int = Field(default=1, description="how many days ahead, from tomorrow")

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, Forecast.Args)
        highs = FORECASTS.get(args.city.lower())
        if highs is None:
            return toolenv.ToolResult.error(f"no forecast for {args.city!r}")
        return toolenv.ToolResult(text=", ".join(map(str, highs[: args.days])))


class MaxOf(toolenv.Tool):
    """The largest of some numbers."""

    name = "max_of"

    class Args(BaseModel):
        values: list[float] = Field(description="the numbers")

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, MaxOf.Args)
        return toolenv.ToolResult(text=f"{max(args.values):g}")


def call(name: str, **values: str) -> str:
    """One call message as Muse Glimmer's template writes it (values as written text)."""
    params = "".join(f'<atem:parameter name="{k}">{v}</atem:parameter>\n' for k, v in values.items())
    return (
        f'<|start|>assistant to={name}<|message|><atem:function_calls>\n<atem:invoke name="{name}">\n'
        f"{params}</atem:invoke>\n</atem:function_calls>"
    )


TURNS = [
    # Reasoning, then a call (the server stopped on <|eot|>, so the reply does not hold it).
    " to=self<|message|>I need the next two days in Paris.<|eom|>" + call("forecast", city="Paris", days="2"),
    # A doubled name, as the recipient list invites it.
    " to=self<|message|>18 and 21: which is higher?<|eom|>" + call("max_of.max_of", values="[18, 21]"),
    " to=self<|message|>21.<|eom|><|start|>assistant to=user<|message|>The warmer day reaches <answer>21</answer> °C.",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Forecast(), MaxOf()],
        tasks=[{"question": "How warm will the warmer of the next two days in Paris be?", "answer": "21"}],
        parser="muse_glimmer",
        max_turns=4,
    )
    obs, _ = env.reset(seed=0)
    print(obs)
    for turn in TURNS:
        obs, reward, terminated, truncated, info = env.step(turn)
        for c in info["action"].tool_calls:
            print(f"--- {c.id}: {c.name}({c.arguments!r})")
        print(f"--- text: {info['action'].text!r}")
        print(f"--- observation: {obs!r}")
    print(f"reward={reward} terminated={terminated} answer={info['answer']!r}")
    env.close()


if __name__ == "__main__":
    main()
