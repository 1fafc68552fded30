"""Small inline-SVG charts (histograms and bar charts) for the self-contained HTML report.

Hand-written rather than a plotting library: the report must open offline with no
script or font from anywhere, and these two chart kinds are a few dozen lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["bar_chart", "histogram"]

W, H = 360, 200
PAD_L, PAD_R, PAD_T, PAD_B = 48, 10, 28, 34
COLOR = "#3b6ea8"


def _frame(title: str, body: list[str], xlabel: str = "") -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text x="{W / 2}" y="16" text-anchor="middle" class="chart-title">{escape(title)}</text>',
        *body,
    ]
    if xlabel:
        parts.append(f'<text x="{W / 2}" y="{H - 4}" text-anchor="middle" class="chart-label">{escape(xlabel)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def histogram(values: Sequence[float], *, title: str, xlabel: str = "", bins: int = 10, integer: bool = False) -> str:
    """A histogram of `values` as an SVG string (integer=True: one bar per integer).

    NaN and infinite values are left out (they fall in no bin)."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return _frame(title, [f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text>'], xlabel)
    lo, hi = min(values), max(values)
    if integer:
        lo, hi = math.floor(lo), math.floor(hi)
        edges = [float(v) for v in range(int(lo), int(hi) + 2)]
    else:
        if hi == lo:
            lo, hi = lo - 0.5, hi + 0.5
        step = (hi - lo) / bins
        edges = [lo + i * step for i in range(bins + 1)]
    counts = [0] * (len(edges) - 1)
    for v in values:
        i = int(v - edges[0]) if integer else int((v - edges[0]) / (edges[-1] - edges[0]) * len(counts))
        counts[min(max(i, 0), len(counts) - 1)] += 1
    if integer:
        return _bars_svg([str(int(e)) for e in edges[:-1]], counts, title=title, xlabel=xlabel)
    return _bars_svg([_fmt(e) for e in edges[:-1]], counts, title=title, xlabel=xlabel, last=_fmt(edges[-1]))


def bar_chart(labels: Sequence[str], values: Sequence[float], *, title: str, xlabel: str = "") -> str:
    """Vertical bars, one per label."""
    if not labels:
        return _frame(title, [f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text>'], xlabel)
    return _bars_svg(list(labels), list(values), title=title, xlabel=xlabel)


def _bars_svg(labels: list[str], values: Sequence[float], *, title: str, xlabel: str, last: str | None = None) -> str:
    top = max(values) or 1
    n = len(values)
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    bw = plot_w / n
    body = [
        f'<line x1="{PAD_L}" y1="{PAD_T + plot_h}" x2="{W - PAD_R}" y2="{PAD_T + plot_h}" class="axis"/>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + 4}" text-anchor="end" class="tick">{_fmt(top)}</text>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + plot_h}" text-anchor="end" class="tick">0</text>',
    ]
    every = max(1, math.ceil(n / 8))
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        h = plot_h * v / top
        x = PAD_L + i * bw
        body.append(
            f'<rect x="{x + 1:.1f}" y="{PAD_T + plot_h - h:.1f}" width="{max(bw - 2, 1):.1f}" height="{h:.1f}" '
            f'fill="{COLOR}"><title>{escape(label)}: {_fmt(v)}</title></rect>'
        )
        if i % every == 0:
            anchor = "start" if last is not None else "middle"
            tx = x if last is not None else x + bw / 2
            y = PAD_T + plot_h + 12
            body.append(f'<text x="{tx:.1f}" y="{y}" text-anchor="{anchor}" class="tick">{escape(label[:12])}</text>')
    if last is not None:
        body.append(
            f'<text x="{W - PAD_R}" y="{PAD_T + plot_h + 12}" text-anchor="end" class="tick">{escape(last)}</text>'
        )
    return _frame(title, body, xlabel)
