"""`toolenv view runs/NAME [--serve --port P]`: the self-contained HTML report of a rollout."""

from __future__ import annotations

import argparse
import http.server
import sys
from functools import partial
from pathlib import Path
from typing import Any

HELP = "Write a self-contained HTML report of a rollout directory; optionally serve it on 127.0.0.1."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", metavar="RUN", type=Path, nargs="+", help="run directories (runs/NAME) or trajectories.jsonl files"
    )
    parser.add_argument("--out", type=Path, help="where to write the HTML (default: the first RUN/report.html)")
    parser.add_argument("--title", help="page title")
    parser.add_argument("--serve", action="store_true", help="serve the report on http://127.0.0.1:PORT/ until Ctrl-C")
    parser.add_argument("--port", type=int, default=8765, help="port for --serve (default 8765; 0 picks a free one)")


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves the one report file at `/` (and its own name); nothing else on disk is reachable."""

    def __init__(self, *args: Any, page: Path, **kwargs: Any) -> None:
        self.page = page
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        if self.path.split("?")[0] not in ("/", f"/{self.page.name}"):
            self.send_error(404, "only the report is served here")
            return
        body = self.page.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(page: Path, port: int) -> None:
    """Serve `page` on 127.0.0.1 until interrupted."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), partial(_Handler, page=page))
    print(f"serving {page} at http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _warn(message: str) -> None:
    print(f"toolenv view: warning: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from toolenv.report.html import build_report

    page = build_report(args.run, args.out, title=args.title, warn=_warn)
    print(f"wrote {page} ({page.stat().st_size / 1024:.0f} KiB)", flush=True)
    if args.serve:
        serve(page, args.port)
    return 0
