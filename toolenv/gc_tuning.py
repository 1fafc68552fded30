"""`tuned_gc`: the garbage collector set for many concurrent episodes, for one block of code.

With a thousand episodes in flight, every step's objects (coroutine frames, parsed
calls, results, chat messages) live across a tool's await, so CPython's young
collections cannot free them: each one is walked again and again and promoted, and
full collections of the whole heap follow. At 1,024 concurrent episodes that was about
a fifth of the run's wall time (docs/benchmarks.md). Inference servers deal with the
same thing the same way: `gc.freeze()` after start-up (vLLM, SGLang) so collections skip
what lives for the whole run, and fewer, larger young collections.

The collector's settings are process-wide, so toolenv changes them only inside
`tuned_gc()` (the rollout runner wraps its run in it), leaves them alone when the
program has set them itself, and puts them back on the way out. No library offers
this scoped form.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["DEFAULT_GEN0_THRESHOLD", "LIVE_OBJECTS_PER_EPISODE", "gen0_threshold_for", "tuned_gc"]

#: Young-generation threshold inside `tuned_gc` (CPython's default is 700, 2,000 from 3.13).
DEFAULT_GEN0_THRESHOLD = 100_000
#: Container objects an episode in flight keeps alive across its tool's await (its turns, chat
#: messages, results, trajectory record and coroutine frames: about 120 for a 4-turn episode of
#: the concurrency benchmark), with room to spare.
LIVE_OBJECTS_PER_EPISODE = 256


def gen0_threshold_for(episodes: int) -> int:
    """A young generation that holds what `episodes` episodes in flight keep alive.

    A young collection walks every object allocated since the last one; objects of episodes
    still in flight all survive it, so one that fires mid-run is pure cost (21 ms at 1,024
    episodes with the default threshold, a tenth of a 200 ms run). Sized like this, such
    objects are mostly freed by reference counting before a collection comes round.
    """
    return max(DEFAULT_GEN0_THRESHOLD, LIVE_OBJECTS_PER_EPISODE * episodes)


_lock = threading.Lock()
_depth = 0
_saved: tuple[tuple[int, ...], bool] | None = None  # thresholds before, and whether we froze


@contextlib.contextmanager
def tuned_gc(gen0_threshold: int = DEFAULT_GEN0_THRESHOLD) -> Iterator[bool]:
    """Within the block: objects alive at its start are frozen out of collections and the
    young generation holds `gen0_threshold` objects. Yields whether it changed anything.

    It changes nothing when the collector is disabled, when its young threshold is already
    at least `gen0_threshold`, or inside another `tuned_gc` (the outermost one restores).
    It freezes only if nothing else has frozen objects, since unfreezing is process-wide.
    """
    global _depth, _saved
    if gen0_threshold < 1:
        raise ValueError(f"gen0_threshold must be at least 1, got {gen0_threshold}")
    with _lock:
        _depth += 1
        applied = False
        if _depth == 1 and gc.isenabled() and gc.get_threshold()[0] < gen0_threshold:
            before = gc.get_threshold()
            freeze = gc.get_freeze_count() == 0
            if freeze:
                # No collection first: with a large heap (a training worker's) it takes a good
                # fraction of a second. Garbage frozen here is collected after the block.
                gc.freeze()
            gc.set_threshold(gen0_threshold, *before[1:])
            _saved, applied = (before, freeze), True
    try:
        yield applied
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                thresholds, froze = _saved
                _saved = None
                gc.set_threshold(*thresholds)
                if froze:
                    # What the block made and still holds goes to the oldest generation unwalked,
                    # as what was alive at its start does: with the young threshold back at its
                    # default, the next allocation would otherwise walk all of it (10-20 ms after
                    # 1,024 episodes). Garbage cycles among it go at the next full collection.
                    gc.freeze()
                    gc.unfreeze()
