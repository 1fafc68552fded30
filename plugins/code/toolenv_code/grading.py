"""Hidden-test grading: run a solution, then each test, and count the passes.

Split grading (the default, `TestSpec.split_tests`). Each test that allows it is split, from the
task alone, into probes (its calls of the solution: `f(x)` in `assert f(x) == [1, 2]`,
`candidate(3)` in `assert abs(candidate(3) - 0.5) < 1e-6`) and the rest, which holds the
expected values. The solution's sandboxed process runs the solution, the setup and then only
the probes, each compiled on its own, and reports each probe's value as plain data (None,
bools, numbers, str, bytes, `Fraction`, `Decimal` and lists, tuples, dicts and sets of them;
a value that is not, say a generator or a NumPy array, is first widened through `list(...)`,
`sorted(...)`, `.attr`, `[0]` or `()` where the test applies them to it, reported as its truth
where the test uses nothing else of it (`assert f(x)`, `not f(x)`), else converted as
the in-process comparisons below convert it: a namedtuple to a tuple, a Counter to a dict,
NumPy values to lists and numbers; a value still not plain data fails its test, saying so). The host decodes the values
without evaluating anything (`toolenv_code._split.decode_value`), and the verdict comes from
outside the solution's process: on the host when the test only compares probe values with
literals (`==`, `<`, `in`, `and`, `not`, `abs(... - ...)`; ~99% of HumanEval's and MBPP's
tests) and that costs the host time linear in the values (not a `Decimal` against a huge int),
else from a second sandboxed process that never holds the solution, where the test
runs with each probe replaced by its value. Whatever the solution finds in its own process
(frames, `gc`, the grader's result channel and nonce), the expected values of a split test are
not there, and reporting anything but its own values does not pass it: it passes only by
producing the right values. A loop (`ReplayTest`) is recorded first, in a sandboxed process
without the solution, with its calls of the solution recorded instead of made (their arguments
as plain data; twice, `random` seeded alike by the grader, to check they are reproducible);
the solution's process makes those calls, and the trusted run replays the test with each call
answered by its value. Of the shipped tasks, all 1,133 of HumanEval's tests split (5 loops)
and all 2,922 of MBPP's.

What stays in the solution's process (graded as before, below): tests that are not a run of
simple statements, asserts and loops (`with`, `try`), loops the recording cannot reproduce or
that would hand the solution an object they keep, tests that call the solution outside an assert
(`f(x); assert x == [1, 3]`), hand it a variable they check afterwards (`assert f(x) == x`),
pass one of its functions as a value (`check(candidate)`), use it inside a comprehension or
lambda, or whose expected side reads what the setup binds or a variable the probes' inputs are
computed from (`x = cases[0][0]`: `cases` would be in the solution's process);
`TestReport.split` says which tests were split. The setup (`candidate = f`, MBPP's
`test_setup_code`), the prompt and a split test's own statements that its probes need (their
inputs) do run there; a probe's own arguments are visible to the solution, as its inputs are.

In the solution's process, all tests run in one process (one fork, not one per test), each
under its own `SIGALRM` budget (a test's probes share it), so a test that hangs costs only
itself (with `stop_on_timeout`, for all-or-nothing scoring, the tests after one whose timeout
fails it are not run). The solution's own prints go to /dev/null; results come back on a duplicate of stdout
as lines tagged with a random nonce, so a solution cannot pass by printing or exiting early
(unreported tests fail). The tests' comparisons there run on plain data (an object whose
`__eq__` returns True equals nothing), the tests see pristine builtins and the prompt's own
helpers (a solution that redefines `set`, `abs` or the prompt's `encode_cyclic` does not change
what the tests check), and the grader keeps its own references to what it uses and drops its
source from `linecache`. For tests that are not split it does not guard against code that walks
the grader's frames or objects (`sys._getframe`, `gc`) or patches the modules the tests import.
The sandbox, not the grader, protects the host.
"""

from __future__ import annotations

import ast
import base64
import functools
import marshal
import secrets
import textwrap
import warnings
from typing import Any

from markdown_it import MarkdownIt
from pydantic import BaseModel, ConfigDict, Field

from toolenv._ast import parse
from toolenv_code._split import ReplayTest, SplitTest, decode_value, encode_value, split_tests
from toolenv_code.sandbox import ExecResult, SandboxLimits, SandboxPool, get_pool

__all__ = ["TestReport", "TestSpec", "arun_tests", "extract_code", "run_tests", "solution_source"]

#: Upper bound on one grading run, however many tests time out (`TestSpec.total_timeout`'s default).
MAX_TOTAL_SECONDS = 60.0

#: Only what finds fenced code: blocks, lists (fences inside list items) and fences.
_MARKDOWN = MarkdownIt("zero").enable(["fence", "list"])
#: Languages whose blocks are the answer's code (any case); untagged blocks count when none is tagged.
_PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})

