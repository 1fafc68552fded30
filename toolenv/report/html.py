"""The trajectory report: one self-contained HTML file (inline CSS, JS, SVG and images).

Python draws the summary charts as SVG and embeds the trajectories as JSON; the
page's script (`report.js`) renders the filterable episode list and each episode
as a conversation. Nothing is fetched when the file is opened.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic_core import PydanticSerializationError

from toolenv._outputs import in_system_folder, open_output
from toolenv._text import fix_text
from toolenv.image_store import IMAGE_STORE
from toolenv.report.console import summary_rows
from toolenv.report.summary import Summary, SummaryBuilder
from toolenv.report.svg import bar_chart, histogram
from toolenv.trajectory import Trajectory, dump_json, iter_trajectory_file

__all__ = ["build_report", "iter_run", "load_run", "render_report"]

REPORT = "report.html"
_PLACEHOLDER = re.compile(r"__(?:TITLE|GENERATED|CSS|SUMMARY_ROWS|CHARTS|JS|DATA)__")


def _asset(name: str) -> str:
    return resources.files("toolenv.report").joinpath(name).read_text(encoding="utf-8")


def load_run(run: str | Path, *, warn: Callable[[str], None] | None = None) -> tuple[list[Trajectory], Path]:
    """The trajectories of a run directory (or of a `.jsonl` file) and the directory.

    A partial last line (a run killed mid-write) is left out with a warning, given to
    `warn` (default: `warnings.warn`); every other line must be a valid trajectory.

    Raises:
        FileNotFoundError: no trajectories file there.
        ValueError: a line is not a valid trajectory (the message names the file, the line
            and why), or the file holds no trajectories.
    """
    trajs, folder = iter_run(run, warn=warn)
    return list(trajs), folder


def run_file(run: str | Path) -> Path:
    """The trajectories file a run names: the file itself, or the one in the run's folder."""
    path = Path(run)
    return path if path.is_file() else path / "trajectories.jsonl"


def iter_run(run: str | Path, *, warn: Callable[[str], None] | None = None) -> tuple[Iterator[Trajectory], Path]:
    """`load_run` one trajectory at a time (flat memory for a run of any size): the
    FileNotFoundError comes at once, the ValueErrors and the warning as the iteration
    reaches them."""
    file = run_file(run)
    if not file.is_file():
        raise FileNotFoundError(f"no trajectories at {file} (expected a run directory written by toolenv rollout)")

    return iter_trajectory_file(file, on_partial=partial_line_warning(file, warn)), file.parent


def run_name(folder: Path) -> str:
    """The name of a run's folder, for a page's title: that of the folder `.` or `sub/..` stands for
    (their own names are empty or `..`), and never more of its path than its name."""
    return Path(os.path.abspath(folder)).name or str(folder)


def check_distinct(runs: Sequence[str | Path]) -> None:
    """Refuse runs that name one trajectories file more than once (a run twice, its folder and
    its file, a link to it), whose episodes would all be read, reported or exported twice.

    Raises:
        ValueError: naming the run given again and the one it repeats.
    """
    seen: dict[tuple[int, int], str | Path] = {}
    for run in runs:
        try:
            st = run_file(run).stat()
        except OSError:  # not there: the reader's own error says so
            continue
        if (first := seen.get((st.st_dev, st.st_ino))) is not None:
            raise ValueError(f"{run} is {first} again (the same trajectories file): its episodes would be read twice")
        seen[st.st_dev, st.st_ino] = run


def partial_line_warning(file: Path, warn: Callable[[str], None] | None) -> Callable[[int], None]:
    """What a reader of `file` does with a partial last line: tell `warn`, or warn."""

    def partial(lineno: int) -> None:
        message = f"{file}:{lineno}: left out a partial last line (a run killed mid-write; resuming reruns it)"
        if warn is None:
            warnings.warn(message, stacklevel=4)
        else:
            warn(message)

    return partial


def _charts(rewards: Sequence[float], turns: Sequence[float], summary: Summary) -> list[str]:
    mix = summary.tool_mix
    lat = [
        (name, stats)
        for name, stats in (
            ("episode", summary.episode_latency_s),
            ("agent/act", summary.agent_latency_s),
            ("tool/call", summary.tool_latency_s),
        )
        if stats is not None
    ]
    lat_labels = [f"{name} {p}" for name, _ in lat for p in ("p50", "p90", "p99")]
    lat_values = [getattr(s, p) for _, s in lat for p in ("p50", "p90", "p99")]
    return [
        histogram(rewards, title="Reward distribution", xlabel="episode reward"),
        histogram(turns, title="Turns per episode", xlabel="turns", integer=True),
        bar_chart(list(mix), list(mix.values()), title="Tool-call mix", xlabel="calls per tool"),
        bar_chart(lat_labels, lat_values, title="Latency percentiles (s)", xlabel="seconds"),
    ]


def _finite(data: Any) -> Any:
    """`data` with each NaN or infinity as the string the trajectory file uses for it
    (`JSON.parse` rejects the bare `NaN` that `json.dumps` writes)."""
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data


def _json_for_script(data: Any) -> str:
    try:
        text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a non-finite float somewhere (rare): walk the data once more
        text = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False)
    text = fix_text(text)  # U+FFFD for a lone surrogate (half an emoji), which UTF-8 cannot hold
    # Inside <script> only "</" and "<!--" are dangerous; escaping every <, > and & covers both.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class _ImageTable:
    """An in-page image store: each distinct image once, as base64, under its hash.

    A task's prompt photo appears in every sample of it; in the page it is embedded once.
    Only the hashes stay: each image leaves with the data chunk it first appears in.
    """

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.pending: dict[str, str] = {}

    def put(self, data: bytes, mime: str) -> str:
        name = hashlib.sha256(data).hexdigest()
        if name not in self.seen:
            self.seen.add(name)
            self.pending[name] = base64.b64encode(data).decode("ascii")
        return name


