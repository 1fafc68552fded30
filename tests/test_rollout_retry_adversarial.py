"""A reader of a `--retry-errors` run reads each episode once while another run changes the files.

`read_trajectories`, `toolenv view`, `toolenv export` and the report read the run's file and then
the lines a killed run left aside; a run that starts or ends meanwhile (putting lines back,
setting them aside) must not make an episode vanish from what the reader is in the middle of.
Real runs in real subprocesses, killed for real; no network.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from test_rollout_retry_durability import ALL, _by_key, _errored_run, _killed_retry, example

from toolenv.runner import rollout
from toolenv.trajectory import Trajectory, iter_trajectory_file, iter_trajectory_lines, kept_lines, retrying_file


def test_a_reader_meanwhile_a_resume_puts_the_lines_back_reads_each_once(tmp_path: Path) -> None:
    """A reader half way through the file when a resume puts the lines aside back into it (a new
    file, renamed over the one being read) and removes the file aside: they are read there."""
    run = tmp_path / "run"
    _errored_run(run, ["price", "color"])
    _killed_retry(run, tmp_path, ["color"], ["price"])  # color's earlier line is aside, not in the file
    reading = iter_trajectory_file(run / "trajectories.jsonl")
    first = next(reading)
    res = rollout(example.ENV_ID, example.ScriptedAgent(), out=run)  # no --retry-errors: color goes back
    assert (res.new, res.skipped) == (0, 4) and not retrying_file(run / "trajectories.jsonl").exists()
    by_id = _by_key([first, *reading])
    assert sorted(by_id) == sorted(ALL)
    assert by_id["color"].error is not None and by_id["price"].error is None


def test_a_reader_meanwhile_a_retry_sets_lines_aside_reads_each_once(tmp_path: Path) -> None:
    """A retry that sets the errored lines aside and rewrites the file between the reader's look
    for lines aside (none yet) and its opening of the file: the reader still reads them."""
    run = tmp_path / "run"
    _errored_run(run, ["price", "color"])
    path = run / "trajectories.jsonl"
    aside = retrying_file(path)
    retried: list[bool] = []

    def read(file: Path) -> Iterator[tuple[int, Trajectory | None, str]]:
        if file == aside and not retried:  # the reader's first look aside: a retry starts right after
            retried.append(True)
            yield from ()
            _killed_retry(run, tmp_path, ["price", "color"], [])
            return
        yield from iter_trajectory_lines(file)

    trajs = list(kept_lines(path, read(path), read=read, key=lambda t: t.key))
    assert retried and aside.exists()  # the retry did set them aside
    by_id = _by_key(trajs)
    assert sorted(by_id) == sorted(ALL)
    assert sorted(k for k, t in by_id.items() if t.error) == ["color", "price"]
