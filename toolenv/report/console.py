"""Terminal output of a rollout: a live progress bar and the closing summary table.

Rich draws both when it is installed. The progress is plain lines when its stream is not a
terminal or Rich is missing, and the table plain text without Rich, so the core keeps
working with its minimal dependencies.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import IO, Any

from toolenv.report.summary import Summary
from toolenv.trajectory import Trajectory

__all__ = ["Progress", "format_summary", "percent", "print_summary", "summary_rows"]


class Progress:
    """Episodes done, mean reward so far, tool errors and rate, updated per finished episode.

    On a terminal, a live Rich bar. Into a file or a pipe (nohup, Slurm, `2> log`), where Rich
    would draw nothing until the run ends and then one frame cut at 80 columns, plain lines:
    one at the start, one every `plain_interval` seconds as episodes finish, one at the end.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: IO[str] | None = None,
        label: str = "rollout",
        plain_interval: float = 30.0,
    ):
        self.total = total
        self.done = 0
        self.reward_sum = 0.0
        self.tool_errors = 0
        self.episode_errors = 0
        self.started = time.perf_counter()
        self.label = label
        self.plain_interval = plain_interval
        self._bar: Any = None
        self._task: Any = None
        self._plain: IO[str] | None = None  # the stream plain lines go to
        self._shown = -1  # the `done` of the last plain line
        self._shown_at = 0.0
        if not enabled:
            return
        out = stream or sys.stderr
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress
        except ImportError:  # pragma: no cover - rich is optional
            self._plain = out
            return
        console = Console(file=out)
        if not console.is_terminal:
            self._plain = out
            return
        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._bar.add_task(label, total=total, stats=self.stats())

    def stats(self) -> str:
        """The text beside the bar."""
        mean = self.reward_sum / self.done if self.done else 0.0
        rate = self.done / max(time.perf_counter() - self.started, 1e-9)
        text = f"reward {mean:.3f} | tool errors {self.tool_errors} | {rate:.2f} ep/s"
        return text + (f" | failed {self.episode_errors}" if self.episode_errors else "")

    def update(self, traj: Trajectory) -> None:
        """Count one finished episode."""
        self.done += 1
        self.reward_sum += traj.reward
        self.tool_errors += traj.tool_errors
        self.episode_errors += traj.error is not None
        if self._bar is not None:
            self._bar.update(self._task, advance=1, stats=self.stats())
        elif self._plain is not None and (
            self.done == self.total or time.perf_counter() - self._shown_at >= self.plain_interval
        ):
            self._line()

    def _line(self) -> None:
        """One plain progress line, flushed (a log file is read while the run goes on)."""
        assert self._plain is not None
        elapsed = int(time.perf_counter() - self.started)
        clock = f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"
        self._plain.write(f"{self.label}: {self.done}/{self.total} episodes | {self.stats()} | {clock}\n")
        self._plain.flush()
        self._shown, self._shown_at = self.done, time.perf_counter()

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        elif self._plain is not None:
            self._line()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self._plain is not None and self._shown != self.done:  # where a stopped run got to
            self._line()


def _lat(stats: Any) -> str:
    if stats is None:
        return "-"
    return f"p50 {stats.p50:.3f}s  p90 {stats.p90:.3f}s  p99 {stats.p99:.3f}s"


def percent(rate: float) -> str:
    """`rate` as a percentage with one decimal, or more where one would round a rate short of 1 up
    to 100.0% or one above 0 down to 0.0% (1 failure in 2,000 is 99.95%); `>99.999%` and
    `<0.001%` past three."""
    for digits in (1, 2, 3):
        text = f"{rate:.{digits}%}"
        shown = float(text[:-1])
        if (shown < 100 or rate >= 1) and (shown > 0 or rate <= 0):
            return text
    return ">99.999%" if rate > 0.5 else "<0.001%"


def _pass_at(pass_at_k: dict[str, float]) -> str:
    return ", ".join(f"pass@{k} {percent(v)}" for k, v in pass_at_k.items())


