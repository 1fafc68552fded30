"""Reading passage corpora (JSONL) and the bundled HotpotQA data.

A corpus line is `{"id", "title", "text"}`, or Search-R1's wiki-18 form
`{"id", "contents": "\\"Title\\"\\nText"}`; both load into `Passage`s.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from toolenv_search.backend import Passage

__all__ = [
    "bundled_corpus_path",
    "bundled_nq_open_path",
    "bundled_questions_path",
    "file_digest",
    "load_corpus",
    "passage_from_record",
]


def _data_file(name: str) -> Path:
    # The package is installed from a directory (editable or wheel), so the data is a real file.
    return Path(str(resources.files("toolenv_search") / "data" / name))


def bundled_corpus_path() -> Path:
    """The 1,000 HotpotQA distractor paragraphs shipped with the package."""
    return _data_file("corpus.jsonl")


def bundled_questions_path() -> Path:
    """The 100 HotpotQA questions whose paragraphs make up the bundled corpus."""
    return _data_file("questions.jsonl")


def bundled_nq_open_path() -> Path:
    """NQ-open's 3,610 dev questions (no passages: answer them through a Wikipedia retriever)."""
    return _data_file("nq_open_dev.jsonl")


def passage_from_record(record: Any, fallback_id: str) -> Passage:
    """A `Passage` from one corpus record (title/text or Search-R1 `contents`).

    Raises:
        ValueError: the record is not an object or has no text.
    """
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    pid = record.get("id", record.get("_id", fallback_id))
    title = record.get("title")
    text = record.get("text")
    if text is None and isinstance(record.get("contents"), str):
        head, _, body = record["contents"].partition("\n")
        if title is None:
            head = head.strip()
            # One pair of quotes wraps the title; quotes of the title's own (`"Weird Al" Yankovic`) stay.
            title = head[1:-1] if len(head) >= 2 and head[0] == head[-1] == '"' else head
            text = body.strip()
        else:
            text = record["contents"]
    if not isinstance(text, str):
        raise ValueError('a passage needs a "text" (or Search-R1 "contents") string')
    return Passage(id=str(pid), title=str(title or ""), text=text)


def load_corpus(path: str | Path) -> list[Passage]:
    """All passages of a JSONL corpus, in file order.

    Raises:
        ValueError: a line is not valid JSON or not a passage (the message names the line), or the file is empty.
    """
    path = Path(path)
    passages: list[Passage] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                passages.append(passage_from_record(json.loads(line), fallback_id=str(lineno - 1)))
            except (json.JSONDecodeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: not a corpus passage ({exc})") from None
    if not passages:
        raise ValueError(f"{path}: the corpus has no passages")
    return passages


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (the BM25 cache key)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
