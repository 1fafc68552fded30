"""The sandbox shows the system and the interpreter, not the host's own files.

The host's folders outside the system (homes, a project checkout and its `.git`, rollout logs
such as `runs/*/trajectories.jsonl`, training data, caches) hold reference solutions and gold
answers: code that can read them passes tasks without solving them (reward hacking a policy
finds). Each fork server lays an empty read-only tmpfs over every top-level folder of `/` that
is not part of the system and binds back, read-only, only the interpreter's own paths there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import toolenv_code
from toolenv_code import _confine, isolation_report
from toolenv_code.sandbox import SandboxLimits, SandboxPool, get_pool

PACKAGE = Path(toolenv_code.__file__).resolve().parent
DATA = PACKAGE / "data"
HUMANEVAL = DATA / "humaneval" / "HumanEval.jsonl"
ROOT_ONLY = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="namespaces are sure to be there as root (CI runs as root)"
)
SECRET = "host secret: the answer is 42"


def _checkout() -> Path | None:
    """The git checkout the package is imported from (an editable install), if any."""
    for folder in PACKAGE.parents:
        if (folder / ".git").exists():
            return folder
    return None


@pytest.fixture
def host_secrets() -> Iterator[list[str]]:
    """World-readable files in host folders outside the system: beside the checkout (or the
    interpreter's prefix) and under /var/tmp; removed afterwards."""
    near = _checkout() or Path(sys.prefix).resolve()
    bases = [str(near.parent)] + (["/var/tmp"] if os.access("/var/tmp", os.W_OK) else [])
    folders, files = [], []
    for base in dict.fromkeys(bases):
        if not os.access(base, os.W_OK) or base.startswith(("/tmp", "/dev/shm", "/run")):
            continue
        folder = tempfile.mkdtemp(prefix="toolenv-host-files-", dir=base)
        folders.append(folder)
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "secret.txt")
        Path(path).write_text(SECRET)
        os.chmod(path, 0o644)
        files.append(path)
    if not files:
        pytest.skip("no writable host folder outside the system to put a file in")
    yield files
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


_READ = r"""
import json, os
seen = {}
for path in PATHS:
    try:
        with open(path, "rb") as fh:
            seen[path] = fh.read(60).decode("utf-8", "replace")
    except OSError as exc:
        seen[path] = type(exc).__name__
print(json.dumps(seen))
"""


def _read_in_sandbox(paths: list[str], pool: SandboxPool | None = None, session: str | None = None) -> dict[str, str]:
    pool = pool or get_pool()
    result = pool.run(f"PATHS = {paths!r}\n" + _READ, SandboxLimits(timeout=20, cpu_seconds=10), session=session)
    assert result.ok, result.stderr[-2000:]
    seen: dict[str, str] = json.loads(result.stdout)
    return seen


@ROOT_ONLY
def test_a_file_in_a_host_folder_outside_the_system_is_not_readable(host_secrets: list[str]) -> None:
    """In a one-shot run and in a session; the host still reads it."""
    pool = get_pool()
    for session in (None, "host-files"):
        seen = _read_in_sandbox(host_secrets, pool, session)
        for path in host_secrets:
            assert seen[path] in ("FileNotFoundError", "PermissionError"), f"the sandbox read {path}: {seen[path]!r}"
    pool.close_session("host-files")
    assert all(Path(path).read_text() == SECRET for path in host_secrets)


_GIT = r"""
import json, os, subprocess
out = {"lexists": os.path.lexists(GIT), "through_proc": os.path.lexists("/proc/self/root" + GIT)}
try:
    out["listing"] = os.listdir(os.path.dirname(GIT))
except OSError as exc:
    out["listing"] = type(exc).__name__
try:
    done = subprocess.run(["git", "-c", "safe.directory=*", "--git-dir", GIT, "show", "HEAD:" + REL],
                          capture_output=True, text=True, timeout=20)
    out["git_show"] = done.stdout[:60]
except OSError as exc:  # no git in the sandbox: nothing to show
    out["git_show"] = ""
print(json.dumps(out))
"""


@ROOT_ONLY
def test_the_checkout_s_git_folder_is_not_reachable() -> None:
    """The reviewer's hack: `git show HEAD:.../HumanEval.jsonl` from the checkout's `.git`."""
    checkout = _checkout()
    if checkout is None:
        pytest.skip("the package is not imported from a git checkout")
    git = str(checkout / ".git")
    rel = str(HUMANEVAL.relative_to(checkout))
    result = get_pool().run(f"GIT, REL = {git!r}, {rel!r}\n" + _GIT, SandboxLimits(timeout=30, cpu_seconds=20))
    assert result.ok, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["lexists"] is False and out["through_proc"] is False, out
    assert out["git_show"] == "", out
    assert ".git" not in out["listing"], out


