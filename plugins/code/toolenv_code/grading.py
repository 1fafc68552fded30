"""Hidden-test grading: run a solution, then each test separately, and count the passes.

All tests of one task run in one sandboxed process (one fork, not one per test),
each under its own `SIGALRM` budget, so a test that hangs costs only itself and
the count stays meaningful. The solution's own prints go to /dev/null; results
come back on a duplicate of stdout as lines tagged with a random nonce, so a
solution cannot pass by printing or by exiting early (unreported tests fail).

Reward hacks an RL policy can find are closed: the tests' comparisons run on plain
data (an object whose `__eq__` returns True equals nothing), the tests see pristine
builtins and the prompt's own helpers (a solution that redefines `set`, `abs` or the
prompt's `encode_cyclic` does not change what the tests check), and the grader keeps
its own references to what it uses and drops its source from `linecache`. It does not
guard against code that walks the grader's frames or objects (`sys._getframe`, `gc`)
or patches the modules the tests import; the sandbox, not the grader, protects the host.
"""

from __future__ import annotations

import ast
import functools
import secrets
import warnings

from markdown_it import MarkdownIt
from pydantic import BaseModel, ConfigDict, Field

from toolenv_code.sandbox import ExecResult, SandboxLimits, SandboxPool, get_pool

__all__ = ["TestReport", "TestSpec", "arun_tests", "extract_code", "run_tests", "solution_source"]

#: Upper bound on one grading run, however many tests time out.
MAX_TOTAL_SECONDS = 60.0

#: Only what finds fenced code: blocks, lists (fences inside list items) and fences.
_MARKDOWN = MarkdownIt("zero").enable(["fence", "list"])
#: Languages whose blocks are the answer's code (any case); untagged blocks count when none is tagged.
_PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})

