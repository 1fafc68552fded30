"""When a repeating fault is worth a log line: at its 1st, 10th, 100th ... occurrence.

A judge or retriever that is down fails every episode of a run; one line per episode floods
the log, one line in all hides how long it went on. The judge, SQL's execution match and the
verl agent loop's tool-failure warning share this rule.
"""

from __future__ import annotations

__all__ = ["Decades"]


class Decades:
    """The next count (1, 10, 100 ...) at which to log. Not locked: callers count under their own lock."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 1

    def due(self, count: int) -> bool:
        """Whether `count` reached the next decade; if so, the one after it becomes the next."""
        if count < self.next:
            return False
        while self.next <= count:
            self.next *= 10
        return True
