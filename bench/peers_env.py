"""The separate virtualenv `.venv-bench` that holds the peers (GEM, SkyRL-gym) for side-by-side benchmarks.

Peers are installed from the package index at the versions pinned in `PEERS` (a
rerun measures the same peer code; a venv holding another version is brought to the
pin), never vendored, and kept out of the project's own venv. Before installing, a
`pip install --dry-run --report` shows what each peer would pull; a peer that would
bring torch (or any CUDA wheel) is left out and reported, so a multi-GB CUDA torch is
never downloaded.

    python bench/peers_env.py          # create or complete .venv-bench, print its state
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("TOOLENV_BENCH_VENV", ROOT / ".venv-bench"))
PY = VENV / ("Scripts" if os.name == "nt" else "bin") / "python"


def shown(path: str | Path) -> str:
    """`path` as output and results show it: relative to the repository, never a machine path."""
    p = Path(path)
    try:
        return Path(os.path.abspath(p)).relative_to(ROOT).as_posix()
    except ValueError:
        return p.name


# distribution name -> (module it provides, the pinned version the published tables measured)
PEERS = {"gem-llm": ("gem", "0.1.0"), "skyrl-gym": ("skyrl_gym", "0.4.0")}
FORBIDDEN = ("torch", "nvidia-", "triton")


def requirement(dist: str) -> str:
    """The pip requirement that installs `dist` at its pinned version."""
    return f"{dist}=={PEERS[dist][1]}"


def installed() -> dict[str, bool]:
    """Which peers import in the bench venv at their pinned version (all False when it does not exist)."""
    if not PY.exists():
        return dict.fromkeys(PEERS, False)
    out = {}
    for dist, (module, version) in PEERS.items():
        check = f"import {module}; from importlib.metadata import version; assert version({dist!r}) == {version!r}"
        rc = subprocess.call([str(PY), "-c", check], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out[dist] = rc == 0
    return out


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(PY), "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _pulls_forbidden(req: str) -> list[str]:
    """Names of forbidden packages `pip install req` would bring in (dry run)."""
    proc = _pip("install", "--dry-run", "--quiet", "--report", "-", req)
    if proc.returncode != 0:
        raise RuntimeError(f"pip cannot resolve {req}: {proc.stderr.strip().splitlines()[-1:]}")
    report = json.loads(proc.stdout)
    names = [item["metadata"]["name"].lower() for item in report.get("install", [])]
    return [n for n in names if n.startswith(FORBIDDEN)]


def ensure(verbose: bool = True) -> dict[str, bool]:
    """Create `.venv-bench` with toolenv (editable) and every peer that installs without torch."""
    say = print if verbose else (lambda *a, **k: None)
    if not PY.exists():
        say(f"creating {shown(VENV)}")
        venv.create(VENV, with_pip=True)
    if _pip("show", "toolenv").returncode != 0:
        proc = _pip("install", "--quiet", "-e", str(ROOT))
        if proc.returncode != 0:
            raise RuntimeError(f"installing toolenv into {shown(VENV)} failed: {proc.stderr.strip()[-400:]}")
    state = installed()
    for dist, ok in state.items():
        if ok:
            continue
        req = requirement(dist)
        heavy = _pulls_forbidden(req)
        if heavy:
            say(f"skipping {req}: it would install {', '.join(heavy)} (no torch in the bench venv)")
            continue
        say(f"installing {req}")
        proc = _pip("install", "--quiet", req)
        if proc.returncode != 0:
            say(f"installing {req} failed: {proc.stderr.strip()[-300:]}")
    return installed()


def main() -> int:
    state = ensure()
    for dist, ok in state.items():
        print(f"{dist}: {'installed' if ok else 'missing'}")
    print(f"python: {PY}")
    return 0 if any(state.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