_HARNESS = """\
import atexit as _atexit, builtins as _builtins, linecache as _linecache, operator as _operator, os as _os
import signal as _signal, sys as _sys, time as _time, types as _types
from collections import abc as _abc
import numbers as _numbers

# Nothing below may be looked up again after the solution ran: it could have patched
# builtins or modules. Functions defined from here on read builtins from this copy.
__builtins__ = _B = dict(vars(_builtins))
_linecache.clearcache()  # this program's source (nonce, tests) must not be readable by the solution
_NONCE = {nonce!r}
_ENTRY = frozenset({entry_points!r})
_OUT = _os.dup(1)
_null = _os.open(_os.devnull, _os.O_WRONLY)
_os.dup2(_null, 1)
_os.close(_null)
_write, _exit, _setitimer, _ITIMER_REAL = _os.write, _os._exit, _signal.setitimer, _signal.ITIMER_REAL
_exit_handlers = _atexit._ncallbacks
_getsignal, _setsignal, _SIGALRM, _SIG_IGN, _now = (
    _signal.getsignal, _signal.signal, _signal.SIGALRM, _signal.SIG_IGN, _time.monotonic)
_DEADLINE = [0.0]  # when the running snippet's time is up
_THEIRS = [None]  # a SIGALRM handler the solution installed, for alarms it sets itself
_modules = _sys.modules
_OPS = {{
    "==": _operator.eq, "!=": _operator.ne, "<": _operator.lt, "<=": _operator.le,
    ">": _operator.gt, ">=": _operator.ge, "in": _operator.contains, "not in": _operator.contains,
}}
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time rather than a built-in C type
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_COPY = ((int, int.__pos__), (float, float.__pos__), (complex, complex.__pos__),
         (str, lambda x: str.__getitem__(x, slice(None))), (bytes, lambda x: bytes.__getitem__(x, slice(None))))


class _TestTimeout(BaseException):
    pass


class _Opaque(Exception):
    pass


def _alarm(signum, frame):
    # Before the snippet's time is up, the alarm is one the solution set: its own handler gets it.
    theirs = _THEIRS[0]
    if _now() < _DEADLINE[0] and theirs is not None and theirs is not _alarm:
        if callable(theirs):
            return theirs(signum, frame)
        if theirs is _SIG_IGN:
            return None
    raise _TestTimeout("test exceeded its time limit")


def _plain(x):
    # x as plain data (exact builtin types only), so that comparing it runs no code of the
    # solution's: an object that claims to equal anything cannot pass. Conversions may call
    # the object's own methods, but what they return is checked again.
    t = type(x)
    if t in _ATOMS:
        return x
    if issubclass(t, (tuple, list)):
        items = [_plain(v) for v in (tuple.__iter__(x) if issubclass(t, tuple) else list.__iter__(x))]
        return tuple(items) if issubclass(t, tuple) else items
    if issubclass(t, dict):
        return {{_plain(k): _plain(v) for k, v in dict.items(x)}}
    if issubclass(t, (set, frozenset)):
        return frozenset(_plain(v) for v in (set.__iter__(x) if issubclass(t, set) else frozenset.__iter__(x)))
    for base, copy in _COPY:
        if issubclass(t, base):
            return copy(x)
    if issubclass(t, bytearray):
        return bytes(bytearray.__iter__(x))
    np = _modules.get("numpy")
    if np is not None and isinstance(x, (np.generic, np.ndarray)):
        return _plain(x.tolist())  # whatever it returns is checked again
    if isinstance(x, _numbers.Integral):
        return _plain(_operator.index(x))
    if isinstance(x, _numbers.Number):  # Fraction, Decimal: as a float when that is exact, as Python compares
        try:
            v = float(x) if isinstance(x, _numbers.Real) else complex(x)
            exact = type(v) in (float, complex) and v == x
        except Exception:
            exact = False
        if exact:
            return v
    if isinstance(x, _abc.Set):  # dict views
        return frozenset(_plain(v) for v in x)
    raise _Opaque


def _numpy_array(x):
    # A real NumPy array (its type is NumPy's own C type, not a class the solution made):
    # its comparisons are elementwise, and tests written for NumPy expect that.
    t = type(x)
    return t.__name__ == "ndarray" and t.__module__ == "numpy" and not t.__flags__ & _HEAPTYPE


def _compare(left, op, right):
    # A test's comparison, done on plain data; two values that are not plain data compare
    # as they like, but one that is not never equals, contains or orders with one that is.
    fn = _OPS[op]
    a, b = (right, left) if op in ("in", "not in") else (left, right)
    if _numpy_array(a) or _numpy_array(b):
        return fn(a, b) if op != "not in" else not fn(a, b)
    try:
        pa = _plain(a)
    except _Opaque:
        pa = _Opaque
    try:
        pb = _plain(b)
    except _Opaque:
        pb = _Opaque
    if pa is _Opaque and pb is _Opaque:
        result = fn(a, b)
    elif pa is _Opaque or pb is _Opaque:
        result = op == "!="
    else:
        result = fn(pa, pb)
    return (not result) if op == "not in" else result


_signal.signal(_signal.SIGALRM, _alarm)
_M = _types.ModuleType("__main__")  # the solution runs as `__main__`, as a script would (pickle, doctest...)
_modules["__main__"] = _M
_G = vars(_M)
_G["__builtins__"] = _builtins  # the real module (exec would hand it this program's copy)


def _run(kind, index, src, limit, namespace):
    # Our handler again, whatever the solution made of SIGALRM (ignored, a handler that
    # returns): each snippet's time limit holds, so a test that hangs costs only itself.
    current = _getsignal(_SIGALRM)
    if current is not _alarm:
        _THEIRS[0] = current
        _setsignal(_SIGALRM, _alarm)
    _DEADLINE[0] = _now() + limit
    _setitimer(_ITIMER_REAL, limit)
    try:
        exec(compile(src, "<" + kind + ">", "exec"), namespace)
        ok, msg = True, ""
    except BaseException as exc:
        ok, msg = False, exc
    finally:
        _setitimer(_ITIMER_REAL, 0)
    if not ok:
        try:
            msg = type(msg).__name__ + ": " + str(msg)
        except BaseException:
            msg = "an exception that cannot be shown"
    msg = str.__getitem__(msg, slice(0, 300)) if isinstance(msg, str) else ""
    _write(_OUT, (_NONCE + repr((kind, index, ok is True, msg)) + "\\n").encode("utf-8", "backslashreplace"))


def _test_namespace(prefix):
    # What the tests see: the solution's names, but not ones that shadow a builtin (unless
    # the tests are about that name), then the prompt's own definitions again (helpers the
    # tests call must be the prompt's), with pristine builtins.
    ns = {{k: v for k, v in _G.items() if k in _ENTRY or k not in _B}}
    own = {{"__builtins__": _B, "__name__": "__main__"}}
    try:
        exec(compile(prefix, "<prompt>", "exec"), own)
    except BaseException:
        own = {{}}
    ns.update((k, v) for k, v in own.items() if k not in _ENTRY)
    ns.update(__builtins__=_B, __name__="__main__", __toolenv_compare__=_compare)
    return ns


def _main(solution, setup, prefix, tests, limit):
    _run("solution", -1, solution, limit, _G)
    _run("setup", -1, setup, limit, _G)
    namespace = _test_namespace(prefix)
    for i, test in enumerate(tests):
        _run("test", i, test, limit, namespace)


_main({solution!r}, {setup!r}, {prefix!r}, {tests!r}, {limit!r})
# Every result is out: do not wait for threads, timers or exit handlers the solution left
# (the interpreter's exit would, up to the whole time budget). Without any, a normal exit
# is the faster one: the sandbox answers before the process is torn down.
_threading = _modules.get("threading")
if _exit_handlers() or (_threading is not None and _threading.active_count() > 1):
    _exit(0)
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
    entry_points: list[str] = Field(
        default_factory=list,
        description="The solution's names under test that the tests may see although they shadow a builtin.",
    )


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


class _PlainComparisons(ast.NodeTransformer):
    """Turn `a OP b` (one operator other than `is`) into `__toolenv_compare__(a, "OP", b)`."""

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1 or isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            return node
        call = ast.Call(
            func=ast.Name("__toolenv_compare__", ast.Load()),
            args=[node.left, ast.Constant(_OPERATORS[type(node.ops[0])]), node.comparators[0]],
            keywords=[],
        )
        return ast.copy_location(call, node)


_OPERATORS: dict[type[ast.cmpop], str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
}


@functools.lru_cache(maxsize=8192)
def _plain_test(source: str) -> str:
    """A test whose comparisons run on plain data, so that a returned object claiming to
    equal anything (`__eq__` returning True) cannot pass it; unparsable tests stay as they are."""
    try:
        with warnings.catch_warnings():  # dataset tests hold invalid escapes ("\\d") that warn
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    return ast.unparse(ast.fix_missing_locations(_PlainComparisons().visit(tree)))


def _program(answer: str, spec: TestSpec, nonce: str) -> str:
    return _HARNESS.format(
        nonce=nonce,
        entry_points=sorted(spec.entry_points),
        solution=solution_source(answer, spec.solution_prefix),
        setup=spec.setup,
        prefix=spec.solution_prefix,
        tests=[_plain_test(t) for t in spec.tests],
        limit=spec.test_timeout,
    )


def _result_line(text: str) -> tuple[str, int, bool, str] | None:
    """A result line's `(kind, index, ok, message)`, or None when it is not one."""
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    if not (isinstance(value, tuple) and len(value) == 4):
        return None
    kind, index, ok, msg = value
    if isinstance(kind, str) and type(index) is int and isinstance(ok, bool) and isinstance(msg, str):
        return kind, index, ok, msg
    return None


