"""`toolenv rollout ENV_ID --agent NAME -n N --concurrency C --out runs/NAME`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import re
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from toolenv import _aio

if TYPE_CHECKING:
    from toolenv.runner import RolloutResult
    from toolenv.trajectory import Trajectory

HELP = "Run an agent on an env concurrently; write trajectories (JSONL), a summary table and summary.json."


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _kv(text: str) -> tuple[str, Any]:
    """`KEY=VALUE`, VALUE read as JSON when it is JSON (`3`, `true`, `["sql"]`), else the string
    as typed (`007`, `True`, a path; `NaN` and `Infinity` too, which Python's json reads)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value, parse_constant=_not_json)
    except ValueError:  # json.JSONDecodeError is one
        return key, value  # a bare string such as a path or a model name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", metavar="ENV_ID", help="a registered env id, e.g. toolenv/Spider-v0")
    parser.add_argument(
        "--agent", required=True, help="agent plugin name (openai, transformers, oracle, replay) or module:attr"
    )
    parser.add_argument("--model", help="model name or path, passed to the agent as model=")
    parser.add_argument("--base-url", help="server URL, passed to the agent as base_url=")
    parser.add_argument(
        "--agent-arg",
        action="append",
        type=_kv,
        default=[],
        metavar="KEY=VALUE",
        help="another agent argument (VALUE parsed as JSON when it is JSON); repeatable",
    )
    parser.add_argument(
        "--env-arg",
        action="append",
        type=_kv,
        default=[],
        metavar="KEY=VALUE",
        help="a gym.make keyword (max_turns=6, parser=tags...); repeatable",
    )
    parser.add_argument("--tasks", type=Path, help="a JSONL file of tasks to run instead of the env's own")
    parser.add_argument("-n", type=_positive_int, default=None, help="run the first N tasks (default: all)")
    parser.add_argument("--samples", type=_positive_int, default=1, help="attempts per task (default 1)")
    parser.add_argument("--concurrency", "-c", type=_positive_int, default=8, help="episodes in flight (default 8)")
    parser.add_argument("--out", type=Path, required=True, help="output directory, e.g. runs/NAME")
    parser.add_argument(
        "--seed", type=_non_negative_int, default=0, help="episode i resets with seed+i (0 or more; default 0)"
    )
    parser.add_argument("--success-threshold", type=float, default=1.0, help="reward counted as success (default 1.0)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--overwrite", action="store_true", help="start the output afresh instead of resuming")
    mode.add_argument(
        "--retry-errors", action="store_true", help="on resume, rerun this run's episodes that ended with an error"
    )
    parser.add_argument(
        "--episode-timeout",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="stop an episode that runs longer and record it as an error (default: no limit)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no live progress bar")
    parser.add_argument(
        "--images",
        choices=["inline", "files"],
        default="inline",
        help="inline: base64 inside each line (default); files: each distinct image once in OUT/images/",
    )
    parser.add_argument(
        "--no-gc-tuning",
        action="store_true",
        help="leave the garbage collector at its settings (default: tuned for the run, see docs/rollout.md)",
    )


class _Stopped(Exception):
    """The run was stopped by a signal (SIGINT or SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def _cancel_on_signal(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` so that Ctrl-C (SIGINT) or SIGTERM cancels it, then raise `_Stopped`.

    Cancelling lets the runner write `summary.json` (with `"interrupted": true`) and close
    its envs, as `asyncio.run` does for SIGINT from Python 3.11 on; SIGTERM (`kill`,
    `timeout`, `docker stop`, a preempted Slurm or Kubernetes job) would otherwise end the
    process at once. Python 3.10's `asyncio.run` raises KeyboardInterrupt wherever the
    signal lands, inside the event loop's own code too, and its shutdown can then hang.
    A second signal acts as usual (Ctrl-C interrupts, SIGTERM kills), even while a blocking
    call holds the event loop (an agent loading a model's weights, an env building its
    index): the handlers are Python's, which run between bytecodes, not the loop's, which
    would wait for the loop to get control back.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stopped_by: int | None = None
    waiting = True  # a signal after `coro` returned cancels nothing
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopped_by
        if stopped_by is None:
            stopped_by = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one acts as usual
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if waiting and task is not None and not task.done():
            task.cancel()
            loop.call_soon_threadsafe(lambda: None)  # wakes a loop waiting in select()

    try:
        for sig in _STOP_SIGNALS:
            previous[sig] = signal.signal(sig, on_signal)
    except ValueError:  # not the main thread
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        return await coro
    try:
        result = await coro
        waiting = False
        return result
    except asyncio.CancelledError:
        if stopped_by is not None:
            raise _Stopped(stopped_by) from None
        raise
    finally:
        waiting = False
        for sig, handler in previous.items():  # None: one not set from Python, left as the default
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _int_at_least(text: str, least: int, why: str = "") -> int:
    """An integer option of at least `least`, checked here so that the error names the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more{why}, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    """`--seed`."""
    return _int_at_least(text, 0, " (gymnasium seeds are non-negative)")


def _positive_int(text: str) -> int:
    """A count (`-n`, `--samples`, `-c`)."""
    return _int_at_least(text, 1)


#: Python's words for a call without a required argument (the agent's `__init__`, here).
_MISSING_ARGUMENTS = re.compile(r"missing \d+ required (?:positional |keyword-only )?arguments?: (?P<names>.+)$")

#: The agent arguments that have flags of their own; the others go in `--agent-arg KEY=VALUE`.
_AGENT_FLAGS = {"model": "--model", "base_url": "--base-url"}


def _with_agent_flags(message: str) -> str:
    """An agent's "missing 1 required positional argument: 'model'" with the flags that give
    what it misses (`--model`, `--agent-arg path=VALUE`): the signature's words are Python's."""
    found = _MISSING_ARGUMENTS.search(message)
    if found is None or not message.startswith("agent "):
        return message
    flags = [_AGENT_FLAGS.get(name, f"--agent-arg {name}=VALUE") for name in re.findall(r"'(\w+)'", found["names"])]
    return f"{message}; pass {' and '.join(flags)}" if flags else message


def _positive_seconds(text: str) -> float:
    """`--episode-timeout`: a number of seconds above 0, as the runner takes it (`inf`: no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    from toolenv.commands._paths import check_folder
    from toolenv.registry import PluginError
    from toolenv.report.console import print_summary
    from toolenv.runner import arollout

    check_folder("--out", args.out, args.out)
    agent_kwargs: dict[str, Any] = dict(args.agent_arg)
    if args.model is not None:
        agent_kwargs["model"] = args.model
    if args.base_url is not None:
        agent_kwargs["base_url"] = args.base_url
    tally = _RunTally()
    try:
        result = _aio.run(
            _cancel_on_signal(
                arollout(
                    args.env_id,
                    args.agent,
                    n=args.n,
                    tasks=args.tasks,
                    samples=args.samples,
                    concurrency=args.concurrency,
                    out=args.out,
                    overwrite=args.overwrite,
                    retry_errors=args.retry_errors,
                    env_kwargs=dict(args.env_arg),
                    agent_kwargs=agent_kwargs,
                    seed=args.seed,
                    success_threshold=args.success_threshold,
                    progress=not args.no_progress,
                    tune_gc=not args.no_gc_tuning,
                    images=args.images,
                    episode_timeout=args.episode_timeout,
                    keep_trajectories=False,  # memory flat however long the run; the file has them all
                    on_trajectory=tally.add,
                )
            )
        )
    except PluginError as exc:  # an agent that cannot be built: say which flag gives what it lacks
        raise PluginError(_with_agent_flags(str(exc))) from exc
    except (KeyboardInterrupt, _Stopped) as exc:
        signum = exc.signum if isinstance(exc, _Stopped) else signal.SIGINT
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"toolenv rollout: {how}; {_kept(args)}", file=sys.stderr)
        return 128 + int(signum)  # as a shell reports a process a signal ended: 130 (INT), 143 (TERM)
    except OSError as exc:
        if exc.errno not in _DISK_FULL:
            raise
        where = exc.filename or args.out  # a failed write names no file: the run's folder, where it writes
        said = f"could not write to {where} ({_os_error(exc)}); {_kept(args, 'free space and ')}"
        print(f"toolenv rollout: {said}", file=sys.stderr)
        return 2
    print_summary(result.summary, title=f"{args.env_id} × {args.agent}")
    print(f"{result.new} new, {result.skipped} already done; wrote {args.out / 'trajectories.jsonl'} and summary.json")
    for line in tally.warnings():
        print(line, file=sys.stderr)
    return _report_errors(args, result, tally)


#: The errors of a disk that is full (or a file at its size limit, a user at their quota).
_DISK_FULL = frozenset(code for code in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None)) if code is not None)


def _os_error(exc: OSError) -> str:
    """`[Errno 28] No space left on device`, without the file name `str(exc)` may add."""
    return f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)


def _kept(args: argparse.Namespace, first: str = "") -> str:
    """How many trajectories the stopped run left and how to go on from them: `first` (free
    space, say), then the same command (without `--overwrite`, which would throw them away)."""
    path = args.out / "trajectories.jsonl"
    # Only a regular file: /dev/full, say, reads as endless zeros
    kept = _complete_lines(path) if path.is_file() else 0
    again = "run it again without --overwrite" if args.overwrite else "run the same command"
    return f"{kept} trajectories kept in {path} ({first}{again} to resume)"


def _report_errors(args: argparse.Namespace, result: RolloutResult, tally: _RunTally) -> int:
    """Say which episodes ended with an error, with this run's first error and what to do next;
    the exit code: 1 when every episode of this run failed (a server down, a wrong --base-url:
    not data but a failed run), else 0."""
    errors, first = result.summary.episode_errors, tally.episodes.example
    if tally.mostly_rate_limited():
        print(tally.rate_limit_advice(), file=sys.stderr)
    if result.new and result.new_errors == result.new:
        print(
            f"toolenv rollout: every episode of this run ended with an error ({result.new}; fix the cause, "
            f"then rerun them with --retry-errors), e.g.: {first}",
            file=sys.stderr,
        )
        return 1
    if result.new_errors:
        print(
            f"{errors} episode(s) ended with an error (rerun them with --retry-errors), e.g.: {first}", file=sys.stderr
        )
    elif errors:  # all from earlier runs, which the same command skips
        earlier = _first_error(args.out / "trajectories.jsonl")
        print(
            f"{errors} episode(s) ended with an error, e.g.: {earlier} "
            "(none of them in this run: the same command skips them; --retry-errors reruns them)",
            file=sys.stderr,
        )
    return 0


class _Share:
    """How many of this run's calls or episodes there were, how many failed, and the first
    failure's error (one line): what a warning about a backend down for the whole run says."""

    #: Fewer than this are too few for a share to mean much: one bad argument of two calls is
    #: half of them. All of them failing still warns.
    FEW = 4

    def __init__(self) -> None:
        self.total = self.failed = 0
        self.example: str | None = None

    def add(self, error: str | None) -> None:
        """Count one call or episode, failed when `error` is not None."""
        self.total += 1
        if error is not None:
            self.failed += 1
            if self.example is None:
                from toolenv.cli import clip_line  # an error may quote a page of a server's reply

                self.example = clip_line(error)

    def mostly_failed(self) -> bool:
        """Whether to warn: every one failed, or at least half of `FEW` or more. A dead backend
        fails all; one of two backends down, or a flaky one, half or more; a model's own bad
        calls (or an answer a judge cannot read) rarely come near half once past the first few."""
        if not self.failed:
            return False
        return self.failed == self.total or (self.total >= self.FEW and 2 * self.failed >= self.total)


#: An episode's error that is the server's rate limit (the `openai` agent's `HTTP 429: ...`).
_RATE_LIMITED = re.compile(r"\bHTTP 429\b")


class _RunTally:
    """This run's tool calls and episode rewards (its new episodes', not those a resume skipped)
    that failed. A backend down for a whole run fails every one while the episodes go on, and
    the run looks successful: a retriever answering HTTP 500 fails each call (the model sees
    the error), a judge at a wrong URL scores each episode 0 (its error in `reward_info`)."""

    def __init__(self) -> None:
        self.tool_calls = _Share()
        self.rewards = _Share()
        self.episodes = _Share()  # the first error quoted is this run's, not an earlier run's in the file
        self.rate_limited = 0  # episodes whose error is a 429 after the agent's retries

    def add(self, traj: Trajectory) -> None:
        """Count one finished episode's calls, reward and error (the runner's `on_trajectory`)."""
        for turn in traj.turns:
            for call in turn.calls:
                self.tool_calls.add(call.error)
        self.rewards.add(traj.reward_error)
        self.episodes.add(traj.error)
        if traj.error is not None and _RATE_LIMITED.search(traj.error):
            self.rate_limited += 1

    def mostly_rate_limited(self) -> bool:
        """Whether most of this run's failed episodes ended on HTTP 429 and the error quoted does not
        already say what to lower (the `openai` agent's own error may)."""
        failed = self.episodes.failed
        return (
            bool(failed) and 2 * self.rate_limited > failed and "max_concurrency" not in (self.episodes.example or "")
        )

    def rate_limit_advice(self) -> str:
        """The stderr line for a run the server's rate limit failed: what to lower, and how to rerun."""
        return (
            f"toolenv rollout: {self.rate_limited} of {self.episodes.failed} failed episodes of this run ended on "
            "HTTP 429 (the server refused requests for load): lower the agent's requests in flight with "
            "--agent-arg max_concurrency=N (or run fewer episodes at once with -c), then rerun them with --retry-errors"
        )

    def warnings(self) -> list[str]:
        """The stderr lines to print: one per kind of failure that most of the run had."""
        lines = []
        calls, rewards = self.tool_calls, self.rewards
        if calls.mostly_failed():
            lines.append(
                f"toolenv rollout: {calls.failed} of {calls.total} tool calls in this run failed "
                f"(the episodes went on: see tool_error_rate), e.g.: {calls.example}"
            )
        if rewards.mostly_failed():
            lines.append(
                f"toolenv rollout: in {rewards.failed} of {rewards.total} episodes of this run a reward "
                f"reported an error (it scored 0: see reward_info in the trajectories), e.g.: {rewards.example}"
            )
        return lines


def _complete_lines(path: Path) -> int:
    """Lines with their newline: the trajectories kept (the runner writes only valid lines, and
    a resume refuses a file with any other invalid line), counted without parsing them."""
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.endswith(b"\n") and line.strip())


def _first_error(path: Path) -> str | None:
    """The `error` of the first trajectory in the file that has one (read line by line), as one
    line of at most `MAX_ERROR_CHARS`: an error may quote a server's response body, a page of JSON."""
    from toolenv.cli import clip_line

    with path.open(encoding="utf-8") as fh:
        for line in fh:
            with contextlib.suppress(ValueError):  # a partial last line
                data = json.loads(line)
                if isinstance(data, dict) and data.get("error") is not None:
                    return clip_line(str(data["error"]))
    return None
