"""The built wheels hold everything the code reads at run time.

The suite and dev.py install every distribution editable, so all tests read data straight
from the checkout: a data file, licence or asset left out of a wheel by its `package-data`
patterns would go unnoticed until a user installs a built distribution. Here the seven
wheels are built offline from a copy of the working tree, their contents are compared
with the files git tracks under each package (all of them: data, licences, assets,
markers, and the modules too, so a subpackage left out shows), and, installed together with
`pip install --target`, they run every shipped env with its oracle and render a report
in a subprocess that imports them (not the editable checkout).
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).with_name("_wheel_probe.py")


@dataclass(frozen=True)
class Dist:
    """One distribution of the workspace: its folder (as dev.py lists it) and import package."""

    name: str
    folder: str
    package: str

    @property
    def wheel_prefix(self) -> str:
        return self.name.replace("-", "_") + "-"


DISTS = [
    Dist("toolenv", ".", "toolenv"),
    Dist("toolenv-agents", "agents", "toolenv_agents"),
    Dist("toolenv-code", "plugins/code", "toolenv_code"),
    Dist("toolenv-mcp", "plugins/mcp", "toolenv_mcp"),
    Dist("toolenv-search", "plugins/search", "toolenv_search"),
    Dist("toolenv-sql", "plugins/sql", "toolenv_sql"),
    Dist("toolenv-vision", "plugins/vision", "toolenv_vision"),
]
# Files tracked under a package folder that deliberately stay out of its wheel, as
# "folder/path/in/package": none today. Add one only with a comment saying why users never need it.
NOT_SHIPPED: frozenset[str] = frozenset()
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".mypy_cache", ".ruff_cache")


def _build_blocker() -> str | None:
    """Why wheels cannot be built offline with this interpreter, or None when they can."""
    if importlib.util.find_spec("pip") is None:
        return f"pip is not installed in {sys.prefix}"
    try:  # its metadata, not an import: importing setuptools here would swap distutils under pytest
        version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return f"setuptools (the build backend) is not installed in {sys.prefix}"
    if int(version.split(".")[0]) < 77:
        return f"setuptools {version} is older than the backend the pyproject files require (>=77)"
    return None


def _copy_sources(dist: Dist, dest: Path) -> Path:
    """The distribution's top-level files and package folder, without caches: setuptools
    builds in the source folder, and would leave `build/` there (whose stale files it
    then packs into later wheels) while other processes use the checkout."""
    src, out = ROOT / dist.folder, dest / dist.name
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    shutil.copytree(src / dist.package, out / dist.package, ignore=_IGNORED)
    return out


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run `cmd`; its stdout, or a failure showing both its outputs."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each distribution's wheel (by distribution name), built once, offline, without isolation."""
    blocker = _build_blocker()
    if blocker is not None:
        print(f"skipping the wheel tests: {blocker}")
        pytest.skip(f"cannot build wheels offline: {blocker}")
    tmp = tmp_path_factory.mktemp("wheels")
    sources = [_copy_sources(d, tmp / "src") for d in DISTS]
    out = tmp / "dist"
    _run(
        [
            *PIP,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--no-cache-dir",
            "-w",
            str(out),
            *map(str, sources),
        ]
    )
    built = {}
    for d in DISTS:
        found = sorted(out.glob(f"{d.wheel_prefix}*.whl"))
        assert len(found) == 1, f"expected one wheel of {d.name} in {sorted(p.name for p in out.iterdir())}"
        built[d.name] = found[0]
    return built


