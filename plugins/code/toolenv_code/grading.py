"""Hidden-test grading: run a solution, then each test separately, and count the passes.

All tests of one task run in one sandboxed process (one fork, not one per test),
each under its own `SIGALRM` budget, so a test that hangs costs only itself and
the count stays meaningful. The solution's own prints go to /dev/null; results
come back on a duplicate of stdout as lines tagged with a random nonce, so a
solution cannot pass by printing or by exiting early (unreported tests fail).
This guards against accidents and naive cheating, not against code that inspects
the grader's frames; the sandbox, not the grader, protects the host.
"""

from __future__ import annotations

import ast
import json
import secrets

from markdown_it import MarkdownIt
from pydantic import BaseModel, ConfigDict, Field

from toolenv_code.sandbox import SandboxLimits, SandboxPool, get_pool

__all__ = ["TestReport", "TestSpec", "arun_tests", "extract_code", "run_tests", "solution_source"]

#: Upper bound on one grading run, however many tests time out.
MAX_TOTAL_SECONDS = 60.0

#: Only what finds fenced code: blocks, lists (fences inside list items) and fences.
_MARKDOWN = MarkdownIt("zero").enable(["fence", "list"])
#: Languages whose blocks are the answer's code (any case); untagged blocks count when none is tagged.
_PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})

_HARNESS = """\
import json as _json, os as _os, signal as _signal
_NONCE = {nonce!r}
_OUT = _os.dup(1)
_null = _os.open(_os.devnull, _os.O_WRONLY)
_os.dup2(_null, 1)
_os.close(_null)

class _TestTimeout(BaseException):
    pass

def _alarm(signum, frame):
    raise _TestTimeout("test exceeded its time limit")

_signal.signal(_signal.SIGALRM, _alarm)
import sys as _sys, types as _types
_M = _types.ModuleType("__main__")  # the solution runs as `__main__`, as a script would (pickle, doctest...)
_sys.modules["__main__"] = _M
_G = vars(_M)

def _run(kind, index, src, limit):
    _signal.setitimer(_signal.ITIMER_REAL, limit)
    try:
        exec(compile(src, "<" + kind + ">", "exec"), _G)
        ok, msg = True, ""
    except BaseException as exc:
        ok, msg = False, (type(exc).__name__ + ": " + str(exc))[:300]
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
    line = _NONCE + _json.dumps([kind, index, ok, msg]) + "\\n"
    _os.write(_OUT, line.encode("utf-8", "backslashreplace"))

_run("solution", -1, {solution!r}, {limit!r})
_run("setup", -1, {setup!r}, {limit!r})
for _i, _t in enumerate({tests!r}):
    _run("test", _i, _t, {limit!r})
"""


class TestSpec(BaseModel):
    """The hidden tests of one task (kept in `Task.context`)."""

    __test__ = False  # not a pytest class
    model_config = ConfigDict(extra="forbid")

    tests: list[str] = Field(description="Test snippets; each one counts once (an assert, or a block with asserts).")
    setup: str = Field(default="", description="Code run after the solution and before the tests.")
    solution_prefix: str = Field(
        default="", description="Code run before the solution (HumanEval's prompt: imports, helpers, signature)."
    )
    test_timeout: float = Field(default=5.0, gt=0, description="Wall-clock seconds allowed per test.")


class TestReport(BaseModel):
    """Which tests passed."""

    __test__ = False
    model_config = ConfigDict(extra="forbid")

    passed: list[bool]
    solution_error: str = ""
    messages: list[str] = Field(default_factory=list)
    timed_out: bool = False

    @property
    def fraction(self) -> float:
        """Share of tests passed (0 when there are none)."""
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block, in order, read as CommonMark reads them
    (indented fences, fences in list items, an unclosed block running to the end)."""
    tokens = _MARKDOWN.parse(text)
    return [(t.info.split()[0].lower() if t.info.strip() else "", t.content) for t in tokens if t.type == "fence"]


def extract_code(answer: str) -> str:
    """The code in an answer, as a reader would run it.

    The ```python blocks (also ```py, ```python3; the tag in any case) joined in order,
    so a solution block followed by a usage block is graded as both; blocks that are
    interpreter transcripts (first line `>>>`) are left out. Without python blocks, the
    untagged ``` blocks; without any of these, the whole text.
    """
    blocks = _fenced_blocks(answer)
    code = [body for lang, body in blocks if lang in _PYTHON_TAGS] or [body for lang, body in blocks if not lang]
    code = [body for body in code if not body.lstrip().startswith(">>>")]
    return "\n\n".join(body.strip("\n") for body in code) if code else answer.strip("\n")


def solution_source(answer: str, prefix: str = "") -> str:
    """Join `prefix` and the answer's code: a whole program after the prefix, or a completion of it."""
    code = extract_code(answer).replace("\r\n", "\n")
    if not prefix:
        return code
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):  # 3.10 raises ValueError for a null byte
        return prefix + code  # a body that continues the prompt's signature (HumanEval completion style)
    return prefix.rstrip("\n") + "\n\n" + code


def _limits(spec: TestSpec) -> SandboxLimits:
    total = min(spec.test_timeout * (len(spec.tests) + 2), max(MAX_TOTAL_SECONDS, 2 * spec.test_timeout)) + 2.0
    return SandboxLimits(timeout=total, cpu_seconds=int(total) + 1, max_output_bytes=1 << 20)


def _program(answer: str, spec: TestSpec, nonce: str) -> str:
    return _HARNESS.format(
        nonce=nonce,
        solution=solution_source(answer, spec.solution_prefix),
        setup=spec.setup,
        tests=list(spec.tests),
        limit=spec.test_timeout,
    )


def _report(stdout: str, spec: TestSpec, nonce: str, timed_out: bool) -> TestReport:
    passed = [False] * len(spec.tests)
    messages = ["not run"] * len(spec.tests)
    solution_error = ""
    for line in stdout.splitlines():
        if not line.startswith(nonce):
            continue
        kind, index, ok, msg = json.loads(line[len(nonce) :])
        if kind == "test" and 0 <= index < len(passed):
            passed[index], messages[index] = bool(ok), msg
        elif kind in ("solution", "setup") and not ok:
            solution_error = msg
    return TestReport(passed=passed, messages=messages, solution_error=solution_error, timed_out=timed_out)


async def arun_tests(answer: str, spec: TestSpec, pool: SandboxPool | None = None) -> TestReport:
    """Grade `answer` (code, or text with a fenced code block) against `spec` in the sandbox."""
    nonce = f"@@toolenv-{secrets.token_hex(8)}@@"
    result = await (pool or get_pool()).arun(_program(answer, spec, nonce), _limits(spec))
    return _report(result.stdout, spec, nonce, result.timed_out)


def run_tests(answer: str, spec: TestSpec, pool: SandboxPool | None = None) -> TestReport:
    """`arun_tests`, blocking."""
    nonce = f"@@toolenv-{secrets.token_hex(8)}@@"
    result = (pool or get_pool()).run(_program(answer, spec, nonce), _limits(spec))
    return _report(result.stdout, spec, nonce, result.timed_out)
