"""`toolenv view runs/NAME [--serve --port P]`: the self-contained HTML report of a rollout."""

from __future__ import annotations

import argparse
import http.server
import re
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolenv.report.served import RunIndex

HELP = "Write a self-contained HTML report of a rollout directory; optionally serve it on 127.0.0.1."

_EPISODE = re.compile(r"/episodes/(\d{1,12})\.json")
_LOOPBACK = frozenset({"127.0.0.1", "localhost"})


def _for_loopback(host: str | None) -> bool:
    """Whether a request's Host header names 127.0.0.1 or localhost. A page of another site that
    points its own name at 127.0.0.1 (DNS rebinding) reaches the server too, but names that site."""
    name = (host or "").rpartition(":")[0] or (host or "")
    return name.lower().rstrip(".") in _LOOPBACK


def _port(text: str) -> int:
    """A TCP port, checked with the options: a bad one is a usage error before the report is written."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0 to 65535 (0 picks a free one), got {port}")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", metavar="RUN", type=Path, nargs="+", help="run directories (runs/NAME) or trajectories.jsonl files"
    )
    parser.add_argument("--out", type=Path, help="where to write the HTML (default: the first RUN/report.html)")
    parser.add_argument("--title", help="page title")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="also serve the report on http://127.0.0.1:PORT/ until Ctrl-C, each episode read from the run "
        "when it is opened",
    )
    parser.add_argument("--port", type=_port, default=8765, help="port for --serve (default 8765; 0 picks a free one)")


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves the report (`/`, or its file's name), its episode rows (`/rows.json`) and one
    episode per request (`/episodes/N.json`, read from its line); nothing else on disk is reachable."""

    def __init__(self, *args: Any, index: RunIndex, names: tuple[str, ...], **kwargs: Any) -> None:
        self.index = index
        self.names = names
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        if not _for_loopback(self.headers.get("Host")):
            self.send_error(403, "only pages of 127.0.0.1 or localhost may read this report")
            return
        path = self.path.split("?")[0]
        if path in self.names:
            self._send(self.index.page, "text/html; charset=utf-8")
        elif path == "/rows.json":
            self._send(self.index.rows, "application/json")
        elif (m := _EPISODE.fullmatch(path)) and int(m.group(1)) < len(self.index):
            try:
                body = self.index.episode(int(m.group(1)))
            except (OSError, ValueError) as exc:  # why, in the body: a status line holds Latin-1 only
                self._send(str(exc).encode("utf-8"), "text/plain; charset=utf-8", 500)
                return
            self._send(body, "application/json")
        else:
            self.send_error(404, "only the report is served here")

    def _send(self, body: bytes, content_type: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def make_server(index: RunIndex, port: int, name: str = "report.html") -> http.server.ThreadingHTTPServer:
    """An HTTP server of `index`'s report on 127.0.0.1:`port` (0 picks a free one), not started."""
    handler = partial(_Handler, index=index, names=("/", f"/{name}"))
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


def serve(index: RunIndex, port: int, name: str = "report.html") -> None:
    """Serve the report of `index` on 127.0.0.1 until interrupted."""
    try:
        server = make_server(index, port, name)
    except OSError as exc:  # a port in use: said as `toolenv serve` says it
        raise OSError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
    print(f"serving {len(index)} episodes at http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _warn(message: str) -> None:
    print(f"toolenv view: warning: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from toolenv._outputs import is_stdout
    from toolenv.commands._paths import check_file, check_folder
    from toolenv.report.html import REPORT, build_report, run_file

    if args.out is not None:
        check_file("--out", args.out, REPORT)
        if args.out.resolve() in {run_file(r).resolve() for r in args.run}:  # the page would replace the run
            raise ValueError(f"--out {args.out} is the trajectories file of a run being reported on")
        check_folder("--out", args.out, args.out.parent)
    page = build_report(args.run, args.out, title=args.title, warn=_warn)
    # Not into the page when the page goes to stdout (`--out /dev/stdout > page.html`)
    print(
        f"wrote {page} ({page.stat().st_size / 1024:.0f} KiB)",
        file=sys.stderr if is_stdout(page) else sys.stdout,
        flush=True,
    )
    if args.serve:
        from toolenv.report.served import RunIndex

        index = RunIndex(args.run, title=args.title, warn=lambda _: None)  # build_report warned already
        serve(index, args.port, page.name)
    return 0
