"""Circuit breakers: a tool whose calls keep failing is refused at once for a while.

When a retriever, judge or sandbox server goes down mid-run, every episode in flight
would otherwise wait out the tool's full timeout, turn after turn, and the training step
stalls for minutes. After `breaker_threshold` consecutive failures (timeouts, crashes,
results the tool marked retryable) the circuit opens: calls fail at once with an error
observation saying so. After `breaker_cooldown` seconds one call is let through as a
probe; its success closes the circuit, its failure opens it for another cooldown.

The libraries for this (pybreaker, aiobreaker, purgatory) count raised exceptions, but
here failures are result values and the model's own mistakes (a bad query) must not count,
so the small state machine is written here.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolenv._tool import Tool

__all__ = ["CircuitBreaker", "breaker_for", "reset_breakers"]


class CircuitBreaker:
    """The state of one tool's circuit (shared by every tool object with the same `breaker_key`)."""

    __slots__ = ("cooldown", "failures", "last_error", "lock", "opened_at", "probing", "threshold", "timer")

    def __init__(self, threshold: int, cooldown: float, timer: Callable[[], float] = time.monotonic) -> None:
        self.threshold, self.cooldown, self.timer = threshold, cooldown, timer
        self.failures = 0  # consecutive failed calls
        self.opened_at: float | None = None
        self.probing = False  # a call is out as the probe of an open circuit
        self.last_error = ""
        self.lock = threading.Lock()  # one tool object may serve several threads' event loops

    @property
    def is_open(self) -> bool:
        """True while calls are refused (a probe may still be let through after the cooldown)."""
        return self.opened_at is not None

    def admit(self) -> float | None:
        """None to let a call through, else the seconds until the next probe is let through.

        A call let through while the circuit `is_open` is its probe."""
        with self.lock:
            if self.opened_at is None:
                return None
            waited = self.timer() - self.opened_at
            if waited >= self.cooldown and not self.probing:
                self.probing = True
                return None
            return max(self.cooldown - waited, 0.0)

    def record(self, failed: bool, error: str = "", *, probe: bool = True) -> None:
        """The outcome of a call that was let through. `probe=False` for a call let through
        before the circuit opened (one still in flight): it counts, but it is not the probe's
        outcome, so the probe stays out and no second probe goes."""
        with self.lock:
            was_probe = probe and self.probing
            if was_probe:
                self.probing = False
            if not failed:
                self.failures, self.opened_at = 0, None
                return
            self.failures += 1
            self.last_error = error
            if was_probe or self.failures >= self.threshold:
                self.opened_at = self.timer()

    def abandon(self, *, probe: bool = True) -> None:
        """A call let through ended with no outcome (it was cancelled): if it was the probe
        (`probe`), the next call may probe."""
        if probe:
            self.probing = False

    def refusal(self, name: str, retry_in: float) -> str:
        """The observation of a refused call."""
        return (
            f"Tool '{name}' is unavailable: its last {self.failures} calls failed ({self.last_error}). "
            f"It will be tried again in {retry_in:.0f} s; answer without it or try later."
        )


_BREAKERS: dict[Hashable, CircuitBreaker] = {}
#: Breakers of tools whose `breaker_key` cannot be hashed (or raises), by tool object: each
#: entry holds its settings and is dropped when its tool dies, before its id can be reused.
_OWN: dict[int, tuple[tuple[int, float], CircuitBreaker]] = {}
_LOCK = threading.Lock()


def breaker_for(tool: Tool) -> CircuitBreaker | None:
    """The process's breaker for `tool` (None when its limits set no `breaker_threshold`).

    Tools with the same `breaker_key()` and settings share one: the 512 envs of a run that
    each made their own search tool over one retriever see it fail as one.
    """
    lim = tool.limits
    if lim.breaker_threshold is None:
        return None
    try:
        key = (tool.breaker_key(), lim.breaker_threshold, lim.breaker_cooldown)
        found = _BREAKERS.get(key)
    except Exception:  # noqa: BLE001 - a broken or unhashable breaker_key: a breaker of its own
        return _own_breaker(tool, lim.breaker_threshold, lim.breaker_cooldown)
    if found is None:
        with _LOCK:
            found = _BREAKERS.setdefault(key, CircuitBreaker(lim.breaker_threshold, lim.breaker_cooldown))
    return found


def _own_breaker(tool: Tool, threshold: int, cooldown: float) -> CircuitBreaker:
    """The breaker of `tool` alone, whose `breaker_key` cannot be hashed (a dict of backend
    options in it): that key raised out of the step (`toolenv.caller` gives such a tool
    limits of its own likewise)."""
    settings = (threshold, cooldown)
    with _LOCK:
        found = _OWN.get(id(tool))
        if found is not None and found[0] == settings:
            return found[1]
        if found is None:
            weakref.finalize(tool, _OWN.pop, id(tool), None)
        breaker = CircuitBreaker(threshold, cooldown)
        _OWN[id(tool)] = (settings, breaker)
        return breaker


def reset_breakers() -> None:
    """Close every circuit of the process (forget all failures), e.g. after fixing a server."""
    with _LOCK:
        _BREAKERS.clear()
        for i, (settings, _) in list(_OWN.items()):  # the entries stay, for their finalizers
            _OWN[i] = (settings, CircuitBreaker(*settings))
