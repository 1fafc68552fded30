"""The documented example runs as a script and reports the oracle's full reward over both backends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "search_example.py"


def test_search_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert out.returncode == 0, out.stderr
    assert "bm25 oracle reward: 1.0" in out.stdout
    assert "http oracle reward: 1.0" in out.stdout
    assert "<information>Doc 1(Title: " in out.stdout
