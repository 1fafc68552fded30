"""The `python` tool: run model-written code in the sandbox, optionally keeping state per episode."""

from __future__ import annotations

import signal
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from toolenv import Tool, ToolContext, ToolLimits, ToolResult
from toolenv_code.sandbox import ExecResult, SandboxLimits, SandboxPool, get_pool, preload_names

__all__ = ["PythonTool", "format_result"]

_STATE_KEY = "toolenv_code.session"


class _SessionHandle:
    """Lives in `ctx.state`; released when the episode ends (`PythonTool.release`), or at the
    latest when the episode's state is collected."""

    def __init__(self, pool: SandboxPool, episode_id: str) -> None:
        self.id = episode_id or uuid.uuid4().hex
        self.calls = 0
        self.pool = pool
        self._finalizer = weakref.finalize(self, pool.close_session, self.id)

    def release(self) -> None:
        self._finalizer()

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy of the episode (pickle, `copy.deepcopy`) gets a session of its own: the sandbox's
        interpreter cannot be copied, and sharing it would let each change the other's variables
        and end them with its episode. The copy starts afresh and says so at its next call."""
        return (_copied_handle, (self.pool, self.calls))


def _copied_handle(pool: SandboxPool, calls: int) -> _SessionHandle:
    handle = _SessionHandle(pool, "")
    handle.calls = calls
    return handle


def _signal_name(signum: int) -> str:
    """`SIGTERM`; a real-time signal, which has no `signal.Signals` member, as `SIGRTMIN+1`."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        pass
    rtmin, rtmax = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if rtmin is not None and rtmax is not None and rtmin < signum < rtmax:
        return f"SIGRTMIN+{signum - rtmin}"
    return f"signal {signum}"


def format_result(result: ExecResult, limits: SandboxLimits) -> str:
    """The observation text: output first, then why the run failed, if it did."""
    parts = [p for p in (result.stdout, result.stderr) if p]
    if result.error:
        parts.append(f"Error: {result.error}")
    elif result.timed_out:
        parts.append(f"Error: the code did not finish within {limits.timeout:g} s and was stopped.")
    elif result.signal is not None:
        name = _signal_name(result.signal)
        hint = " (CPU time limit)" if result.signal == signal.SIGXCPU else ""
        parts.append(f"Error: the process was killed by {name}{hint}.")
    elif result.exit_code and not result.stderr:
        parts.append(f"Error: exit status {result.exit_code}.")
    if result.truncated:
        parts.append("(output was truncated)")
    if result.session_ended:
        parts.append("The session has ended, so its variables are gone; the next call starts a fresh one.")
    return "\n".join(p.rstrip("\n") for p in parts) if parts else "(no output)"


_SUMMARY = "Run Python code in a sandbox and return what it prints (stdout, then stderr)."
_FRESH = _SUMMARY + "\n\nEach call starts from a clean interpreter: define what you need in the same call."
_STATEFUL = _SUMMARY + "\n\nVariables, functions and imports persist from one call to the next in this episode."


class PythonTool(Tool):
    """Run Python code in a sandbox and return what it prints (stdout, then stderr).

    Each call starts from a clean interpreter unless the tool is stateful, in which
    case variables persist across the calls of one episode. The model is told which
    of the two this tool is. `preload` names modules the sandbox imports once, ahead of
    every call (`("sympy", "numpy")`: their `import` then costs nothing); without a `pool`
    the tool runs on the process-wide pool for that `preload`.

    Raises:
        ValueError: a `preload` module this Python cannot find, or one the given `pool` lacks.
    """

    name = "python"
    limits = ToolLimits(timeout=60.0)

    class Args(BaseModel):
        code: str = Field(description="Python source to execute; use print() to see values.")

    def __init__(
        self,
        *,
        stateful: bool = False,
        sandbox: SandboxLimits | None = None,
        pool: SandboxPool | None = None,
        preload: Sequence[str] | str = (),
        limits: ToolLimits | None = None,
        **limit_overrides: Any,
    ) -> None:
        self.sandbox = sandbox or SandboxLimits()
        self.preload = preload_names(preload)
        missing = [name for name in self.preload if pool is not None and name not in pool.preload]
        if missing:
            raise ValueError(
                f"PythonTool: the pool given does not pre-import {', '.join(missing)}; "
                "pass preload= to that SandboxPool instead"
            )
        if limits is None and "timeout" not in limit_overrides:
            # The sandbox enforces its own timeout; the caller's must not cut it short.
            limit_overrides["timeout"] = max(type(self).limits.timeout or 0.0, self.sandbox.timeout + 30.0)
        super().__init__(limits=limits, **limit_overrides)
        self.stateful = stateful
        self.description = _STATEFUL if stateful else _FRESH  # type: ignore[misc]  # what the model reads
        self._pool = pool
        self._handles: weakref.WeakSet[_SessionHandle] = weakref.WeakSet()

    def __getstate__(self) -> dict[str, Any]:
        """The tool with its open sessions as a list: a `WeakSet` cannot be pickled."""
        state = self.__dict__.copy()
        state["_handles"] = list(self._handles)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        handles = state.pop("_handles", ())
        self.__dict__.update(state)
        self._handles = weakref.WeakSet(handles)

    def __copy__(self) -> PythonTool:
        """A shallow copy (`tool_limits` steps one per env) with no sessions yet: those the
        original opened stay its own, for its `close` alone to end (`__getstate__` would give
        the copy them too, and closing the copy's env ended another env's episode)."""
        cls = type(self)
        copied = cls.__new__(cls)
        copied.__dict__.update(self.__dict__)
        copied._handles = weakref.WeakSet()
        return copied

    @property
    def pool(self) -> SandboxPool:
        """The pool this tool runs in (the process-wide one for its `preload` unless given)."""
        return self._pool or get_pool(self.preload)

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        handle: _SessionHandle | None = None
        note = ""
        if self.stateful:
            found = ctx.state.get(_STATE_KEY)
            handle = found if isinstance(found, _SessionHandle) else None
            if handle is None:
                handle = ctx.state[_STATE_KEY] = _SessionHandle(self.pool, ctx.episode_id)
                self._handles.add(handle)
        earlier = 0
        if handle is not None:
            # Counted before it runs: a call cut off by the tool's timeout ended its session
            # (`SandboxPool.arun`), and the next call must say that it restarted.
            earlier, handle.calls = handle.calls, handle.calls + 1
        result = await self.pool.arun(args.code, self.sandbox, session=handle.id if handle else None)
        if result.new_session and earlier:
            note = "Note: the session was restarted, so variables from earlier calls are gone.\n"
        text = note + format_result(result, self.sandbox)
        meta: dict[str, Any] = {
            "exit_code": result.exit_code,
            "duration": result.duration,
            "timed_out": result.timed_out,
        }
        if result.error is not None:  # the sandbox failed, not the code: no invalid-call penalty
            meta["infra_error"] = True
        return ToolResult(text=text, is_error=not result.ok, metadata=meta)

    async def release(self, ctx: ToolContext) -> None:
        """The episode ended: close its session now rather than when its state is collected."""
        handle = ctx.state.pop(_STATE_KEY, None)
        if isinstance(handle, _SessionHandle):
            handle.release()

    async def close(self) -> None:
        """Release the sessions this tool opened."""
        for handle in list(self._handles):
            handle.release()
