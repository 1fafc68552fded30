"""Tool plugin errors a plugin author or user hits: arguments for a function tool, a duplicate name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN = """
import toolenv

@toolenv.tool
def crunch(n: int) -> str:
    \"\"\"Crunch a number.\"\"\"
    return str(n * 2)
"""


def _dist(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """Two distributions: one advertises the function tool `crunch`, both the tool `twin`."""
    (tmp_path / "h8crunch.py").write_text(PLUGIN)
    (tmp_path / "h8twin.py").write_text(PLUGIN)
    _dist(tmp_path, "h8crunch", "[toolenv.tools]\ncrunch = h8crunch:crunch\ntwin = h8crunch:crunch\n")
    _dist(tmp_path, "h8twin", "[toolenv.tools]\ntwin = h8twin:crunch\n")
    return tmp_path


def _errors(site: Path, code: str) -> dict[str, str]:
    paths = [str(site), os.environ.get("PYTHONPATH", "")]
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_arguments_for_a_function_tool_plugin_point_at_tool_limits(site: Path) -> None:
    res = _errors(
        site,
        """
        import json
        from toolenv.registry import PluginError, load_tool
        try:
            load_tool("crunch", timeout=2)
        except PluginError as e:
            print(json.dumps({"err": str(e)}))
        """,
    )
    assert "'crunch' is a ready-made tool instance: it takes no arguments (got timeout)" in res["err"]
    assert "tool_limits" in res["err"] and "\n" not in res["err"]


def test_a_tool_name_two_distributions_claim_suggests_their_references(site: Path) -> None:
    res = _errors(
        site,
        """
        import json
        from toolenv.registry import PluginError, load_tool
        try:
            load_tool("twin")
        except PluginError as e:
            print(json.dumps({"err": str(e)}))
        """,
    )
    assert "provided by 2 distributions" in res["err"]
    assert "name the one you mean as 'module:Name': 'h8crunch:crunch' or 'h8twin:crunch'" in res["err"]
