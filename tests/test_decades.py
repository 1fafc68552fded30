"""The 1st, 10th, 100th ... rule for logging a repeating fault, and the verl loop's stop-string
cache that must not outlive (or be confused by) a tokenizer."""

from __future__ import annotations

import gc
from typing import Any

from toolenv._decades import Decades
from toolenv.integrations.verl import _turns


def test_decades_are_due_at_1_10_100_and_1000() -> None:
    decades = Decades()
    due = [n for n in range(1, 2001) if decades.due(n)]
    assert due == [1, 10, 100, 1000]


def test_a_count_that_jumps_past_decades_logs_once_and_waits_for_the_next() -> None:
    decades = Decades()
    assert decades.due(1)
    assert decades.due(57)  # 10 was skipped (counted under another caller's lock): due now
    assert not decades.due(99)
    assert decades.due(100)
    assert not decades.due(100)  # the same count asked twice is logged once


class _Tokenizer:
    """Encodes a stop as one special token when it is in `special`, else as one id per character."""

    def __init__(self, special: set[str]) -> None:
        self.special = special
        self.all_special_ids = [7]
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls += 1
        return [7] if text in self.special else [ord(c) for c in text]


def test_text_stops_answers_per_tokenizer_and_keeps_no_tokenizer_alive() -> None:
    glm = _Tokenizer({"<|observation|>"})
    plain = _Tokenizer(set())
    stops = ["<|observation|>", "</tool_call>"]
    assert _turns.text_stops(glm, stops) == ["</tool_call>"]
    assert _turns.text_stops(plain, stops) == stops  # not the first tokenizer's answer
    assert _turns.text_stops(glm, stops) == ["</tool_call>"]
    assert glm.calls == 2  # asked once per string, then cached
    assert glm in _turns._SPECIAL_STOPS
    count = len(_turns._SPECIAL_STOPS)
    del glm
    gc.collect()
    assert len(_turns._SPECIAL_STOPS) == count - 1  # the freed tokenizer's answers went with it


def test_text_stops_works_for_a_tokenizer_that_takes_no_weak_reference() -> None:
    class Unhashable(_Tokenizer):
        __hash__ = None  # type: ignore[assignment]

    tokenizer: Any = Unhashable({"<|call|>"})
    assert _turns.text_stops(tokenizer, ["<|call|>", "\nObservation:"]) == ["\nObservation:"]