#: Both grading programs start with this: results go out on a duplicate of stdout, tagged
#: with the nonce; every snippet runs under its own SIGALRM budget.
_PRELUDE = """\
import atexit as _atexit, builtins as _builtins, linecache as _linecache, operator as _operator, os as _os
import signal as _signal, sys as _sys, time as _time, types as _types
from collections import abc as _abc
import numbers as _numbers

# Nothing below may be looked up again after the solution ran: it could have patched
# builtins or modules. Functions defined from here on read builtins from this copy.
__builtins__ = _B = dict(vars(_builtins))
_linecache.clearcache()  # this program's source (nonce, tests) must not be readable by the solution
_NONCE = _P["nonce"]
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


class _TestTimeout(BaseException):
    pass


class _ProbeFailed(Exception):
    pass  # the trusted run: a probe that failed in the solution's process (its message as is)


def _alarm(signum, frame):
    # Before the snippet's time is up, the alarm is one the solution set: its own handler gets it.
    theirs = _THEIRS[0]
    if _now() < _DEADLINE[0] and theirs is not None and theirs is not _alarm:
        if callable(theirs):
            return theirs(signum, frame)
        if theirs is _SIG_IGN:
            return None
    raise _TestTimeout("test exceeded its time limit")


_signal.signal(_signal.SIGALRM, _alarm)
_M = _types.ModuleType("__main__")  # the solution runs as `__main__`, as a script would (pickle, doctest...)
_modules["__main__"] = _M
_G = vars(_M)
_G["__builtins__"] = _builtins  # the real module (exec would hand it this program's copy)


def _arm(limit):
    # Our handler again, whatever the solution made of SIGALRM (ignored, a handler that
    # returns): each snippet's time limit holds, so a test that hangs costs only itself.
    current = _getsignal(_SIGALRM)
    if current is not _alarm:
        _THEIRS[0] = current
        _setsignal(_SIGALRM, _alarm)
    _DEADLINE[0] = _now() + limit
    _setitimer(_ITIMER_REAL, limit)


def _describe(exc):
    if type(exc) is _ProbeFailed:
        msg = exc.args[0]
    else:
        try:
            msg = type(exc).__name__ + ": " + str(exc)
        except BaseException:
            msg = "an exception that cannot be shown"
    return str.__getitem__(msg, slice(0, 300)) if isinstance(msg, str) else ""


def _send(*fields):
    _write(_OUT, (_NONCE + repr(fields) + "\\n").encode("utf-8", "backslashreplace"))


def _run(kind, index, src, limit, namespace):
    # Returns whether the snippet ran out of time.
    _arm(limit)
    try:
        exec(compile(src, "<" + kind + ">", "exec"), namespace)
        ok, msg = True, ""
    except BaseException as exc:
        ok, msg = False, exc
    finally:
        _setitimer(_ITIMER_REAL, 0)
    _send(kind, index, ok is True, "" if ok is True else _describe(msg))
    return ok is not True and type(msg) is _TestTimeout

"""

#: Every result is out: do not wait for threads, timers or exit handlers the solution left
#: (the interpreter's exit would, up to the whole time budget). Without any, a normal exit
#: is the faster one: the sandbox answers before the process is torn down.
_EPILOGUE = """
_threading = _modules.get("threading")
if _exit_handlers() or (_threading is not None and _threading.active_count() > 1):
    _exit(0)
"""

#: Plain data: what the solution's process makes of a value, and how it is written out.
_PLAIN_DATA = """\
_ENTRY = frozenset(_P["entry_points"])
_OPS = {
    "==": _operator.eq, "!=": _operator.ne, "<": _operator.lt, "<=": _operator.le,
    ">": _operator.gt, ">=": _operator.ge, "in": _operator.contains, "not in": _operator.contains,
}
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time rather than a built-in C type
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_COPY = ((int, int.__pos__), (float, float.__pos__), (complex, complex.__pos__),
         (str, lambda x: str.__getitem__(x, slice(None))), (bytes, lambda x: bytes.__getitem__(x, slice(None))))
_INF = float("inf")
_VALUE_LIMIT = _P["value_limit"]  # characters of one probe's reported value
_join, _repr, _hex = str.join, repr, hex
_KINDS = [None, None]  # Fraction and Decimal, when the solution imported them


class _Opaque(Exception):
    pass


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
        return {_plain(k): _plain(v) for k, v in dict.items(x)}
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


def _test_namespace(prefix):
    # What the tests see: the solution's names, but not ones that shadow a builtin (unless
    # the tests are about that name), then the prompt's own definitions again (helpers the
    # tests call must be the prompt's), with pristine builtins.
    ns = {k: v for k, v in _G.items() if k in _ENTRY or k not in _B}
    own = {"__builtins__": _B, "__name__": "__main__"}
    try:
        exec(compile(prefix, "<prompt>", "exec"), own)
    except BaseException:
        own = {}
    ns.update((k, v) for k, v in own.items() if k not in _ENTRY)
    ns.update(__builtins__=_B, __name__="__main__", __toolenv_compare__=_compare)
    return ns


def _enc(x, strict, out, depth):
    # x as text the host decodes without evaluating it (toolenv_code._split.decode_value).
    # strict: only exact builtin types (else _Opaque, and the probe may be widened);
    # otherwise subclasses, NumPy values, dict views... are converted as _plain does.
    if depth > 100:
        raise _ProbeFailed("ValueError: the value is nested too deeply to report")
    t = type(x)
    if t is str or t is bytes or t is bool or x is None:
        s = _repr(x)
    elif t is int:
        s = int.__repr__(x) if int.bit_length(x) <= 4096 else _hex(x)
    elif t is float:
        s = "nan" if x != x else "inf" if x == _INF else "-inf" if x == -_INF else float.__repr__(x)
    elif t is complex:
        out.append("complex(")
        _enc(complex.real.__get__(x), True, out, depth + 1)
        out.append(", ")
        _enc(complex.imag.__get__(x), True, out, depth + 1)
        s = ")"
    elif t is list or t is tuple:
        out.append("[" if t is list else "(")
        for i, v in enumerate(list.__iter__(x) if t is list else tuple.__iter__(x)):
            out.append(", " if i else "")
            _enc(v, strict, out, depth + 1)
        s = "]" if t is list else ("," if tuple.__len__(x) == 1 else "") + ")"
    elif t is dict:
        out.append("{")
        for i, (k, v) in enumerate(dict.items(x)):
            out.append(", " if i else "")
            _enc(k, strict, out, depth + 1)
            out.append(": ")
            _enc(v, strict, out, depth + 1)
        s = "}"
    elif t is set or t is frozenset:
        out.append("frozenset(" if t is frozenset else "" if len(x) else "set(")
        out.append("{" if len(x) else "")
        for i, v in enumerate(set.__iter__(x) if t is set else frozenset.__iter__(x)):
            out.append(", " if i else "")
            _enc(v, strict, out, depth + 1)
        s = ("}" if len(x) else "") + (")" if t is frozenset or not len(x) else "")
    elif t is _KINDS[0]:  # rebuilt from two ints on the other side, whatever this object is
        n, d = x.numerator, x.denominator
        if type(n) is not int or type(d) is not int:
            raise _Opaque
        s = "Fraction(" + int.__repr__(n) + ", " + int.__repr__(d) + ")"
    elif t is _KINDS[1]:
        text = x.__str__()
        if type(text) is not str:
            raise _Opaque
        s = "Decimal(" + _repr(text) + ")"
    elif strict:
        raise _Opaque
    else:
        return _enc(_plain(x), True, out, depth)
    out.append(s)
    out[0] += len(s)
    if out[0] > _VALUE_LIMIT:
        raise _ProbeFailed("ValueError: the value is too large to report")


def _encoded(x, strict):
    # Whatever these are (the solution's own classes even), the other side gets a genuine
    # Fraction or Decimal made from ints or a str.
    _KINDS[0] = getattr(_modules.get("fractions"), "Fraction", None)
    _KINDS[1] = getattr(_modules.get("decimal"), "Decimal", None)
    out = [0]
    _enc(x, strict, out, 0)
    return _join("", out[1:])
"""

