"""The documentation site builds with every page linked (mkdocs --strict)."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
