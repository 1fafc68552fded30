"""Reading passage corpora (JSONL) and the bundled HotpotQA data.

A corpus line is `{"id", "title", "text"}`, or Search-R1's wiki-18 form
`{"id", "contents": "\\"Title\\"\\nText"}`; both load into `Passage`s.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from toolenv_search.backend import Passage

__all__ = [
    "bundled_corpus_path",
    "bundled_nq_open_path",
    "bundled_questions_path",
    "check_corpus",
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


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 file.

    Raises:
        ValueError: a byte is not UTF-8 (a Latin-1 file, a Parquet one); the message names its line.
    """
    lineno = 0
    try:
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                yield lineno, line
    except UnicodeDecodeError as exc:
        # A text-mode read decodes ahead of the line it returns: find the line the byte is on.
        raise ValueError(
            f"{path}:{_undecodable_line(path, lineno + 1)}: not UTF-8 text ({exc.reason}); "
            "a corpus is a JSONL file, one passage object a line"
        ) from None


def _undecodable_line(path: Path, first: int) -> int:
    """The number of the first line of `path` from line `first` on that is not UTF-8, numbered as a
    text-mode read numbers them (a line ends at `\n`, `\r\n` or `\r`)."""
    lineno = 0
    with path.open("rb") as fh:
        for raw in fh:
            pieces = raw.replace(b"\r\n", b"\n").split(b"\r")
            for piece in pieces[:-1] if len(pieces) > 1 and not pieces[-1] else pieces:
                lineno += 1
                if lineno < first:
                    continue
                try:
                    piece.decode("utf-8")
                except UnicodeDecodeError:
                    return lineno
    return first


def _passages(path: Path) -> Iterator[Passage]:
    """The passages of a JSONL corpus, in file order (blank lines skipped).

    Raises:
        ValueError: a line is not UTF-8, not valid JSON or not a passage (the message names the line).
    """
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            passage = passage_from_record(json.loads(line), fallback_id=str(lineno - 1))
        except (json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: not a corpus passage ({exc})") from None
        yield passage


def load_corpus(path: str | Path) -> list[Passage]:
    """All passages of a JSONL corpus, in file order.

    Raises:
        ValueError: a line is not valid JSON or not a passage (the message names the line), or the file is empty.
    """
    path = Path(path)
    passages = list(_passages(path))
    if not passages:
        raise ValueError(f"{path}: the corpus has no passages")
    return passages


def check_corpus(path: str | Path) -> int:
    """Read a JSONL corpus through as `load_corpus` does, keeping nothing; the number of passages.

    What a backend runs when it is built, so that a corpus it could not load fails there, in one
    line naming the file and line, not at every search.

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: it is a directory, or `load_corpus` would refuse it.
        OSError: it cannot be read.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give the path of a JSONL corpus file")
    if not path.exists():
        raise FileNotFoundError(f"corpus not found: {path}")
    count = sum(1 for _ in _passages(path))
    if not count:
        raise ValueError(f"{path}: the corpus has no passages")
    return count


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (the BM25 cache key)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