#: Run 1, in the solution's process: the solution, the setup, the tests that cannot be split
#: (whole), the probes of those that can and the recorded calls of loops. This program holds no
#: expected value of a split test.
_CANDIDATE = """\
def _not_plain(x):
    try:
        name = str.__getitem__(type.__dict__["__name__"].__get__(type(x)), slice(0, 60))
    except BaseException:
        name = "?"
    return ("TypeError: the result is a " + name + ", not plain data: the grader checks None, bools, "
            "numbers, str, bytes and lists, tuples, dicts and sets of them")


def _widen(v, levels, namespace, at):
    # v as data, widened through `list(...)`, `.attr`... while it is not plain data (at[0]: the level).
    while True:
        try:
            return _encoded(v, True)
        except _Opaque:
            if at[0] + 1 >= len(levels):
                try:
                    return _encoded(v, False)
                except _Opaque:
                    raise _ProbeFailed(_not_plain(v)) from None
        at[0] += 1
        v = eval(compile(levels[at[0]], "<probe>", "eval"), namespace, {"__toolenv_v__": v})


def _probe(index, context, probes, limit, namespace, calls=None):
    # The probes of a split test: each is evaluated on its own (a frame walk finds only its
    # own code), widened while its value is not plain data, and reported as data. The test's
    # expected side is not in this process. A loop's calls (`calls`: the site, the arguments
    # as the recording run reported them) are made the same way, each reported as probe `c`.
    # Returns whether the test ran out of time.
    reports = []
    timed_out = False
    todo = [(k, None, None) for k in range(len(probes))] if calls is None else calls
    _arm(limit)
    try:
        if context:
            exec(compile(context, "<test>", "exec"), namespace)
        code = {}  # a loop's call sites, compiled once
        for c, (k, args, kwargs) in enumerate(todo):
            func, levels = (None, probes[k]) if calls is None else probes[k]
            at = [0]
            try:
                if func is None:
                    v = eval(compile(levels[0], "<probe>", "eval"), namespace)
                else:
                    if k not in code:
                        code[k] = compile(func, "<probe>", "eval")
                    v = eval(code[k], namespace)(*args, **kwargs)
                text = _widen(v, levels, namespace, at)
                reports.append((c, at[0], True, text))
            except _TestTimeout:
                raise
            except BaseException as exc:
                reports.append((c, at[0], False, _describe(exc)))
    except BaseException as exc:  # the context failed, or the test's time ran out
        timed_out = type(exc) is _TestTimeout
        msg = _describe(exc)
        reports.extend((c, 0, False, msg) for c in range(len(reports), len(todo)))
    finally:
        _setitimer(_ITIMER_REAL, 0)
    for c, level, ok, text in reports:
        _send("probe", index, c, level, ok is True, text)
    return timed_out


def _main(solution, setup, prefix, items, limit, stop):
    # stop: the tests that running out of time fails whatever else happens; after one of them
    # times out, the rest are not run (all-or-nothing grading: they cannot change the score).
    _run("solution", -1, solution, limit, _G)
    _run("setup", -1, setup, limit, _G)
    namespace = _test_namespace(prefix)
    for index, whole, context, probes in items:
        if probes is None:
            timed_out = _run("test", index, whole, limit, namespace)
        elif context is None:  # a loop: the calls its recording made
            timed_out = _probe(index, "", probes, limit, namespace, _CALLS[index])
        else:
            timed_out = _probe(index, context, probes, limit, namespace)
        if timed_out is True and index in stop:
            _send("stopped", index, False, "")
            break


_main(_P["solution"], _P["setup"], _P["prefix"], _P["items"], _P["limit"], frozenset(_P["stop"]))
"""

