"""BM25 retrieval: toolenv-search's bm25 backend against rank-bm25 (`BM25Okapi`), same corpus, same queries.

Corpora: the bundled HotpotQA paragraphs with their 100 questions, and a
generated 100k-passage corpus (Zipf pseudo-words, `bench_search.synthetic_corpus`)
with its generated 5-word queries. For each, both libraries index the same
passage texts (`title\\ntext`) and answer the same queries one per call:

- toolenv: `BM25Backend.search([q], 5)` (bm25s, sparse precomputed scores), as
  shipped: Lucene IDF, k1=1.5, b=0.75, passages with score 0 left out. The
  "batch of 64" row sends 64 queries per call.
- rank-bm25: `BM25Okapi(tokenized).get_scores(q)`, then the top 5 by score
  (k1=1.5, b=0.75, its Okapi IDF with the epsilon floor for very common terms).

Tokenisation is the same for both: bm25s's tokenizer (lower case, words of two
or more word characters, English stopwords, no stemming), whose string tokens
are handed to rank-bm25. What differs is only the IDF formula (Lucene's
log(1 + (N-df+.5)/(df+.5)) vs Okapi's log((N-df+.5)/(df+.5)) floored at
0.25 x mean IDF) and that toolenv omits zero-score passages; those explain
top-5 disagreements. Reported: index build time, queries per second and ratio,
mean top-5 overlap (|A∩B| / max(|A|,|B|) per query). Runs in `.venv-bench`
(rank-bm25 lives there); `--quick` without it measures toolenv only.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _peers
import peers_env
from _common import machine, table, write

TOPK = 5


def rank_bm25_rows(corpus: Path, queries: list[str]) -> dict[str, Any]:
    """Build BM25Okapi over the corpus; queries/s and top-5 ids, with its own IDF and with Lucene's."""
    import bm25s  # type: ignore[import-untyped]
    import numpy as np
    from rank_bm25 import BM25Okapi  # type: ignore[import-untyped,import-not-found,unused-ignore]

    from toolenv_search.corpus import load_corpus

    def tok(texts: list[str]) -> list[list[str]]:
        out: list[list[str]] = bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)
        return out

    t0 = time.perf_counter()
    passages = load_corpus(corpus)
    okapi = BM25Okapi(tok([f"{p.title}\n{p.text}" if p.title else p.text for p in passages]), k1=1.5, b=0.75)
    build_s = time.perf_counter() - t0
    ids = [p.id for p in passages]

    def top(q: str) -> list[str]:
        scores = okapi.get_scores(tok([q])[0])
        best = np.argsort(-scores, kind="stable")[:TOPK]
        return [ids[i] for i in best if scores[i] > 0]

    t0 = time.perf_counter()
    hits = [top(q) for q in queries]
    qps = len(queries) / (time.perf_counter() - t0)
    # Diagnostic: the same scores with bm25s's Lucene IDF, to show the IDF is what differs.
    dfs = Counter(w for freqs in okapi.doc_freqs for w in freqs)  # rank-bm25 does not keep its df table
    n = okapi.corpus_size
    okapi.idf = {w: math.log(1 + (n - df + 0.5) / (df + 0.5)) for w, df in dfs.items()}
    lucene = [top(q) for q in queries]
    return {"build_s": build_s, "qps": qps, "top": hits, "top_lucene_idf": lucene}


def toolenv_rows(corpus: Path, queries: list[str], cache: Path, rounds: int) -> dict[str, Any]:
    """Build the toolenv index (fresh cache); queries/s one per call and 64 per call; top-5 ids."""
    from toolenv_search.bm25 import BM25Backend

    backend = BM25Backend(corpus, cache_dir=cache)
    t0 = time.perf_counter()
    backend.load()
    build_s = time.perf_counter() - t0

    async def go() -> tuple[float, float, list[list[str]]]:
        hits = [[p.id for p in (await backend.search([q], TOPK))[0]] for q in queries]
        t0 = time.perf_counter()
        for _ in range(rounds):
            for q in queries:
                await backend.search([q], TOPK)
        single = rounds * len(queries) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(rounds):
            for i in range(0, len(queries), 64):
                await backend.search(queries[i : i + 64], TOPK)
        batch = rounds * len(queries) / (time.perf_counter() - t0)
        return single, batch, hits

    single, batch, hits = asyncio.run(go())
    return {"build_s": build_s, "qps": single, "qps_batch64": batch, "top": hits}


