"""A GLM-4.5/4.6 style episode: `<arg_key>`/`<arg_value>` tool calls after the model's reasoning.

Run it:  python examples/glm45_example.py

The env binds the `glm45` parser to its tools, so each `<arg_value>` is read by the tool's
argument types: the SQL stays text exactly as written (quotes, `<`, new lines), `limit`
becomes an int. The `<think>` block is reasoning: kept in the turn's text, never read as a
call, and the reply ends at `<|observation|>`, where GLM waits for the results.
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
    "<think>I should list the singers over 30 with <tool_call>run_sql</tool_call>.</think>\n"
    "<tool_call>run_sql\n"
    "<arg_key>query</arg_key>\n<arg_value>SELECT name FROM singer\nWHERE age > 30 AND name <> 'Bo'\n"
    "ORDER BY name</arg_value>\n"
    "<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n"
    "</tool_call><|observation|>",
    "<think>Ann and Cy.</think>\nTwo singers are over 30: <answer>2</answer><|user|>",
]


def main() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[RunSQL()],
        tasks=[{"question": "How many singers are older than 30?", "answer": "2"}],
        parser="glm45",
    )
    obs, _ = env.reset(seed=0)
    print(obs)
    for turn in TURNS:
        obs, reward, terminated, truncated, info = env.step(turn)
        for call in info["action"].tool_calls:
            print(f"--- {call.id} {call.name}({call.arguments!r})")
        print(f"--- text: {info['action'].text!r}")
        print(f"--- observation: {obs!r}")
    print(f"reward={reward} terminated={terminated} answer={info['action'].answer!r}")
    env.close()


if __name__ == "__main__":
    main()
