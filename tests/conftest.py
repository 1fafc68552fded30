"""Shared fixtures for the core tests: a couple of small real tools."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel, Field

import toolenv


class Add(toolenv.Tool):
    """Add two integers."""

    name = "add"

    class Args(BaseModel):
        a: int = Field(description="first addend")
        b: int = Field(description="second addend")

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        return toolenv.ToolResult(text=str(args.a + args.b))


class Sleep(toolenv.Tool):
    """Sleep for a while, then answer."""

    name = "sleep"

    class Args(BaseModel):
        seconds: float = Field(ge=0, le=60)

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        await asyncio.sleep(args.seconds)
        return toolenv.ToolResult(text=f"slept {args.seconds}")


class Meet(toolenv.Tool):
    """Answer `met` once `n` calls are in flight together, `alone` if they never all arrive.

    Shows calls overlap without timing them: run one after another, no call ever meets
    the others (the first gives up after 10 s, and lets the rest answer at once).
    """

    name = "meet"

    class Args(BaseModel):
        pass

    def __init__(self, n: int) -> None:
        super().__init__(timeout=60)
        self.n, self.started = n, 0
        self.all_in = asyncio.Event()

    async def run(self, args: BaseModel, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        self.started += 1
        if self.started >= self.n:
            self.all_in.set()
        try:
            await asyncio.wait_for(self.all_in.wait(), 10)
        except asyncio.TimeoutError:  # not TimeoutError on Python 3.10
            self.all_in.set()
            return toolenv.ToolResult(text="alone")
        return toolenv.ToolResult(text="met" if self.started >= self.n else "alone")


@pytest.fixture
def add_tool() -> Add:
    return Add()


@pytest.fixture
def sleep_tool() -> Sleep:
    return Sleep()


TASKS = [
    {"id": "t1", "question": "2+3?", "answer": "5"},
    {"id": "t2", "question": "10+4?", "answer": "14"},
    {"id": "t3", "question": "Capital of France?", "answer": ["Paris", "paris, france"]},
]


def calc_env(**kw: Any) -> toolenv.ToolEnv:
    """An env of `Add` over `TASKS` (hermes calls, exact-match reward, 8 turns unless told), as
    the integration tests register it under their own ids."""
    kw.setdefault("max_turns", 8)
    kw.setdefault("parser", "hermes")
    return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, reward="exact_match", **kw)
