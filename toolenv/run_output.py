"""A rollout's output directory: `trajectories.jsonl` (append, flushed per line), `images/`,
`summary.json`, `run.json`, the lock one run at a time holds, and the lines a `--retry-errors`
run keeps aside until their reruns are written."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Container, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from toolenv._outputs import open_output
from toolenv.image_store import IMAGE_STORE, IMAGES_DIR, ImageStore
from toolenv.report.summary import Summary
from toolenv.trajectory import (
    Trajectory,
    dump_line,
    invalid_line_message,
    iter_trajectory_lines,
    retrying_file,
)

__all__ = ["LOCK", "RUN_CONFIG", "SUMMARY", "TRAJECTORIES", "RunOutput", "reaches"]

TRAJECTORIES = "trajectories.jsonl"
SUMMARY = "summary.json"
RUN_CONFIG = "run.json"
LOCK = ".lock"


def reaches(reward: float, threshold: float) -> bool:
    """`reward >= threshold`, a reward a float rounding below it included: weights 0.6, 0.3
    and 0.1 add up to 0.9999999999999999, and a perfect episode is a success all the same."""
    return reward >= threshold or math.isclose(reward, threshold, rel_tol=1e-9, abs_tol=1e-12)


class RunOutput:
    """`trajectories.jsonl` (append, flushed per line), `images/`, `summary.json`, `run.json`.

    Nothing on disk changes until `start` (after the caller has checked what `load` gave).
    Earlier trajectories are read one at a time and the file is rewritten line by line, so
    resuming holds none of them unless the caller keeps them (`keep_trajectories`).

    An errored line `--retry-errors` reruns moves to the `retrying_file` first, then leaves
    the file, and stays there until its rerun is appended: at every moment each episode has
    its earlier line or its rerun in the directory, whatever kills the run. `restore` puts
    back the lines whose rerun was not written when the run ends; after a SIGKILL, readers
    and the next `load` count those whose episode the file has no line of. Not appending the
    reruns beside the errored lines: then the file would hold two lines of an episode until
    the end, and a reader streaming it could not tell the first was superseded.
    """

    def __init__(self, out: Path, *, resume: bool, overwrite: bool, images: str) -> None:
        self.dir = out
        self.path = out / TRAJECTORIES
        self.retrying = retrying_file(self.path)
        self.images = ImageStore(out / IMAGES_DIR) if images == "files" else None
        self._rewrite = overwrite  # the file needs writing afresh at `start`
        self._edits: dict[int, bool | None] = {}  # line number -> its new `success`, or None: dropped
        self._moved: set[int] = set()  # line numbers of the file's lines to rerun: to the retrying file
        self._back: dict[int, bool | None] = {}  # retrying file line -> into the file (a new `success`)
        self._aside: set[int] = set()  # retrying file lines to rerun again: they stay there
        self._waiting: set[tuple[str, int]] = set()  # episodes whose earlier line is aside, not yet rerun
        self._started = False
        self._cut = False  # a write failed: the file may end in a cut line
        self._load_previous = False
        self._fh: IO[str] | None = None
        out.mkdir(parents=True, exist_ok=True)
        self._lock = _lock(out)
        try:
            if (_has_lines(self.path) or _has_lines(self.retrying)) and not overwrite:
                if not resume:
                    held = self.path if _has_lines(self.path) else self.retrying  # a killed retry left only those
                    raise FileExistsError(f"{held} already has trajectories; resume, or overwrite to start again")
                self._load_previous = True
            if not self.path.exists():
                self._rewrite = True
        except BaseException:
            self.unlock()
            raise

    def previous_config(self) -> dict[str, Any]:
        """The `run.json` of the run being resumed ({} when starting afresh, or none is readable)."""
        if not self._load_previous:
            return {}
        try:
            config = json.loads((self.dir / RUN_CONFIG).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return config if isinstance(config, dict) else {}

    def load(self, retry: Container[tuple[str, int]], success_threshold: float) -> Iterator[Trajectory]:
        """Each earlier trajectory to keep, its `success` marked at `success_threshold`
        (a line whose `success` changes is rewritten at `start`). An errored one whose
        (task id, sample) is in `retry` is not given: it is run again, its line kept aside
        until then; an errored one this run will not run again stays. Then those of the
        retrying file a killed run left whose episode the file has no line of."""
        if not self._load_previous:
            return
        here: set[tuple[str, int]] = set()
        lines = iter_trajectory_lines(self.path) if self.path.exists() else iter(())
        for lineno, traj, line in lines:
            if traj is None:
                if line.endswith("\n"):  # not what a killed write leaves: never drop it unasked
                    raise _cannot_resume(self.path, lineno, line)
                self._edits[lineno] = None  # a partial last line from a killed run: dropped
                continue
            if traj.error is not None and traj.key in retry:
                self._edits[lineno] = None
                self._moved.add(lineno)
                self._waiting.add(traj.key)
                continue
            here.add(traj.key)
            success = traj.error is None and reaches(traj.reward, success_threshold)
            if success != traj.success:
                traj.success = self._edits[lineno] = success
            elif not line.endswith("\n"):  # a last line without its newline gets one
                self._rewrite = True
            yield traj
        yield from self._load_aside(here, retry, success_threshold)

    def _load_aside(
        self, here: set[tuple[str, int]], retry: Container[tuple[str, int]], success_threshold: float
    ) -> Iterator[Trajectory]:
        """The lines of the retrying file a killed run left, of episodes with no line in the file
        (`here`, or one being rerun): one to rerun again stays aside, the others go back."""
        if not self.retrying.exists():
            return
        for lineno, traj, line in iter_trajectory_lines(self.retrying):
            if traj is None:
                raise _cannot_resume(self.retrying, lineno, line)
            if traj.key in here or traj.key in self._waiting:  # the file's line is the later one
                continue
            if traj.error is not None and traj.key in retry:
                self._aside.add(lineno)
                self._waiting.add(traj.key)
                continue
            here.add(traj.key)
            success = traj.error is None and reaches(traj.reward, success_threshold)
            self._back[lineno] = None if success == traj.success else success
            traj.success = success
            yield traj

    def start(self) -> None:
        """Start writing: apply what `load` decided (lines set aside or dropped, `success`
        changed, lines aside put back) and remove a stale summary."""
        (self.dir / SUMMARY).unlink(missing_ok=True)  # a killed run must not leave an earlier run's summary
        if not self._load_previous:  # started afresh: an earlier run's images are nobody's now
            self.retrying.unlink(missing_ok=True)
            (self.images or ImageStore(self.dir / IMAGES_DIR)).clear()
        back = self._back
        if self._waiting:  # before the file loses them, with every line aside a killed run left
            with open_output(self.retrying) as dst:
                n = _picked(self.path, dict.fromkeys(self._moved), dst)
                kept = sorted(self._aside | back.keys())
                _picked(self.retrying, {i: back.get(i) for i in kept}, dst)
            back = {n + 1 + i: back[lineno] for i, lineno in enumerate(kept) if lineno in back}  # numbered anew
        if self._rewrite or self._edits or back:  # atomically: a crash now leaves the old file or the new one
            # with its permissions, and through a symlink the file it points to (`open_output`)
            with open_output(self.path) as dst:
                if self._load_previous:  # else the file starts empty (`overwrite`)
                    _rewritten(self.path, self._edits, dst)
                    _picked(self.retrying, back, dst)
        if not self._waiting:  # what was aside is back in the file
            self.retrying.unlink(missing_ok=True)
        self._edits, self._back, self._moved, self._aside = {}, {}, set(), set()
        self._started = True

    def write(self, traj: Trajectory) -> Trajectory:
        """Append `traj` and return it as written: a value JSON cannot hold is written as null
        and named in `error` (the returned trajectory is read back from the line)."""
        line, problems, altered = dump_line(traj, self.images)
        if problems:
            said = f"could not write {'; '.join(problems)}"
            traj.error = f"{traj.error}; {said}" if traj.error else said
            traj.success = False
            line = dump_line(traj, self.images).text
        if altered:  # keep in memory what the file holds
            context = {IMAGE_STORE: self.images} if self.images else None
            try:
                traj = Trajectory.model_validate_json(line, context=context)
            except ValidationError:  # what was left does not read back: keep who ran what, and why
                traj = Trajectory(
                    env_id=traj.env_id,
                    agent=traj.agent,
                    model=traj.model,
                    task=traj.task,
                    sample=traj.sample,
                    seed=traj.seed,
                    episode_id=traj.episode_id,
                    error=f"{traj.error or 'the trajectory could not be written'}; its turns were left out",
                    started_at=traj.started_at,
                    duration_s=traj.duration_s,
                )
                line = dump_line(traj, self.images).text
        self._append(line + "\n")
        self._waiting.discard(traj.key)  # its rerun is in the file now: the line aside is superseded
        return traj

    def _append(self, text: str) -> None:
        """Append `text` and flush it; a write that fails may leave part of it, a cut last line
        that nothing must follow (`restore` then leaves the lines aside where they are)."""
        try:
            if self._fh is None:
                self._fh = self.path.open("a", encoding="utf-8")
            self._fh.write(text)
            self._fh.flush()
        except BaseException:
            self._cut = True
            raise

    def restore(self, add: Callable[[Trajectory], None] | None = None) -> None:
        """End the retry: append the earlier lines of the episodes whose rerun was not written
        (a run stopped or failed), each given to `add`, and remove the retrying file. When the
        file may end in a cut line, or appending fails, they stay aside instead, where readers
        and the next resume count them. Once, after `start`."""
        if not self._started:
            return
        self._started = False
        keep = self._cut
        try:
            if self._waiting:
                for _, traj, line in iter_trajectory_lines(self.retrying):
                    if traj is None:  # unreadable now (an image gone): not ours to drop
                        keep = True
                        continue
                    if traj.key not in self._waiting:  # rerun: its line in the file supersedes this one
                        continue
                    self._waiting.discard(traj.key)
                    if add is not None:
                        add(traj)  # in the directory either way: the summary counts it
                    if not keep:
                        try:
                            self._append(line if line.endswith("\n") else line + "\n")
                        except OSError:
                            keep = True
                if self._fh is not None:
                    os.fsync(self._fh.fileno())  # the lines are in the file before the file aside goes
            if not keep:
                self.retrying.unlink(missing_ok=True)
        except OSError:  # a full disk: the lines aside stay (and the run's own error is the one told)
            self._cut = True

    def write_config(self, config: Mapping[str, Any]) -> None:
        (self.dir / RUN_CONFIG).write_text(json.dumps(config, indent=2, default=str) + "\n", encoding="utf-8")

    def write_summary(self, summary: Summary) -> None:
        tmp = self.dir / (SUMMARY + ".tmp")
        tmp.write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.dir / SUMMARY)

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            if self._cut:  # its buffer still holds the write that failed: the run's error says why
                with contextlib.suppress(OSError):
                    fh.close()
            else:
                fh.close()

    def unlock(self) -> None:
        """Let another run use the directory (the lines aside put back, if the run has not)."""
        self.restore()
        self.close()
        if self._lock is not None:
            self._lock.close()  # closing the file releases its lock
            self._lock = None


def _lock(out: Path) -> IO[bytes] | None:
    """An exclusive lock on `out` (held by the open file `out/.lock`), so a second run on it
    fails at once instead of writing into the same file: ours, or None where the platform
    (Windows) or file system (an NFS mount without locking) has none."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    fh = (out / LOCK).open("a+b")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise RuntimeError(
            f"another run is writing to {out}; wait for it to end, or use another output directory"
        ) from None
    except OSError:  # no locks on this file system: run unguarded, as before
        fh.close()
        return None
    return fh


