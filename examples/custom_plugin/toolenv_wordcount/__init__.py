"""An example third-party plugin: one tool and one env, registered through entry points."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import toolenv


class WordCount(toolenv.Tool):
    """Count the words in a text."""

    name = "word_count"

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        text: str = Field(description="the text to count", max_length=100_000)

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        assert isinstance(args, WordCount.Args)
        return toolenv.ToolResult(text=str(len(args.text.split())))


SENTENCES = ["the quick brown fox", "jumps over the lazy dog today", "hello"]


def make_env(**overrides: Any) -> toolenv.ToolEnv:
    """`toolenv/WordCount-v0`: count the words of a sentence, with the tool's help."""
    tasks = [
        {"id": str(i), "question": f"How many words are in: {s!r}?", "answer": str(len(s.split()))}
        for i, s in enumerate(SENTENCES)
    ]
    kwargs: dict[str, Any] = {"tools": [WordCount()], "tasks": tasks, "max_turns": 3, **overrides}
    return toolenv.ToolEnv(**kwargs)
