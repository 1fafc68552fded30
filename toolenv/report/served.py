"""The report as `toolenv view --serve` serves it: episodes read one at a time, by an index.

The self-contained page holds every episode, so a browser opening it loads the whole run
(a 1 GB rollout file is a page of about 1 GB) and the server reads all of it for each view.
Served, the page holds the summary and the charts only; the episode list comes from
`rows.json` (one small row per episode) and an episode, when it is opened, from
`episodes/N.json`, read from its own line of the run's file at the byte offset an index
built once, in one pass over the file, keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolenv.image_store import IMAGE_STORE, IMAGES_DIR, ImageStore
from toolenv.report.html import (
    _ImageTable,
    _json_for_script,
    _page_parts,
    check_distinct,
    partial_line_warning,
    run_file,
    run_name,
)
from toolenv.report.summary import SummaryBuilder
from toolenv.trajectory import Trajectory, kept_lines

__all__ = ["ROW_TEXT_CHARS", "RunIndex"]

#: Characters of a task's question, an answer and an error that an episode's row keeps for the
#: page's text search (a row is held for every episode of the run, by the server and the page).
ROW_TEXT_CHARS = 1000

#: Where the data goes in the page: how many episodes there are (the page fetches the rest).
_SERVED = '<script type="application/json" id="report-served">{data}</script>\n'


@dataclass(frozen=True, slots=True)
class _Line:
    """Where one episode is: its file, and the byte offset and length of its line."""

    file: Path
    offset: int
    length: int


def _row(traj: Trajectory) -> dict[str, Any]:
    """What the page's episode list shows and filters on, for one episode."""
    cap = ROW_TEXT_CHARS
    return {
        "task_id": traj.task.id,
        "sample": traj.sample,
        "env_id": traj.env_id,
        "reward": traj.reward,
        "turns": len(traj.turns),
        "calls": sum(len(t.parsed.tool_calls) for t in traj.turns),
        "tool_errors": sum(r.is_error for t in traj.turns for r in t.results),
        "error": bool(traj.error),
        "success": traj.success,
        "truncated": traj.truncated,
        "text": " ".join([traj.task.id, traj.task.question[:cap], (traj.answer or "")[:cap], (traj.error or "")[:cap]]),
    }


class RunIndex:
    """One or more runs' trajectories files, indexed for serving: built in one pass, then each
    episode is read from its own line.

    Raises (at construction), as `toolenv.report.load_run` does:
        FileNotFoundError: a run has no trajectories file.
        ValueError: a line is not a valid trajectory, a file holds none, or a run is given twice.
    """

    def __init__(
        self,
        runs: Sequence[str | Path],
        *,
        title: str | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        if not runs:
            raise ValueError("no run to report on")
        files = []
        for run in runs:
            file = run_file(run)
            if not file.is_file():
                raise FileNotFoundError(
                    f"no trajectories at {file} (expected a run directory written by toolenv rollout)"
                )
            files.append(file)
        check_distinct(runs)
        self.title = title or f"toolenv · {' + '.join(run_name(f.parent) for f in files)}"
        self.lines: list[_Line] = []
        rows: list[dict[str, Any]] = []
        summary = SummaryBuilder()
        rewards: list[float] = []
        turns: list[float] = []
        for file in files:
            for line, traj in _scan(file, warn):
                self.lines.append(line)
                rows.append(_row(traj))
                summary.add(traj)
                rewards.append(traj.reward)
                turns.append(float(len(traj.turns)))
        before, after = _page_parts(self.title, summary.build(), rewards, turns)
        before = before.replace(
            "Self-contained: works offline.", "Served: each episode is read from the run when you open it."
        )
        data = _json_for_script({"title": self.title, "episodes": len(self.lines)})
        self.page = (before + _SERVED.format(data=data) + after).encode("utf-8")
        self.rows = _json_for_script(rows).encode("utf-8")

    def __len__(self) -> int:
        return len(self.lines)

    def episode(self, i: int) -> bytes:
        """Episode `i` (in file order, from 0) as JSON, `{"episode", "images"}`: its line and nothing else is read.

        Raises:
            IndexError: no such episode.
            ValueError: its line is no longer the trajectory indexed (the file was rewritten or removed).
        """
        if not 0 <= i < len(self.lines):
            raise IndexError(f"no episode {i}: the run has {len(self.lines)}")
        where = self.lines[i]
        try:
            with open(where.file, "rb") as fh:
                fh.seek(where.offset)
                raw = fh.read(where.length)
        except FileNotFoundError:  # a later run removed it (lines aside put back) or the run is gone
            raise ValueError(
                f"{where.file} is gone since it was indexed; restart toolenv view to index it again"
            ) from None
        try:
            traj = Trajectory.model_validate_json(
                raw, context={IMAGE_STORE: ImageStore(where.file.parent / IMAGES_DIR)}
            )
        except ValueError:
            raise ValueError(
                f"{where.file} changed since it was indexed (episode {i + 1} is not where it was); "
                "restart toolenv view to index it again"
            ) from None
        table = _ImageTable()
        episode = traj.model_dump(mode="json", context={IMAGE_STORE: table})
        return _json_for_script({"episode": episode, "images": table.pending}).encode("utf-8")


def _scan(file: Path, warn: Callable[[str], None] | None) -> Iterator[tuple[_Line, Trajectory]]:
    """Each trajectory of `file` with where its line is, kept as `iter_trajectory_file` keeps
    them (`kept_lines`, the lines a killed `--retry-errors` run left aside included): read in
    bytes here, for the offsets."""
    return kept_lines(file, _lines(file), partial_line_warning(file, warn), read=_lines, key=_key)


def _key(item: tuple[_Line, Trajectory]) -> tuple[str, int]:
    return item[1].key


def _lines(file: Path) -> Iterator[tuple[int, tuple[_Line, Trajectory] | None, str]]:
    """Each non-blank line of `file`: its number, where it is with its trajectory (None when it is
    not one) and, for an invalid line, its text."""
    context = {IMAGE_STORE: ImageStore(file.parent / IMAGES_DIR)}
    offset = 0
    with open(file, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                traj = Trajectory.model_validate_json(raw, context=context)
            except ValueError:
                yield lineno, None, raw.decode("utf-8", "surrogateescape")
                continue
            yield lineno, (_Line(file, start, len(raw)), traj), ""