def _has_lines(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def _cannot_resume(path: Path, lineno: int, line: str) -> ValueError:
    return ValueError(
        f"cannot resume: {invalid_line_message(path, lineno, line)}; "
        "fix or remove that line, or use --overwrite (overwrite=True) to start again"
    )


def _lines_of(path: Path) -> Iterator[tuple[int, str]]:
    """Each non-blank line of `path` with its number, as `iter_trajectory_lines` numbers them
    (none when it is not there); a cut last line, from a killed write, too."""
    if not path.exists():
        return
    with path.open(encoding="utf-8", errors="surrogateescape") as src:
        for lineno, line in enumerate(src, 1):
            if line.strip():
                yield lineno, line


def _written(line: str, success: bool | None, dst: IO[str]) -> None:
    """Write `line` to `dst` with its newline, its `success` set to `success` (None: as it is)."""
    if success is not None:
        data = json.loads(line)
        data["success"] = success
        line = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    dst.write(line if line.endswith("\n") else line + "\n")


def _rewritten(src: Path, edits: Mapping[int, bool | None], dst: IO[str]) -> None:
    """Every line of `src` into `dst`, as `edits` says: its new `success`, or None: left out."""
    for lineno, line in _lines_of(src):
        edit = edits.get(lineno, line)
        if edit is not None:
            _written(line, edit if isinstance(edit, bool) else None, dst)


def _picked(src: Path, picks: Mapping[int, bool | None], dst: IO[str]) -> int:
    """The lines of `src` numbered in `picks` into `dst`, each with its new `success` (None: as
    it is); returns how many."""
    n = 0
    if picks:
        for lineno, line in _lines_of(src):
            if lineno in picks:
                _written(line, picks[lineno], dst)
                n += 1
    return n
