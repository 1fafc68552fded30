"""`toolenv export RUN... --out FILE`: trajectories as chat-format fine-tuning data."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolenv.trajectory import Trajectory

HELP = (
    "Write rollout trajectories as chat-format (or exact-token) JSONL for supervised fine-tuning "
    "(e.g. the successful ones)."
)


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
    parser.add_argument(
        "--format",
        choices=["chat", "tokens"],
        default="chat",
        help="chat messages (chat, default), or the exact token ids the model read and wrote with a loss "
        "mask and logprobs (tokens; needs trajectories with prompt_token_ids and token_ids)",
    )
    parser.add_argument("--success-only", action="store_true", help="keep only the episodes that succeeded")
    parser.add_argument("--min-reward", type=float, default=None, help="keep episodes with at least this reward")
    parser.add_argument(
        "--calls",
        choices=["text", "structured"],
        default=None,
        help="assistant tool calls as the model wrote them (text, default) or as tool_calls for the "
        "target model's chat template to write (structured)",
    )
    parser.add_argument(
        "--arguments",
        choices=["json", "object"],
        default=None,
        help="structured calls' arguments as a JSON string (json, the OpenAI spec, default) or as an "
        "object (what most Hugging Face chat templates expect)",
    )
    parser.add_argument(
        "--weights",
        action="store_true",
        help='put OpenAI\'s fine-tuning "weight" on every assistant message: 0 on a turn the env could not '
        "use (parse errors, or neither a tool call nor an answer), 1 on the others; with --format tokens, "
        "assistant_masks is 0 on such turns' tokens",
    )
    parser.add_argument(
        "--tools",
        metavar="ENV_ID|FILE.json",
        default=None,
        help="put these tool schemas on every line as `tools`, for the chat template to list as the model "
        "saw them (an agent with native tool calling, the transformers agent): an env's tool_schemas() "
        "(the env made with gym.make) or a JSON file holding a list of OpenAI function schemas",
    )


def _warn(message: str) -> None:
    print(f"toolenv export: warning: {message}", file=sys.stderr)


def _is_schema(item: Any) -> bool:
    function = item.get("function") if isinstance(item, dict) else None
    return item.get("type") == "function" and isinstance(function, dict) and isinstance(function.get("name"), str)


def _schema_file(path: Path) -> list[dict[str, Any]]:
    """The OpenAI function schemas a JSON file holds."""
    if not path.is_file():
        raise ValueError(f"--tools: no file named {path}")
    try:
        schemas = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"--tools: {path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(schemas, list) or not all(_is_schema(s) for s in schemas):
        raise ValueError(
            f"--tools: {path} must hold a list of OpenAI function schemas "
            '([{"type": "function", "function": {"name": ...}}, ...], what env.tool_schemas() returns)'
        )
    return schemas


def _env_schemas(env_id: str) -> list[dict[str, Any]]:
    """The tool schemas of the env `env_id` (`module:namespace/Name-vN` imports the module first)."""
    import gymnasium as gym
    from gymnasium.error import Error as GymError

    from toolenv.cli import error_line

    try:
        env = gym.make(env_id)
    except GymError as exc:  # a file name with a typo reads as an env id: say both were tried
        raise ValueError(f"--tools {env_id}: no such file, nor an env id Gymnasium knows ({error_line(exc)})") from None
    try:
        schemas = getattr(env.unwrapped, "tool_schemas", None)
        if not callable(schemas):
            raise TypeError(f"--tools: {env_id} is not a toolenv env (it has no tool_schemas())")
        return list(schemas())
    finally:
        env.close()


def tool_schemas(source: str) -> list[dict[str, Any]]:
    """`--tools`: a JSON file's schemas (a name ending in .json, or any existing file), else an env id's."""
    path = Path(source)
    return _schema_file(path) if path.suffix == ".json" or path.is_file() else _env_schemas(source)


def run(args: argparse.Namespace) -> int:
    import itertools

    from toolenv._outputs import is_stdout
    from toolenv.commands._paths import check_file, check_folder
    from toolenv.export import export_chat, export_tokens
    from toolenv.report.html import check_distinct, iter_run, run_file

    if args.format == "tokens" and (args.calls or args.arguments or args.tools):
        raise ValueError("--calls, --arguments and --tools shape chat messages; --format tokens writes token ids")
    tools = None if args.tools is None else tool_schemas(args.tools)
    runs = [iter_run(r, warn=_warn)[0] for r in args.run]  # a missing file is an error before any work
    check_distinct(args.run)
    inputs = {run_file(r).resolve() for r in args.run}
    if args.out.resolve() in inputs:  # the export would replace the run it reads
        raise ValueError(f"--out {args.out} is the trajectories file of a run being exported")
    check_file("--out", args.out, "sft.jsonl")
    check_folder("--out", args.out, args.out.parent)
    read = 0

    def trajectories() -> Iterator[Trajectory]:  # streamed: a run of any size exports in flat memory
        nonlocal read
        for t in itertools.chain.from_iterable(runs):
            read += 1
            yield t

    if args.format == "tokens":
        missing = 0

        def count(_: Trajectory) -> None:
            nonlocal missing
            missing += 1

        written = export_tokens(
            trajectories(),
            args.out,
            success_only=args.success_only,
            min_reward=args.min_reward,
            on_missing=count,
            weights=args.weights,
        )
        if missing:
            one = missing == 1
            _warn(
                f"{missing} kept {'trajectory has' if one else 'trajectories have'} no token ids and "
                f"{'was' if one else 'were'} left out (the transformers agent records them with "
                "record_prompt_ids=True, the openai agent with return_token_ids=True against vLLM)"
            )
    else:
        written = export_chat(
            trajectories(),
            args.out,
            success_only=args.success_only,
            min_reward=args.min_reward,
            calls=args.calls or "text",
            arguments=args.arguments or "json",
            tools=tools,
            weights=args.weights,
        )
    # Not into the data when the data goes to stdout (`--out /dev/stdout | jq`, `> all.jsonl`)
    print(
        f"wrote {written} of {read} trajectories to {args.out}", file=sys.stderr if is_stdout(args.out) else sys.stdout
    )
    return 0
