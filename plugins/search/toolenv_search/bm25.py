"""The embedded default backend: a BM25 index (bm25s) over a local JSONL corpus.

The index is built once per corpus content and tokenizer settings, saved under a
cache directory keyed by their hash, and held once per process: any number of
`BM25Backend` objects (e.g. 1,024 envs from 1,024 factory calls) for the same
corpus share one in-memory index.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import bm25s  # type: ignore[import-untyped]
import filelock
import numpy as np

from toolenv_search.backend import Passage, SearchError
from toolenv_search.cachedir import default_cache_dir
from toolenv_search.corpus import bundled_corpus_path, check_corpus, file_digest, load_corpus

__all__ = ["BM25Backend", "BM25Index", "default_cache_dir"]

_FORMAT = 1  # bump when the on-disk layout changes
# Text is tokenized in this Unicode form (the passages shown keep the corpus's own). bm25s's tokens
# are runs of word characters, which a decomposed accent (NFD) ends: "Ångström" was indexed as
# "ngstro" and never matched the same word typed composed; NFKC also folds full-width letters and
# ligatures ("ＧＰＴ", "ofﬁce") to their plain forms.
_NORMAL_FORM: Final = "NFKC"
_LOCK_WAIT = 900.0  # seconds to wait for another process's build: far more than 1M passages take


def _normal(texts: Iterable[str]) -> list[str]:
    """`texts` in `_NORMAL_FORM`, as they are tokenized for the index and its queries alike."""
    return [unicodedata.normalize(_NORMAL_FORM, t) for t in texts]


def _stemmer(name: str | None) -> Any:
    if name is None:
        return None
    try:
        import Stemmer  # type: ignore[import-not-found,unused-ignore]  # PyStemmer
    except ImportError:
        raise ValueError(
            f"stemmer={name!r} needs PyStemmer: pip install 'toolenv-search[stem]' (or use stemmer=None)"
        ) from None
    try:
        return Stemmer.Stemmer(name)
    except KeyError:
        known = ", ".join(Stemmer.algorithms())
        raise ValueError(f"unknown stemmer language {name!r}; known: {known}") from None


@dataclass
class BM25Index:
    """A loaded index and the passages it ranks (position i in the index is `passages[i]`)."""

    retriever: Any
    passages: list[Passage]
    stemmer: Any
    stopwords: str
    cache_path: Path
    built: bool  # True when this process built it, False when it came from the cache

    def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """Top passages per query, best first; passages that share no term with the query are left out."""
        if not queries:
            return []
        tokens = bm25s.tokenize(
            _normal(queries), stopwords=self.stopwords, stemmer=self.stemmer, return_ids=False, show_progress=False
        )
        out: list[list[Passage]] = []
        for query_tokens in tokens:
            if not query_tokens:
                out.append([])
                continue
            scores = np.asarray(self.retriever.get_scores(query_tokens))
            out.append(
                [self.passages[int(doc)].model_copy(update={"score": float(scores[doc])}) for doc in _top(scores, topk)]
            )
        return out


def _top(scores: np.ndarray[Any, Any], k: int) -> list[int]:
    """Positions of the `k` best positive scores, best first; a tie goes to the earlier passage.

    As Lucene's doc-id order: bm25s leaves ties to numpy's argpartition/argsort (or jax
    when it is installed), whose order differs between machines and versions.
    """
    hits = np.flatnonzero(scores > 0.0)  # ascending positions
    if len(hits) > k >= 1:
        kth = np.partition(scores[hits], len(hits) - k)[len(hits) - k]
        hits = hits[scores[hits] >= kth]  # the top k and everything tied with the k-th
    order = np.argsort(-scores[hits], kind="stable")[: max(k, 1)]
    return [int(i) for i in hits[order]]


def _build(passages: list[Passage], stemmer: Any, stopwords: str, k1: float, b: float) -> Any:
    texts = [f"{p.title}\n{p.text}" if p.title else p.text for p in passages]
    tokens = bm25s.tokenize(_normal(texts), stopwords=stopwords, stemmer=stemmer, show_progress=False)
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(tokens, show_progress=False)
    return retriever


def _load_or_build(corpus: Path, cache_root: Path, stemmer_name: str | None, k1: float, b: float) -> BM25Index:
    stopwords = "en"
    settings = json.dumps(
        {
            "corpus": file_digest(corpus),
            "stem": stemmer_name,
            "stop": stopwords,
            "k1": k1,
            "b": b,
            "fmt": _FORMAT,
            "norm": _NORMAL_FORM,  # an index of text tokenized otherwise is another index
            "bm25s": getattr(bm25s, "__version__", "unknown"),  # its on-disk format may change between versions
        },
        sort_keys=True,
    )
    key = hashlib.sha256(settings.encode()).hexdigest()[:20]
    target = cache_root / "bm25" / key
    passages = load_corpus(corpus)
    stemmer = _stemmer(stemmer_name)
    retriever = _load_cached(target, len(passages))
    if retriever is not None:
        return BM25Index(retriever, passages, stemmer, stopwords, target, built=False)
    with _build_lock(target):
        # The worker that held the lock may have built it: load theirs instead of building again.
        retriever = _load_cached(target, len(passages))
        if retriever is not None:
            return BM25Index(retriever, passages, stemmer, stopwords, target, built=False)
        retriever = _build(passages, stemmer, stopwords, k1, b)
        _save(retriever, target, settings)
    return BM25Index(retriever, passages, stemmer, stopwords, target, built=True)


def _load_cached(target: Path, num_docs: int) -> Any:
    """The index saved at `target`, or None when there is none (or it is damaged, or of another corpus)."""
    if not (target / "params.index.json").exists():
        return None
    try:
        retriever = bm25s.BM25.load(str(target), mmap=True, show_progress=False)
    except (OSError, ValueError, KeyError):
        return None  # a damaged cache entry is rebuilt
    return retriever if int(retriever.scores["num_docs"]) == num_docs else None


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Hold `<key>.lock` next to the index while building it: workers that start together build it once.

    A cache directory that cannot hold a lock (read-only), or a lock still held after
    `_LOCK_WAIT` seconds (a stale soft lock where the file system has no flock), only
    costs this process a build of its own.
    """
    lock: filelock.BaseFileLock | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(target.parent / f"{target.name}.lock")
        lock.acquire(timeout=_LOCK_WAIT)
    except OSError:  # filelock.Timeout is a TimeoutError, an OSError
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _save(retriever: Any, target: Path, settings: str) -> None:
    """Save into a private directory, then rename: other processes never see half an index."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        retriever.save(str(tmp), show_progress=False)
        (tmp / "settings.json").write_text(settings, encoding="utf-8")
        if target.exists():  # damaged (we hold the lock, and it did not load)
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:  # a process without the lock won the race; its index is the same
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a read-only cache only costs a rebuild next time


# The corpora read through without a fault, by path, with the size and mtime they had then: a
# rollout builds one backend per env, and the corpus is read once, not once per env.
_CHECKED: dict[str, tuple[int, int]] = {}


def _check_once(corpus: Path) -> None:
    """Read `corpus` through (`check_corpus`) unless this version of it was read already.

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: it is a directory, or a line of it is not a passage (the message names the line).
        OSError: it cannot be read.
    """
    try:
        st = corpus.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"corpus not found: {corpus}") from None
    version = (st.st_size, st.st_mtime_ns)
    if _CHECKED.get(str(corpus)) == version:
        return
    check_corpus(corpus)
    _CHECKED[str(corpus)] = version


_INDEXES: dict[tuple[Any, ...], BM25Index] = {}
_LOCKS: dict[tuple[Any, ...], threading.Lock] = {}
_REGISTRY_LOCK = threading.Lock()


class BM25Backend:
    """BM25 over a JSONL corpus (default: the bundled HotpotQA paragraphs).

    The index is loaded (or built) on the first search; a corpus of your own is read through
    when the backend is built (once per process and version of the file), so that one it could
    not load fails here, naming the file and line, rather than every search.

    Args:
        corpus: path of a JSONL corpus (`id`, `title`, `text` per line).
        cache_dir: where built indexes are kept (default `default_cache_dir()`).
        stemmer: a Snowball language such as `"english"` (needs PyStemmer), or None.
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.

    Raises:
        FileNotFoundError: the corpus does not exist.
        ValueError: the corpus is a directory or malformed (the message names the line), or the
            stemmer is unknown or needs PyStemmer.
        OSError: the corpus cannot be read.
    """

    name = "bm25"

    def __init__(
        self,
        corpus: str | Path | None = None,
        *,
        cache_dir: str | Path | None = None,
        stemmer: str | None = None,
        k1: float = 1.5,
        b: float = 0.75,
    ) -> None:
        self.corpus = Path(corpus).resolve() if corpus is not None else bundled_corpus_path()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.stemmer = stemmer
        self.k1 = k1
        self.b = b
        self._index: BM25Index | None = None
        _stemmer(stemmer)  # an unknown language, or no PyStemmer, fails here rather than at every search
        if corpus is not None:  # the bundled corpus is the package's own, checked by its tests: not read here
            _check_once(self.corpus)

    def _key(self) -> tuple[Any, ...]:
        st = self.corpus.stat()
        # The cache dir is not part of the key: wherever it was saved, the index in memory is the same.
        return (str(self.corpus), st.st_size, st.st_mtime_ns, self.stemmer, self.k1, self.b)

    def load(self) -> BM25Index:
        """The shared index, loading it from the cache or building it on first use (thread-safe).

        Raises:
            FileNotFoundError: the corpus does not exist.
            ValueError: the corpus is malformed, or the stemmer is unavailable.
        """
        if self._index is not None:
            return self._index
        key = self._key()
        with _REGISTRY_LOCK:
            lock = _LOCKS.setdefault(key, threading.Lock())
        with lock:
            index = _INDEXES.get(key)
            if index is None:
                index = _INDEXES[key] = _load_or_build(self.corpus, self.cache_dir, self.stemmer, self.k1, self.b)
        self._index = index
        return index

    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """Rank the corpus for each query (in a worker thread, so the event loop keeps running)."""
        try:
            index = self._index if self._index is not None else await asyncio.to_thread(self.load)
        except (OSError, ValueError) as exc:
            raise SearchError(f"The search index is unavailable: {exc}") from exc
        if len(index.passages) <= 5000:  # sub-millisecond: a thread hop would cost more than it saves
            return index.search(queries, topk)
        return await asyncio.to_thread(index.search, queries, topk)

    async def aclose(self) -> None:
        """Nothing to release: the index stays shared for the process."""

    def __repr__(self) -> str:
        return f"<BM25Backend corpus={str(self.corpus)!r}>"
