"""A Qwen3-Coder style episode: XML tool calls whose arguments are raw text.

Run it:  python examples/qwen3_xml_example.py

The env binds the `qwen3_xml` parser to its tools, so each `<parameter=...>` is read by the
tool's argument types: the SQL stays text exactly as written (quotes, `<`, new lines),
`limit` becomes an int.
"""

from __future__ import annotations

import sqlite3

import gymnasium as gym
from pydantic import BaseModel, Field

import toolenv

DB = sqlite3.connect(":memory:")
DB.executescript(
    "CREATE TABLE singer(name TEXT, age INT); INSERT INTO singer VALUES ('Ann', 31), ('Bo', 25), ('Cy', 40);"
)


class RunSQL(toolenv.Tool):
    """Run a read-only SQL query on the singers database."""

    name = "run_sql"

    class Args(BaseModel):
        query: str = Field(description="one SELECT statement")
        limit: int = Field(default=10, description="rows to return at most")

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, RunSQL.Args)
        rows = DB.execute(args.query).fetchmany(args.limit)
        return toolenv.ToolResult(text="\n".join(", ".join(map(str, r)) for r in rows))


TURNS = [
    "I'll list the singers over 30.\n"
    "<tool_call>\n<function=run_sql>\n"
    "<parameter=query>\nSELECT name FROM singer\nWHERE age > 30 AND name <> 'Bo'\nORDER BY name\n</parameter>\n"
    "<parameter=limit>\n5\n</parameter>\n"
    "</function>\n</tool_call>",
    "Two singers are over 30: <answer>2</answer>",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[RunSQL()],
        tasks=[{"question": "How many singers are older than 30?", "answer": "2"}],
        parser="qwen3_xml",
    )
    obs, _ = env.reset(seed=0)
    print(obs)
    for turn in TURNS:
        obs, reward, terminated, truncated, info = env.step(turn)
        for call in info["action"].tool_calls:
            print(f"--- {call.name}({call.arguments!r})")
        print(f"--- observation: {obs!r}")
    print(f"reward={reward} terminated={terminated}")
    env.close()


if __name__ == "__main__":
    main()
