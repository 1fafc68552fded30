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
    import toolenv
    import toolenv.integrations.verl as verl

    page = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: ([\w.]+)$", page, re.M))
    packages = {d for d in documented if d.count(".") == 1}  # whole packages: their own __all__
    missing = [
        f"{prefix}.{name}"
        for prefix, names in (("toolenv", toolenv.__all__), ("toolenv.integrations.verl", verl.__all__))
        for name in names
        if name != "__version__"
        and not any(d.endswith(f".{name}") for d in documented)
        and not any(name in importlib.import_module(p).__all__ for p in packages)
    ]
    assert not missing, f"public names missing from docs/api.md: {missing}"
