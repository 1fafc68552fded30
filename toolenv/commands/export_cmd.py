"""`toolenv export RUN... --out FILE`: trajectories as chat-format fine-tuning data."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolenv.trajectory import Trajectory, TurnRecord

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
        "(the env made with gym.make, with the env arguments of the exported runs that ran it, from their "
        "run.json) or a JSON file holding a list of OpenAI function schemas",
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


#: What `--tools` says to do when the env cannot be made as the run made it.
_USE_A_FILE = (
    "pass its schemas as a JSON file instead (--tools FILE.json, what json.dumps(env.tool_schemas()) "
    "writes for the env made as the run made it)"
)


def _bare_id(env_id: str) -> str:
    """An env id without the `module:` gym.make imports first (`mtenv:mt/Research-v0`)."""
    return env_id.rpartition(":")[2]


def _run_config(run: Path) -> dict[str, Any] | None:
    """The run.json of a run folder, or beside a trajectories file (None: none readable)."""
    from toolenv.report.html import run_file
    from toolenv.run_output import RUN_CONFIG

    try:
        config = json.loads((run_file(run).parent / RUN_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def run_env_kwargs(env_id: str, runs: list[Path]) -> dict[str, Any]:
    """The env arguments the runs made `env_id` with, as their run.json records them ({} when
    no run names it): the schemas of the env as the model saw it, not of its defaults.

    Raises:
        ValueError: two runs made it with other arguments (one `tools` column fits one of them).
    """
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for run in runs:
        config = _run_config(run)
        if config is None or _bare_id(str(config.get("env_id", ""))) != _bare_id(env_id):
            continue
        kwargs = config.get("env_kwargs") or {}
        found.setdefault(json.dumps(kwargs, sort_keys=True), (run, kwargs))
    if len(found) > 1:
        (a, _), (b, _) = list(found.values())[:2]
        raise ValueError(
            f"--tools {env_id}: runs {a} and {b} made it with other env arguments (see their run.json), "
            "so no one set of schemas fits both: export them one at a time, or pass --tools FILE.json"
        )
    return next(iter(found.values()))[1] if found else {}


def _without_redacted(env_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` less the values run.json hides (`***`, a key or a token), with a warning: the env
    is made without them (it may read them from its environment variables)."""
    hidden = sorted(k for k, v in kwargs.items() if v == "***")
    if hidden:
        _warn(f"--tools {env_id}: run.json hides {', '.join(hidden)}; the env is made without them")
    return {k: v for k, v in kwargs.items() if k not in hidden}


def _env_schemas(env_id: str, env_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The tool schemas of the env `env_id` (`module:namespace/Name-vN` imports the module first),
    made with `env_kwargs` (its `tools` references resolved, as `toolenv rollout` does)."""
    import gymnasium as gym
    from gymnasium.error import Error as GymError

    from toolenv.cli import error_line
    from toolenv.registry import resolved_tools

    try:
        env = gym.make(env_id, **resolved_tools(env_kwargs or {}))
    except GymError as exc:  # a file name with a typo reads as an env id: say both were tried
        raise ValueError(f"--tools {env_id}: no such file, nor an env id Gymnasium knows ({error_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party env's constructor
        raise ValueError(f"--tools {env_id}: the env could not be made ({error_line(exc)}); {_USE_A_FILE}") from None
    try:
        schemas = getattr(env.unwrapped, "tool_schemas", None)
        if not callable(schemas):
            raise TypeError(f"--tools: {env_id} is not a toolenv env (it has no tool_schemas())")
        return list(schemas())
    finally:
        env.close()


def tool_schemas(source: str, runs: list[Path] | None = None) -> list[dict[str, Any]]:
    """`--tools`: a JSON file's schemas (a name ending in .json, or any existing file), else an env
    id's, the env made with the env arguments of the `runs` that made it (`run_env_kwargs`)."""
    path = Path(source)
    if path.suffix == ".json" or path.is_file():
        return _schema_file(path)
    return _env_schemas(source, _without_redacted(source, run_env_kwargs(source, runs or [])))


def _env_had(turn: TurnRecord, call_id: str) -> bool:
    """Whether the env ran the call (any answer but its "Unknown tool" refusal): a tool the
    model made up is no schema the export left out."""
    return not any(r.call_id == call_id and r.text.startswith("Unknown tool '") for r in turn.results)


def called_tools(trajectory: Trajectory) -> set[str]:
    """The names of the tools the trajectory's calls ran (calls of a tool the env lacked left out)."""
    return {c.name for turn in trajectory.turns for c in turn.parsed.tool_calls if _env_had(turn, c.id)}


def _warn_missing(called: set[str], schemas: list[dict[str, Any]], source: str) -> None:
    """One line when the exported calls name tools the written schemas lack: a template renders
    such a row with tools the model never saw, or without ones it called."""
    missing = sorted(called - {s["function"]["name"] for s in schemas})
    if missing:
        _warn(
            f"the exported calls ran tools the --tools {source} schemas lack: {', '.join(missing)}; give the "
            "schemas of the env the runs used (its env id, or a JSON file of its tool_schemas())"
        )


def run(args: argparse.Namespace) -> int:
    import itertools

    from toolenv._outputs import is_stdout
    from toolenv.commands._paths import check_file, check_folder
    from toolenv.export import _kept, _native, export_chat, export_tokens
    from toolenv.report.html import check_distinct, iter_run, run_file

    if args.format == "tokens" and (args.calls or args.arguments or args.tools):
        raise ValueError("--calls, --arguments and --tools shape chat messages; --format tokens writes token ids")
    tools = None if args.tools is None else tool_schemas(args.tools, args.run)
    runs = [iter_run(r, warn=_warn)[0] for r in args.run]  # a missing file is an error before any work
    check_distinct(args.run)
    inputs = {run_file(r).resolve() for r in args.run}
    if args.out.resolve() in inputs:  # the export would replace the run it reads
        raise ValueError(f"--out {args.out} is the trajectories file of a run being exported")
    check_file("--out", args.out, "sft.jsonl")
    check_folder("--out", args.out, args.out.parent)
    read = 0
    called: set[str] = set()  # the tools the exported calls ran, to check against `tools`
    native = False  # whether a kept trajectory has native tool calls (they want `tools` beside them)

    def trajectories() -> Iterator[Trajectory]:  # streamed: a run of any size exports in flat memory
        nonlocal read, native
        for t in itertools.chain.from_iterable(runs):
            read += 1
            if tools is not None and _kept(t, args.success_only, args.min_reward, args.weights):
                called.update(called_tools(t))
            elif tools is None and not native and any(_native(turn) for turn in t.turns):
                native = _kept(t, args.success_only, args.min_reward, args.weights)
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
        if tools is not None:
            _warn_missing(called, tools, args.tools)
        elif native:
            _warn(
                "the exported trajectories have native tool calls but their rows list no tools, so a chat "
                "template renders calls of tools it never declared: pass --tools ENV_ID (or FILE.json)"
            )
    # Not into the data when the data goes to stdout (`--out /dev/stdout | jq`, `> all.jsonl`)
    print(
        f"wrote {written} of {read} trajectories to {args.out}", file=sys.stderr if is_stdout(args.out) else sys.stdout
    )
    return 0
