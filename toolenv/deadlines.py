"""`Deadline`: a tool call's timeout, as `asyncio.timeout` keeps it, at a fraction of the cost.

Every tool call that waits (a search over HTTP, SQL in a worker thread, a sandboxed run)
runs under its tool's timeout. `asyncio.timeout` spends two coroutine frames, a state
machine and a loop timer (a `TimerHandle` pushed onto the loop's heap, ordered by a Python
`__lt__`, then cancelled, since nearly every call returns in time) on each call: about a
third of the CPU of an env step whose tool waits once, and more with a thousand calls in
flight. asyncio offers nothing lighter, so this is the same rule in a plain object:

- at the deadline the call's task is cancelled (`Task.cancel`); when that cancellation comes
  back out of the call and no other cancellation was asked for meanwhile (`Task.uncancel`,
  as `asyncio.timeout` counts them), the caller turns it into `TimeoutError`;
- deadlines share timers: each is rounded *up* to a bucket (1% of its timeout, at least
  1 ms), and the calls whose deadlines fall in one bucket share one loop timer. A deadline
  fires never early and at most 1% (or 1 ms) late. A bucket's timer is left to fire when
  its calls have all returned: the next calls of the same window reuse it;
- a call that has not ended when its deadline fired gets a short grace (`GRACE` of its
  timeout, at least `MIN_GRACE_S`) to take the cancellation in: a cleanup that awaits (an
  HTTP client closing its pool) ends within it. One still running after it (a tool that
  swallowed the cancellation) is left to finish in the background by the caller
  (`toolenv.caller`), so a call ends within SLACK + GRACE (6%) of its timeout.
"""

from __future__ import annotations

import asyncio
import math
import sys
import weakref
from typing import Any

__all__ = ["Deadline"]

#: A deadline fires at most this fraction of its timeout late (and never early).
SLACK = 0.01
#: ... or this many seconds late, whichever is more: no bucket is finer than a millisecond.
MIN_BUCKET_S = 0.001
#: A call still running this fraction of its timeout after its deadline fired is left behind
#: (it caught the cancellation and waits on); a cleanup that awaits briefly ends well within it.
GRACE = 0.05
#: ... or after this many seconds, whichever is more.
MIN_GRACE_S = 0.001


class Deadline:
    """The timeout of one call in the running task; `close` it when the call ends.

    Needs Python 3.11+ (`Task.cancelling`/`uncancel`).
    """

    __slots__ = ("_cancelling", "_delay", "_members", "_task", "expired")
    _task: asyncio.Task[Any]
    _cancelling: int
    _delay: float
    _members: set[Deadline]
    expired: bool

    def __init__(self, delay: float, spent: float = 0.0) -> None:
        """`delay` seconds from when the call began, `spent` seconds ago (its first step's time)."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a Deadline needs to run inside a task")
        if sys.version_info < (3, 11):  # pragma: no cover - the caller uses it on 3.11+ only
            raise RuntimeError("a Deadline needs Python 3.11+ (Task.uncancel)")
        self._task = task
        self._cancelling = task.cancelling()
        self._delay = delay
        self.expired = False
        buckets = _BUCKETS.get(loop)
        if buckets is None:
            buckets = _BUCKETS[loop] = _Buckets()
        self._members = buckets.arm(loop, self, delay, spent)

    def expire(self) -> None:
        """Cancel the call's task now (its timer calls this)."""
        if not self.expired:
            self.expired = True
            self._task.cancel()

    def alone(self) -> bool:
        """True when it fired and its cancel is the only one asked of its task: the step itself
        is not being cancelled (Ctrl-C, a shutdown, an outer timeout)."""
        if not self.expired or sys.version_info < (3, 11):
            return False
        return self._cancelling == 0 and self._task.cancelling() == 1

    def grace(self) -> float:
        """Seconds its call may still run after it fired before it is left behind (`GRACE`)."""
        return max(self._delay * GRACE, MIN_GRACE_S)

    def close(self, exc: BaseException | None) -> bool:
        """Disarm it as its call ends with `exc` (None: a result). True when `exc` is the
        cancellation this deadline caused and nothing else asked for: raise `TimeoutError`."""
        self._members.discard(self)
        if not self.expired or sys.version_info < (3, 11):
            return False
        return self._task.uncancel() <= self._cancelling and isinstance(exc, asyncio.CancelledError)


class _Buckets:
    """The deadline buckets of one event loop: bucket time -> the deadlines due then.

    It holds no reference to its loop: `_BUCKETS` is keyed weakly by the loop, and a value
    that referred to its key would keep every loop that ever ran a deadline alive.
    """

    __slots__ = ("due",)

    def __init__(self) -> None:
        self.due: dict[float, set[Deadline]] = {}

    def arm(self, loop: asyncio.AbstractEventLoop, deadline: Deadline, delay: float, spent: float) -> set[Deadline]:
        """Add `deadline` to its bucket (a past one, when `spent` used up `delay`: it fires at once)."""
        width = max(delay * SLACK, MIN_BUCKET_S)
        when = math.ceil((loop.time() + delay - spent) / width) * width
        members = self.due.get(when)
        if members is None:
            members = self.due[when] = set()
            loop.call_at(when, self._fire, when)
        members.add(deadline)
        return members

    def _fire(self, when: float) -> None:
        for deadline in list(self.due.pop(when, ())):
            deadline.expire()


_BUCKETS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Buckets] = weakref.WeakKeyDictionary()
