"""Rollouts to fine-tuning data: keep the episodes that succeeded, write them as chat JSONL.

A scripted agent plays two arithmetic tasks with a calculator tool and gets one wrong;
`toolenv.export_chat` keeps the success and writes it in the OpenAI chat layout
(`{"messages": [...], "tools": [...], "metadata": {...}}`), ready for an SFT trainer.
The same from the shell: `toolenv export RUN_DIR --out sft.jsonl --success-only`.

Run: python examples/export_example.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import toolenv
from toolenv.agent import Agent, EnvInfo

TASKS = [
    {"id": "sum", "question": "What is 19 + 23?", "answer": "42"},
    {"id": "product", "question": "What is 6 * 9?", "answer": "54"},
]


@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


class AlwaysAdds(Agent):
    """Adds the two numbers of the question, then answers with the sum (wrong for the product)."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        a, b = (int(w) for w in env_info.task.question.rstrip("?").split() if w.isdigit())
        if env_info.turn == 0:
            return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
        return f"The answer is <answer>{a + b}</answer>"


def make_env() -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[add], tasks=TASKS, max_turns=3)


def main() -> None:
    out = Path(tempfile.mkdtemp())
    result = toolenv.rollout(make_env, AlwaysAdds(), out=out / "run")
    print("episodes:", sorted((t.task.id, t.success) for t in result.trajectories))
    kept = toolenv.export_chat(
        result.trajectories, out / "sft.jsonl", success_only=True, tools=make_env().tool_schemas()
    )
    line = json.loads((out / "sft.jsonl").read_text().splitlines()[0])
    print(f"kept {kept} of {len(result.trajectories)}: task {line['metadata']['task_id']}")
    for m in line["messages"][2:]:
        print(f"  {m['role']:>9}: {m['content']!r}")


if __name__ == "__main__":
    main()