def overlap(a: list[str], b: list[str]) -> float:
    return 1.0 if not a and not b else len(set(a) & set(b)) / max(len(a), len(b))


def measure(quick: bool) -> dict[str, Any]:
    """Both libraries on both corpora, in this process."""
    from bench_search import synthetic_corpus

    from toolenv_search.corpus import bundled_corpus_path, bundled_questions_path

    skipped: dict[str, str] = {}
    try:
        import rank_bm25  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: F401
    except ImportError as exc:
        skipped["rank-bm25"] = f"rank-bm25 is not importable in {sys.prefix} ({exc})"
    n_syn = 5_000 if quick else 100_000
    questions = [json.loads(line)["question"] for line in bundled_questions_path().open(encoding="utf-8")]
    corpora: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        syn = Path(tmp) / "synthetic.jsonl"
        syn_queries = synthetic_corpus(syn, n_syn)[: 100 if quick else 1_000]
        for name, path, queries, timed_peer, rounds in [
            ("hotpotqa (bundled)", bundled_corpus_path(), questions, len(questions), 1 if quick else 10),
            (f"synthetic {n_syn:,}", syn, syn_queries, 20 if quick else 200, 1),
        ]:
            row: dict[str, Any] = {"corpus": name, "queries": len(queries)}
            ours = toolenv_rows(path, queries, Path(tmp) / f"cache-{len(corpora)}", rounds)
            row["toolenv"] = {k: v for k, v in ours.items() if k != "top"}
            if not skipped:
                peer = rank_bm25_rows(path, queries[:timed_peer])  # it is slow: a subset on the big corpus
                row["rank-bm25"] = {k: v for k, v in peer.items() if not k.startswith("top")}
                row["compared_queries"] = timed_peer
                pairs = list(zip(ours["top"], peer["top"], strict=False))
                row["top5_overlap"] = sum(overlap(a, b) for a, b in pairs) / len(pairs)
                row["top1_agreement"] = sum(bool(a) and bool(b) and a[0] == b[0] for a, b in pairs) / len(pairs)
                pairs = list(zip(ours["top"], peer["top_lucene_idf"], strict=False))
                row["top5_overlap_lucene_idf"] = sum(overlap(a, b) for a, b in pairs) / len(pairs)
            corpora.append(row)
    return {
        "corpora": corpora,
        "skipped": skipped,
        "versions": _peers.versions("toolenv", "toolenv-search", "bm25s", "rank-bm25", "numpy"),
        "python": peers_env.shown(sys.executable),
    }


def main() -> int:
    args = _peers.parse_args(__doc__.splitlines()[0])
    extras = {"toolenv-search": _peers.editable("search"), "rank-bm25": ["rank-bm25==0.2.2"]}
    got = _peers.run(__file__, args, measure, extras)
    if got is None:
        return 1
    result, note = got
    venv = Path(result["python"]).parent.parent.name
    print(f"machine: {machine()['processor']}, {machine()['cpus']} CPUs; measured with {venv}/bin/python")
    rows = []
    for c in result["corpora"]:
        ours, peer = c["toolenv"], c.get("rank-bm25")
        base = peer["qps"] if peer else float("nan")
        rows.append([c["corpus"], "toolenv bm25 (1/call)", ours["build_s"], ours["qps"], ours["qps"] / base])
        rows.append([c["corpus"], "toolenv bm25 (64/call)", "", ours["qps_batch64"], ours["qps_batch64"] / base])
        if peer:
            rows.append([c["corpus"], "rank-bm25 BM25Okapi", peer["build_s"], peer["qps"], 1.0])
    table(rows, ["corpus", "library", "build s", "queries/s", "× rank-bm25"])
    for c in result["corpora"]:
        if "top5_overlap" in c:
            print(
                f"{c['corpus']}: top-5 overlap {c['top5_overlap']:.3f}, top-1 agreement {c['top1_agreement']:.3f} "
                f"over {c['compared_queries']} queries; top-5 overlap with rank-bm25 given Lucene's IDF "
                f"{c['top5_overlap_lucene_idf']:.3f}"
            )
    for label, why in result["skipped"].items():
        print(f"not measured: {label}: {why}")
    if note:
        print(note)
    write(
        "peers_search",
        {
            "quick": args.quick,
            "topk": TOPK,
            "corpora": result["corpora"],
            "skipped": result["skipped"],
            "versions": result["versions"],
            "measured_with": result["python"],
            "note": note,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
