"""A retrieval server speaking the Search-R1 API over any `SearchBackend` (Starlette).

Many rollout workers can then share one index: `POST /retrieve` and `GET /health`.
Starlette (with uvicorn) is small, async and typed, which suits a backend whose
`search` is already a coroutine.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from toolenv_search.backend import SearchBackend, SearchError
from toolenv_search.protocol import MAX_REQUEST_TOPK, RetrieveRequest, document_of

__all__ = ["create_app"]


def create_app(backend: SearchBackend, *, default_topk: int = 3, max_topk: int = MAX_REQUEST_TOPK) -> Starlette:
    """An ASGI app serving `backend` at `/retrieve` (and `/health`).

    A request's `topk` above `max_topk` is refused (HTTP 422), never silently cut short.
    """

    async def retrieve(request: Request) -> JSONResponse:
        try:
            req = RetrieveRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
            return JSONResponse({"error": f"invalid request: {detail}"}, status_code=422)
        if not req.queries:
            return JSONResponse({"result": []})
        topk = req.topk or default_topk
        if topk > max_topk:
            return JSONResponse(
                {"error": f"invalid request: topk: at most {max_topk} on this server, got {topk}"}, status_code=422
            )
        try:
            hits = await backend.search(req.queries, topk)
        except SearchError as exc:
            return JSONResponse({"error": str(exc)}, status_code=503 if exc.retryable else 500)
        result: list[list[Any]] = [
            [{"document": document_of(p), "score": p.score} if req.return_scores else document_of(p) for p in row]
            for row in hits
        ]
        return JSONResponse({"result": result})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "backend": backend.name})

    return Starlette(
        routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health, methods=["GET"])],
    )
