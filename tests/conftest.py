"""Shared fixtures for the core tests: a couple of small real tools."""

from __future__ import annotations

import asyncio

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
