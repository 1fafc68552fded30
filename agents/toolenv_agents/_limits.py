"""The `openai` agent's request limits: where a turn's time went, and the error lines that say
which option to change (the deadline over a whole attempt is `toolenv._aio.within`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

__all__ = ["Spent", "load_hint", "timeout_message"]


@dataclass
class Spent:
    """Seconds one turn spent waiting for a request slot or its `rate_limit` turn (`queue`), in
    retry sleeps (`backoff`) and in requests (`request`, every attempt's): a slow server shows in
    `request`, a saturated client in `queue`."""

    queue: float = 0.0
    backoff: float = 0.0
    request: float = 0.0

    def since(self, start: float, field: str) -> float:
        """Add the seconds since `start` (`time.monotonic()`) to `field`; returns now."""
        now = time.monotonic()
        setattr(self, field, getattr(self, field) + now - start)
        return now

    def metadata(self) -> dict[str, float]:
        """The turn's `agent_metadata` keys, in milliseconds' precision."""
        return {
            "queue_s": round(self.queue, 3),
            "backoff_s": round(self.backoff, 3),
            "request_s": round(self.request, 3),
        }


def timeout_message(exc: BaseException, timeout: float, connect_timeout: float) -> str:
    """What timed out, the limit and the option that raises it: a connection (`connect_timeout`)
    or the whole attempt (`timeout`: httpx's per-read limits and the overall deadline)."""
    if isinstance(exc, httpx.ConnectTimeout):
        return (
            f"could not connect to the model server within {connect_timeout:g} s "
            f"(connect_timeout={connect_timeout:g}; check base_url, or raise it with --agent-arg connect_timeout=N)"
        )
    return (
        f"the model server did not answer within {timeout:g} s "
        f"(timeout={timeout:g}; raise it with --agent-arg timeout=N)"
    )


def load_hint(max_concurrency: int, rate_limit: float | None) -> str:
    """What to lower when the server still refused for load (HTTP 429) after every retry."""
    rate = f"lower rate_limit (now {rate_limit:g})" if rate_limit else "set rate_limit"
    return (
        f"; the server is refusing requests for load: lower max_concurrency (now {max_concurrency}) or {rate}: "
        "--agent-arg max_concurrency=N or --agent-arg rate_limit=R (requests per second, all episodes together)"
    )