#: Every way to the bundled HumanEval file the code could try: the package as the import system
#: finds it (a setuptools editable finder's mapping included), /proc links to the fork server's
#: root and working directory, and a search of every non-system folder it can see.
_HUNT = r"""
import glob, importlib.util, json, os
found = {}
def attempt(label, path):
    try:
        with open(path, "rb") as fh:
            found[label] = fh.read(40).decode("utf-8", "replace")
    except OSError:
        pass
spec = importlib.util.find_spec("toolenv_code")
for loc in (spec.submodule_search_locations or []) if spec else []:
    attempt("spec:" + loc, os.path.join(loc, "data", "humaneval", "HumanEval.jsonl"))
for pid in SERVER_PIDS:
    attempt(f"proc-root:{pid}", f"/proc/{pid}/root" + HUMANEVAL)
    attempt(f"proc-cwd:{pid}", f"/proc/{pid}/cwd/" + REL_TO_CWD)
for label, path in (("real", HUMANEVAL), ("self-root", "/proc/self/root" + HUMANEVAL)):
    attempt(label, path)
for top in sorted(os.listdir("/")):
    if top in ("proc", "sys", "dev", "usr", "etc") or os.path.islink("/" + top):
        continue
    for folder, dirs, files in os.walk("/" + top):
        dirs[:] = [d for d in dirs if d not in ("__pycache__",)]
        for name in files:
            if name in ("HumanEval.jsonl", "mbpp.jsonl") or name.endswith(".pack"):
                attempt("walk:" + os.path.join(folder, name), os.path.join(folder, name))
print(json.dumps(found))
"""


@ROOT_ONLY
def test_the_bundled_humaneval_data_is_not_reachable_by_any_path() -> None:
    assert HUMANEVAL.is_file()
    pool = get_pool()
    pids = [int(stats["pid"]) for stats in pool.stats()]
    # What a process started in the checkout (the fork servers' working directory, if kept) would open.
    rel_to_cwd = os.path.relpath(HUMANEVAL, os.getcwd())
    code = f"HUMANEVAL, SERVER_PIDS, REL_TO_CWD = {str(HUMANEVAL)!r}, {pids!r}, {rel_to_cwd!r}\n" + _HUNT
    result = pool.run(code, SandboxLimits(timeout=120, cpu_seconds=100))
    assert result.ok, result.stderr[-2000:]
    found = json.loads(result.stdout)
    leaks = {label: text for label, text in found.items() if not label.endswith(".pack")}
    assert leaks == {}, f"the sandbox read the bundled data: {leaks}"
    assert not [label for label in found if label.endswith(".pack")], f"git packs reachable: {sorted(found)}"


_LEGIT = r"""
import json, locale, os, pwd, subprocess, sys, zoneinfo
import numpy, sympy
out = {
    "numpy": float(numpy.linalg.det(numpy.eye(3))),
    "sympy": str(sympy.factor(sympy.Symbol("x") ** 2 - 1)),
    "zone": str(zoneinfo.ZoneInfo("Europe/Paris")),
    "root_user": pwd.getpwuid(0).pw_name,
    "urandom": len(open("/dev/urandom", "rb").read(8)),
    "null": open("/dev/null", "w").write("x"),
    "locale": locale.setlocale(locale.LC_ALL, ""),
}
child = subprocess.run([sys.executable, "-c", "import numpy, json; print(json.dumps(numpy.arange(3).tolist()))"],
                       capture_output=True, text=True, timeout=60)
out["python_c"] = child.stdout.strip() or child.stderr[-300:]
print(json.dumps(out))
"""


def test_python_still_has_its_standard_library_packages_and_system_files() -> None:
    """What code legitimately needs: the stdlib, site-packages (numpy, sympy), /etc, /dev,
    the system's time zones, and the interpreter itself in a subprocess."""
    pytest.importorskip("numpy")
    pytest.importorskip("sympy")
    result = get_pool().run(_LEGIT, SandboxLimits(timeout=90, cpu_seconds=60))
    assert result.ok, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["numpy"] == 1.0 and out["sympy"] == "(x - 1)*(x + 1)"
    assert out["zone"] == "Europe/Paris" and out["root_user"] == "root"
    assert out["urandom"] == 8 and out["null"] == 1
    assert out["python_c"] == "[0, 1, 2]"


@ROOT_ONLY
def test_the_isolation_report_says_the_host_files_are_hidden() -> None:
    report = isolation_report()
    assert report.host_files == "hidden" and "host_files=hidden" in report.summary()


def test_a_source_root_on_sys_path_is_bound_back_as_its_importable_parts_only(tmp_path: Path) -> None:
    """A checkout root on `sys.path` (a legacy editable install, the package folder's parent)
    must not come back whole: its `.git`, logs and data would be in view again."""
    root = tmp_path / "checkout"
    (root / ".git").mkdir(parents=True)
    (root / "runs").mkdir()
    (root / "runs" / "trajectories.jsonl").write_text("{}")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "mod.py").write_text("")
    (root / "pyproject.toml").write_text("")
    assert _confine._importable_parts(str(root)) == [str(root / "mod.py"), str(root / "pkg")]
    only_code = tmp_path / "extra"  # nothing but importable things: it comes back whole
    only_code.mkdir()
    (only_code / "mod.py").write_text("")
    (only_code / "__pycache__").mkdir()
    assert _confine._importable_parts(str(only_code)) == [str(only_code)]


