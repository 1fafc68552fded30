"""The demo data of `toolenv/MCP-v0`: a shop's prices, questions about them, and their oracle.

With no `servers`, `gym.make("toolenv/MCP-v0")` runs against `toolenv_mcp.demo_server` on
these tasks, so the env works out of the box (`toolenv check`, the rollout demo, the
reliability suite) and shows the whole MCP path: a real server process, typed arguments
checked against its schemas, two tool calls per task. The data are made up for the demo.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from toolenv import Task

__all__ = ["DEMO_SERVERS", "PRICES", "demo_tasks", "mcp_oracle"]

#: Unit prices in euros.
PRICES = {"apple": 0.5, "bread": 2.25, "cheese": 4.8, "eggs": 0.3, "milk": 1.1, "rice": 1.75}
_ORDERS = [
    ("bread", 3),
    ("apple", 7),
    ("cheese", 2),
    ("eggs", 12),
    ("milk", 4),
    ("rice", 5),
    ("cheese", 3),
    ("apple", 9),
]

#: The demo server, as an `mcpServers` config: this interpreter runs `toolenv_mcp.demo_server`.
DEMO_SERVERS: dict[str, Any] = {
    "mcpServers": {"shop": {"command": sys.executable, "args": ["-m", "toolenv_mcp.demo_server"]}}
}


def _total(item: str, quantity: int) -> float:
    return round(PRICES[item] * quantity, 10)  # what the server's `multiply` returns


def demo_tasks() -> list[Task]:
    """One question per order; the gold answers are the total as the tool writes it and as a person would."""
    tasks = []
    for item, quantity in _ORDERS:
        total = _total(item, quantity)
        answers = sorted({repr(total), f"{total:g}", f"{total:.2f}"})
        tasks.append(
            Task(
                id=f"{item}-{quantity}",
                question=f"How much do {quantity} units of {item} cost at the shop, in euros?",
                answer=answers,
                context={"item": item, "quantity": quantity},
            )
        )
    return tasks


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def mcp_oracle(task: Task, turn: int, observation: str) -> str:
    """Look the price up, multiply, answer (hermes format, the env's default)."""
    item, quantity = task.context["item"], task.context["quantity"]
    if turn == 0:
        return _call("price", item=item)
    if turn == 1:
        return _call("multiply", a=PRICES[item], b=quantity)
    return f"<answer>{_total(item, quantity):g}</answer>"