def _report(stdout: str, spec: TestSpec, nonce: str, timed_out: bool) -> TestReport:
    passed = [False] * len(spec.tests)
    messages = ["not run"] * len(spec.tests)
    solution_error = ""
    for line in stdout.splitlines():
        if not line.startswith(nonce):
            continue
        parsed = _result_line(line[len(nonce) :])
        if parsed is None:
            continue
        kind, index, ok, msg = parsed
        if kind == "test" and 0 <= index < len(passed):
            passed[index], messages[index] = bool(ok), msg
        elif kind in ("solution", "setup") and not ok:
            solution_error = msg
    return TestReport(passed=passed, messages=messages, solution_error=solution_error, timed_out=timed_out)


def _graded(result: ExecResult, spec: TestSpec, nonce: str) -> TestReport:
    if result.error:  # the sandbox failed, not the solution: no report rather than a false zero
        raise RuntimeError(f"the sandbox failed: {result.error}")
    return _report(result.stdout, spec, nonce, result.timed_out)


async def arun_tests(answer: str, spec: TestSpec, pool: SandboxPool | None = None) -> TestReport:
    """Grade `answer` (code, or text with a fenced code block) against `spec` in the sandbox.

    Raises:
        RuntimeError: the sandbox itself failed (its pool is closed, its server died twice).
    """
    nonce = f"@@toolenv-{secrets.token_hex(8)}@@"
    result = await (pool or get_pool()).arun(_program(answer, spec, nonce), _limits(spec))
    return _graded(result, spec, nonce)


def run_tests(answer: str, spec: TestSpec, pool: SandboxPool | None = None) -> TestReport:
    """`arun_tests`, blocking."""
    nonce = f"@@toolenv-{secrets.token_hex(8)}@@"
    result = (pool or get_pool()).run(_program(answer, spec, nonce), _limits(spec))
    return _graded(result, spec, nonce)
