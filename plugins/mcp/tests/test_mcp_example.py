"""The example script runs end to end in a fresh interpreter, and leaves no server process behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mcp_example.py"


def test_mcp_example_runs() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "tools: ['price', 'multiply']" in out
    assert "<tool_response>\n2.25\n</tool_response>" in out
    assert "no item 'caviar'; the shop sells apple, bread, cheese, eggs, milk, rice" in out
    assert "Invalid arguments for tool 'multiply': a: '2.25' is not of type 'number'. Expected arguments: a, b." in out
    assert "<tool_response>\n6.75\n</tool_response>" in out
    assert "reward=1.0 terminated=True" in out
    assert "gym.make tools: ['shop__price', 'shop__multiply']" in out
    assert "shop__price(milk) -> <tool_response>\n1.1\n</tool_response>" in out
