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
from typing import Any

import pytest
from _examples import load_example

from toolenv.report import build_report, render_report, summarize
from toolenv.report.svg import histogram
from toolenv.runner import rollout

ROOT = Path(__file__).resolve().parents[1]
example = load_example("rollout_example")


def page_data(page: str) -> dict[str, Any]:
    """The page's data, its chunks joined as the page's script joins them."""
    chunks = [
        json.loads(m)
        for m in re.findall(r'<script type="application/json" class="report-data">(.*?)</script>', page, re.S)
    ]
    assert chunks, "the page has no data"
    assert all(c["title"] == chunks[0]["title"] for c in chunks)
    return {
        "title": chunks[0]["title"],
        "episodes": [e for c in chunks for e in c["episodes"]],
        "images": {k: v for c in chunks for k, v in c["images"].items()},
    }


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
    episodes = page_data(page)["episodes"]
    assert sorted(e["task"]["id"] for e in episodes) == ["color", "price", "sum-1", "sum-2"]


def test_script_breaking_text_is_escaped(run_dir: Path) -> None:
    trajs = [
        t.model_copy(update={"answer": "</script><script>alert(1)</script>"})
        for t in __import__("toolenv.trajectory", fromlist=["x"]).read_trajectories(run_dir / "trajectories.jsonl")
    ]
    page = render_report(trajs, title="<b>x</b>")
    assert "</script><script>alert(1)" not in page
    assert "<title>&lt;b&gt;x&lt;/b&gt;</title>" in page
    assert "alert(1)" in page_data(page)["episodes"][0]["answer"]


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


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return bytes(resp.read())


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
                body = _get(f"http://127.0.0.1:{port}/")
                break
            except OSError:
                time.sleep(0.1)
        assert b'id="report-served"' in body, proc.stderr.read() if proc.poll() is not None and proc.stderr else body
        # The page holds no episode: the list comes from rows.json, an episode from its own URL.
        assert b'class="report-data"' not in body
        rows = json.loads(_get(f"http://127.0.0.1:{port}/rows.json"))
        assert sorted(r["task_id"] for r in rows) == ["color", "price", "sum-1", "sum-2"]
        i = next(i for i, r in enumerate(rows) if r["task_id"] == "color")
        got = json.loads(_get(f"http://127.0.0.1:{port}/episodes/{i}.json"))
        assert got["episode"]["task"]["id"] == "color"
        (image,) = [im for t in got["episode"]["turns"] for r in t["results"] for im in r["images"]]
        assert image["file"] in got["images"]  # each image of the episode comes with it
        for path in ("/trajectories.jsonl", "/episodes/4.json", "/episodes/-1.json"):
            with pytest.raises(urllib.error.HTTPError) as info:
                _get(f"http://127.0.0.1:{port}{path}")
            assert info.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert (run_dir / "report.html").exists()


class _CountingFile:
    """A binary file that counts the bytes read from it (what a request of the server reads)."""

    read_bytes = 0

    def __init__(self, fh: Any) -> None:
        self.fh = fh

    def __enter__(self) -> _CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()

    def __iter__(self) -> Any:
        for line in self.fh:
            _CountingFile.read_bytes += len(line)
            yield line

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        _CountingFile.read_bytes += len(data)
        return bytes(data)

    def readline(self, n: int = -1) -> bytes:
        data = self.fh.readline(n)
        _CountingFile.read_bytes += len(data)
        return bytes(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)


