"""The `toolenv` command: each subcommand lives in its own module under `toolenv.commands`.

A subcommand module exposes `HELP: str`, `add_arguments(parser)` and
`run(args) -> int`. Plugins add commands through the `toolenv.commands` entry-point
group (name = subcommand), e.g. `serve-search` → `toolenv serve-search`.
Errors print one readable line and exit non-zero.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import select
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from pydantic import ValidationError

from toolenv import __version__
from toolenv._ast import parse

__all__ = ["error_line", "main"]

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


def _source_of(module: str) -> Path | None:
    """The source file of a module, found without importing it or its parent packages
    (`importlib.util.find_spec` imports the parents: a plugin's package that fails to import
    would break `toolenv --help`)."""
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported to find it
    for part in parts:
        if spec is None or not spec.submodule_search_locations:
            return None  # not found, or a module (not a package): no submodules
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    return Path(spec.origin) if spec is not None and spec.origin and spec.has_location else None


def _help_of(target: str) -> str | None:
    """A command's `HELP`, read from its module's source: `toolenv --help` lists every command
    without importing them all (one loads verl's dependencies, another the MCP SDK)."""
    try:
        source = _source_of(target.split(":")[0])
        if source is None:
            return None
        tree = parse(source.read_text(encoding="utf-8"))
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


#: The longest error line printed (a library error can be a page of text).
MAX_ERROR_CHARS = 500


def _validation_problems(exc: ValidationError) -> str:
    """`loc: message` for each error of a pydantic ValidationError, joined."""
    said = []
    for e in exc.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"])
        said.append(f"{where}: {e['msg']}" if where else e["msg"])
    return "; ".join(said) or str(exc)


def clip_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` on one line (white space runs made one space), clipped to `limit` characters: an
    error may quote a server's response body, a page of JSON."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_line(exc: BaseException) -> str:
    """An exception as one readable line that keeps its cause.

    A pydantic ValidationError (raised, or quoted by the message of the error it led to)
    becomes `field: message; ...`, not its header line; other multi-line messages are
    joined into one line. The line is clipped to `MAX_ERROR_CHARS`.
    """
    text = str(exc).strip()
    inner = exc if isinstance(exc, ValidationError) else exc.__cause__ or exc.__context__
    if isinstance(inner, ValidationError):
        quoted = str(inner).strip()
        problems = _validation_problems(inner)
        if inner is exc:
            text = f"{exc.title}: {problems}"
        elif quoted and quoted in text:
            text = text.replace(quoted, problems)
    return clip_line(_with_env_id_hint(" ".join(text.split())) or type(exc).__name__)


#: Gymnasium's message for an env id it does not know, with its guess of a similar name if any.
_NO_SUCH_ENV = re.compile(
    r"Environment `(?P<name>[^`]+)` doesn't exist(?: in namespace (?P<ns>[^\s.]+))?\."
    r"(?P<guess> Did you mean: `[^`]*`\?)?"
)


def _with_env_id_hint(text: str) -> str:
    """Gymnasium's "Environment `X` doesn't exist" saying what to type instead.

    `Spider-v0` (the name plugins and oracles use) gets the registered id, `toolenv/Spider-v0`,
    rather than Gymnasium's guess at a similar name among its own (`Swimmer`); a name nothing
    resembles gets where the ids are listed. A guess of Gymnasium's in the same namespace
    (`toolenv/Spyder-v0`: `Spider`) is kept.
    """
    found = _NO_SUCH_ENV.search(text)
    gymnasium = sys.modules.get("gymnasium")  # loaded, as it raised the error: never imported here
    if found is None or gymnasium is None:
        return text
    name, namespace = found["name"], found["ns"]
    ids = sorted(i for i, spec in gymnasium.registry.items() if spec.name == name and spec.namespace != namespace)
    where = f" in namespace {namespace}" if namespace else ""
    if ids:
        hint = f"Environment `{name}` doesn't exist{where}; did you mean {' or '.join(ids)}?"
    elif found["guess"] is None:
        hint = f"{found[0]} `toolenv list` shows the installed env ids (your own: MODULE:NAME-vN imports MODULE first)."
    else:
        return text
    return text.replace(found[0], hint, 1)


#: The exit status of a command whose output reader went away: the shell's for SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141


def _stdout_reader_is_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll says POLLERR), so that a
    BrokenPipeError of another pipe or socket is still reported as an error."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (replaced in-process): not its pipe
        return False
    if not hasattr(select, "poll"):  # Windows: take it as stdout's
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _quit_quietly() -> int:
    """Stop quietly, as `ls | head` does: the rest of the output goes to /dev/null (so the
    flush at interpreter exit fails no more) and the status is the shell's for SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


@contextlib.contextmanager
def _one_line_warnings(command: str) -> Iterator[None]:
    """A `UserWarning` a command's code gives (the replay agent leaving out a killed run's cut
    last line, say) is one line, `toolenv COMMAND: warning: ...`, as the commands' own warnings
    are, not Python's two (the file, line and source of the `warn` call); other categories
    (a library's DeprecationWarning) keep Python's format, which says where they come from."""
    default = warnings.formatwarning

    def formatwarning(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        if issubclass(category, UserWarning):
            return f"toolenv {command}: warning: {message}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning
    try:
        yield
    finally:
        warnings.formatwarning = default


#: Commands that SIGTERM stops as Ctrl-C does. `rollout` handles it itself; `serve` (and a plugin's
#: command) ends by the signal, as uvicorn does.
UNWIND_ON_SIGTERM = frozenset({"check", "doctor", "export", "list", "verl-data", "view"})


class _Terminated(BaseException):
    """SIGTERM, raised where the command is, so that it unwinds as on Ctrl-C (a BaseException,
    as KeyboardInterrupt is: no `except Exception` swallows it)."""


@contextlib.contextmanager
def _sigterm_unwinds(enabled: bool) -> Iterator[None]:
    """SIGTERM (`timeout`, `docker stop`, a preempted job) raises `_Terminated`, so that a file being
    written is removed, not left behind as its hidden temporary name; a second one kills at once."""

    def on_sigterm(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise _Terminated

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm) if enabled else None
    except ValueError:  # not the main thread (main called from a thread): leave signals alone
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `toolenv` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    modules = _modules()
    parser = _Parser(
        prog="toolenv",
        description="Typed tool-use environments for LLM agents.",
        epilog="`toolenv COMMAND --help` shows a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"toolenv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    # Only the chosen subcommand's module is imported; others are listed by name.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    loaded: dict[str, ModuleType] = {}
    subparsers: dict[str, argparse.ArgumentParser] = {}
    for name, target in sorted(modules.items()):
        if name == chosen:
            try:
                mod = importlib.import_module(target.split(":")[0])
            except ImportError as exc:
                print(f"toolenv {name}: not available ({exc}); is its package installed?", file=sys.stderr)
                return 2
            except Exception as exc:  # noqa: BLE001 - a plugin that fails to import: one line, not a traceback
                print(f"toolenv {name}: not available ({type(exc).__name__}: {error_line(exc)})", file=sys.stderr)
                return 2
            loaded[name] = mod
            p = sub.add_parser(name, help=getattr(mod, "HELP", None), description=getattr(mod, "HELP", None))
            try:
                mod.add_arguments(p)
            except Exception as exc:  # noqa: BLE001 - a plugin's command with no or broken options: one line
                print(f"toolenv {name}: not available ({type(exc).__name__}: {error_line(exc)})", file=sys.stderr)
                return 2
            subparsers[name] = p
        else:  # listed by name, with its help line when the whole list is asked for
            sub.add_parser(name, help=_help_of(target) if chosen is None else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the command's own parser: `toolenv rollout: error: ...`
        subparsers.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    mod = loaded[args.command]
    try:
        with _one_line_warnings(args.command), _sigterm_unwinds(args.command in UNWIND_ON_SIGTERM):
            rc = int(mod.run(args) or 0)
        sys.stdout.flush()  # a reader gone away (`| head`) shows here, not at interpreter exit
        return rc
    except BrokenPipeError as exc:
        if _stdout_reader_is_gone():
            return _quit_quietly()
        print(f"toolenv {args.command}: error: {error_line(exc)}", file=sys.stderr)  # a socket's, say
        return 2
    except KeyboardInterrupt:
        print(f"toolenv {args.command}: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print(f"toolenv {args.command}: stopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    except Exception as exc:  # noqa: BLE001 - one readable line instead of a traceback
        print(f"toolenv {args.command}: error: {error_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