#: The runs that never hold the solution start with the prompt and the setup's trusted part.
_TRUSTED_BASE = """\
import random as _random
_ENTRY = frozenset(_P["entry_points"])
_own = {"__builtins__": _builtins, "__name__": "__main__"}
try:
    exec(compile(_P["prefix"], "<prompt>", "exec"), _own)
except BaseException:
    _own = {}
_G.update((k, v) for k, v in _own.items() if k not in _ENTRY and k not in ("__builtins__", "__name__"))
_run("setup", -1, _P["setup"], _P["limit"], _G)
_seed = _random.seed
"""

#: Run 0, before the solution's, in a process that never holds it: each loop test run with its
#: calls of the solution recorded (their arguments as plain data) instead of made, twice (the same
#: seed for `random`), to check that the calls are reproducible.
_RECORD = """\
class _Fallback(BaseException):
    pass  # the loop cannot be replayed: it runs whole in the solution's process


def _mutables(x, out):
    # ids of the lists, dicts and sets in plain data x
    stack = [x]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is list or t is dict or t is set:
            out.add(id(v))
        if t is dict:
            stack.extend(dict.keys(v))
            stack.extend(dict.values(v))
        elif t is list or t is tuple or t is set or t is frozenset:
            stack.extend(v)


def _kept(ids, namespace):
    # Whether an object the test keeps (reachable from its names) is among ids: the solution
    # could change it in place, and the test would then see the change (a copy does not).
    seen, stack = set(), list(namespace.values())
    while stack:
        v = stack.pop()
        t = type(v)
        if t not in (list, tuple, dict, set, frozenset) or id(v) in seen:
            continue
        if id(v) in ids or len(seen) > _P["max_walk"]:
            return True
        seen.add(id(v))
        stack.extend(dict.values(v) if t is dict else v)
        if t is dict:
            stack.extend(dict.keys(v))
    return False


def _recording(index, source, limit):
    calls, size = [], [0]
    namespace = dict(_G)

    def __toolenv_record__(k, /, *args, **kwargs):
        try:
            text = _encoded((args, kwargs), True)
        except (_Opaque, _ProbeFailed):
            raise _Fallback("an input is not plain data") from None
        ids = set()
        _mutables((args, kwargs), ids)
        if ids and _kept(ids, namespace):
            raise _Fallback("the solution would be handed an object the test keeps")
        size[0] += len(text)
        if len(calls) >= _P["max_calls"] or size[0] > _P["max_size"]:
            raise _Fallback("too many calls to record")
        calls.append((k, text))

    namespace["__toolenv_record__"] = __toolenv_record__
    _seed(_P["seed"] + index)
    _arm(limit)
    try:
        exec(compile(source, "<test>", "exec"), namespace)
        error = ""
    except _Fallback as exc:
        return None, exc.args[0]
    except BaseException as exc:
        error = _describe(exc)
    finally:
        _setitimer(_ITIMER_REAL, 0)
    return calls, error


for _index, _source in _P["tests"]:
    _first, _error = _recording(_index, _source, _P["limit"])
    if _first is not None and (_first, _error) != _recording(_index, _source, _P["limit"]):
        _first, _error = None, "its calls are not the same when run again"
    if _first is None:
        _send("fallback", _index, False, _error)
        continue
    for _k, _text in _first:
        _write(_OUT, (_NONCE + "('call', " + repr(_index) + ", " + repr(_k) + ", " + _text + ")\\n").encode(
            "utf-8", "backslashreplace"))
    _send("recorded", _index, _error == "", _error)
"""