def test_a_served_episode_is_read_from_its_own_line_only(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`toolenv view --serve` of a large run: the page holds no episode, and a request for one
    reads its own line of the run's file (by an index built once), not the file."""
    import builtins
    import threading

    import toolenv.report.served as served
    from toolenv.commands.view_cmd import make_server

    lines = (run_dir / "trajectories.jsonl").read_text().splitlines()
    big = tmp_path / "big" / "trajectories.jsonl"
    big.parent.mkdir()
    with big.open("w") as fh:
        for i in range(300):
            for line in lines:
                fh.write(json.dumps({**json.loads(line), "sample": i}) + "\n")
    size = big.stat().st_size
    index = served.RunIndex([big.parent])
    assert len(index) == 1200

    opened: list[_CountingFile] = []

    def counting_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = _CountingFile(builtins.open(file, mode, *args, **kwargs))  # noqa: SIM115 - closed by its caller
        opened.append(f)
        return f

    monkeypatch.setattr(served, "open", counting_open, raising=False)
    _CountingFile.read_bytes = 0
    server = make_server(index, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page = _get(f"{url}/")
        assert b'class="report-data"' not in page and len(page) < size / 10
        rows = json.loads(_get(f"{url}/rows.json"))
        assert len(rows) == 1200 and (rows[777]["task_id"], rows[777]["sample"]) == (
            json.loads(lines[777 % 4])["task"]["id"],
            777 // 4,
        )
        assert _CountingFile.read_bytes == 0 and not opened  # neither reads the run's file
        # Every other line overwritten in place: a request that read (or parsed) them would fail.
        raw = big.read_bytes().split(b"\n")
        blanked = [line if k == 777 else b"{" + b" " * max(len(line) - 1, 0) for k, line in enumerate(raw[:-1])]
        big.write_bytes(b"\n".join(blanked) + b"\n")
        got = json.loads(_get(f"{url}/episodes/777.json"))
        assert (got["episode"]["task"]["id"], got["episode"]["sample"]) == (rows[777]["task_id"], 777 // 4)
        assert len(opened) == 1 and _CountingFile.read_bytes == len(raw[777]) + 1  # its line, newline included
        with pytest.raises(urllib.error.HTTPError) as info:  # a line changed since: a 500 that says so
            _get(f"{url}/episodes/778.json")
        assert info.value.code == 500 and "changed since it was indexed" in info.value.read().decode()
    finally:
        server.shutdown()
        server.server_close()


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
    parsed = page_data(page)
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
    assert "__DATA__" in page.split('class="report-data"')[0]  # in the tool-mix chart and table, as text
    parsed = page_data(page)
    assert len(parsed["episodes"]) == 4 and parsed["title"] == "__JS__ report __TITLE__ __DATA__"
    assert page.count(_asset("report.js")) == 1  # the script went where __JS__ was in the template


def test_a_large_page_keeps_its_data_in_chunks_a_browser_can_read(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A browser reads each `<script>`'s text as one string, and its strings end near 512 MiB:
    one script of a 640 MB report (67k Spider episodes) read back cut short, and the page
    showed no episode. The data goes in chunks, each under `CHUNK_CHARS`."""
    import toolenv.report.html as html
    from toolenv.trajectory import read_trajectories

    monkeypatch.setattr(html, "CHUNK_CHARS", 20_000)
    trajs = read_trajectories(run_dir / "trajectories.jsonl", strict=True)
    many = [t.model_copy(update={"sample": i}) for i in range(30) for t in trajs]
    page = render_report(many)
    chunks = re.findall(r'<script type="application/json" class="report-data">(.*?)</script>', page, re.S)
    biggest = max(len(json.dumps(t.model_dump(mode="json"))) for t in trajs)
    assert len(chunks) > 5 and all(len(c) < 20_000 + 2 * biggest for c in chunks)
    data = page_data(page)
    assert [(e["task"]["id"], e["sample"]) for e in data["episodes"]] == [t.key for t in many]
    refs = {im["file"] for e in data["episodes"] for t in e["turns"] for r in t["results"] for im in r["images"]}
    assert refs and refs == set(data["images"])  # each image in the page once, in the chunk that first needs it
    assert sum(c.count(next(iter(refs))) for c in chunks) >= 30  # referenced from many chunks


def _live_trajectories() -> int:
    import gc

    from toolenv.trajectory import Trajectory

    gc.collect()
    return sum(type(o) is Trajectory for o in gc.get_objects())


def test_build_report_holds_one_trajectory_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import toolenv.report.html as html
    from toolenv.report.summary import SummaryBuilder

    run = tmp_path / "run"
    rollout(example.ENV_ID, example.ScriptedAgent(), samples=30, out=run, tune_gc=False)
    live: list[int] = []

    class Counting(SummaryBuilder):
        def add(self, traj: Any) -> None:
            live.append(_live_trajectories())
            super().add(traj)

    monkeypatch.setattr(html, "SummaryBuilder", Counting)
    before = {p.name for p in run.iterdir()}
    assert {"run.json", "summary.json", "trajectories.jsonl"} <= before and "report.html" not in before
    page = build_report(run)
    assert len(live) == 120 and max(live) <= 3
    assert len(page_data(page.read_text())["episodes"]) == 120
    assert {p.name for p in run.iterdir()} == before | {"report.html"}  # the report, nothing else


def test_no_report_from_a_run_with_an_invalid_line(run_dir: Path) -> None:
    path = run_dir / "trajectories.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + '{"not": "a trajectory"}\n' + "".join(lines[2:]))
    before = {p.name for p in run_dir.iterdir()}
    with pytest.raises(ValueError, match=r"trajectories\.jsonl:3: not a valid trajectory"):
        build_report(run_dir)
    assert {p.name for p in run_dir.iterdir()} == before and "report.html" not in before


def _serving(run: Path) -> tuple[Any, int]:
    """`toolenv view --serve`'s server of `run`, started on a free loopback port."""
    import threading

    from toolenv.commands.view_cmd import make_server
    from toolenv.report.served import RunIndex

    server = make_server(RunIndex([run]), 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


def _get_as(port: int, path: str, host: str) -> tuple[int, bytes]:
    """GET `path` from 127.0.0.1:`port` with the Host header a browser would send for `host`."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_served_report_refuses_a_page_of_another_site(run_dir: Path) -> None:
    """DNS rebinding: a site the user visits points its own name at 127.0.0.1 and reads the
    served run through the browser. Such a request names that site in its Host header; only
    requests for 127.0.0.1 or localhost are answered."""
    server, port = _serving(run_dir)
    try:
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.attacker.example:{port}"):
            for path in ("/", "/rows.json", "/episodes/0.json"):
                status, body = _get_as(port, path, host)
                assert status == 403 and b"task_id" not in body, (host, path)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
            status, body = _get_as(port, "/rows.json", host)
            assert status == 200 and len(json.loads(body)) == 4
    finally:
        server.shutdown()
        server.server_close()


def test_served_episode_error_names_a_non_ascii_path(run_dir: Path, tmp_path: Path) -> None:
    """A run in a folder named in Chinese whose file changed since it was indexed: the episode's
    request gets its 500 saying so (the reason went into the status line, which is Latin-1 only,
    and the server hung up with no answer)."""
    run = tmp_path / "运行"
    run.mkdir()
    (run / "trajectories.jsonl").write_bytes((run_dir / "trajectories.jsonl").read_bytes())
    server, port = _serving(run)
    try:
        line = (run / "trajectories.jsonl").read_bytes().split(b"\n")[0]
        (run / "trajectories.jsonl").write_bytes(b"{" + b" " * (len(line) - 1) + b"\n")
        status, body = _get_as(port, "/episodes/0.json", f"127.0.0.1:{port}")
        text = body.decode("utf-8")
        assert status == 500 and "changed since it was indexed" in text and "运行" in text
    finally:
        server.shutdown()
        server.server_close()


def test_a_report_of_text_with_a_lone_surrogate_is_writable(run_dir: Path) -> None:
    """Trajectories kept in memory hold text as the agent gave it, half an emoji included: the
    page shows U+FFFD there and can be written as UTF-8 (as the trajectory file writes it)."""
    from toolenv.trajectory import read_trajectories

    trajs = read_trajectories(run_dir / "trajectories.jsonl", strict=True)
    trajs[0].answer = "cut \ud83d"
    page = render_report(trajs)
    page.encode("utf-8")
    assert page_data(page)["episodes"][0]["answer"] == "cut \ufffd"


def test_a_report_of_numpy_metadata_in_memory_is_written(run_dir: Path) -> None:
    """A rollout kept in memory holds a tool's metadata as the tool gave it, numpy values included:
    the page shows them as plain numbers and lists, as the trajectory file writes them, instead of
    failing with pydantic's `Unable to serialize unknown type`."""
    import numpy as np

    from toolenv.trajectory import read_trajectories

    trajs = read_trajectories(run_dir / "trajectories.jsonl", strict=True)
    trajs[0].turns[0].results[0].metadata["score"] = np.float32(0.5)
    trajs[0].turns[0].agent_metadata["ids"] = np.arange(3)
    episode = page_data(render_report(trajs))["episodes"][0]
    assert episode["turns"][0]["results"][0]["metadata"]["score"] == 0.5
    assert episode["turns"][0]["agent_metadata"]["ids"] == [0, 1, 2]


def _cut_write(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    """The page's copy of its data into the report writes a little, then fails as a full disk or
    a Ctrl-C would."""
    import shutil

    def cut(src: Any, dst: Any, *args: Any) -> None:
        dst.write(src.read(100))
        raise exc

    monkeypatch.setattr(shutil, "copyfileobj", cut)


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_report_cut_in_the_middle_leaves_the_previous_one_whole(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    """A write that fails or is interrupted halfway leaves the report that was there, and nothing beside it."""
    before = build_report(run_dir).read_bytes()
    files = sorted(p.name for p in run_dir.iterdir())
    _cut_write(monkeypatch, exc)
    with pytest.raises(type(exc)):
        build_report(run_dir)
    assert (run_dir / "report.html").read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == files


def test_cli_view_that_fails_writing_is_one_line_and_keeps_the_report(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolenv.cli import main

    before = build_report(run_dir).read_bytes()
    _cut_write(monkeypatch, OSError(28, "No space left on device"))
    assert main(["view", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("toolenv view: error: ") and err.count("\n") == 1
    assert (run_dir / "report.html").read_bytes() == before


def test_a_report_through_a_symlink_or_into_dev_null(run_dir: Path, tmp_path: Path) -> None:
    """A symlinked report is replaced at the file it points to, the link kept; /dev/null is written into."""
    real = tmp_path / "elsewhere" / "page.html"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    assert build_report(run_dir, link) == link
    assert link.is_symlink() and real.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in real.parent.iterdir()) == ["page.html"]
    build_report(run_dir, "/dev/null")
    assert Path("/dev/null").is_char_device()


def test_the_same_run_twice_is_refused(run_dir: Path) -> None:
    """A run named twice (as its folder and its file) would show every episode twice."""
    with pytest.raises(ValueError, match=r"again \(the same trajectories file\): its episodes would be read twice"):
        build_report([run_dir, run_dir / "trajectories.jsonl"])
    with pytest.raises(ValueError, match="again"):
        build_report([run_dir, run_dir])
    assert not (run_dir / "report.html").exists()


def test_view_to_dev_stdout_keeps_its_message_out_of_the_page(run_dir: Path, tmp_path: Path) -> None:
    """`toolenv view RUN --out /dev/stdout > page.html`: the page whole, the "wrote" line on stderr
    (on stdout it went over the start of the page)."""
    page = tmp_path / "page.html"
    with page.open("w") as fh:
        out = subprocess.run(
            [sys.executable, "-m", "toolenv.cli", "view", str(run_dir), "--out", "/dev/stdout"],
            stdout=fh,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n")
    assert out.stderr.startswith("wrote /dev/stdout")


def test_two_reports_written_at_once_do_not_share_a_temporary_file(run_dir: Path, tmp_path: Path) -> None:
    """A second report of the same run written while the first is being read (two `toolenv view`
    processes, a watcher re-rendering) leaves the first one's data alone: both pages are whole."""
    path = run_dir / "trajectories.jsonl"
    path.write_text(path.read_text() + '{"cut')  # a partial last line: `warn` is called mid-report
    pages: list[Path] = []

    def meanwhile(message: str) -> None:
        if not pages:
            pages.append(build_report(run_dir, tmp_path / "r.html", warn=lambda _: None))

    first = build_report(run_dir, tmp_path / "r.html", warn=meanwhile)
    for page in (first, pages[0]):
        assert len(page_data(page.read_text())["episodes"]) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "run"]


@pytest.mark.parametrize("given", [".", "trajectories.jsonl", "./", "sub/.."])
def test_the_default_title_names_a_run_given_as_dot(run_dir: Path, monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    """`cd runs/NAME && toolenv view .` titled the page `toolenv · ` (the name of `.` is empty):
    the title names the run's folder however the run is given, served or not."""
    from toolenv.report.served import RunIndex

    (run_dir / "sub").mkdir()
    monkeypatch.chdir(run_dir)
    page = build_report(given, run_dir / "page.html").read_text(encoding="utf-8")
    assert "<title>toolenv · run</title>" in page and page_data(page)["title"] == "toolenv · run"
    assert RunIndex([given]).title == "toolenv · run"


def test_served_episode_of_a_file_gone_says_to_restart_the_viewer(run_dir: Path, tmp_path: Path) -> None:
    """A file indexed and then removed (a later run put a killed retry's lines aside back and
    removed `trajectories.retrying.jsonl`; a run folder deleted) gets the same one-line 500 as a
    file rewritten, saying to restart, not a bare "No such file"."""
    run = tmp_path / "gone"
    run.mkdir()
    (run / "trajectories.jsonl").write_bytes((run_dir / "trajectories.jsonl").read_bytes())
    server, port = _serving(run)
    try:
        (run / "trajectories.jsonl").unlink()
        status, body = _get_as(port, "/episodes/0.json", f"127.0.0.1:{port}")
        text = body.decode("utf-8")
        assert status == 500 and "restart toolenv view" in text and "gone" in text, text
    finally:
        server.shutdown()
        server.server_close()
