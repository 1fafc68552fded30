"""`toolenv check ENV_ID|TOOL`: Gymnasium's checker plus toolenv's own checks."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

HELP = "Check an env (e.g. toolenv/Spider-v0) or a tool plugin (e.g. sql)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="an env ID (namespace/Name-vN, Name-vN or module:Name-vN) or a tool plugin name")
    parser.add_argument("--kwargs", default="{}", help="JSON keyword arguments for gym.make or the tool")
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="NAME_OR_PATH",
        help="also check that the env's parser reads the tool calls this model's chat template writes "
        "(a Hugging Face tokenizer name or folder; needs transformers)",
    )


def _tokenizer(name: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError("--tokenizer needs transformers: pip install transformers") from None
    return AutoTokenizer.from_pretrained(name)


#: A Gymnasium env id: one with a namespace (`ns/Name-vN`) or a module to import first
#: (`module:Name-vN`), or a versioned name (`Name-vN`); tool names have none of these.
_ENV_ID = re.compile(r".*[/:].*|[\w.-]+-v\d+")


def _is_env_id(target: str) -> bool:
    """Whether `target` names an env rather than a tool plugin (whose names are
    `[a-zA-Z0-9_-]`, with no `/`, `:` or `-vN` suffix); a tool plugin of that name wins."""
    from toolenv.registry import entries

    if any(e.name == target for e in entries("tools")):
        return False
    return _ENV_ID.fullmatch(target) is not None


#: How `ToolEnv.reset` says it has no task to reset on (a generic env such as `toolenv/ToolEnv-v0`).
_NO_TASKS = "this env has no tasks"

#: What to type instead: the env's message names a Python keyword, not this command's option.
_NO_TASKS_HINT = (
    "the env has no tasks to check it on; give some with "
    """--kwargs '{"tasks": [{"question": "2+3?", "answer": "5"}]}' (or "tasks": "FILE.jsonl")"""
)


def run(args: argparse.Namespace) -> int:
    from toolenv._aio import run as run_coroutine
    from toolenv.checker import check_env, check_tool
    from toolenv.env import ToolEnv
    from toolenv.registry import load_tool

    try:
        kwargs: dict[str, Any] = json.loads(args.kwargs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kwargs is not valid JSON: {exc.msg}") from None
    if not isinstance(kwargs, dict):
        raise ValueError("--kwargs must be a JSON object")
    if _is_env_id(args.target):
        import gymnasium as gym

        from toolenv.registry import resolved_tools

        tokenizer = _tokenizer(args.tokenizer) if args.tokenizer else None  # before the env: nothing to close
        made = gym.make(args.target, **resolved_tools(kwargs))
        try:
            env = made.unwrapped
            if not isinstance(env, ToolEnv):
                raise TypeError(f"{args.target} is not a toolenv ToolEnv")
            results = check_env(env, tokenizer)
        finally:
            made.close()
    else:
        if args.tokenizer:
            raise ValueError("--tokenizer checks an env's parser; give an env id (namespace/Name-vN)")
        tool = load_tool(args.target, **kwargs)
        try:
            results = check_tool(tool)
        finally:
            run_coroutine(tool.close())
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"{'ok ' if r.ok else 'FAIL'} {r.name:<{width}}  {r.message}".rstrip())
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if any(r.message.startswith(_NO_TASKS) for r in failed):
        print(f"toolenv check: {_NO_TASKS_HINT}", file=sys.stderr)
    return 1 if failed else 0
