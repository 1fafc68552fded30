"""BM25 search throughput and index time: bundled HotpotQA corpus vs a generated 100k-passage corpus.

For each corpus: index build time (fresh cache), load time (from the on-disk cache),
queries/s one query per call, queries/s in batches of 64, and queries/s through the
retrieval server (`toolenv serve-search`, its own process) over loopback HTTP with 16
concurrent clients, each search sent alone or batched with the others (HTTPBackend
batch_wait=2 ms). Ratios are against one query per call in process.

Run: python bench/bench_search.py [--quick] [--passages N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from toolenv_search.bm25 import BM25Backend, _load_or_build
from toolenv_search.corpus import bundled_corpus_path, bundled_questions_path
from toolenv_search.http_backend import HTTPBackend

RESULTS = Path(__file__).resolve().parent / "results" / "search.json"


def synthetic_corpus(path: Path, n: int, seed: int = 0) -> list[str]:
    """Write n deterministic passages (Zipf-distributed pseudo-words) as JSONL; return a query vocabulary."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, size=int(rng.integers(3, 10)))) for _ in range(30_000)])
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.07
    weights /= weights.sum()
    with path.open("w", encoding="utf-8") as fh:
        for start in range(0, n, 10_000):
            rows = rng.choice(len(vocab), size=(min(10_000, n - start), 80), p=weights)
            for i, row in enumerate(rows, start):
                words = vocab[row]
                rec = {"id": f"syn-{i}", "title": " ".join(words[:3]), "text": " ".join(words[3:])}
                fh.write(json.dumps(rec) + "\n")
    return [" ".join(vocab[rng.choice(len(vocab), size=5, p=weights)]) for _ in range(2_000)]


_SERVERS: list[subprocess.Popen[bytes]] = []


def serve(corpus: Path, cache: Path) -> str:
    """Start `toolenv serve-search` (its own process, as rollout workers would use it); return its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", "toolenv.cli", "serve-search", "--corpus", str(corpus), "--cache-dir", str(cache)]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stderr=subprocess.DEVNULL)
    _SERVERS.append(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("serve-search did not start")


def stop_server() -> None:
    while _SERVERS:
        proc = _SERVERS.pop()
        proc.terminate()
        proc.wait(20)


async def qps_single(backend: Any, queries: list[str]) -> float:
    start = time.perf_counter()
    for q in queries:
        await backend.search([q], 3)
    return len(queries) / (time.perf_counter() - start)


async def qps_batch(backend: Any, queries: list[str], size: int = 64) -> float:
    start = time.perf_counter()
    for i in range(0, len(queries), size):
        await backend.search(queries[i : i + size], 3)
    return len(queries) / (time.perf_counter() - start)


async def qps_http(url: str, queries: list[str], workers: int = 16, batch_wait: float = 0.0) -> float:
    backend = HTTPBackend(url, timeout=30, batch_wait=batch_wait)
    await backend.search(queries[:1], 3)  # warm the connection pool

    async def worker(part: list[str]) -> None:
        for q in part:
            await backend.search([q], 3)

    start = time.perf_counter()
    await asyncio.gather(*(worker(queries[i::workers]) for i in range(workers)))
    elapsed = time.perf_counter() - start
    await backend.aclose()
    return len(queries) / elapsed


def measure(name: str, corpus: Path, queries: list[str], cache: Path) -> dict[str, Any]:
    start = time.perf_counter()
    built = _load_or_build(corpus, cache, None, 1.5, 0.75)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    loaded = _load_or_build(corpus, cache, None, 1.5, 0.75)
    load_s = time.perf_counter() - start
    assert built.built and not loaded.built
    backend = BM25Backend(corpus, cache_dir=cache)
    backend.load()
    single = asyncio.run(qps_single(backend, queries))
    batch = asyncio.run(qps_batch(backend, queries))
    url = serve(corpus, cache)
    http = asyncio.run(qps_http(url, queries))
    http_batched = asyncio.run(qps_http(url, queries, batch_wait=0.002))
    stop_server()
    return {
        "corpus": name,
        "passages": len(built.passages),
        "queries": len(queries),
        "index_build_s": round(build_s, 3),
        "index_load_s": round(load_s, 3),
        "qps_single": round(single, 1),
        "qps_batch64": round(batch, 1),
        "qps_http16": round(http, 1),
        "qps_http16_batched": round(http_batched, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small generated corpus and few queries (CI)")
    parser.add_argument("--passages", type=int, default=None, help="generated corpus size (default 100,000)")
    args = parser.parse_args()
    n = args.passages or (5_000 if args.quick else 100_000)
    n_queries = 200 if args.quick else 1_000
    questions = [json.loads(line)["question"] for line in bundled_questions_path().open(encoding="utf-8")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        hp_queries = (questions * (n_queries // len(questions) + 1))[:n_queries]
        rows.append(measure("hotpotqa (bundled)", bundled_corpus_path(), hp_queries, tmpdir / "c1"))
        start = time.perf_counter()
        syn_queries = synthetic_corpus(tmpdir / "synthetic.jsonl", n)[:n_queries]
        gen_s = time.perf_counter() - start
        rows.append(measure(f"synthetic {n:,}", tmpdir / "synthetic.jsonl", syn_queries, tmpdir / "c2"))
        rows[-1]["generate_s"] = round(gen_s, 3)
    header = (
        f"{'corpus':<22}{'passages':>9}{'build s':>9}{'load s':>8}{'q/s 1':>9}"
        f"{'q/s b64':>16}{'q/s http':>16}{'q/s http batch':>18}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        b = f"{r['qps_batch64']:.0f} ({r['qps_batch64'] / r['qps_single']:.2f}x)"
        h = f"{r['qps_http16']:.0f} ({r['qps_http16'] / r['qps_single']:.2f}x)"
        hb = f"{r['qps_http16_batched']:.0f} ({r['qps_http16_batched'] / r['qps_single']:.2f}x)"
        print(
            f"{r['corpus']:<22}{r['passages']:>9,}{r['index_build_s']:>9.2f}{r['index_load_s']:>8.2f}"
            f"{r['qps_single']:>9.0f}{b:>16}{h:>16}{hb:>18}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {"quick": args.quick, "machine": platform.platform(), "python": platform.python_version(), "rows": rows}
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
