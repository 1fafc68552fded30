"""Reports of rollouts: the summary numbers, the terminal table, and the self-contained HTML viewer."""

from toolenv.report.html import build_report, load_run, render_report
from toolenv.report.summary import LatencyStats, Summary, SummaryBuilder, summarize

__all__ = ["LatencyStats", "Summary", "SummaryBuilder", "build_report", "load_run", "render_report", "summarize"]
