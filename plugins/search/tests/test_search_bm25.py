"""The BM25 backend: retrieval on the bundled corpus, the on-disk cache and process-wide sharing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolenv_search.backend import Passage, SearchBackend
from toolenv_search.bm25 import BM25Backend
from toolenv_search.cachedir import default_cache_dir
from toolenv_search.corpus import bundled_corpus_path, load_corpus


def test_bundled_corpus_is_complete() -> None:
    passages = load_corpus(bundled_corpus_path())
    assert len(passages) == 1000
    assert len({p.id for p in passages}) == 1000
    assert all(p.id.startswith("hp-") and p.title and p.text for p in passages)
    data = bundled_corpus_path().parent
    names = ("SOURCE.md", "LICENSE-CC-BY-SA-4.0.txt", "LICENSE-reflexion-MIT.txt", "questions.jsonl")
    for name in (*names, "nq_open_dev.jsonl", "README-nq_open.md"):
        assert (data / name).is_file()


async def test_title_query_ranks_its_article_first(tmp_path: Path) -> None:
    backend = BM25Backend(cache_dir=tmp_path)
    assert isinstance(backend, SearchBackend)
    [hits] = await backend.search(["Constantin Medien German media group Ismaning"], 3)
    assert hits[0].id == "hp-f93b09ca3d5f"
    assert hits[0].title == "Constantin Medien"
    assert len(hits) == 3
    scores = [h.score for h in hits]
    assert all(s is not None and s > 0 for s in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]


async def test_batch_keeps_query_order(tmp_path: Path) -> None:
    backend = BM25Backend(cache_dir=tmp_path)
    queries = ["VIVA Poland music channel", "Constantin Medien"]
    batch = await backend.search(queries, 2)
    singles = [(await backend.search([q], 2))[0] for q in queries]
    assert [[p.id for p in row] for row in batch] == [[p.id for p in row] for row in singles]
    assert batch[0][0].title == "VIVA Poland"


async def test_stopword_only_and_unknown_queries_find_nothing(tmp_path: Path) -> None:
    backend = BM25Backend(cache_dir=tmp_path)
    assert await backend.search(["the of a", "zzqxjv unknownword"], 3) == [[], []]
    assert await backend.search([], 3) == []


async def test_topk_larger_than_corpus_is_clamped(tmp_path: Path) -> None:
    corpus = tmp_path / "tiny.jsonl"
    corpus.write_text(
        json.dumps({"id": "a", "title": "Apple", "text": "An apple is a fruit."})
        + "\n"
        + json.dumps({"id": "b", "contents": '"Banana"\nA banana is a yellow fruit.'})
        + "\n",
        encoding="utf-8",
    )
    backend = BM25Backend(corpus, cache_dir=tmp_path / "cache")
    [hits] = await backend.search(["yellow fruit"], 50)
    assert [h.id for h in hits] == ["b", "a"]
    # Search-R1's wiki-18 "contents" form: the quoted first line is the title.
    assert hits[0] == Passage(id="b", title="Banana", text="A banana is a yellow fruit.", score=hits[0].score)


def test_index_is_cached_on_disk_keyed_by_corpus_hash(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "x", "title": "Xylophone", "text": "A percussion instrument."}) + "\n")
    cache = tmp_path / "cache"
    first = BM25Backend(corpus, cache_dir=cache).load()
    assert first.built
    assert (first.cache_path / "params.index.json").is_file()
    assert first.cache_path.parent == cache / "bm25"
    # A fresh process loads the saved index instead of building it.
    code = (
        "import sys; from toolenv_search.bm25 import BM25Backend; "
        "i = BM25Backend(sys.argv[1], cache_dir=sys.argv[2]).load(); print(i.built, i.cache_path)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(corpus), str(cache)], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", str(first.cache_path)]
    # Other content, other key.
    corpus.write_text(json.dumps({"id": "y", "title": "Yacht", "text": "A sailing boat."}) + "\n")
    second = BM25Backend(corpus, cache_dir=cache).load()
    assert second.built and second.cache_path != first.cache_path
    assert [p.id for p in second.passages] == ["y"]


def test_one_index_per_process(tmp_path: Path) -> None:
    backends = [BM25Backend(cache_dir=tmp_path) for _ in range(50)]
    indexes = {id(b.load()) for b in backends}
    assert len(indexes) == 1


def test_cache_dir_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOOLENV_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("TOOLENV_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert default_cache_dir() == tmp_path / "xdg" / "toolenv"


def test_bad_corpus_is_refused_when_the_backend_is_built(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "1", "title": "ok", "text": "fine"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        BM25Backend(corpus, cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="corpus not found"):
        BM25Backend(tmp_path / "missing.jsonl", cache_dir=tmp_path / "cache")


def test_unknown_stemmer_language_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("Stemmer")
    with pytest.raises(ValueError, match="unknown stemmer language 'klingon'"):
        BM25Backend(cache_dir=tmp_path, stemmer="klingon").load()


async def test_stemming_matches_inflections(tmp_path: Path) -> None:
    pytest.importorskip("Stemmer")
    corpus = tmp_path / "s.jsonl"
    corpus.write_text(json.dumps({"id": "r", "title": "Run", "text": "She was running marathons."}) + "\n")
    plain = BM25Backend(corpus, cache_dir=tmp_path / "c")
    stemmed = BM25Backend(corpus, cache_dir=tmp_path / "c", stemmer="english")
    assert await plain.search(["marathon runs"], 1) == [[]]
    [hits] = await stemmed.search(["marathon runs"], 1)
    assert [h.id for h in hits] == ["r"]


def test_damaged_cache_entry_is_rebuilt(tmp_path: Path) -> None:
    from toolenv_search.bm25 import _load_or_build

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "x", "title": "Xylophone", "text": "A percussion instrument."}) + "\n")
    first = _load_or_build(corpus, tmp_path / "cache", None, 1.5, 0.75)
    assert first.built
    (first.cache_path / "params.index.json").write_text("{broken", encoding="utf-8")
    again = _load_or_build(corpus, tmp_path / "cache", None, 1.5, 0.75)
    assert again.built and again.cache_path == first.cache_path
    assert [p.id for p in again.search(["xylophone"], 1)[0]] == ["x"]
    assert not _load_or_build(corpus, tmp_path / "cache", None, 1.5, 0.75).built


def test_index_needs_neither_scipy_nor_numba(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "for m in ('scipy', 'scipy.sparse', 'numba'): sys.modules[m] = None\n"
        "import asyncio\n"
        "from toolenv_search.bm25 import BM25Backend\n"
        "b = BM25Backend(cache_dir=sys.argv[1])\n"
        "print(b.load().retriever.csc_backend, asyncio.run(b.search(['VIVA Media'], 1))[0][0].title)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "numpy VIVA Media"


async def test_tied_scores_rank_in_corpus_order(tmp_path: Path) -> None:
    """Equal scores go to the earlier passage (Lucene's doc-id order), the same for every topk.

    bm25s leaves ties to numpy's argpartition/argsort (or jax when installed), whose order
    differs between machines and versions; a rerun elsewhere then saw other passages.
    """
    corpus = tmp_path / "ties.jsonl"
    rows = [{"id": f"p{i}", "text": "apple pie" if i % 3 == 0 else f"cherry tart w{i}"} for i in range(3000)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    backend = BM25Backend(corpus, cache_dir=tmp_path / "cache")
    apples = [f"p{i}" for i in range(0, 3000, 3)]
    for topk in (1, 3, 7, 50, 1000, 3000):
        [hits] = await backend.search(["apple"], topk)
        assert [h.id for h in hits] == apples[:topk]
    # A better match still comes first; the tie below it keeps corpus order.
    [hits] = await backend.search(["apple tart w7"], 4)
    assert [h.id for h in hits] == ["p7", "p0", "p3", "p6"]


_BUILD_WHEN_TOLD = """
import json, sys
from toolenv_search.bm25 import BM25Backend
backend = BM25Backend(sys.argv[1], cache_dir=sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
index = backend.load()
print(json.dumps({"built": index.built, "n": len(index.passages), "top": index.search(["w7 w11"], 1)[0][0].id}))
"""


def test_workers_starting_together_build_the_index_once(tmp_path: Path) -> None:
    """Rollout workers that start at once on a new corpus: one builds, the rest wait and load its index.

    Each build of a 100k-passage corpus takes ~15 s and ~600 MB; eight workers all building at
    once cost eight times that, and a late finisher deleted the index others were loading.
    """
    corpus = tmp_path / "c.jsonl"
    rows = [{"id": f"d{i}", "text": " ".join(f"w{(i * 7 + j * 13) % 997}" for j in range(40))} for i in range(15000)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cache = tmp_path / "cache"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILD_WHEN_TOLD, str(corpus), str(cache)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for w in workers:  # every worker has imported everything and waits
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        for w in workers:  # then all of them load at the same moment
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
        results = [json.loads(w.communicate(timeout=300)[0]) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    assert all(w.returncode == 0 for w in workers)
    assert sorted(r["built"] for r in results) == [False, False, True]
    assert {(r["n"], r["top"]) for r in results} == {(15000, results[0]["top"])}
    assert [p.name for p in (cache / "bm25").iterdir() if not p.name.endswith(".lock")] == [
        BM25Backend(corpus, cache_dir=cache).load().cache_path.name
    ]


async def test_text_that_reads_the_same_matches_whatever_its_unicode_form(tmp_path: Path) -> None:
    """A decomposed passage (NFD: macOS file names, some PDF text) split at its accents into fragments
    ("Ångström" indexed as "ngstro"), so the same word typed composed (NFC, as models write) found
    nothing; full-width letters (CJK input methods) and ligatures did not match their plain forms."""
    import unicodedata

    rows = [
        {"id": "nfd", "title": "", "text": unicodedata.normalize("NFD", "Anders Ångström measured spectra.")},
        {"id": "lig", "title": "", "text": "The ﬁnal ofﬁce report."},
        {"id": "gpt", "title": "", "text": "GPT models generate text."},
        {"id": "other", "title": "", "text": "Bananas are yellow fruit."},
    ]
    corpus = tmp_path / "u.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    backend = BM25Backend(corpus, cache_dir=tmp_path / "cache")
    queries = [unicodedata.normalize("NFC", "Ångström"), "final office", "ＧＰＴ"]
    found = await backend.search(queries, 1)
    assert [[h.id for h in row] for row in found] == [["nfd"], ["lig"], ["gpt"]]
    # The passage itself is shown as the corpus has it.
    assert found[0][0].text == rows[0]["text"]
