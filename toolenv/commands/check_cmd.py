"""`toolenv check ENV_ID|TOOL`: Gymnasium's checker plus toolenv's own checks."""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = "Check an env (e.g. toolenv/Spider-v0) or a tool plugin (e.g. sql)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="an env ID (namespace/Name-vN) or a tool name")
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


def run(args: argparse.Namespace) -> int:
    from toolenv.checker import check_env, check_tool
    from toolenv.env import ToolEnv
    from toolenv.registry import load_tool

    try:
        kwargs: dict[str, Any] = json.loads(args.kwargs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kwargs is not valid JSON: {exc.msg}") from None
    if "/" in args.target:
        import gymnasium as gym

        env = gym.make(args.target, **kwargs).unwrapped
        if not isinstance(env, ToolEnv):
            raise TypeError(f"{args.target} is not a toolenv ToolEnv")
        results = check_env(env, _tokenizer(args.tokenizer) if args.tokenizer else None)
        env.close()
    else:
        if args.tokenizer:
            raise ValueError("--tokenizer checks an env's parser; give an env id (namespace/Name-vN)")
        results = check_tool(load_tool(args.target, **kwargs))
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"{'ok ' if r.ok else 'FAIL'} {r.name:<{width}}  {r.message}")
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0
