"""Child processes that score math answers for the `math` reward, one answer at a time each,
killed and replaced when an answer takes longer than its timeout.

Why processes: sympy evaluates some answers (a power tower) in one C call that holds the GIL
for minutes, so a worker thread's timeout freed nothing: the whole process froze, signals
included. Why not `multiprocessing`: its spawn and forkserver start methods import the parent's
`__main__` again, which runs a training script without a `__main__` guard a second time; a
`python -m` child imports only toolenv. The children are started on first use, shared by every
`math` reward of the process (at most `size` of them), and end when the process does.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
from typing import Any

__all__ = ["MathPool", "MathTimeout", "shared_pool"]

#: Seconds a new child may take to import math-verify and sympy (a loaded host is slow).
READY_TIMEOUT = 120.0


class MathTimeout(Exception):
    """The answer took longer than its timeout; its child was killed."""


class _Child:
    """One child process and its pipes."""

    def __init__(self) -> None:
        # toolenv as this process finds it (an editable install, a checkout put on sys.path)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolenv.rewards._math_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
            encoding="utf-8",
        )
        try:
            first = self.read(READY_TIMEOUT)
        except BrokenPipeError as exc:
            raise ImportError(f"the math-verify process did not start: {exc}") from None
        if first is None or "ready" not in first:
            self.kill()
            why = (first or {}).get("error") or f"it did not start within {READY_TIMEOUT:g} s"
            raise ImportError(str(why))

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The child's next answer, or None when none came within `timeout`.

        Raises:
            BrokenPipeError: the child is gone (it closed its output).
        """
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return None
        line = self.proc.stdout.readline()
        if not line:
            self.kill()
            raise BrokenPipeError(f"the math-verify process ended (exit code {self.proc.returncode})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The child's answer to `request`.

        Raises:
            MathTimeout: no answer within `timeout` (the child is killed).
            BrokenPipeError: the child is gone (it died, or was killed from outside).
        """
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.read(timeout)
        if answer is None:
            self.kill()
            raise MathTimeout
        return answer

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a write the child never read: its pipe is broken
                    pipe.close()


class MathPool:
    """At most `size` children; a call takes an idle one (or starts one, or waits) and gives it back."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._cond = threading.Condition()
        self._idle: list[_Child] = []
        self._all: set[_Child | _Starting] = set()  # started and not dropped, idle, busy or starting

    def _take(self) -> _Child:
        with self._cond:
            while not self._idle and len(self._all) >= self.size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            placeholder = _Starting()
            self._all.add(placeholder)  # holds the slot while the child starts, outside the lock
        try:
            child = _Child()
        except BaseException:
            self._drop(placeholder)
            raise
        with self._cond:
            self._all.discard(placeholder)
            self._all.add(child)
        return child

    def _give(self, child: _Child) -> None:
        with self._cond:
            if child in self._all:  # not a child of a pool closed meanwhile
                self._idle.append(child)
                self._cond.notify()
                return
        child.kill()

    def _drop(self, child: _Child | _Starting) -> None:
        with self._cond:
            self._all.discard(child)
            self._cond.notify()  # a waiter may start a new child in its place

    def score(self, answer: str, golds: list[str], require_box: bool, timeout: float) -> dict[str, Any]:
        """The child's answer: `{"value", "info"}`, or `{"error"}` when math-verify raised.

        Raises:
            MathTimeout: the answer took longer than `timeout` seconds.
            BrokenPipeError: the child died while scoring it.
            ImportError: no child could start (math-verify is not installed).
        """
        request = {"answer": answer, "golds": golds, "require_box": require_box}
        for attempt in range(2):
            child = self._take()
            try:
                result = child.ask(request, timeout)
            except (BrokenPipeError, OSError) as exc:
                self._drop(child)
                if attempt:  # it died on this answer, twice: the answer's doing
                    raise BrokenPipeError(str(exc)) from None
                continue  # a child found dead (killed while idle): another gets the answer
            except BaseException:
                self._drop(child)
                raise
            self._give(child)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Kill every child (at exit)."""
        with self._cond:
            children = [c for c in self._all if isinstance(c, _Child)]
            self._all, self._idle = set(), []
            self._cond.notify_all()
        for child in children:
            child.kill()


class _Starting:
    """A slot of the pool whose child is starting."""


_POOL: MathPool | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> MathPool:
    """The process's pool: one child per CPU, at most 4 (scoring is quick; the bound is memory,
    about 100 MB a child with sympy)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = MathPool(max(1, min(4, os.cpu_count() or 1)))
            atexit.register(_POOL.close)
        return _POOL


def _forget_after_fork() -> None:
    """A forked child (a vector env's worker) starts its own children: the pipes are the parent's."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
