"""The sandbox hides the datasets shipped with toolenv_code (reference solutions and tests).

Code that could read them would pass any HumanEval or MBPP task by finding its row and
running the reference solution: reward hacking an RL policy finds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import gymnasium as gym
import pytest

import toolenv  # noqa: F401 - registers the envs
import toolenv_code
from toolenv_code import _confine, isolation_report
from toolenv_code.datasets import humaneval_tasks, mbpp_tasks
from toolenv_code.sandbox import SandboxLimits, get_pool

PACKAGE = Path(toolenv_code.__file__).parent
DATA = PACKAGE.resolve() / "data"
FAST = SandboxLimits(timeout=10.0, cpu_seconds=5)
ROOT_ONLY = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="namespaces are sure to be there as root (CI runs as root)"
)

#: Sandboxed code: what each path shows of the data folder (a listing, a dataset's first bytes,
#: or the error's name), and what a recursive glob from the package's checkout finds.
_LOOK = r"""
import ctypes, glob, json, os
os.symlink(DATA, "inner")  # a link the code makes itself
libc = ctypes.CDLL(None, use_errno=True)
# Take the cover off: directly, then as root of a user namespace of its own (locked mounts).
undone = [libc.umount2(DATA.encode(), 2)]
undone.append(libc.unshare(0x10000000 | 0x00020000))  # CLONE_NEWUSER | CLONE_NEWNS
undone.append(libc.umount2(DATA.encode(), 2))
seen = {}
for path in [*PATHS, "/proc/self/root" + DATA, os.path.abspath("inner")]:
    try:
        names = os.listdir(path)
    except OSError as exc:
        names = type(exc).__name__
    try:
        with open(os.path.join(path, "humaneval", "HumanEval.jsonl")) as fh:
            text = fh.read(40)
    except OSError as exc:
        text = type(exc).__name__
    seen[path] = [names, text]
found = glob.glob(GLOB_ROOT + "/**/toolenv_code/data/*/*.json*", recursive=True)
print(json.dumps({"seen": seen, "glob": found, "undone": [u == 0 for u in undone]}))
"""


def _look(paths: list[str], glob_root: str) -> str:
    return f"DATA = {str(paths[0])!r}\nPATHS = {paths!r}\nGLOB_ROOT = {glob_root!r}\n" + _LOOK


def _assert_nothing_seen(out: dict[str, object], where: str) -> None:
    seen = out["seen"]
    assert isinstance(seen, dict) and len(seen) >= 3
    for path, (names, text) in seen.items():
        assert names in ([], "FileNotFoundError", "PermissionError"), f"{where}: {path} lists {names}"
        assert text in ("FileNotFoundError", "PermissionError"), f"{where}: {path} reads {text!r}"
    assert out["glob"] == [], f"{where}: the glob found {out['glob']}"
    assert out["undone"][0] is False and out["undone"][2] is False, f"{where}: the code took the cover off"


@pytest.fixture
def outside_link() -> Iterator[str]:
    """A host symlink to the data folder outside /tmp (the sandbox lays its own tmpfs over /tmp)."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    folder = tempfile.mkdtemp(prefix="toolenv-code-test-", dir=base)
    os.chmod(folder, 0o755)
    link = os.path.join(folder, "data-link")
    os.symlink(DATA, link)
    yield link
    shutil.rmtree(folder, ignore_errors=True)


@ROOT_ONLY
def test_code_cannot_list_or_read_the_bundled_datasets(outside_link: str) -> None:
    """By its real path, the path through the package as imported, /proc/self/root, a host
    symlink and one of its own; in a one-shot run and in a session (each its own mounts)."""
    assert (DATA / "humaneval" / "HumanEval.jsonl").is_file()  # the host sees them
    paths = list(dict.fromkeys([str(DATA), str(PACKAGE / "data"), outside_link]))
    code = _look(paths, str(DATA.parents[2]))
    pool = get_pool()
    run = pool.run(code, FAST)
    session = pool.run(code, FAST, session="hidden-data")
    pool.close_session("hidden-data")
    assert run.ok and session.ok, run.stderr + session.stderr
    _assert_nothing_seen(json.loads(run.stdout), "run")
    _assert_nothing_seen(json.loads(session.stdout), "session")
    assert (DATA / "humaneval" / "HumanEval.jsonl").is_file()  # and the host still does


_CHEAT = r"""<answer>
import glob, json
for path in glob.glob(ROOT + "/**/toolenv_code/data/*/*.jsonl", recursive=True):
    for line in open(path):
        row = json.loads(line)
        if row.get("task_id") in (TID, NUM):
            exec(row["prompt"] + row["canonical_solution"] if "canonical_solution" in row else row["code"])
</answer>"""