def _completed(s: Summary, metric: str, value: str | None) -> list[tuple[str, str]]:
    """The row of `metric` over the episodes that completed, to go beside the one over all
    episodes, where an episode a server failure stopped scores 0: when some episodes failed."""
    return [(f"{metric}, completed", value)] if s.episode_errors and value is not None else []


def _health_rows(s: Summary) -> list[tuple[str, str]]:
    """What the model server did to the turns that completed: retried requests and generations cut
    by max_tokens. Only when not zero."""
    rows = []
    if s.agent_retries:
        turns = "turn" if s.retried_turns == 1 else "turns"
        rows.append(("model requests retried", f"{s.agent_retries} (in {s.retried_turns} {turns})"))
    if s.truncated_generations:
        rows.append(("generations cut by max_tokens", str(s.truncated_generations)))
    return rows


def _tokens(s: Summary) -> str:
    """The token totals, saying how many turns they leave out (replies without usage)."""
    text = f"{s.prompt_tokens or 0} / {s.completion_tokens}"
    if s.turns_without_usage:
        turns = "turn" if s.turns_without_usage == 1 else "turns"
        text += f" ({s.turns_without_usage} {turns} without usage)"  # which the totals leave out
    return text


def summary_rows(s: Summary) -> list[tuple[str, str]]:
    """The summary as (metric, value) rows."""
    c_mean, c_rate, c_pass = s.completed_mean_reward, s.completed_success_rate, s.completed_pass_at_k
    rows = [
        ("episodes", str(s.episodes)),
        *_completed(s, "episodes", f"{s.completed_episodes} ({s.episode_errors} failed: rerun with --retry-errors)"),
        ("mean reward", f"{s.mean_reward:.4f} (std {s.std_reward:.4f})"),
        *_completed(s, "mean reward", None if c_mean is None else f"{c_mean:.4f}"),
        ("success rate", percent(s.success_rate)),
        *_completed(s, "success rate", None if c_rate is None else percent(c_rate)),
        *([("pass@k", _pass_at(s.pass_at_k))] if s.pass_at_k else []),
        *_completed(s, "pass@k", _pass_at(c_pass) if c_pass else None),
        ("turns / episode", f"{s.mean_turns:.2f}"),
        ("tool calls / episode", f"{s.tool_calls_per_episode:.2f}"),
        ("tool error rate", percent(s.tool_error_rate)),
        ("failed episodes", str(s.episode_errors)),
        *([("episodes with a reward error", str(s.reward_errors))] if s.reward_errors else []),
        ("truncated", percent(s.truncated_rate)),
        *_health_rows(s),
        ("episode latency", _lat(s.episode_latency_s)),
        ("agent latency / action", _lat(s.agent_latency_s)),
        ("tool latency / call", _lat(s.tool_latency_s)),
    ]
    if s.tool_mix:
        rows.append(("tool mix", ", ".join(f"{k} {v}" for k, v in s.tool_mix.items())))
    if s.cached_calls:
        rows.append(("calls answered by a cache", str(s.cached_calls)))
    if s.refused_calls:
        rows.append(("calls refused (circuit open)", str(s.refused_calls)))
    if s.infra_errors:
        rows.append(("failed calls not the model's fault", str(s.infra_errors)))
    if s.completion_tokens is not None:  # an agent that reports no tokens at all (the oracle): no row
        rows.append(("tokens (prompt / completion)", _tokens(s)))
    if s.wall_time_s is not None:
        rows.append(("wall time", f"{s.wall_time_s:.1f}s"))
    return rows


def format_summary(s: Summary) -> str:
    """The summary as a plain two-column text table."""
    rows = summary_rows(s)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def print_summary(s: Summary, *, title: str = "rollout summary", stream: IO[str] | None = None) -> None:
    """Print the summary table (Rich when installed)."""
    out = stream or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:  # pragma: no cover - rich is optional
        print(f"{title}\n{format_summary(s)}", file=out)
        return
    # Text, not markup: a tool name is what the model wrote, and `[/x]` in markup raises.
    table = Table(title=Text(title))
    table.add_column("metric", style="bold")
    table.add_column("value")
    for k, v in summary_rows(s):
        table.add_row(Text(k), Text(v))
    Console(file=out).print(table)
