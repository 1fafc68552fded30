"""The typed agent API (`toolenv.agent`): loading agents by name or `module:attr`."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolenv.agent import load_agent
from toolenv.registry import PluginError


def test_module_that_fails_on_import_is_a_plugin_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken `module:attr` agent raises PluginError naming it, like a broken entry point."""
    (tmp_path / "broken_agent_mod.py").write_text('raise RuntimeError("boom at import")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"broken_agent_mod:Echo.*RuntimeError: boom at import"):
        load_agent("broken_agent_mod:Echo")
