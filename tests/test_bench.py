"""The side-by-side benchmarks' plumbing: what each side is run with, and how its answer is checked."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(BENCH))
    yield


def test_bare_python_starts_without_the_project_installed() -> None:
    """A spawned `python -c` is timed without toolenv's editable installs (their finders cost ~10 ms a start)."""
    from _common import bare_python

    with bare_python() as python:
        probe = "import sys, importlib.util; print(sys.prefix); print(importlib.util.find_spec('toolenv'))"
        out = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, check=True, cwd=python.parent
        ).stdout
        assert out.splitlines() == [str(python.parent.parent), "None"]
    assert not python.exists()


def test_peers_code_check_refuses_a_row_that_spawns_another_python() -> None:
    pytest.importorskip("toolenv_code")
    from _common import bare_python
    from bench_peers_code import check

    def run(python: str, code: str) -> tuple[bool, str]:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
        return p.returncode == 0, p.stdout + p.stderr

    with bare_python() as python:
        check("python -c", lambda code: run(str(python), code), python)
        with pytest.raises(AssertionError):
            check("python -c", lambda code: run(sys.executable, code), python)


def test_code_check_refuses_a_side_that_does_less() -> None:
    pytest.importorskip("toolenv_code")
    from bench_code import check

    check("ok", "trivial", lambda code: (True, "1\n", ""))
    check("ok", "failing", lambda code: (False, "", "ZeroDivisionError: division by zero"))
    with pytest.raises(AssertionError):
        check("silent", "trivial", lambda code: (True, "", ""))
    with pytest.raises(AssertionError):
        check("never fails", "failing", lambda code: (True, "", ""))


def test_peers_are_pinned() -> None:
    import peers_env

    for dist, (_module, version) in peers_env.PEERS.items():
        assert peers_env.requirement(dist) == f"{dist}=={version}"
        assert version.count(".") >= 1


def test_a_pinned_extra_at_another_version_is_reinstalled() -> None:
    from _peers import _at_pin

    show = "Name: rank-bm25\nVersion: 0.2.1\nSummary: x\n"
    assert not _at_pin(["rank-bm25==0.2.2"], show)
    assert _at_pin(["rank-bm25==0.2.1"], show)
    assert _at_pin(["-e", "plugins/sql"], show)  # editable installs are stamped by their pyproject instead


def test_peers_code_counts_busy_cpu_once() -> None:
    """`/proc/stat`'s cpu line: user nice system idle iowait irq softirq steal guest guest_nice.
    Linux counts guest time in user (and guest_nice in nice) already, and steal is time another
    system ran on the CPU: summing every field but idle and iowait counted a VM host's guests twice
    and a VM's stolen time as its own work, inflating the "CPU ms per call"."""
    from bench_peers_code import busy_seconds

    line = "cpu  100 20 30 1000 40 5 6 70 50 10"
    assert busy_seconds(line, 100) == pytest.approx((100 + 20 + 30 + 5 + 6) / 100)
    assert busy_seconds("cpu  100 20 30 1000 40 5 6", 100) == pytest.approx(1.61)  # an older kernel's fewer fields
