"""A small calculator tool and tasks, so the verl path runs without any plugin installed.

`toolenv verl-data toolenv/ToolEnv-v0 --env-kwargs '{"tools": ["toolenv.integrations.verl.demo:Calculator"],
"tasks": "tasks.jsonl"}'` trains on it; the tests and the docs' quick start use it too.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from pydantic import BaseModel, Field

from toolenv._ast import parse
from toolenv._tool import Tool, ToolContext
from toolenv.types import ToolResult

__all__ = ["DEMO_TASKS", "Calculator", "evaluate", "show"]

_OPS: dict[type[ast.AST], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expression: str) -> float:
    """Evaluate + - * / over numbers and parentheses (an AST walk: `eval` would run any code).

    Raises:
        ValueError: anything else in the expression, or division by zero.
    """
    try:
        tree = parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression ({exc.msg})") from None

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            return float(_OPS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](walk(node.operand)))
        raise ValueError(f"unsupported element {type(node).__name__}; use numbers, + - * / and parentheses")

    return walk(tree)


class Calculator(Tool):
    """Evaluate an arithmetic expression with + - * / and parentheses."""

    name = "calculator"

    class Args(BaseModel):
        expression: str = Field(description="The expression, e.g. '6 * 7'.", max_length=200)

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        try:
            value = evaluate(args.expression)
        except ValueError as exc:
            return ToolResult.error(f"Cannot evaluate {args.expression!r}: {exc}")
        return ToolResult(text=show(value), metadata={"value": value})


def show(value: float) -> str:
    """`value` as the model reads it: whole numbers in full (`83810205`, not `:g`'s `8.38102e+07`,
    which no gold answer matches), others to 12 significant digits (`0.3`, not `0.30000000000000004`)."""
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return f"{value:.12g}"


#: Tasks for ToolEnv-v0 with the calculator.
DEMO_TASKS: list[dict[str, Any]] = [
    {"id": "calc-0", "question": "What is 6 * 7?", "answer": "42"},
    {"id": "calc-1", "question": "What is (12 + 30) / 2?", "answer": "21"},
    {"id": "calc-2", "question": "What is 19 * 3 - 4?", "answer": "53"},
]
