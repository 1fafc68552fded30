"""Small tools the tests of several packages share (tests/ is on pytest's `pythonpath`)."""

from __future__ import annotations

from pydantic import BaseModel

import toolenv


class Add(toolenv.Tool):
    """Add two integers."""

    name = "add"

    class Args(BaseModel):
        a: int
        b: int

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        return toolenv.ToolResult(text=str(args.a + args.b))