#: Characters of JSON in one `<script>` of page data. The page's script reads each one's text as
#: one string; a browser's strings stop near 512 MiB (V8), so a report of one 640 MB script
#: showed no episode at all, and a whole run in one would cap its size there.
CHUNK_CHARS = 8_000_000


class _PageData:
    """The trajectories as `<script type="application/json" class="report-data">` chunks of
    `{"title", "episodes", "images"}`, written out as they fill, and what the summary and
    the charts need (so a run of any size is rendered without holding its trajectories)."""

    def __init__(self, write: Callable[[str], object], title: str) -> None:
        self._write = write
        self._title = title
        self._table = _ImageTable()
        self._episodes: list[str] = []
        self._size = 0
        self.chunks = 0
        self.summary = SummaryBuilder()
        self.rewards: list[float] = []
        self.turns: list[float] = []

    def add(self, traj: Trajectory) -> None:
        self.summary.add(traj)
        self.rewards.append(traj.reward)
        self.turns.append(float(len(traj.turns)))
        context = {IMAGE_STORE: self._table}
        try:
            data = traj.model_dump(mode="json", context=context)
        except PydanticSerializationError:  # numpy in metadata (a run kept in memory): as the file has it
            data = json.loads(dump_json(traj, context).text)
        text = _json_for_script(data)
        self._episodes.append(text)
        self._size += len(text) + sum(len(v) for v in self._table.pending.values())
        if self._size >= CHUNK_CHARS:
            self.flush()

    def flush(self) -> None:
        """Write what was added since the last chunk as one more (the page has at least one)."""
        if not self._episodes and not self._table.pending and self.chunks:
            return
        head = _json_for_script({"title": self._title})[:-1]  # the object left open
        images = _json_for_script(self._table.pending)
        self._write(
            f'<script type="application/json" class="report-data">{head}, "episodes": ['
            f'{", ".join(self._episodes)}], "images": {images}}}</script>\n'
        )
        self._episodes, self._size, self._table.pending = [], 0, {}
        self.chunks += 1


def _fill(template: str, values: dict[str, str]) -> str:
    # One pass over the template: text filled in (a title, a tool name) is never scanned again,
    # so a placeholder inside it stays text.
    return _PLACEHOLDER.sub(lambda m: values[m.group(0)], template)


def _page_parts(title: str, summary: Summary, rewards: Sequence[float], turns: Sequence[float]) -> tuple[str, str]:
    """The page before its data and after it."""
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary_rows(summary))
    values = {
        "__TITLE__": escape(title),
        "__GENERATED__": escape(datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        "__CSS__": _asset("report.css"),
        "__SUMMARY_ROWS__": rows,
        "__CHARTS__": "".join(f'<figure class="chart-box">{svg}</figure>' for svg in _charts(rewards, turns, summary)),
        "__JS__": _asset("report.js"),
    }
    before, after = _asset("template.html").split("__DATA__")
    return _fill(before, values), _fill(after, values)


def render_report(
    trajs: Sequence[Trajectory], *, title: str = "toolenv trajectories", summary: Summary | None = None
) -> str:
    """The report page for `trajs` as one HTML string."""
    parts: list[str] = []
    data = _PageData(parts.append, title)
    for t in trajs:
        data.add(t)
    data.flush()
    before, after = _page_parts(title, summary or data.summary.build(), data.rewards, data.turns)
    return before + "".join(parts) + after


def build_report(
    run: str | Path | Sequence[str | Path],
    out: str | Path | None = None,
    *,
    title: str | None = None,
    warn: Callable[[str], None] | None = None,
) -> Path:
    """Write the report of one or more runs; returns the HTML file's path (default `RUN/report.html`).

    Several runs (e.g. one per env) make one page whose env filter tells them apart. Each
    file is read as `load_run` reads it (`warn` as there), one trajectory at a time: the
    page's data goes to a temporary file beside the report as it is read, so memory stays
    flat however large the run, and no report is written when a line is invalid. The report
    is replaced whole (`toolenv._outputs.open_output`): a write that fails or is interrupted
    leaves the previous one; a FIFO or /dev/null is written into.

    Raises:
        FileNotFoundError: a run has no trajectories file.
        ValueError: a line is not a valid trajectory, a file holds none, or a run is given twice.
    """
    runs = [run] if isinstance(run, (str, Path)) else list(run)
    if not runs:
        raise ValueError("no run to report on")
    opened = [iter_run(r, warn=warn) for r in runs]  # a missing file is an error before any work
    check_distinct(runs)
    folders = [folder for _, folder in opened]
    target = Path(out) if out is not None else folders[0] / REPORT
    title = title or f"toolenv · {' + '.join(run_name(f) for f in folders)}"
    # The data's file is nameless (gone however the process ends) and its own (two reports at
    # once), beside the report, or in the run's folder for /dev/stdout (/dev is not writable).
    spool = folders[0] if in_system_folder(target) else Path(os.path.realpath(target)).parent
    spool.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile("w+", encoding="utf-8", dir=spool) as src:
        data = _PageData(src.write, title)
        for trajs, _ in opened:
            for t in trajs:
                data.add(t)
        data.flush()
        before, after = _page_parts(title, data.summary.build(), data.rewards, data.turns)
        src.seek(0)
        # Whole or not at all: a failed or interrupted write leaves the report that was there
        with open_output(target) as page:
            page.write(before)
            shutil.copyfileobj(src, page)
            page.write(after)
    return target
