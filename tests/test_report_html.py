"""The HTML report: self-contained, with charts, data and a working `toolenv view --serve`."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _examples import load_example

from toolenv.report import build_report, render_report, summarize
from toolenv.report.svg import histogram
from toolenv.runner import rollout

ROOT = Path(__file__).resolve().parents[1]
example = load_example("rollout_example")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    rollout(example.ENV_ID, example.ScriptedAgent(), out=tmp_path / "run")
    return tmp_path / "run"


def test_report_is_self_contained(run_dir: Path) -> None:
    page = build_report(run_dir).read_text()
    assert page.startswith("<!DOCTYPE html>")
    # No external resource of any kind: no src/href to a URL, no CDN.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert page.count("<svg") == 4 and "Reward distribution" in page and "Tool-call mix" in page
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert data is not None
    episodes = json.loads(data.group(1))["episodes"]
    assert sorted(e["task"]["id"] for e in episodes) == ["color", "price", "sum-1", "sum-2"]


def test_script_breaking_text_is_escaped(run_dir: Path) -> None:
    trajs = [
        t.model_copy(update={"answer": "</script><script>alert(1)</script>"})
        for t in __import__("toolenv.trajectory", fromlist=["x"]).read_trajectories(run_dir / "trajectories.jsonl")
    ]
    page = render_report(trajs, title="<b>x</b>")
    assert "</script><script>alert(1)" not in page
    assert "<title>&lt;b&gt;x&lt;/b&gt;</title>" in page
    data = re.search(r'id="report-data">(.*?)</script>', page, re.S)
    assert data is not None and "alert(1)" in json.loads(data.group(1))["episodes"][0]["answer"]


def test_histogram_counts_every_value() -> None:
    svg = histogram([0.0, 0.0, 1.0, 0.5], title="r", bins=2)
    counts = [int(m) for m in re.findall(r"<title>[^<]*: (\d+)</title>", svg)]
    assert sum(counts) == 4 and counts == [2, 2]
    assert "no data" in histogram([], title="empty")


def test_summary_of_nothing_is_zero() -> None:
    s = summarize([])
    assert s.episodes == 0 and s.episode_latency_s is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_view_serves_on_loopback(run_dir: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolenv.cli", "view", str(run_dir), "--serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = b""
        deadline = time.monotonic() + 60  # a loaded machine may take a while to start the server
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                    body = resp.read()
                break
            except OSError:
                time.sleep(0.1)
        assert b"report-data" in body, proc.stderr.read() if proc.poll() is not None and proc.stderr else body
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/trajectories.jsonl", timeout=5)
        assert info.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert (run_dir / "report.html").exists()


def test_view_missing_run_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "toolenv.cli", "view", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "no trajectories" in out.stderr and out.stderr.strip().count("\n") == 0


def test_an_image_shared_by_episodes_is_embedded_once(run_dir: Path) -> None:
    import base64

    from toolenv.trajectory import read_trajectories

    trajs = read_trajectories(run_dir / "trajectories.jsonl")
    with_image = next(t for t in trajs if any(r.images for turn in t.turns for r in turn.results))
    image = next(im for turn in with_image.turns for r in turn.results for im in r.images)
    page = render_report([with_image, with_image.model_copy(update={"sample": 1})])
    assert page.count(base64.b64encode(image.data).decode()) == 1
    data = re.search(r'id="report-data">(.*?)</script>', page, re.S)
    assert data is not None
    parsed = json.loads(data.group(1))
    refs = [im["file"] for ep in parsed["episodes"] for t in ep["turns"] for r in t["results"] for im in r["images"]]
    assert len(refs) == 2 and set(refs) == set(parsed["images"])


def test_placeholders_in_user_text_stay_text(run_dir: Path) -> None:
    """A tool name the model made up, or a title, that reads like a template placeholder
    (`__DATA__`, `__JS__`) is shown as written; the page keeps its data and its script."""
    from toolenv.report.html import _asset
    from toolenv.trajectory import read_trajectories

    trajs = read_trajectories(run_dir / "trajectories.jsonl", strict=True)
    odd = next(t for t in trajs if t.tool_calls)
    odd.turns[0].parsed.tool_calls[0].name = "__DATA__"  # counted in the summary's tool mix
    page = render_report(trajs, title="__JS__ report __TITLE__ __DATA__")
    assert "<title>__JS__ report __TITLE__ __DATA__</title>" in page
    assert "__DATA__" in page.split('id="report-data"')[0]  # in the tool-mix chart and table, as text
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert data is not None
    parsed = json.loads(data.group(1))
    assert len(parsed["episodes"]) == 4 and parsed["title"] == "__JS__ report __TITLE__ __DATA__"
    assert page.count(_asset("report.js")) == 1  # the script went where __JS__ was in the template