def test_the_host_folders_to_cover_keep_the_system() -> None:
    covers = _confine.host_covers()
    for kept in ("/usr", "/etc", "/dev", "/proc", "/sys", "/tmp", "/run", "/bin", "/lib"):
        assert kept not in covers
    for top in os.listdir("/"):
        path = "/" + top
        if os.path.isdir(path) and not os.path.islink(path) and top in ("home", "root", "opt", "srv", "var", "mnt"):
            assert path in covers, f"{path} stays in view"


@ROOT_ONLY
def test_files_at_the_top_of_the_host_tree_read_empty() -> None:
    """A container's description of itself (`/container_info.json`), an installer left there..."""
    files = [path for path in _confine.host_top_files() if os.path.getsize(path) > 0]
    if not files:
        pytest.skip("no non-empty file at the top of / here")
    seen = _read_in_sandbox(files)
    assert all(seen[path] == "" for path in files), seen
    assert all(os.path.getsize(path) > 0 for path in files)  # the host's are unchanged


def test_without_namespaces_the_report_says_the_host_files_are_visible(tmp_path: Path) -> None:
    """No mount namespace, nothing to cover the host's folders with: the report must say so."""
    path = Path(__file__).with_name("test_code_unprivileged.py")
    spec = importlib.util.spec_from_file_location("_unprivileged_for_host_files", path)
    assert spec is not None and spec.loader is not None
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    report = helpers._without_namespaces(helpers._REPORT, tmp_path)
    assert report["filesystem"] == "none" and report["host_files"] == "visible"


#: A client run by a venv that has toolenv_code installed as a wheel would (in its site-packages),
#: its dependencies from this environment's site-packages through a `.pth` line.
_WHEEL = """
import json, sys
import toolenv_code
from toolenv_code import isolation_report
from toolenv_code.sandbox import SandboxLimits, SandboxPool

pool = SandboxPool(size=1)
try:
    out = {
        "module": toolenv_code.__file__,
        "run": pool.run(sys.argv[1], SandboxLimits(timeout=20)).stdout,
        "numpy": pool.run("import numpy; print(numpy.__name__)", SandboxLimits(timeout=20)).stdout,
        "report": isolation_report(pool).model_dump(),
        "bound": pool.stats()[0]["isolation"]["exposed"],
    }
finally:
    pool.close()
print(json.dumps(out))
"""


@ROOT_ONLY
def _fake_plugin_with_data(site: Path) -> Path:
    """Another toolenv plugin installed in `site` (a package with a `data` folder and a
    `toolenv.envs` entry point), as a wheel installs one; its gold answers' file, resolved."""
    package = site / "toolenv_fakeplug"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    gold = package / "data" / "gold.jsonl"
    gold.write_text(SECRET)
    info = site / "toolenv_fakeplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toolenv-fakeplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[toolenv.envs]\nfakeplug/Fake-v0 = toolenv_fakeplug:make\n")
    return gold.resolve()


def test_a_wheel_install_in_a_host_folder_has_its_data_hidden_and_the_rest_of_the_folder_too() -> None:
    """The package in a venv's site-packages, the venv in a host folder outside the system:
    the venv comes back (the code imports from it), its data folder and the venv's neighbours do not."""
    import subprocess
    import sysconfig

    near = _checkout() or Path(sys.prefix).resolve()
    # Beside the checkout, else /var/tmp (a CI clone lies under /tmp, which the sandbox covers anyway).
    usable = [
        base
        for base in (str(near.parent), "/var/tmp")
        if os.access(base, os.W_OK) and not base.startswith(("/tmp", "/dev/shm", "/run"))
    ]
    if not usable:
        pytest.skip("no writable host folder outside the system for a venv")
    folder = Path(tempfile.mkdtemp(prefix="toolenv-wheel-", dir=usable[0]))
    try:
        folder.chmod(0o755)
        venv = folder / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        site = next((venv / "lib").glob("python3*/site-packages"))
        shutil.copytree(PACKAGE, site / "toolenv_code", ignore=shutil.ignore_patterns("__pycache__"))
        (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        neighbour = folder / "trajectories.jsonl"
        neighbour.write_text(SECRET)
        neighbour.chmod(0o644)
        data = site.resolve() / "toolenv_code" / "data" / "humaneval" / "HumanEval.jsonl"
        plugin_gold = _fake_plugin_with_data(site)
        code = f"PATHS = {[str(data), str(neighbour), str(plugin_gold)]!r}\n" + _READ
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        args = [str(venv / "bin" / "python"), "-c", _WHEEL, code]
        done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=folder, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["module"].startswith(str(site)), out["module"]  # the copy in site-packages was imported
        seen = json.loads(out["run"])
        assert seen[str(data)] in ("FileNotFoundError", "PermissionError"), seen
        assert seen[str(neighbour)] in ("FileNotFoundError", "PermissionError"), seen
        assert seen[str(plugin_gold)] in ("FileNotFoundError", "PermissionError"), seen  # another plugin's gold
        assert out["numpy"] == "numpy\n", "numpy (this environment's site-packages, through a .pth line) is gone"
        assert out["report"]["datasets"] == "hidden" and out["report"]["host_files"] == "hidden", out["report"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