@ROOT_ONLY
@pytest.mark.parametrize("env_id", ["toolenv/HumanEval-v0", "toolenv/MBPP-v0"])
def test_an_answer_that_runs_the_reference_solution_from_the_data_scores_0(env_id: str) -> None:
    """The reviewer's hack scores 0; the honest reference solution still scores 1."""
    task = humaneval_tasks()[0] if "HumanEval" in env_id else next(t for t in mbpp_tasks() if t.id == "MBPP/11")
    num = int(task.id.split("/")[1]) if task.id.startswith("MBPP") else None
    cheat = _CHEAT.replace("ROOT", repr(str(DATA.parents[2]))).replace("TID", repr(task.id))
    cheat = cheat.replace("NUM", repr(num))
    rewards, reports = [], []
    for answer in (cheat, f"<answer>\n{task.answer}\n</answer>"):
        env = gym.make(env_id)
        try:
            env.reset(options={"task_id": task.id})
            rewards.append(float(env.step(answer)[1]))
            reports.append(env.unwrapped.episode.state.get("tests_passed"))
        finally:
            env.close()
    assert rewards == [0.0, 1.0], reports


@ROOT_ONLY
def test_the_isolation_report_says_the_datasets_are_hidden() -> None:
    report = isolation_report()
    assert report.datasets == "hidden" and "datasets=hidden" in report.summary()
    assert get_pool().stats()[0]["isolation"]["hidden_data"] is True  # what the server says it laid


def test_a_folder_holding_a_path_that_must_stay_reachable_is_not_covered() -> None:
    """The interpreter's own paths, /tmp and /dev/shm must stay reachable: a data folder that
    holds one (or is one) is left uncovered (and the report then says `visible`)."""
    prefix = os.path.realpath(sys.prefix)
    assert _confine._holds_kept_path(os.path.dirname(prefix))
    assert _confine._holds_kept_path(prefix)
    assert _confine._holds_kept_path("/")  # holds /tmp
    assert not _confine._holds_kept_path(str(DATA))


#: Run with a copy of toolenv_code under /tmp (as a CI clone made with `mktemp -d`): the fork
#: servers put its root on `sys.path`, so it is bound back over the private /tmp, data and all.
_COPY = """
import json, sys
import toolenv_code
from toolenv_code import isolation_report
from toolenv_code.sandbox import SandboxLimits, SandboxPool

code = sys.argv[1]
pool = SandboxPool(size=1)
try:
    out = {
        "module": toolenv_code.__file__,
        "run": pool.run(code, SandboxLimits(timeout=10)).stdout,
        "session": pool.run(code, SandboxLimits(timeout=10), session="s").stdout,
        "exposed": pool.stats()[0]["isolation"]["exposed"],
        "datasets": isolation_report(pool).model_dump().get("datasets"),
    }
finally:
    pool.close()
print(json.dumps(out))
"""


@ROOT_ONLY
def test_a_package_under_tmp_bound_back_for_the_interpreter_still_has_its_data_hidden(tmp_path: Path) -> None:
    root = tmp_path / "clone"
    shutil.copytree(PACKAGE, root / "toolenv_code", ignore=shutil.ignore_patterns("__pycache__"))
    data = root.resolve() / "toolenv_code" / "data"
    code = _look([str(data)], str(root.resolve()))
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _COPY, code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["module"].startswith(str(root))  # the copy, not the checkout, was imported
    assert str(root.resolve()) in out["exposed"]  # the case under test: its folder is bound back
    _assert_nothing_seen(json.loads(out["run"]), "run")
    _assert_nothing_seen(json.loads(out["session"]), "session")
    assert out["datasets"] == "hidden"


def _unprivileged_helpers() -> ModuleType:
    """test_code_unprivileged.py's harness (tests import as separate modules, not a package)."""
    path = Path(__file__).with_name("test_code_unprivileged.py")
    spec = importlib.util.spec_from_file_location("_unprivileged", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_AS_USER = """
import json, sys
from toolenv_code import isolation_report
from toolenv_code.sandbox import SandboxPool

pool = SandboxPool(size=1)
try:
    code = sys.argv[1]
    out = {"run": pool.run(code).stdout, "session": pool.run(code, session="s").stdout}
    out["user_ns"] = pool.stats()[0]["isolation"]["user_ns"]
    out["datasets"] = isolation_report(pool).datasets
finally:
    pool.close()
print(json.dumps(out))
"""


@ROOT_ONLY
def test_an_ordinary_user_s_sandbox_hides_the_datasets_too(tmp_path: Path) -> None:
    """Started by an ordinary user, the fork server works in a user namespace (where the kernel allows one)."""
    from _procs import as_nobody, skip_unless_nobody_can_run_us

    skip_unless_nobody_can_run_us(tmp_path)
    done = as_nobody([sys.executable, "-c", _AS_USER, _look([str(DATA)], str(DATA.parents[2]))], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["user_ns"]:
        pytest.skip("the kernel gives an ordinary user no user namespace here")
    _assert_nothing_seen(json.loads(out["run"]), "run")
    _assert_nothing_seen(json.loads(out["session"]), "session")
    assert out["datasets"] == "hidden"


def test_without_namespaces_the_report_says_the_datasets_are_visible(tmp_path: Path) -> None:
    """No mount namespace, nothing to lay a tmpfs in: the data stays readable, and the report says so."""
    helpers = _unprivileged_helpers()
    report = helpers._without_namespaces(helpers._REPORT, tmp_path)
    assert report["filesystem"] == "none" and report["datasets"] == "visible"
