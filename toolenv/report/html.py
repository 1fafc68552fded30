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
import re
import warnings
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from toolenv.image_store import IMAGE_STORE
from toolenv.report.console import summary_rows
from toolenv.report.summary import Summary, summarize
from toolenv.report.svg import bar_chart, histogram
from toolenv.trajectory import Trajectory, load_trajectory_file

__all__ = ["build_report", "load_run", "render_report"]

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
    path = Path(run)
    file = path if path.is_file() else path / "trajectories.jsonl"
    if not file.is_file():
        raise FileNotFoundError(f"no trajectories at {file} (expected a run directory written by toolenv rollout)")
    trajs, partial = load_trajectory_file(file)
    if partial is not None:
        message = f"{file}:{partial}: left out a partial last line (a run killed mid-write; resuming reruns it)"
        if warn is None:
            warnings.warn(message, stacklevel=2)
        else:
            warn(message)
    return trajs, file.parent


def _charts(trajs: Sequence[Trajectory], summary: Summary) -> list[str]:
    rewards = [t.reward for t in trajs]
    turns = [float(len(t.turns)) for t in trajs]
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
    # Inside <script> only "</" and "<!--" are dangerous; escaping every <, > and & covers both.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class _ImageTable:
    """An in-page image store: each distinct image once, as base64, under its hash.

    A task's prompt photo appears in every sample of it; in the page it is embedded once.
    """

    def __init__(self) -> None:
        self.images: dict[str, str] = {}

    def put(self, data: bytes, mime: str) -> str:
        name = hashlib.sha256(data).hexdigest()
        if name not in self.images:
            self.images[name] = base64.b64encode(data).decode("ascii")
        return name


def render_report(
    trajs: Sequence[Trajectory], *, title: str = "toolenv trajectories", summary: Summary | None = None
) -> str:
    """The report page for `trajs` as one HTML string."""
    summary = summary or summarize(trajs)
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary_rows(summary))
    table = _ImageTable()
    episodes = [t.model_dump(mode="json", context={IMAGE_STORE: table}) for t in trajs]
    data = {"title": title, "episodes": episodes, "images": table.images}
    values = {
        "__TITLE__": escape(title),
        "__GENERATED__": escape(datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        "__CSS__": _asset("report.css"),
        "__SUMMARY_ROWS__": rows,
        "__CHARTS__": "".join(f'<figure class="chart-box">{svg}</figure>' for svg in _charts(trajs, summary)),
        "__JS__": _asset("report.js"),
        "__DATA__": _json_for_script(data),
    }
    # One pass over the template: text filled in (a title, a tool name) is never scanned again,
    # so a placeholder inside it stays text.
    return _PLACEHOLDER.sub(lambda m: values[m.group(0)], _asset("template.html"))


def build_report(
    run: str | Path | Sequence[str | Path],
    out: str | Path | None = None,
    *,
    title: str | None = None,
    warn: Callable[[str], None] | None = None,
) -> Path:
    """Write the report of one or more runs; returns the HTML file's path (default `RUN/report.html`).

    Several runs (e.g. one per env) make one page whose env filter tells them apart. Each
    file is read as `load_run` reads it (`warn` as there).

    Raises:
        FileNotFoundError: a run has no trajectories file.
        ValueError: a line is not a valid trajectory, or a file holds none.
    """
    runs = [run] if isinstance(run, (str, Path)) else list(run)
    if not runs:
        raise ValueError("no run to report on")
    trajs: list[Trajectory] = []
    folders: list[Path] = []
    for r in runs:
        t, folder = load_run(r, warn=warn)
        trajs += t
        folders.append(folder)
    target = Path(out) if out is not None else folders[0] / REPORT
    target.parent.mkdir(parents=True, exist_ok=True)
    name = " + ".join(f.name for f in folders)
    target.write_text(render_report(trajs, title=title or f"toolenv · {name}"), encoding="utf-8")
    return target