#: Run 2, a process that never holds the solution: the split tests with each probe replaced
#: by the value it had in run 1 (plain data), and the loops replayed, each call answered with
#: the value the call with the same arguments had in run 1.
_TRUSTED = """\
_ERRORS = _P["errors"]
_CURRENT = [0]


def __toolenv_probe__(k):
    key = (_CURRENT[0], k)
    if key in _ERRORS:
        raise _ProbeFailed(_ERRORS[key])
    return _VALUES[key]


_G["__toolenv_probe__"] = __toolenv_probe__
for _index, _source in _P["tests"]:
    _CURRENT[0] = _index
    _run("test", _index, _source, _P["limit"], _G)


def _canon(x):
    # The same for equal plain data of the same types, whatever the order of a set or dict.
    t = type(x)
    if t is list or t is tuple:
        return (t.__name__, tuple(_canon(v) for v in x))
    if t is dict:
        return ("dict", tuple(sorted(((_canon(k), _canon(v)) for k, v in x.items()), key=repr)))
    if t is set or t is frozenset:
        return (t.__name__, tuple(sorted((_canon(v) for v in x), key=repr)))
    return (t.__name__, repr(x))


def _replayer(index, sites, recorded, missing, namespace):
    waiting = {}
    for c in range(len(recorded) - 1, -1, -1):
        k, args, kwargs = recorded[c]
        waiting.setdefault((k, _canon((args, kwargs))), []).append(c)

    def __toolenv_replay__(k, /, *args, **kwargs):
        queue = waiting.get((k, _canon((args, kwargs))))
        if not queue:
            raise _ProbeFailed(missing)
        key = (index, queue.pop())
        if key in _ERRORS:
            raise _ProbeFailed(_ERRORS[key])
        v = _VALUES[key]
        for source in sites[k][_P["levels"][key] + 1:]:  # widened here as the solution's process would
            v = eval(compile(source, "<probe>", "eval"), namespace, {"__toolenv_v__": v})
        return v

    return __toolenv_replay__


for _index, _source, _sites, _missing in _P["replays"]:
    _namespace = dict(_G)
    _namespace["__toolenv_replay__"] = _replayer(_index, _sites, _RECORDED[_index], _missing, _namespace)
    _seed(_P["seed"] + _index)
    _run("test", _index, _source, _P["limit"], _namespace)
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
    total_timeout: float = Field(
        default=MAX_TOTAL_SECONDS,
        gt=0,
        allow_inf_nan=False,
        description="Wall-clock seconds one sandboxed run of the grading may take however many tests time out "
        "(raised to 2 × test_timeout when lower; 2 s more to start and report); the tests not reached by then "
        "fail.",
    )
    entry_points: list[str] = Field(
        default_factory=list,
        description="The solution's names under test: the tests see the solution's although they shadow a "
        "builtin or a name of the prompt. The functions the prompt only declares (a signature and a docstring, "
        "as HumanEval's) are added.",
    )
    split_tests: bool = Field(
        default=True,
        description="Check each test that allows it outside the solution's process (on the host, or in a "
        "second sandboxed process), from the values its calls of the solution returned, so that the solution's "
        "process never holds what it is checked against. False: every test runs in the solution's process, "
        "where code that walks the grader's frames can forge the results.",
    )


class TestReport(BaseModel):
    """Which tests passed."""

    __test__ = False
    model_config = ConfigDict(extra="forbid")

    passed: list[bool]
    solution_error: str = ""
    messages: list[str] = Field(default_factory=list)
    timed_out: bool = False
    split: list[bool] = Field(
        default_factory=list,
        description="Per test: graded outside the solution's process (its expected values were never in it).",
    )

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


def _compiles(source: str) -> bool:
    """Whether `source` compiles (`return` outside a function included, which `ast.parse` lets by).

    An answer too deeply nested for the parser (`-` repeated 100,000 times) does not: the
    parser's MemoryError or RecursionError must not escape from the reward.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # 3.10 raises ValueError for a null byte
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _body_indent(prefix: str) -> str:
    """The indentation of the body of the function the prompt ends with, if it ends with one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            body = parse(prefix).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ""
    if not body or not isinstance(body[-1], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ""
    line = prefix.splitlines()[body[-1].body[0].lineno - 1]
    return line[: len(line) - len(line.lstrip())]


def _future_imports(code: str) -> tuple[str, str]:
    """The `from __future__` imports `code` opens with (after its docstring, if any), and the rest.

    They must open the program, so they go before the prompt: after it, a program that
    runs as it is would not compile.
    """
    if "__future__" not in code:
        return "", code
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            body = parse(code).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return "", code
    futures: list[ast.stmt] = []
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            futures.append(stmt)
        elif not (i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            break
    if not futures:
        return "", code
    lines = code.splitlines(keepends=True)
    moved = {n for stmt in futures for n in range(stmt.lineno - 1, stmt.end_lineno or stmt.lineno)}
    head = "".join(lines[n] for n in sorted(moved))
    rest = "".join(line for n, line in enumerate(lines) if n not in moved)
    return head.rstrip("\n") + "\n", rest


def solution_source(answer: str, prefix: str = "") -> str:
    """Join `prefix` and the answer's code: a whole program after the prefix, or a completion of it.

    This is the program the grader runs as the solution; a check of your own (a `ToolVerified`
    reward) runs it too: `solution_source(episode.answer, context["solution_prefix"])`, then the
    task context's `setup` and each of its `tests`. The code is `extract_code(answer)` (fences
    removed). A completion (HumanEval style: the body of the prompt's last function) has its first
    line's indentation back if it lost it: the answer parsers strip the text around an answer.
    """
    code = extract_code(answer).replace("\r\n", "\n")
    if not prefix:
        return code
    if _compiles(code):
        future, code = _future_imports(code)
        return future + prefix.rstrip("\n") + "\n\n" + code
    completion = prefix + code  # a body that continues the prompt's signature
    indent = _body_indent(prefix)
    if indent and code[:1] not in (" ", "\t") and not _compiles(completion):
        for candidate in (prefix + indent + code, prefix + textwrap.indent(code, indent)):
            if _compiles(candidate):
                return candidate
    return completion


def _limits(spec: TestSpec, tests: int | None = None, output: int = 1 << 20) -> SandboxLimits:
    count = len(spec.tests) if tests is None else tests
    total = min(spec.test_timeout * (count + 2), max(spec.total_timeout, 2 * spec.test_timeout)) + 2.0
    return SandboxLimits(timeout=total, cpu_seconds=int(total) + 1, max_output_bytes=output)


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
            tree = parse(source)
    except (SyntaxError, ValueError):
        return source
    return ast.unparse(ast.fix_missing_locations(_PlainComparisons().visit(tree)))


#: Characters of one probe's reported value; a larger value fails its test.
VALUE_LIMIT = 1 << 17
#: Output of the solution's run: room for the probes' values.
_FIRST_OUTPUT = 1 << 23


@functools.cache
def _compiled(kind: str) -> str:
    """A grading program's code, compiled once here and sent marshalled (base64): compiling
    its source in every sandbox run cost about as much as a run of a small test."""
    parts = {
        "candidate": _PLAIN_DATA + _CANDIDATE,
        "record": _PLAIN_DATA + _TRUSTED_BASE + _RECORD,
        "trusted": _TRUSTED_BASE + _TRUSTED,
    }
    source = _PRELUDE + parts[kind] + _EPILOGUE
    return base64.b64encode(marshal.dumps(compile(source, "<grader>", "exec"))).decode("ascii")


def _launcher(kind: str, params: dict[str, object], head: str = "") -> str:
    """The program a sandbox runs: its parameters as literals, then the grader's code (the
    sandbox runs this interpreter, `sys.executable`, so the marshalled code fits it)."""
    return (
        f"_P = {params!r}\n{head}import marshal as _marshal_, binascii as _binascii_\n"
        f"exec(_marshal_.loads(_binascii_.a2b_base64({_compiled(kind)!r})))\n"
    )


def _nonce() -> str:
    return f"@@toolenv-{secrets.token_hex(8)}@@"


class _Results:
    """What a run reported: `(kind, index, ok, message)` lines and the probes' values."""

    def __init__(self, stdout: str, nonce: str) -> None:
        self.lines: list[tuple[str, int, bool, str]] = []
        self.probes: dict[tuple[int, int], tuple[int, bool, str]] = {}  # (test, probe): (level, ok, text)
        self.calls: dict[
            int, list[tuple[int, tuple[object, ...], dict[str, object]]]
        ] = {}  # test: (site, args, kwargs)
        # Longer lines are not the grader's (a value's repr is at most 4 times its size):
        # parsing them could tie up the host.
        longest = len(nonce) + 4 * VALUE_LIMIT + 1000
        for line in stdout.splitlines():
            if line.startswith(nonce) and len(line) <= longest:
                self._read(line[len(nonce) :])

    def _read(self, text: str) -> None:
        try:  # (not `ast.literal_eval`: a forged line's set of colliding ints would tie up the host)
            value = decode_value(text)
        except ValueError:
            return
        if not isinstance(value, tuple):
            return
        if len(value) == 4 and value[0] == "call":  # a loop's call, from the recording run
            _, index, k, inputs = value
            if type(index) is int and type(k) is int and type(inputs) is tuple and len(inputs) == 2:
                args, kwargs = inputs
                if type(args) is tuple and type(kwargs) is dict and all(type(n) is str for n in kwargs):
                    self.calls.setdefault(index, []).append((k, args, kwargs))
        elif len(value) == 4:
            kind, index, ok, msg = value
            if isinstance(kind, str) and type(index) is int and isinstance(ok, bool) and isinstance(msg, str):
                self.lines.append((kind, index, ok, msg))
        elif len(value) == 6 and value[0] == "probe":
            _, index, k, level, ok, msg = value
            ints = type(index) is int and type(k) is int and type(level) is int
            if ints and isinstance(ok, bool) and isinstance(msg, str):
                self.probes[(index, k)] = (level, ok, msg)


