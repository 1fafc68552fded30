"""`toolenv serve-search`: serve a local search backend over the Search-R1 retrieval API."""

from __future__ import annotations

import argparse
import socket
import sys

from toolenv.commands.serve_cmd import LOG_LEVELS

HELP = "Serve a local search backend (BM25 by default) over the Search-R1 retrieval API (POST /retrieve, GET /health)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `toolenv serve-search`."""
    parser.add_argument("--backend", default="bm25", choices=["bm25", "duckduckgo"], help="backend to serve")
    parser.add_argument("--corpus", default=None, help="JSONL corpus for bm25 (default: bundled HotpotQA)")
    parser.add_argument("--cache-dir", default=None, help="index cache directory (default: user cache)")
    parser.add_argument("--stemmer", default=None, help="Snowball stemmer language for bm25, e.g. english")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    parser.add_argument(
        "--log-level", default="warning", type=str.lower, choices=LOG_LEVELS, help="uvicorn log level (default warning)"
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket with TCP_NODELAY, which the connections it accepts inherit.

    uvicorn sets TCP_NODELAY only on sockets it binds itself; without it each small
    response waits about 40 ms for a delayed ACK (measured: 45 ms vs 1.5 ms a request).
    """
    # As uvicorn picks the family: a host with a colon is IPv6 (`::1`, `::`).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def run(args: argparse.Namespace) -> int:
    """Build the backend (and its index) first, then serve until interrupted."""
    import uvicorn

    from toolenv_search.backend import SearchBackend
    from toolenv_search.backends import make_backend
    from toolenv_search.bm25 import BM25Backend
    from toolenv_search.protocol import MAX_REQUEST_TOPK
    from toolenv_search.server import create_app

    if not 1 <= args.topk <= MAX_REQUEST_TOPK:
        raise ValueError(f"--topk must be between 1 and {MAX_REQUEST_TOPK}, got {args.topk}")
    backend: SearchBackend
    if args.backend == "bm25":
        backend = bm25 = BM25Backend(args.corpus, cache_dir=args.cache_dir, stemmer=args.stemmer)
        if not bm25.corpus.exists():
            raise FileNotFoundError(f"corpus not found: {bm25.corpus}")
        index = bm25.load()  # fail before binding the port, not on the first request
        origin = "built" if index.built else "loaded from cache"
        print(f"bm25 index of {len(index.passages)} passages {origin} ({index.cache_path})", file=sys.stderr)
    else:
        backend = make_backend(args.backend)
    # Bind before serving so that a busy port is one readable error line, not a uvicorn log.
    sock = bind_socket(args.host, args.port)
    host = f"[{args.host}]" if ":" in args.host else args.host
    port = sock.getsockname()[1]  # the one picked for --port 0
    print(f"serving {args.backend} on http://{host}:{port}/retrieve", file=sys.stderr, flush=True)
    config = uvicorn.Config(create_app(backend, default_topk=args.topk), log_level=args.log_level)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
