"""Which of a parser's stop strings a chat model's generation is given: the core's rule
(`toolenv.parsers.stops`), re-exported under the names the agents have always imported."""

from __future__ import annotations

from toolenv.parsers.stops import PER_CALL_STOPS, chat_stops

__all__ = ["PER_CALL_STOPS", "chat_stops"]
