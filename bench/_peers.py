"""Shared plumbing for the peer benchmarks that run tool code side by side (code, SQL, search).

Each benchmark measures every row in one process inside `.venv-bench` (see
`peers_env.py`), where the peers live next to toolenv and its plugins; the
driver starts that worker, reads its JSON and prints the table. With `--quick`
and no `.venv-bench`, the worker's code runs here instead and measures only what
is importable (toolenv), and the note says so.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peers_env

ROOT = peers_env.ROOT
FORBIDDEN = peers_env.FORBIDDEN


def parse_args(description: str) -> argparse.Namespace:
    """`--quick`, `--out`, and the hidden `--worker` flag the driver passes inside `.venv-bench`."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a few seconds; numbers are not meaningful")
    p.add_argument("--out", type=Path, default=None, help="JSON output path")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(peers_env.PY), "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def ensure(extras: dict[str, list[str]], *, peers: bool = True) -> None:
    """Complete `.venv-bench` (peers, then `extras`: distribution -> pip arguments, a peer pinned
    as `name==version`, and brought to that version when another is there), never pulling torch."""
    if peers:
        peers_env.ensure()
    for dist, spec in extras.items():
        stamp = _stamp(spec)
        mark = Path(peers_env.VENV) / f".installed-{dist}"
        info = _pip("show", dist)
        if info.returncode == 0 and (stamp is None or _read(mark) == stamp) and _at_pin(spec, info.stdout):
            continue
        report = Path(peers_env.VENV) / f".dry-run-{dist}.json"
        proc = _pip("install", "--dry-run", "--quiet", "--report", str(report), *spec)
        if proc.returncode != 0:
            print(f"cannot resolve {dist}: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        names = [i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]]
        report.unlink()
        heavy = [n for n in names if n.startswith(FORBIDDEN)]
        if heavy:
            print(f"skipping {dist}: it would install {', '.join(heavy)} (no torch in the bench venv)")
            continue
        print(f"installing {dist} into {peers_env.shown(peers_env.VENV)}")
        proc = _pip("install", "--quiet", *spec)
        if proc.returncode != 0:
            print(f"installing {dist} failed: {proc.stderr.strip()[-300:]}")
        elif stamp is not None:
            mark.write_text(stamp)


def _stamp(spec: list[str]) -> str | None:
    """For an editable install of one of the repo's plugins, a digest of its pyproject.toml: the
    install is redone when it changes (an editable install's metadata keeps the requirements it
    was installed with, so a dependency added later would be missing there). None otherwise."""
    if spec[:1] != ["-e"]:
        return None
    return hashlib.sha256((Path(spec[1]) / "pyproject.toml").read_bytes()).hexdigest()


def _at_pin(spec: list[str], pip_show: str) -> bool:
    """False when `spec` pins a version (`name==1.2.3`) and `pip show`'s output names another one."""
    if len(spec) != 1 or "==" not in spec[0]:
        return True
    pinned = spec[0].split("==", 1)[1].strip()
    versions = [line.split(":", 1)[1].strip() for line in pip_show.splitlines() if line.startswith("Version:")]
    return versions == [pinned]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def editable(plugin: str) -> list[str]:
    """pip arguments for one of the repo's plugins, installed editable."""
    return ["-e", str(ROOT / "plugins" / plugin)]


def run(
    script: str, args: argparse.Namespace, measure: Callable[[bool], dict[str, Any]], extras: dict[str, list[str]]
) -> tuple[dict[str, Any], str] | None:
    """Measure in `.venv-bench` (or here, toolenv only, for `--quick` without it); None if the worker failed.

    Returns the worker's result and a note for the output (empty when the peers ran).
    """
    if args.worker:  # inside .venv-bench: measure and hand the numbers back as JSON
        print(json.dumps(measure(args.quick)))
        raise SystemExit(0)
    if not args.quick:
        ensure(extras)
    elif peers_env.PY.exists():  # the venv as it is, but no plugin installed before its requirements changed
        ensure({d: spec for d, spec in extras.items() if _stamp(spec) is not None}, peers=False)
    if not peers_env.PY.exists():
        absent = peers_env.shown(peers_env.VENV)
        note = f"{absent} is absent (--quick does not create it): toolenv only, peers not measured"
        return measure(args.quick), note
    env = dict(os.environ)
    # Peers spawn a bare `python`: make it the bench venv's interpreter, like every other row.
    env["PATH"] = f"{peers_env.PY.parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        [str(peers_env.PY), str(Path(script).resolve()), "--worker", *(["--quick"] if args.quick else [])],
        capture_output=True,
        text=True,
        cwd=Path(script).resolve().parent,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        print(f"{Path(script).name}: the worker in {peers_env.shown(peers_env.VENV)} failed", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result, ""


def versions(*dists: str) -> dict[str, str]:
    """Installed versions of `dists` (those present)."""
    from importlib import metadata

    out = {}
    for d in dists:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[d] = metadata.version(d)
    return out


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of xs, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]
