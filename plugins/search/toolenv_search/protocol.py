"""The Search-R1 retrieval API as Pydantic models, shared by the client and the server.

`POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}` answers
`{"result": [[{"document": DOC, "score": s}, ...], ...]}` (or bare `DOC`s without
scores), where `DOC` is a corpus record: `{"id", "contents": "\\"Title\\"\\nText"}`
in Search-R1's wiki-18 corpus, and here also `title`/`text`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolenv_search.backend import Passage
from toolenv_search.corpus import passage_from_record

__all__ = ["MAX_REQUEST_TOPK", "RetrieveRequest", "document_of", "parse_result"]

MAX_REQUEST_TOPK = 1000  # the largest `topk` a request may ask for


class RetrieveRequest(BaseModel):
    """The body of `POST /retrieve`."""

    model_config = ConfigDict(extra="ignore")  # forks add fields; ignore what we do not use

    # As Search-R1's server: an empty list (a training step in which no rollout searched)
    # gets an empty result, no cap on a rollout batch, and a `topk` of 0 means the default.
    queries: list[str]
    topk: int | None = Field(default=None, ge=0, le=MAX_REQUEST_TOPK)
    return_scores: bool = False


def document_of(p: Passage) -> dict[str, Any]:
    """The wire form of a passage: Search-R1's `contents` plus explicit `title` and `text`."""
    return {"id": p.id, "title": p.title, "text": p.text, "contents": f'"{p.title}"\n{p.text}'}


def parse_result(payload: Any, n_queries: int) -> list[list[Passage]]:
    """Passages per query from a `/retrieve` response.

    Raises:
        ValueError: the payload does not have the API's shape (the message says where).
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), list):
        raise ValueError('expected a JSON object with a "result" list')
    rows = payload["result"]
    if len(rows) != n_queries:
        raise ValueError(f"expected {n_queries} result lists, got {len(rows)}")
    out: list[list[Passage]] = []
    for qi, row in enumerate(rows):
        if not isinstance(row, list):
            raise ValueError(f"result[{qi}] is not a list")
        hits = []
        for di, item in enumerate(row):
            score: Any = None
            doc = item
            if isinstance(item, dict) and isinstance(item.get("document"), dict):
                doc, score = item["document"], item.get("score")
            try:
                p = passage_from_record(doc, fallback_id=f"{qi}-{di}")
                hits.append(p.model_copy(update={"score": float(score)}) if score is not None else p)
            except (ValueError, TypeError, ValidationError) as exc:
                raise ValueError(f"result[{qi}][{di}]: {exc}") from None
        out.append(hits)
    return out
