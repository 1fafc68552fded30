"""The documentation site builds with every page linked (mkdocs --strict), its API page says
where each name imports from, and the README's example runs as written."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import toolenv

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (it comes with the dev extra: pip install -e .[dev])")
    out = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = [p for p in pages if p not in nav]
    assert not missing, f"pages not in mkdocs.yml nav: {missing}"


def test_api_reference_covers_the_public_api() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: ([\w.]+)$", page, re.M))
    covered = {d.rsplit(".", 1)[-1] for d in documented}
    for package in (d for d in documented if d.count(".") <= 1):  # a whole package: the names in its __all__
        covered.update(getattr(importlib.import_module(package), "__all__", ()))
    public = {
        package: importlib.import_module(package).__all__
        for package in (
            "toolenv",
            "toolenv.integrations.verl",
            "toolenv.integrations.trl",
            "toolenv.integrations.skyrl",
            "toolenv_search",
            "toolenv_sql",
            "toolenv_code",
            "toolenv_mcp",
        )
    }
    missing = [f"{p}.{n}" for p, names in public.items() for n in names if n != "__version__" and n not in covered]
    assert not missing, f"public names missing from docs/api.md: {missing}"
    from toolenv.registry import entries

    agents = {e.load().__name__ for e in entries("agents")}
    assert agents <= covered, f"agent plugins missing from docs/api.md: {sorted(agents - covered)}"


def test_api_reference_headings_say_where_to_import_from() -> None:
    """docs/api.md says its names import from `toolenv` unless the heading or the section names a
    module: an object that `toolenv` does not export must show its full path in its heading."""
    page = (ROOT / "docs" / "api.md").read_text()
    section, wrong = "", []
    for block in re.split(r"\n(?=## |::: )", page):
        if block.startswith("## "):
            section = block.splitlines()[0]
        if not block.startswith("::: toolenv.") or section in ("## verl", "## TRL", "## SkyRL", "## Plugins"):
            continue  # those sections name the package to import from
        path = block.split()[1]
        if _is_module(path):
            continue  # a module: its heading names it
        if path.rpartition(".")[2] not in toolenv.__all__ and "show_root_full_path: true" not in block:
            wrong.append(path)
    assert not wrong, f"shown as if importable from toolenv, but it is not: {wrong}"


def _is_module(path: str) -> bool:
    """Whether the dotted `path` names a module (else an object inside one)."""
    try:
        importlib.import_module(path)
    except ImportError:
        return False
    return True


def test_readme_snippet_runs_as_written() -> None:
    """The README's "In twenty lines" example runs against the current API and does what its
    comments say."""
    readme = (ROOT / "README.md").read_text()
    (code,) = re.findall(r"^```python\n(.*?)^```", readme, re.M | re.S)
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)
    env = scope["env"]
    assert isinstance(env, gym.Env) and isinstance(env.unwrapped, toolenv.ToolEnv)
    try:
        assert scope["reward"] == 1.0 and scope["terminated"] is True and scope["truncated"] is False
        episode = env.unwrapped.episode
        assert episode is not None and episode.turns[0].observation == "<tool_response>\n5\n</tool_response>"
    finally:
        env.close()
