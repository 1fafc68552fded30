"""`toolenv export RUN... --out FILE`: trajectories as chat-format fine-tuning data."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolenv.trajectory import Trajectory

HELP = "Write rollout trajectories as chat-format JSONL for supervised fine-tuning (e.g. the successful ones)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", metavar="RUN", type=Path, nargs="+", help="run directories (runs/NAME) or trajectories.jsonl files"
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="the JSONL file to write (the images of trajectories that have any go to images/ beside it)",
    )
    parser.add_argument("--success-only", action="store_true", help="keep only the episodes that succeeded")
    parser.add_argument("--min-reward", type=float, default=None, help="keep episodes with at least this reward")
    parser.add_argument(
        "--calls",
        choices=["text", "structured"],
        default="text",
        help="assistant tool calls as the model wrote them (text, default) or as tool_calls for the "
        "target model's chat template to write (structured)",
    )
    parser.add_argument(
        "--arguments",
        choices=["json", "object"],
        default="json",
        help="structured calls' arguments as a JSON string (json, the OpenAI spec, default) or as an "
        "object (what most Hugging Face chat templates expect)",
    )


def _warn(message: str) -> None:
    print(f"toolenv export: warning: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    import itertools

    from toolenv.export import export_chat
    from toolenv.report.html import iter_run

    runs = [iter_run(r, warn=_warn)[0] for r in args.run]  # a missing file is an error before any work
    read = 0

    def trajectories() -> Iterator[Trajectory]:  # streamed: a run of any size exports in flat memory
        nonlocal read
        for t in itertools.chain.from_iterable(runs):
            read += 1
            yield t

    written = export_chat(
        trajectories(),
        args.out,
        success_only=args.success_only,
        min_reward=args.min_reward,
        calls=args.calls,
        arguments=args.arguments,
    )
    print(f"wrote {written} of {read} trajectories to {args.out}")
    return 0
