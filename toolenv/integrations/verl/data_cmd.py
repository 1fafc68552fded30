"""`toolenv verl-data ENV_ID --out file.parquet`: write verl's dataset for an env."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toolenv._outputs import is_stdout
from toolenv.integrations.verl.data import DEFAULT_AGENT_NAME, build_rows, write_parquet

HELP = "Write a verl parquet dataset (one row per task) for training ENV_ID with verl."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", metavar="ENV_ID", help="e.g. toolenv/Spider-v0")
    parser.add_argument("--out", required=True, help="parquet file to write")
    parser.add_argument(
        "--split",
        default="all",
        choices=["all", "train", "test"],
        help="train: 90%% of the tasks, test: the other 10%% (a fixed hash of the task id), or the dataset's own "
        "train/test split when every task has one (MBPP); all: every task",
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument(
        "--env-kwargs",
        default="{}",
        help="JSON object of env factory overrides, e.g. '{\"max_turns\": 4}'; "
        '"tools" may list "module:Name" references or tool plugin names',
    )
    parser.add_argument("--agent-name", default=DEFAULT_AGENT_NAME, help="agent loop name stored in each row")
    parser.add_argument("--data-source", default=None, help="data_source column (default: ENV_ID)")
    parser.add_argument(
        "--native-tools",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the agent loop gives the model the tools through the chat template, so the prompt only says how to "
        "answer (default: on for --agent-name tool_agent, verl's own tool loop; off otherwise)",
    )
    parser.add_argument(
        "--skip-failed",
        action="store_true",
        help="leave out the tasks whose reset fails (an unreadable image, say) instead of stopping at the first; "
        "how many and the first reasons go to stderr, and the command still fails when every task does",
    )


def _env_kwargs(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--env-kwargs is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ValueError("--env-kwargs must be a JSON object")
    return value


#: Reasons shown of the tasks `--skip-failed` left out (each is one line; the rest are counted).
SHOWN_REASONS = 5


def _report_skipped(skipped: list[tuple[str, str]], total: int) -> None:
    """Say on stderr how many tasks were left out, and why for the first few."""
    if not skipped:
        return
    print(f"skipped {len(skipped)} of {total} tasks whose reset failed:", file=sys.stderr)
    for task_id, reason in skipped[:SHOWN_REASONS]:
        print(f"  task {task_id!r}: {reason}", file=sys.stderr)
    if len(skipped) > SHOWN_REASONS:
        print(f"  ... and {len(skipped) - SHOWN_REASONS} more", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    skipped: list[tuple[str, str]] = []
    rows = build_rows(
        args.env_id,
        env_kwargs=_env_kwargs(args.env_kwargs),
        split=args.split,
        limit=args.limit,
        agent_name=args.agent_name,
        data_source=args.data_source,
        native_tools=args.native_tools,
        skip_failed=args.skip_failed,
        skipped=skipped,
    )
    _report_skipped(skipped, len(rows) + len(skipped))
    path = write_parquet(rows, args.out)
    # Not into the data when the data goes to stdout (`--out /dev/stdout | ...`)
    print(
        f"wrote {len(rows)} row{'' if len(rows) == 1 else 's'} for {args.env_id} to {path}",
        file=sys.stderr if is_stdout(path) else sys.stdout,
    )
    return 0