def _timeout_fails(split: SplitTest | ReplayTest | None) -> bool:
    """Whether a test that runs out of time in the solution's process fails whatever else happens:
    a whole test does; a split test does when its last probe (failed with every probe from the
    one running out of time on) is one whose error fails it. Loops are not counted."""
    if split is None:
        return True
    return isinstance(split, SplitTest) and bool(split.probes) and split.probes[-1].unconditional


def _checked(result: ExecResult) -> ExecResult:
    if result.error:  # the sandbox failed, not the solution: no report rather than a false zero
        raise RuntimeError(f"the sandbox failed: {result.error}")
    return result


def _is_stub(stmt: ast.stmt) -> bool:
    """A definition whose body is only a docstring, `pass` or `...`: a signature to complete."""
    if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return all(
        isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in stmt.body
    )


@functools.lru_cache(maxsize=1024)
def _entry_points(names: tuple[str, ...], prefix: str) -> tuple[str, ...]:
    """The names under test: `names`, and the functions the prompt only declares (HumanEval's
    signature and docstring), which the answer writes: the tests must see the answer's."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            body = parse(prefix).body if prefix else []
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        body = []
    declared = {s.name for s in body if _is_stub(s)}  # type: ignore[attr-defined]
    return tuple(sorted(set(names) | declared))


#: A loop's recording: at most this many calls, this many characters of arguments (else it runs whole).
MAX_CALLS = 10_000
_MAX_RECORDED = 1 << 21
#: Objects of the test's own that the recording run walks to see if it hands one to the solution.
_MAX_WALK = 100_000


def _values_source(name: str, items: list[str]) -> str:
    """Source binding `name` to a dict of plain data the host wrote from decoded values."""
    body = "{" + ", ".join(items) + "}"
    imports = "from fractions import Fraction\n" if "Fraction(" in body else ""
    imports += "from decimal import Decimal\n" if "Decimal(" in body else ""
    return f'{imports}nan, inf = float("nan"), float("inf")\n{name} = {body}\n'


class _Grading:
    """One grading: the loops' recording (when there are loops), the solution's run (whole tests,
    probes and the loops' calls), then the trusted run."""

    def __init__(self, answer: str, spec: TestSpec, stop_on_timeout: bool = False) -> None:
        self.spec = spec
        self.answer = answer
        self.stop_on_timeout = stop_on_timeout
        self.stopped: int | None = None  # the test that timed out, when grading stopped there
        self.entry_points = _entry_points(tuple(spec.entry_points), spec.solution_prefix)
        n = len(spec.tests)
        self.splits: list[SplitTest | ReplayTest | None]
        if spec.split_tests:
            splits, self.trusted_setup = split_tests(
                tuple(spec.tests), spec.setup, spec.solution_prefix, self.entry_points
            )
            self.splits = list(splits)
        else:
            self.splits, self.trusted_setup = [None] * n, ""
        self.passed = [False] * n
        self.messages = ["not run"] * n
        self.solution_error = ""
        self.timed_out = False
        self.seed = secrets.randbits(48)  # the loops' `random`: drawn by the grader, never in the solution's process
        self.calls: dict[int, tuple[str, list[int]]] = {}  # a loop's recorded calls, as source, and their sites
        self.missing: dict[int, str] = {}  # what a replayed call not recorded fails with
        loops = [(i, s.record) for i, s in enumerate(self.splits) if isinstance(s, ReplayTest)]
        self.record: str | None = None
        if loops:
            self.record_nonce = _nonce()
            params = {
                "nonce": self.record_nonce,
                "entry_points": list(self.entry_points),
                "prefix": spec.solution_prefix,
                "setup": self.trusted_setup,
                "tests": loops,
                "limit": spec.test_timeout,
                "seed": self.seed,
                "value_limit": VALUE_LIMIT,
                "max_calls": MAX_CALLS,
                "max_size": _MAX_RECORDED,
                "max_walk": _MAX_WALK,
            }
            self.record = _launcher("record", params)
            self.record_limits = _limits(spec, len(loops) * 2, output=_FIRST_OUTPUT)
        self.first_limits = _limits(spec, output=_FIRST_OUTPUT)

    def after_record(self, result: ExecResult) -> None:
        """Read the loops' recording: the calls to make, or the loops to run whole after all."""
        self.timed_out = _checked(result).timed_out
        results = _Results(result.stdout, self.record_nonce)
        recorded = {index: (ok, msg) for kind, index, ok, msg in results.lines if kind == "recorded"}
        for i, split in enumerate(self.splits):
            if not isinstance(split, ReplayTest):
                continue
            if i not in recorded:  # the recording gave up on it (or never got to it): graded whole
                self.splits[i] = None
                continue
            ok, msg = recorded[i]
            calls = [c for c in results.calls.get(i, []) if 0 <= c[0] < len(split.calls)]
            made = ", ".join(f"({k}, {encode_value(a)}, {encode_value(kw)})" for k, a, kw in calls)
            self.calls[i] = made, [k for k, _, _ in calls]
            self.missing[i] = msg if not ok else "the test's inputs were not those recorded (not reproducible)"

    @property
    def first(self) -> str:
        """The solution's run: the answer, the setup, whole tests, probes and the loops' calls."""
        items: list[tuple[int, str, str | None, list[Any] | None]] = []
        calls: list[str] = []
        stop: list[int] = []
        for i, (test, split) in enumerate(zip(self.spec.tests, self.splits, strict=True)):
            if self.stop_on_timeout and _timeout_fails(split):
                stop.append(i)
            if split is None:
                items.append((i, _plain_test(test), "", None))
            elif isinstance(split, ReplayTest):
                items.append((i, "", None, [list(site) for site in split.calls]))
                calls.append(f"{i}: [{self.calls[i][0]}]")
            elif split.probes:
                items.append((i, "", split.context, [list(p.levels) for p in split.probes]))
        params = {
            "nonce": self.nonce,
            "entry_points": list(self.entry_points),
            "solution": solution_source(self.answer, self.spec.solution_prefix),
            "setup": self.spec.setup,
            "prefix": self.spec.solution_prefix,
            "items": items,
            "limit": self.spec.test_timeout,
            "value_limit": VALUE_LIMIT,
            "stop": stop,
        }
        return _launcher("candidate", params, _values_source("_CALLS", calls) if calls else "")

    @functools.cached_property
    def nonce(self) -> str:
        return _nonce()

    def after_first(self, result: ExecResult) -> str | None:
        """Read the solution's run; the trusted run's program, or None when no test needs it."""
        self.timed_out = _checked(result).timed_out or self.timed_out
        results = _Results(result.stdout, self.nonce)
        probes = results.probes
        for kind, index, ok, msg in results.lines:
            if kind == "test" and 0 <= index < len(self.passed) and self.splits[index] is None:
                self.passed[index], self.messages[index] = ok, msg
            elif kind in ("solution", "setup") and not ok and not self.solution_error:
                self.solution_error = msg  # the first: a setup that fails for want of the solution's names follows
            elif kind == "stopped" and self.stop_on_timeout and self.stopped is None and 0 <= index < len(self.passed):
                self.stopped = index
        if self.stopped is not None:  # the tests after it were not run: they fail, saying why
            skipped = f"not run: test {self.stopped} timed out (all-or-nothing grading stops there)"
            for i in range(self.stopped + 1, len(self.passed)):
                self.passed[i], self.messages[i] = False, skipped
        values: list[str] = []
        errors: dict[tuple[int, int], str] = {}
        levels_at: dict[tuple[int, int], int] = {}
        tests: list[tuple[int, str]] = []
        replays: list[tuple[int, str, list[tuple[str, ...]], str]] = []
        recorded: list[str] = []
        for i, split in enumerate(self.splits):
            if self.stopped is not None and i > self.stopped:
                continue
            if isinstance(split, ReplayTest):
                for c, k in enumerate(self.calls[i][1]):
                    level, ok, text = probes.get((i, c), (-1, False, "not run"))
                    if ok and 0 <= level < len(split.calls[k][1]):
                        try:
                            values.append(f"({i}, {c}): {encode_value(decode_value(text))}")
                            levels_at[(i, c)] = level
                            continue
                        except ValueError:
                            text = "the grader could not read the value this call returned"
                    errors[(i, c)] = text if not ok else text or "not run"
                recorded.append(f"{i}: [{self.calls[i][0]}]")
                replays.append((i, split.replay, [site[1] for site in split.calls], self.missing[i]))
                continue
            if split is None:
                continue
            got: dict[int, object] = {}
            failed: dict[int, str] = {}
            levels: list[int] = []
            verdict: tuple[bool, str] | None = None
            for k, probe in enumerate(split.probes):
                level, ok, text = probes.get((i, k), (-1, False, ""))
                if not 0 <= level < len(probe.levels):
                    verdict = (False, "not run")
                    break
                if ok:
                    try:
                        got[k] = decode_value(text)
                    except ValueError:
                        ok, text = False, "the grader could not read the value this call returned"
                if not ok:
                    failed[k] = text
                    if probe.unconditional and verdict is None:  # the test fails whatever it expects
                        verdict = (False, text)
                levels.append(level)
            if verdict is None and not any(levels):
                verdict = split.decide(got, failed)
            if verdict is not None:
                self.passed[i], self.messages[i] = verdict
                continue
            values += (f"({i}, {k}): {encode_value(v)}" for k, v in got.items())
            errors.update(((i, k), msg) for k, msg in failed.items())
            tests.append((i, split.trusted_source(levels)))
        self.second_count = len(tests) + len(replays)
        if not self.second_count:
            return None
        self.second_nonce = _nonce()
        params = {
            "nonce": self.second_nonce,
            "entry_points": list(self.entry_points),
            "prefix": self.spec.solution_prefix,
            "setup": self.trusted_setup,
            "errors": errors,
            "tests": tests,
            "replays": replays,
            "levels": levels_at,
            "seed": self.seed,
            "limit": self.spec.test_timeout,
        }
        # The values as source the host wrote from decoded plain data (nan and inf as names).
        head = _values_source("_VALUES", values)
        return _launcher("trusted", params, head + (_values_source("_RECORDED", recorded) if replays else ""))

    def after_second(self, result: ExecResult) -> None:
        """Read the trusted run's verdicts."""
        self.timed_out = _checked(result).timed_out or self.timed_out
        for kind, index, ok, msg in _Results(result.stdout, self.second_nonce).lines:
            if kind == "test" and 0 <= index < len(self.passed) and self.splits[index] is not None:
                self.passed[index], self.messages[index] = ok, msg

    def report(self) -> TestReport:
        return TestReport(
            passed=self.passed,
            messages=self.messages,
            solution_error=self.solution_error,
            timed_out=self.timed_out,
            split=[s is not None for s in self.splits],
        )


async def arun_tests(
    answer: str, spec: TestSpec, pool: SandboxPool | None = None, *, stop_on_timeout: bool = False
) -> TestReport:
    """Grade `answer` (code, or text with a fenced code block) against `spec` in the sandbox.

    `stop_on_timeout`: stop at the first test that runs out of its `test_timeout` (when that
    fails it for sure); the tests after it are not run and fail, saying so. For all-or-nothing
    scoring, where they cannot change the score: a looping answer costs one test's time.

    Raises:
        RuntimeError: the sandbox itself failed (its pool is closed, its server died twice).
    """
    pool = pool or get_pool()
    grading = _Grading(answer, spec, stop_on_timeout)
    if grading.record is not None:
        grading.after_record(await pool.arun(grading.record, grading.record_limits))
    second = grading.after_first(await pool.arun(grading.first, grading.first_limits))
    if second is not None:
        grading.after_second(await pool.arun(second, _limits(spec, grading.second_count)))
    return grading.report()


def run_tests(
    answer: str, spec: TestSpec, pool: SandboxPool | None = None, *, stop_on_timeout: bool = False
) -> TestReport:
    """`arun_tests`, blocking."""
    pool = pool or get_pool()
    grading = _Grading(answer, spec, stop_on_timeout)
    if grading.record is not None:
        grading.after_record(pool.run(grading.record, grading.record_limits))
    second = grading.after_first(pool.run(grading.first, grading.first_limits))
    if second is not None:
        grading.after_second(pool.run(second, _limits(spec, grading.second_count)))
    return grading.report()
