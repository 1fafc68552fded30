"""The example script runs end to end in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sql_example.py"


def test_sql_example_runs() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "How many albums are there?" in out
    assert "347" in out
    assert "this is DELETE" in out
    assert "reward: 1.0" in out
    assert "bob      | 20" in out and "ann      | 13.75" in out
