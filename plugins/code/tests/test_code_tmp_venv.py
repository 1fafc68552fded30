"""The sandbox run by an interpreter that lives under /tmp (a CI clone's venv, made in `mktemp -d`).

Every run gets a private /tmp, so without care the venv's site-packages vanish inside
the sandbox. The interpreter's own directories must be visible there, read-only, and
nothing else of the host's /tmp.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolenv_code

_PROBE = r"""
import errno, json, os, sys
out = {"prefix": sys.prefix}
try:
    import toolenv_probe_venv, toolenv_probe_extra
    out["imported"] = [toolenv_probe_venv.VALUE, toolenv_probe_extra.VALUE]
except ImportError as exc:
    out["imported"] = repr(exc)
try:
    with open(os.path.join(SCRATCH, "written"), "w") as fh:
        fh.write("x")
    out["write"] = "written"
except OSError as exc:
    out["write"] = errno.errorcode.get(exc.errno, str(exc.errno))
out["secret"] = os.path.exists(SECRET)
out["listing"] = sorted(os.listdir(ROOT)) if os.path.isdir(ROOT) else None
print(json.dumps(out))
"""

_CLIENT = """
import json, sys
sys.path[:0] = {host_path!r}
from toolenv_code.sandbox import SandboxPool

pool = SandboxPool(size=1)
probe = {probe!r}
results = [pool.run(probe), pool.run(probe, session="s")]
isolation = pool.stats()[0]["isolation"]
pool.close()
print(json.dumps({{"isolation": isolation, "runs": [[r.stdout, r.stderr] for r in results]}}))
"""


@pytest.fixture
def tmp_root() -> Iterator[Path]:
    """A directory right under /tmp (not $TMPDIR: the point is the path the sandbox hides)."""
    root = Path(tempfile.mkdtemp(prefix="toolenv-venv-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3*/site-packages"))
    assert len(found) == 1, found
    return found[0]


NOBODY = 65534


@pytest.mark.parametrize("user", ["as-is", "nobody"])
def test_a_venv_under_tmp_is_visible_read_only_and_nothing_else_of_tmp(tmp_root: Path, user: str) -> None:
    """Run a pool from a venv under /tmp: as root (namespaces entered directly), and as an
    ordinary user (through a user namespace, where the kernel allows one)."""
    as_nobody = user == "nobody"
    if as_nobody and os.geteuid() != 0:
        pytest.skip("starting the pool as another user needs root (CI runs as root)")
    venv = tmp_root / ".venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--copies", "--system-site-packages", str(venv)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    site = _site_packages(venv)
    (site / "toolenv_probe_venv.py").write_text("VALUE = 'venv'\n")
    scratch = site / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)  # writable by anyone: only a read-only mount can refuse the write
    extra = tmp_root / "extra"  # a directory on sys.path through a .pth file, also under /tmp
    extra.mkdir()
    (extra / "toolenv_probe_extra.py").write_text("VALUE = 'extra'\n")
    (site / "toolenv_probe.pth").write_text(f"{extra}\n")
    secret = tmp_root / "secret.txt"
    secret.write_text("not for the sandbox")
    if as_nobody:  # else it stays 0700, as `mktemp -d` makes it: the sandbox's uid must still get through
        tmp_root.chmod(0o755)

    host_path = [str(Path(toolenv_code.__file__).resolve().parent.parent), sysconfig.get_paths()["purelib"]]
    probe = f"ROOT, SCRATCH, SECRET = {str(tmp_root)!r}, {str(scratch)!r}, {str(secret)!r}\n" + _PROBE
    python = venv / "bin" / "python"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    user_args: dict[str, Any] = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if as_nobody else {}

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, timeout=120,
                              **user_args)  # fmt: skip

    if as_nobody:
        usable = run(f"import sys; sys.path[:0] = {host_path!r}; import toolenv_code.sandbox")
        if usable.returncode:
            pytest.skip(f"this Python is not usable by uid {NOBODY}: {usable.stderr.strip()[-200:]}")
    done = run(_CLIENT.format(host_path=host_path, probe=probe))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["isolation"]["workroot_tmpfs"]:
        pytest.skip("the kernel allows no private /tmp here, so nothing hides the venv")
    for stdout, stderr in out["runs"]:
        assert stdout, stderr
        seen = json.loads(stdout)
        assert seen["prefix"] == str(venv)
        assert seen["imported"] == ["venv", "extra"], "the sandbox cannot import from a venv under /tmp"
        assert seen["write"] == "EROFS", "the venv must be read-only inside the sandbox"
        assert not seen["secret"], "the sandbox sees a file of the host's /tmp"
        assert seen["listing"] == [".venv", "extra"]
    assert not (scratch / "written").exists()