@pytest.fixture(scope="module")
def site(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All seven wheels installed into one plain folder (no editable finders, no .pth files)."""
    target = tmp_path_factory.mktemp("site")
    _run(
        [
            *PIP,
            "install",
            "--no-deps",
            "--no-index",
            "--no-cache-dir",
            "--target",
            str(target),
            *map(str, wheels.values()),
        ]
    )
    return target


def _tracked(dist: Dist) -> set[str]:
    """Files git tracks under the distribution's package folder (and still has on disk), as wheel paths."""
    base = ROOT / dist.folder
    try:
        proc = subprocess.run(
            ["git", "ls-files", "-z", "--", dist.package], cwd=base, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"git cannot list the tracked files of {dist.folder}: {exc}")
    return {
        f
        for f in proc.stdout.split("\0")
        if f and (base / f).is_file() and "__pycache__" not in f and ".egg-info" not in f
    }


def test_the_table_lists_every_workspace_distribution() -> None:
    spec = importlib.util.spec_from_file_location("_toolenv_dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    assert sorted(d.folder for d in DISTS) == sorted(dev.WORKSPACE)


@pytest.mark.parametrize("dist", DISTS, ids=[d.name for d in DISTS])
def test_the_wheel_holds_every_tracked_file_of_its_package(dist: Dist, wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels[dist.name]) as zf:
        names = set(zf.namelist())
    tracked = _tracked(dist)
    assert f"{dist.package}/__init__.py" in tracked and f"{dist.package}/py.typed" in tracked
    skipped = {p for p in NOT_SHIPPED if p.startswith(f"{dist.folder}/")}
    missing = sorted(f for f in tracked - names if f"{dist.folder}/{f}" not in skipped)
    assert not missing, f"{dist.name}'s wheel lacks files its package tracks (fix its package-data): {missing}"
    # Nothing else at the top: no tests, build leftovers or stray packages in users' site-packages.
    tops = {n.split("/", 1)[0] for n in names}
    infos = {t for t in tops if t.endswith(".dist-info")}
    assert len(infos) == 1 and next(iter(infos)).startswith(dist.wheel_prefix), infos
    assert tops - infos == {dist.package}


def test_the_core_wheel_carries_the_projects_licence(wheels: dict[str, Path]) -> None:
    """The Apache-2.0 text (`LICENSE`) goes with the core distribution, which the metadata of
    every distribution names."""
    core = next(d for d in DISTS if d.folder == ".")
    with zipfile.ZipFile(wheels[core.name]) as zf:
        texts = [n for n in zf.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert texts, "the core wheel has no LICENSE"
        assert zf.read(texts[0]) == (ROOT / "LICENSE").read_bytes()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()


def _wheel_entry_points(wheel: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
    with zipfile.ZipFile(wheel) as zf:
        info = next((n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")), None)
        if info is not None:
            parser.read_string(zf.read(info).decode())
    return parser


def test_the_installed_wheels_run_every_env_and_the_report(wheels: dict[str, Path], site: Path, tmp_path: Path) -> None:
    shipped: dict[str, set[str]] = {}
    for wheel in wheels.values():
        eps = _wheel_entry_points(wheel)
        for group in eps.sections():
            shipped.setdefault(group, set()).update(eps[group])
    assert shipped["toolenv.envs"], "no wheel ships an env"
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "TOOLENV_CACHE_DIR": str(tmp_path / "cache"),  # the BM25 index: never the user's cache
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    work = tmp_path / "work"  # neither the checkout nor the probe's folder is on sys.path
    work.mkdir()
    probe = shutil.copy(PROBE, work / PROBE.name)
    out = _run([sys.executable, str(probe), str(site), str(tmp_path / "runs")], cwd=work, env=env)
    result = json.loads(out.splitlines()[-1])
    where = Path(result["site"])

    # The wheels' copies are imported, not the checkout the editable installs point at ...
    assert set(result["modules"]) == {d.package for d in DISTS}
    for package, path in result["modules"].items():
        assert Path(path).is_relative_to(where), f"{package} was imported from {path}, not from the wheel"
    # ... and their metadata is what entry points are read from (the editable dist-infos in
    # the venv have the same names, and importlib.metadata keeps the first one on sys.path).
    for group, rows in result["entry_points"].items():
        assert sorted(n for n, _ in rows) == sorted(shipped.get(group, ())), group
        assert all(Path(folder) == where for _, folder in rows), rows

    # Every shipped env was made, reset and played to the end by its oracle, twice.
    assert set(result["envs"]) == shipped["toolenv.envs"]
    for name, played in result["envs"].items():
        assert played["done"] and played["reward"] == 1.0, (name, played)
        assert result["rollouts"][name] == [1.0], (name, result["rollouts"][name])
    page = Path(result["report"]).read_text(encoding="utf-8")
    for asset in ("report.css", "report.js"):
        assert (ROOT / "toolenv" / "report" / asset).read_text(encoding="utf-8").strip() in page, asset
    for name in shipped["toolenv.envs"]:
        assert name in page

    # The wheel's console script lists the plugins and runs their health reports.
    script = str(site / "bin" / "toolenv")
    listed = _run([script, "list"], cwd=work, env=env)
    assert all(name in listed for name in shipped["toolenv.envs"]), listed
    assert "code-sandbox" in _run([script, "doctor"], cwd=work, env=env)
