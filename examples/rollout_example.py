"""Roll an agent out on a small env, then write the HTML report.

Run it:  python examples/rollout_example.py [OUT_DIR]

The env has three tools — `add` (text), `lookup` (a table, like SQL results) and
`swatch` (an image) — and a scripted agent that solves every task. The same
module works from the command line, since importing it registers the env id
`rollout_example/Calc-v0` with Gymnasium:

    PYTHONPATH=examples toolenv rollout rollout_example:rollout_example/Calc-v0 \
        --agent rollout_example:ScriptedAgent -n 4 --out runs/calc --images files --episode-timeout 60
    toolenv view runs/calc
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv
from toolenv import tool
from toolenv.agent import AgentAction, EnvInfo

ENV_ID = "rollout_example/Calc-v0"
PRICES = {"apple": 3, "pear": 5, "plum": 2}
COLORS = {"red": (220, 40, 40), "green": (40, 160, 60), "blue": (40, 80, 220)}


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour PNG, encoded with zlib so the example needs no imaging library."""
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


class Lookup(toolenv.Tool):
    """Look up the fruit price table."""

    name = "lookup"

    class Args(BaseModel):
        fruit: str = Field(description="a fruit name, or * for every row")

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        rows = [[k, v] for k, v in PRICES.items() if args.fruit in ("*", k)]
        if not rows:
            return toolenv.ToolResult.error(f"no fruit named {args.fruit!r}; known: {', '.join(PRICES)}")
        text = "\n".join(f"{k}\t{v}" for k, v in rows)
        return toolenv.ToolResult(text=text, metadata={"columns": ["fruit", "price"], "rows": rows})


class Swatch(toolenv.Tool):
    """Show a colour swatch."""

    name = "swatch"

    class Args(BaseModel):
        color: str

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        rgb = COLORS.get(args.color)
        if rgb is None:
            return toolenv.ToolResult.error(f"unknown colour {args.color!r}")
        image = toolenv.ToolImage(data=png(24, 16, rgb), width=24, height=16)
        return toolenv.ToolResult(text=f"a {args.color} swatch", images=[image])


TASKS = [
    {"id": "sum-1", "question": "What is 2 + 3?", "answer": "5", "context": {"call": ["add", {"a": 2, "b": 3}]}},
    {"id": "sum-2", "question": "What is 10 + 4?", "answer": "14", "context": {"call": ["add", {"a": 10, "b": 4}]}},
    {
        "id": "price",
        "question": "What does a pear cost?",
        "answer": "5",
        "context": {"call": ["lookup", {"fruit": "pear"}]},
    },
    {
        "id": "color",
        "question": "Show blue; what colour is it?",
        "answer": "blue",
        "context": {"call": ["swatch", {"color": "blue"}]},
    },
]


def make_env(**overrides: Any) -> toolenv.ToolEnv:
    """The example env; keyword overrides go to ToolEnv (max_turns, tasks, reward...)."""
    kwargs: dict[str, Any] = {
        "tools": [add, Lookup(), Swatch()],
        "tasks": TASKS,
        "max_turns": 3,
        "task_order": "sequential",
    }
    kwargs.update(overrides)
    return toolenv.ToolEnv(**kwargs)


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=make_env)


class ScriptedAgent(toolenv.Agent):
    """Calls the tool named in the task's context, then answers with the gold answer."""

    name = "scripted"

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> AgentAction:
        task = env_info.task
        if env_info.turn == 0 and "call" in task.context:
            name, args = task.context["call"]
            return AgentAction(text=f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>")
        return AgentAction(text=f"<answer>{task.answers[0]}</answer>")


def main(out: Path) -> int:
    result = toolenv.rollout(
        ENV_ID,
        ScriptedAgent(),
        concurrency=2,
        out=out,
        overwrite=True,
        images="files",  # the swatch PNG goes to OUT/images/ once; the JSON line names the file
        episode_timeout=60.0,  # an episode still running after a minute is stopped and recorded as an error
    )
    from toolenv.report import build_report
    from toolenv.report.console import print_summary

    print_summary(result.summary)
    page = build_report(out)
    print(f"mean reward {result.summary.mean_reward:.2f} over {result.summary.episodes} episodes; report: {page}")
    return 0 if result.summary.success_rate == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "calc"))
