"""The `toolenv` command: each subcommand lives in its own module under `toolenv.commands`.

A subcommand module exposes `HELP: str`, `add_arguments(parser)` and
`run(args) -> int`. Plugins add commands through the `toolenv.commands` entry-point
group (name = subcommand), e.g. `serve-search` → `toolenv serve-search`.
Errors print one readable line and exit non-zero.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import NoReturn

__all__ = ["main"]

COMMANDS: dict[str, str] = {
    "list": "toolenv.commands.list_cmd",
    "check": "toolenv.commands.check_cmd",
    "doctor": "toolenv.commands.doctor_cmd",
    "export": "toolenv.commands.export_cmd",
    "rollout": "toolenv.commands.rollout_cmd",
    "serve": "toolenv.commands.serve_cmd",
    "view": "toolenv.commands.view_cmd",
    "verl-data": "toolenv.integrations.verl.data_cmd",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage block is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _modules() -> dict[str, str]:
    found = dict(COMMANDS)
    for ep in metadata.entry_points(group="toolenv.commands"):
        found.setdefault(ep.name, ep.value)
    return found


def _help_of(target: str) -> str | None:
    """A command's `HELP`, read from its module's source: `toolenv --help` lists every command
    without importing them all (one loads verl's dependencies, another the MCP SDK)."""
    try:
        spec = importlib.util.find_spec(target.split(":")[0])
        if spec is None or spec.origin is None:
            return None
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (ImportError, OSError, SyntaxError, ValueError):  # a broken plugin is listed without help
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "HELP" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `toolenv` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    modules = _modules()
    parser = _Parser(
        prog="toolenv",
        description="Typed tool-use environments for LLM agents.",
        epilog="`toolenv COMMAND --help` shows a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the chosen subcommand's module is imported; others are listed by name.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    loaded: dict[str, ModuleType] = {}
    for name, target in sorted(modules.items()):
        if name == chosen:
            try:
                mod = importlib.import_module(target.split(":")[0])
            except ImportError as exc:
                print(f"toolenv {name}: not available ({exc}); is its package installed?", file=sys.stderr)
                return 2
            loaded[name] = mod
            p = sub.add_parser(name, help=getattr(mod, "HELP", None), description=getattr(mod, "HELP", None))
            mod.add_arguments(p)
        else:  # listed by name, with its help line when the whole list is asked for
            sub.add_parser(name, help=_help_of(target) if chosen is None else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    mod = loaded[args.command]
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print(f"toolenv {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one readable line instead of a traceback
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"toolenv {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
