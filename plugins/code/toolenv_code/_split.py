"""Split a hidden test into probes (what needs the solution) and the rest (what holds the answer).

The grader runs the probes in the solution's process and sends their values back as plain
data; the rest is checked on the host when it only compares them with literals (`Check`),
else in a second process that never holds the solution. This module decides, from the task
alone (never from the answer), which tests can be split and how, and encodes and decodes
the probe values.

A test splits when it is a run of simple statements (imports, assignments and expressions
that do not use the solution, asserts) and every use of the solution inside its asserts is a
call, an attribute or an item of a name the solution defines (`f(x)`, `candidate(3)`,
`Solution().run(x)`, `mod.CONST`). A loop (`for`, `while`, `if` inside) whose calls of the
solution take inputs that do not depend on what it returned becomes a `ReplayTest` (recorded,
called, replayed: see `grading`). Anything else (`with`, `try`, a solution function passed
as a value as in `check(candidate)`, a statement that calls the solution outside an assert as
in `f(x); assert x == [1, 3]`, comprehensions and lambdas that use it, an expected side that
reads what the setup binds or a variable the probes' inputs come from, both of which are in
the solution's process) is left whole.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import io
import math
import operator
import re
import symtable
import sys
import tokenize
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from toolenv._ast import parse

__all__ = ["Probe", "ReplayTest", "SplitTest", "decode_value", "encode_value", "split_tests"]

#: The name a climbed probe's source uses for the value of the expression it encloses.
INNER = "__toolenv_v__"
#: The name the trusted side calls to get a probe's value: `__toolenv_probe__(k)`.
PROBE = "__toolenv_probe__"
#: A loop's calls of the solution in its recording run, `__toolenv_record__(k, *args, **kwargs)`,
#: and in its replay, `__toolenv_replay__(k, *args, **kwargs)`: `k` is the call's place in the test.
RECORD, REPLAY = "__toolenv_record__", "__toolenv_replay__"

#: Builtins a probe may be handed to in the solution's process when its value is not plain
#: data (`list(gen())`, `sorted(keys())`): one argument, nothing else revealed.
_CONVERTERS = frozenset(
    {"list", "tuple", "sorted", "set", "frozenset", "dict", "len", "sum", "min", "max", "any", "all", "bool"}
    | {"int", "float", "str", "abs", "next"}
)
_BUILTINS = frozenset(dir(builtins))
_STDLIB = frozenset(sys.stdlib_module_names)
#: Nodes that hold a comparison or computation with the expected side: never climbed through.
_SCOPED = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_UNSPLITTABLE = (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)

Path = tuple[tuple[str, int | None], ...]


class _Unsplittable(Exception):
    """The test is graded whole, in the solution's process."""


@dataclass(frozen=True)
class Probe:
    """One use of the solution in a test, and the enclosing nodes it may be widened to."""

    levels: tuple[str, ...]
    """Source run in the solution's process: level 0 is the probe, level `l` the `l`-th
    enclosing node with the previous level's value as `__toolenv_v__`; where the test uses only
    the truth of the last, one more level, `not not __toolenv_v__`, in the same place."""
    paths: tuple[Path, ...]
    """Where each level's node sits in the test's tree."""
    unconditional: bool
    """Always evaluated when the test runs (not behind `and`/`or`/`if`): its error fails the test."""


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


class _ProbeError(Exception):
    """A probe the host check reads had failed in the solution's process."""


#: What the host evaluates of a test: a function of the probes' values and errors.
Expr = Callable[[dict[int, object], dict[int, str]], Any]


@dataclass(frozen=True)
class Check:
    """One assert the host can check on the probes' values without running any code: made
    of literals, the probes, comparisons, `and`/`or`/`not`, `+`/`-` of numbers and `abs`."""

    expr: Expr
    message: str


@dataclass(frozen=True)
class SplitTest:
    """A test split into probes and the trusted rest."""

    tree: ast.Module
    context: str
    """The test's own statements that the probes need (imports, variables), run before them."""
    probes: tuple[Probe, ...]
    checks: tuple[Check, ...] | None = None
    """The test as plain checks the host can make on the values (`assert f(x) == [1, 2]`), or None."""
    big_literals: bool = False
    """The test's own literals hold an int too large to meet a `Decimal` on the host."""

    def decide(self, values: dict[int, object], errors: dict[int, str]) -> tuple[bool, str] | None:
        """The verdict from the probes' values without running code, when the test is plain checks.

        Comparing plain data (builtin types, `Fraction`, `Decimal`) with a literal runs no code
        of the solution's or the test's, so the trusted run is only needed for other tests, and
        for values whose comparison would cost the host more than linear time (`_costly`).
        """
        if self.checks is None or _costly(values.values(), self.big_literals):
            return None
        for check in self.checks:
            try:
                ok = bool(check.expr(values, errors))
            except _ProbeError as exc:
                return False, str(exc)
            except _Undecided:
                return None
            except (TypeError, ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
                return False, f"{type(exc).__name__}: {exc}"[:300]  # `<` between types, as the test would raise
            if not ok:
                return False, f"AssertionError: {check.message}"[:300]
        return True, ""

    def trusted_source(self, levels: list[int]) -> str:
        """The test with probe `k`'s node at `levels[k]` replaced by `__toolenv_probe__(k)`."""
        tree = copy.deepcopy(self.tree)
        for k, (probe, level) in enumerate(zip(self.probes, levels, strict=True)):
            _put(tree, probe.paths[level], ast.Call(ast.Name(PROBE, ast.Load()), [ast.Constant(k)], []))
        return ast.unparse(ast.fix_missing_locations(tree))


def _put(tree: ast.AST, path: Path, node: ast.AST) -> None:
    """Replace the node at `path` in `tree` by `node`."""
    *parent_path, (field, index) = path
    parent: ast.AST = tree
    for name, i in parent_path:
        parent = getattr(parent, name) if i is None else getattr(parent, name)[i]
    if index is None:
        setattr(parent, field, node)
    else:
        getattr(parent, field)[index] = node


@dataclass(frozen=True)
class ReplayTest:
    """A loop test, graded in three runs of which only the second holds the solution.

    1. The recording run (no solution) runs `record`: the test with each statement that needs
       the solution's values (its asserts, the assignments of what the solution returned)
       reduced to the solution's calls, each recorded with its arguments as plain data.
    2. The solution's process makes exactly those calls and reports their values.
    3. The trusted run replays `replay`, the whole test, each call answered with the value the
       call with the same arguments returned. Both trusted runs seed `random` alike.

    A test qualifies when no input of a call, no loop and no branch depends on what the solution
    returned; the grader falls back to running it whole when the recording shows more (see
    `grading`)."""

    record: str
    replay: str
    calls: tuple[tuple[str | None, tuple[str, ...]], ...]
    """Per call site `k`: the solution's callable as source (None: the site is no call, its
    level 0 is evaluated as is) and its levels, as `Probe.levels`."""


#: Bits of an int (or a `Fraction`'s terms) a `Decimal` is compared with on the host. Python
#: converts the int to a Decimal first, in time quadratic in its size (~0.3 s for 10**150000,
#: and once per item of a list of Decimals that `in` walks); up to this size it is microseconds.
_CHEAP_BITS = 1024


def _costly(values: Iterable[object], big_literals: bool) -> bool:
    """Whether the values (and the test's literals) hold a `Decimal` and an int or a `Fraction`
    too large to compare with it cheaply: such a test is left to the trusted run, in the sandbox."""
    decimal = False
    big = big_literals
    stack = list(values)
    while stack:
        value = stack.pop()
        t = type(value)
        if t is Decimal:
            decimal = True
        elif t is int:
            big = big or _big_int(value)
        elif t is Fraction:
            q: Fraction = value  # type: ignore[assignment]
            big = big or max(abs(q.numerator).bit_length(), q.denominator.bit_length()) > _CHEAP_BITS
        elif t is dict:
            stack += value.keys()  # type: ignore[attr-defined]
            stack += value.values()  # type: ignore[attr-defined]
        elif t in (list, tuple, set, frozenset):
            stack += value  # type: ignore[arg-type]
        if decimal and big:
            return True
    return False


def _big_int(value: object) -> bool:
    return type(value) is int and value.bit_length() > _CHEAP_BITS


def _parse(source: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():  # dataset tests hold invalid escapes ("\\d") that warn
            warnings.simplefilter("ignore")
            return parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _bound(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    return {
        n.id
        for n in ast.walk(stmt)
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)) and not _inside_scope(stmt, n)
    }


def _inside_scope(stmt: ast.stmt, target: ast.AST) -> bool:
    """`target` is bound inside a comprehension or lambda of `stmt` (its own scope)."""
    return any(
        isinstance(n, _SCOPED) and any(m is target for m in ast.walk(n)) for n in ast.walk(stmt) if n is not stmt
    )


def _globals_used(stmt: ast.stmt) -> set[str]:
    """Module-level names a statement reads, in its own code or in the functions it defines."""
    try:
        top = symtable.symtable(ast.unparse(stmt), "<setup>", "exec")
    except (SyntaxError, ValueError, RecursionError):
        return _loads(stmt)
    names = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    tables = list(top.get_children())
    while tables:
        table = tables.pop()
        names |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and s.is_global()}
        tables += table.get_children()
    return names


def _scope_locals(node: ast.AST) -> set[str]:
    """Names bound by comprehensions and lambdas inside `node` (their own variables)."""
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Lambda):
            a = n.args
            names |= {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
        elif isinstance(n, ast.comprehension):
            names |= {m.id for m in ast.walk(n.target) if isinstance(m, ast.Name)}
    return names


@dataclass
class _Env:
    """What the trusted side can resolve: builtins, the prompt's and the setup's trusted names."""

    trusted: set[str]
    tainted: set[str]
    across: set[str]  # names some test binds: another test may rely on them
    shadowed: set[str]  # builtin names the prompt, the setup or the test rebinds
    hidden: set[str]  # names the setup binds (it runs in the solution's process): not for the expected side


def _environment(setup: str, prefix: str, entry_points: tuple[str, ...]) -> tuple[_Env, str] | None:
    """Classify the prompt's and the setup's names; the trusted part of the setup."""
    tainted = set(entry_points)
    prefix_tree = _parse(prefix) if prefix else ast.Module([], [])
    setup_tree = _parse(setup) if setup else ast.Module([], [])
    if setup_tree is None:
        return None
    prefix_names: set[str] = set()
    for stmt in prefix_tree.body if prefix_tree is not None else []:
        prefix_names |= _bound(stmt)
    trusted = prefix_names - tainted
    kept: list[ast.stmt] = []
    for stmt in setup_tree.body:
        used = _globals_used(stmt)
        unknown = {n for n in used if n not in trusted and n not in _BUILTINS and n not in _STDLIB}
        if used & tainted or unknown:
            tainted |= _bound(stmt)
            trusted -= _bound(stmt)
        else:
            kept.append(stmt)
            trusted |= _bound(stmt) - tainted
    shadowed = (prefix_names | {n for s in setup_tree.body for n in _bound(s)}) & _BUILTINS
    hidden = {n for s in setup_tree.body if not isinstance(s, (ast.Import, ast.ImportFrom)) for n in _bound(s)}
    env = _Env(trusted=trusted, tainted=tainted, across=set(), shadowed=shadowed, hidden=hidden)
    return env, "\n".join(ast.unparse(s) for s in kept)


class _Splitter:
    """Find the probes of one test's asserts."""

    def __init__(self, env: _Env, local: set[str]) -> None:
        self.env = env
        self.local = local  # names this test bound before the current statement
        self.probes: list[tuple[list[ast.AST], list[Path], bool]] = []

    def tainted(self, name: str, scoped: set[str]) -> bool:
        if name in scoped:
            return False
        if name in self.local:
            return False
        if name in self.env.across:
            raise _Unsplittable(f"uses {name}, which another test binds")
        if name in self.env.tainted:
            return True
        return not (name in self.env.trusted or name in _BUILTINS or name in _STDLIB)

    def dependent(self, node: ast.AST) -> bool:
        """Whether `node` reads a name of the solution."""
        scoped = _scope_locals(node)
        return any(
            isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and self.tainted(n.id, scoped)
            for n in ast.walk(node)
        )

    def visit(self, node: ast.AST, path: Path, chain: list[ast.AST], conditional: bool) -> None:
        """Find the probes under `node` (`chain`: its ancestors, innermost last)."""
        if not self.dependent(node):
            return
        if isinstance(node, _SCOPED + _UNSPLITTABLE):
            raise _Unsplittable("uses the solution inside a comprehension, a lambda or an assignment expression")
        if isinstance(node, ast.Name):
            raise _Unsplittable(f"uses {node.id} as a value")
        if self.is_probe(node):
            self.add_probe(node, path, chain, conditional)
            return
        for field, value in ast.iter_fields(node):
            items = value if isinstance(value, list) else [value]
            for i, child in enumerate(items):
                if not isinstance(child, ast.AST):
                    continue
                later = conditional or _conditional(node, field, i)
                index = i if isinstance(value, list) else None
                self.visit(child, (*path, (field, index)), [*chain, node], later)

    def is_probe(self, node: ast.AST) -> bool:
        """A call of the solution, or an attribute or item of one of its names."""
        if isinstance(node, ast.Call):
            return self.dependent(node.func)
        if isinstance(node, ast.Attribute):
            return True  # its value is dependent, as the node is
        if isinstance(node, ast.Subscript):
            return self.dependent(node.value)
        return False

    def add_probe(self, node: ast.AST, path: Path, chain: list[ast.AST], conditional: bool) -> None:
        levels, paths = [node], [path]
        for parent in reversed(chain):
            if not self.climbable(parent, levels[-1]):
                break
            levels.append(parent)
            paths.append(paths[-1][:-1])
        top = levels[-1]
        if isinstance(top, ast.expr) and _truth_only(top, chain[: len(chain) - len(levels) + 1]):
            # Only its truth is used (`assert f(x)`, `not f(x)`): a value that is not plain data
            # (a `re.Match`, a generator) is reported as `not not value`, a bool, in its place.
            levels.append(ast.UnaryOp(ast.Not(), ast.UnaryOp(ast.Not(), top)))
            paths.append(paths[-1])
        self.probes.append((levels, paths, not conditional))

    def climbable(self, parent: ast.AST, child: ast.AST) -> bool:
        """Whether a value that is not plain data may be widened to `parent` in the solution's
        process: an attribute, a constant item, a call without arguments, or a converter builtin
        applied to it alone. Never a comparison or an operator: those hold the expected side."""
        if isinstance(parent, ast.Attribute):
            return parent.value is child
        if isinstance(parent, ast.Subscript):
            return parent.value is child and _constant(parent.slice)
        if isinstance(parent, ast.Call):
            if parent.func is child:
                return not parent.args and not parent.keywords
            func = parent.func
            return (
                isinstance(func, ast.Name)
                and func.id in _CONVERTERS
                and func.id not in self.env.shadowed
                and func.id not in self.local
                and not self.env.tainted & {func.id}
                and len(parent.args) == 1
                and parent.args[0] is child
                and not parent.keywords
            )
        return False


def _truth_only(node: ast.AST, chain: list[ast.AST]) -> bool:
    """Whether the test uses only the truth of `node`'s value (`chain`: its ancestors, innermost
    last): it is an assert's or a conditional expression's test, or the operand of `not`,
    directly or through `and`/`or` and the branches of `... if ... else ...` that are used so."""
    for parent in reversed(chain):
        if isinstance(parent, ast.BoolOp) or (isinstance(parent, ast.IfExp) and parent.test is not node):
            node = parent
            continue
        if isinstance(parent, ast.UnaryOp):
            return isinstance(parent.op, ast.Not)
        return isinstance(parent, (ast.Assert, ast.IfExp)) and parent.test is node
    return False


def _constant(node: ast.AST) -> bool:
    """A literal index or slice (`0`, `-1`, `1:3`, `'key'`): it reveals nothing of the answer."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _constant(node.operand)
    if isinstance(node, ast.Slice):
        return all(p is None or _constant(p) for p in (node.lower, node.upper, node.step))
    if isinstance(node, ast.Tuple):
        return all(_constant(e) for e in node.elts)
    return False


def _conditional(node: ast.AST, field: str, index: int) -> bool:
    """Whether the child at `field[index]` of `node` may not be evaluated when `node` is."""
    if isinstance(node, ast.BoolOp):
        return index > 0
    if isinstance(node, ast.IfExp):
        return field != "test"
    if isinstance(node, ast.Compare):  # `a < f(x) < g(y)`: g(y) only when the first comparison holds
        return field == "comparators" and index > 0
    return isinstance(node, ast.Assert) and field == "msg"


_ARITHMETIC: dict[type[ast.operator], Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub}
_NUMBERS = (bool, int, float, complex, Fraction, Decimal)


class _Undecided(Exception):
    """The host leaves this test to the trusted run."""


def _number(value: object) -> object:
    """`value` when it is a number: `+` and `-` of anything else (lists, str) are left to the
    trusted run, where they cannot tie up the host."""
    if type(value) not in _NUMBERS:
        raise _Undecided
    return value


def _expr(node: ast.AST, nodes: list[ast.AST], env: _Env, local: set[str]) -> Expr | None:
    """`node` as a function of the probes' values, or None when it is not made of what the
    host may evaluate (literals, probes, comparisons, `and`/`or`/`not`, `+`/`-`, `abs`)."""
    if any(node is n for n in nodes):
        k = next(i for i, n in enumerate(nodes) if n is node)

        def probe(values: dict[int, object], errors: dict[int, str]) -> object:
            if k in errors:
                raise _ProbeError(errors[k])
            return values[k]

        return probe
    try:
        literal = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    else:
        return lambda values, errors: literal
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        inner = _expr(node.operand, nodes, env, local)
        if inner is None:
            return None
        if isinstance(node.op, ast.Not):
            return lambda values, errors: not inner(values, errors)
        return lambda values, errors: -_number(inner(values, errors))  # type: ignore[operator]
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        fn, left, right = (
            _ARITHMETIC[type(node.op)],
            _expr(node.left, nodes, env, local),
            _expr(node.right, nodes, env, local),
        )
        if left is None or right is None:
            return None
        return lambda values, errors: fn(_number(left(values, errors)), _number(right(values, errors)))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "abs":
        if "abs" in env.shadowed | env.tainted | local | env.trusted or len(node.args) != 1 or node.keywords:
            return None
        arg = _expr(node.args[0], nodes, env, local)
        if arg is None:
            return None
        return lambda values, errors: abs(_number(arg(values, errors)))  # type: ignore[arg-type]
    if isinstance(node, ast.BoolOp):
        parts = [_expr(v, nodes, env, local) for v in node.values]
        if any(p is None for p in parts):
            return None
        is_and = isinstance(node.op, ast.And)

        def boolop(values: dict[int, object], errors: dict[int, str]) -> object:
            result: object = None
            for part in parts:
                result = part(values, errors)  # type: ignore[misc]
                if bool(result) != is_and:
                    return result
            return result

        return boolop
    if isinstance(node, ast.Compare):
        operands = [_expr(v, nodes, env, local) for v in (node.left, *node.comparators)]
        if any(p is None for p in operands):
            return None
        if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            sides = (node.left, *node.comparators)
            if not all(any(n is s for n in nodes) or _singleton(s) for s in sides):
                return None
        ops = [_COMPARE[type(op)] for op in node.ops]

        def compare(values: dict[int, object], errors: dict[int, str]) -> object:
            left = operands[0](values, errors)  # type: ignore[misc]
            for op, operand in zip(ops, operands[1:], strict=True):
                right = operand(values, errors)  # type: ignore[misc]
                if not op(left, right):
                    return False
                left = right
            return True

        return compare
    return None


def _singleton(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and (node.value is None or type(node.value) is bool)


def _checks(tree: ast.Module, nodes: list[ast.AST], env: _Env) -> tuple[Check, ...] | None:
    """The test as checks the host makes on the probes' values, or None when it is anything else."""
    checks = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assert):
            return None
        if stmt.msg is None:
            message = ""
        elif isinstance(stmt.msg, ast.Constant):
            message = str(stmt.msg.value)
        else:
            return None
        expr = _expr(stmt.test, nodes, env, set())
        if expr is None:
            return None
        checks.append(Check(expr, message))
    return tuple(checks)


def _split_one(tree: ast.Module, env: _Env, shared: set[str]) -> tuple[str, list[Probe], tuple[Check, ...] | None]:
    """Probes and context of one parsed test; raises `_Unsplittable`.

    `shared`: names other tests read (what this test binds of them is run in the solution's
    process too, where those tests may run whole). A standard module the test uses without
    importing it (the solution's import, in the solution's process) is imported.
    """
    own = set().union(*(_bound(s) for s in tree.body)) if tree.body else set()
    used = _loads(tree) - _scope_locals(tree) - own - env.trusted - env.tainted - env.across - _BUILTINS
    tree.body[:0] = [ast.Import([ast.alias(name)]) for name in sorted(used & _STDLIB)]
    local: set[str] = set()
    statements: list[tuple[ast.stmt, set[str]]] = []  # context statements and the names they bind
    found: list[tuple[list[ast.AST], list[Path], bool]] = []
    handed: set[str] = set()  # the test's variables that a probe hands to the solution
    checked: set[str] = set()  # the test's names its asserts read outside the probes (the expected side)
    for s, stmt in enumerate(tree.body):
        splitter = _Splitter(env, local)
        if isinstance(stmt, ast.Assert):
            if stmt.msg is not None and splitter.dependent(stmt.msg):
                stmt.msg = None  # a message that would call the solution: left out
            splitter.visit(stmt.test, (("body", s), ("test", None)), [tree, stmt], False)
            nodes = [levels[0] for levels, _, _ in splitter.probes]
            handed |= {n for node in nodes for n in _loads(node)} & local
            outside = _names_outside(stmt.test, nodes)
            if outside & handed:
                raise _Unsplittable("checks a variable that the solution was handed")
            checked |= outside
            found += splitter.probes
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
                raise _Unsplittable("star import")
            statements.append((stmt, _bound(stmt)))
        elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Pass)):
            if splitter.dependent(stmt):
                raise _Unsplittable("a statement outside the asserts uses the solution")
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            for target in targets:
                if target is not None and not all(
                    isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store)) for n in ast.walk(target)
                ):
                    raise _Unsplittable("assigns to something other than a name")
            if handed & _loads(stmt):
                raise _Unsplittable("reads a variable after the solution may have changed it")
            statements.append((stmt, _bound(stmt)))
        else:
            raise _Unsplittable(f"has a {type(stmt).__name__} statement")
        local |= _bound(stmt)
    for stmt, names in statements:  # run in the solution's process for the other tests' sake
        if names & shared and not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            raise _Unsplittable("binds a variable other tests read: it would be in the solution's process")
    needed = handed | (shared & local)
    context: list[ast.stmt] = []
    for stmt, names in reversed(statements):
        if names & needed:
            context.append(stmt)
            needed |= _loads(stmt) - _scope_locals(stmt)
    context.reverse()
    # The expected side may be computed from a probe's input (`expected = sum(lst)`), but not
    # read from another variable the context binds (`x = cases[0][0]` puts `cases`, answers
    # and all, in the solution's process; `n = len(expected)` puts `expected` there), nor from
    # what the setup binds: both are in the solution's process.
    for stmt, names in reversed(statements):
        if names & checked:
            checked |= _loads(stmt) - _scope_locals(stmt)
    in_context = {n for stmt in context if not isinstance(stmt, (ast.Import, ast.ImportFrom)) for n in _bound(stmt)}
    if (in_context - handed) & checked or (env.hidden - local) & checked:
        raise _Unsplittable("checks a value that is in the solution's process (the setup's, or its inputs')")
    probes = [
        Probe(
            levels=tuple(_level_source(levels, i) for i in range(len(levels))),
            paths=tuple(paths),
            unconditional=unconditional,
        )
        for levels, paths, unconditional in found
    ]
    checks = _checks(tree, [levels[0] for levels, _, _ in found], env)
    return "\n".join(ast.unparse(s) for s in context), probes, checks


def _names_outside(node: ast.AST, probes: list[ast.AST]) -> set[str]:
    """Names `node` reads outside the probe subtrees."""
    if any(node is p for p in probes):
        return set()
    names = {node.id} if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) else set()
    for child in ast.iter_child_nodes(node):
        names |= _names_outside(child, probes)
    return names


def _level_source(levels: list[ast.AST], i: int) -> str:
    """Level `i` of a probe, with level `i - 1` as `__toolenv_v__`."""
    if i == 0:
        return ast.unparse(levels[0])
    node = copy.copy(levels[i])
    inner = levels[i - 1]
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.UnaryOp) and node.operand.operand is inner:
        node.operand = ast.UnaryOp(node.operand.op, ast.Name(INNER, ast.Load()))  # the truth level, `not not v`
        return ast.unparse(node)
    for field, value in ast.iter_fields(node):
        if value is inner:
            setattr(node, field, ast.Name(INNER, ast.Load()))
        elif isinstance(value, list) and any(v is inner for v in value):
            setattr(node, field, [ast.Name(INNER, ast.Load()) if v is inner else v for v in value])
    return ast.unparse(node)


_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Pass, ast.Assert, ast.Import, ast.ImportFrom)
_ASSIGNS = (ast.Assign, ast.AugAssign, ast.AnnAssign)
_BLOCKS = (ast.For, ast.While, ast.If)


def _flatten(body: list[ast.stmt], path: Path, field: str = "body") -> list[tuple[ast.stmt, Path]]:
    """Every statement of `body`, those inside loops and branches too, with its path."""
    out: list[tuple[ast.stmt, Path]] = []
    for j, stmt in enumerate(body):
        here = (*path, (field, j))
        out.append((stmt, here))
        if isinstance(stmt, _BLOCKS):
            out += _flatten(stmt.body, here) + _flatten(stmt.orelse, here, "orelse")
    return out


def _own_parts(stmt: ast.stmt) -> tuple[set[str], set[str]]:
    """The names a statement reads and binds itself (a block: its header, not its body)."""
    if isinstance(stmt, ast.For):
        return _loads(stmt.iter), {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
    if isinstance(stmt, (ast.While, ast.If)):
        return _loads(stmt.test), set()
    reads = _loads(stmt) - _scope_locals(stmt)
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        reads.add(stmt.target.id)
    return reads, _bound(stmt)


def _changes_inputs(stmt: ast.stmt, probes: list[ast.AST], variables: set[str]) -> bool:
    """Whether `stmt`, outside its calls of the solution, calls a method of one of the test's
    variables (`xs.pop()`, `rng.random()`): the recording skips that part of a check, so its
    later inputs would not be the replay's."""
    if any(stmt is p for p in probes):
        return False
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        if any(node is p for p in probes):
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            root = node.func.value
            while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in variables:
                return True
        stack += ast.iter_child_nodes(node)
    return False


def _site_call(name: str, k: int, node: ast.AST) -> ast.expr:
    """`name(k, *args, **kwargs)` with the arguments of call site `k` (none: it is no call)."""
    args, keywords = (node.args, node.keywords) if isinstance(node, ast.Call) else ([], [])
    return ast.Call(ast.Name(name, ast.Load()), [ast.Constant(k), *copy.deepcopy(args)], copy.deepcopy(keywords))


def _replay_one(tree: ast.Module, env: _Env, shared: set[str]) -> ReplayTest:
    """A loop test as a `ReplayTest`; raises `_Unsplittable`."""
    own = set().union(*(_own_parts(s)[1] for s, _ in _flatten(tree.body, ())))
    used = _loads(tree) - _scope_locals(tree) - own - env.trusted - env.tainted - env.across - _BUILTINS
    tree.body[:0] = [ast.Import([ast.alias(name)]) for name in sorted(used & _STDLIB)]
    items = _flatten(tree.body, ())
    if not any(isinstance(s, (ast.For, ast.While)) for s, _ in items):
        raise _Unsplittable("not a loop")
    if own & env.tainted:
        raise _Unsplittable("rebinds a name of the solution")
    splitter = _Splitter(env, own)
    sites: dict[Path, list[int]] = {}  # statement: the calls it makes
    for stmt, path in items:
        if not isinstance(stmt, _SIMPLE + _BLOCKS + (ast.Break, ast.Continue)):
            raise _Unsplittable(f"has a {type(stmt).__name__} statement")
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            raise _Unsplittable("star import")
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if any(
            t is not None and not all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store)) for n in ast.walk(t))
            for t in targets
        ):
            raise _Unsplittable("assigns to something other than a name")
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)) and _own_parts(stmt)[1] & shared:
            raise _Unsplittable("binds a variable other tests read")
        before = len(splitter.probes)
        if isinstance(stmt, ast.Assert):
            if stmt.msg is not None and splitter.dependent(stmt.msg):
                stmt.msg = None  # a message that would call the solution: left out, as in `_split_one`
            splitter.visit(stmt.test, (*path, ("test", None)), [stmt], False)
        elif isinstance(stmt, (*_ASSIGNS, ast.Expr)):
            if stmt.value is not None:
                splitter.visit(stmt.value, (*path, ("value", None)), [stmt], False)
        elif isinstance(stmt, _BLOCKS) and splitter.dependent(stmt.iter if isinstance(stmt, ast.For) else stmt.test):
            raise _Unsplittable("a loop or a branch depends on the solution")
        if len(splitter.probes) > before:
            sites[path] = list(range(before, len(splitter.probes)))
    calls: list[tuple[str | None, tuple[str, ...]]] = []
    nodes: list[ast.AST] = []
    inputs: list[list[ast.expr]] = []
    for levels, _, unconditional in splitter.probes:
        node = levels[0]
        args = [*node.args, *(k.value for k in node.keywords)] if isinstance(node, ast.Call) else []
        free = _loads(node.func) if isinstance(node, ast.Call) else _loads(node)
        if not unconditional or free & own or any(splitter.dependent(a) for a in args):
            raise _Unsplittable("a call the recording cannot make (conditional, or of the solution's output)")
        calls.append(
            (
                ast.unparse(node.func) if isinstance(node, ast.Call) else None,
                tuple(_level_source(levels, i) for i in range(len(levels))),
            )
        )
        nodes.append(node)
        inputs.append(args)
    # What the solution returned (and what is computed from it) is read only where the test checks it.
    outputs: set[str] = set()
    while True:
        more = {
            n
            for stmt, path in items
            if isinstance(stmt, _ASSIGNS) and (path in sites or _own_parts(stmt)[0] & outputs)
            for n in _own_parts(stmt)[1]
        } - outputs
        if not more:
            break
        outputs |= more
    deferred = {
        path
        for stmt, path in items
        if isinstance(stmt, ast.Assert)
        or path in sites
        or (isinstance(stmt, _ASSIGNS) and _own_parts(stmt)[1] & outputs)
    }
    hidden = env.hidden - own  # the setup's, in the solution's process, and what the test computes from it
    for stmt, path in items:
        reads, binds = _own_parts(stmt)
        if path not in deferred and (reads | binds) & outputs:
            raise _Unsplittable("its inputs depend on what the solution returned")
        if path not in deferred and reads & hidden:
            hidden |= binds
    if any(_loads(a) & outputs for args in inputs for a in args):
        raise _Unsplittable("its inputs depend on what the solution returned")
    imported = set().union(*(_bound(s) for s, _ in items if isinstance(s, (ast.Import, ast.ImportFrom))))
    for stmt, path in items:
        if path in deferred and _names_outside(stmt, nodes) & hidden:
            raise _Unsplittable("checks a value that is in the solution's process (the setup's)")
        if path in deferred and _changes_inputs(stmt, nodes, own - imported):
            raise _Unsplittable("its checks may change its inputs, which the recording does not run")
    record, replay = copy.deepcopy(tree), copy.deepcopy(tree)
    for path in deferred:  # recorded: only the calls of the statements that need the solution's values
        made: list[ast.expr] = [_site_call(RECORD, k, nodes[k]) for k in sites.get(path, [])]
        _put(record, path, ast.Expr(ast.Tuple(made, ast.Load())) if made else ast.Pass())
    for k, (_, paths, _) in enumerate(splitter.probes):  # replayed: the whole test
        _put(replay, paths[-1], _site_call(REPLAY, k, nodes[k]))
    return ReplayTest(
        record=ast.unparse(ast.fix_missing_locations(record)),
        replay=ast.unparse(ast.fix_missing_locations(replay)),
        calls=tuple(calls),
    )


@functools.lru_cache(maxsize=4096)
def split_tests(
    tests: tuple[str, ...], setup: str, prefix: str, entry_points: tuple[str, ...]
) -> tuple[tuple[SplitTest | ReplayTest | None, ...], str]:
    """Each test split (a loop: to be replayed; None: graded whole, in the solution's process),
    and the setup's trusted part."""
    found = _environment(setup, prefix, entry_points)
    if found is None:
        return tuple(None for _ in tests), ""
    env, trusted_setup = found
    trees = [_parse(t) for t in tests]
    for tree in trees:
        for stmt in tree.body if tree is not None else []:
            if not isinstance(stmt, ast.Assert):
                env.across |= _bound(stmt) - _module_imports(stmt)
    for tree in trees:
        for stmt in tree.body if tree is not None else []:
            env.shadowed |= _bound(stmt) & _BUILTINS
    out: list[SplitTest | ReplayTest | None] = []
    for test, tree in zip(tests, trees, strict=True):
        if tree is None:
            out.append(None)
            continue
        own = set().union(*(_bound(s) for s in tree.body)) if tree.body else set()
        test_env = _Env(env.trusted, env.tainted, env.across - own, env.shadowed, env.hidden - own)
        shared = set().union(*(_loads(t) for t in trees if t is not None and t is not tree))
        try:
            context, probes, checks = _split_one(tree, test_env, shared)
        except (_Unsplittable, RecursionError, MemoryError):  # (a test nested too deeply stays whole)
            out.append(_replayed(test, test_env, shared))
            continue
        big = any(isinstance(n, ast.Constant) and _big_int(n.value) for n in ast.walk(tree))
        out.append(SplitTest(tree=tree, context=context, probes=tuple(probes), checks=checks, big_literals=big))
    return tuple(out), trusted_setup


def _replayed(test: str, env: _Env, shared: set[str]) -> ReplayTest | None:
    tree = _parse(test)
    try:
        return None if tree is None else _replay_one(tree, env, shared)
    except (_Unsplittable, RecursionError, MemoryError):
        return None


def _module_imports(stmt: ast.stmt) -> set[str]:
    """Names `import m` binds to a standard module of that name: a test that reads one another
    test imported gets the module (it imports it itself), so the name is not another test's variable."""
    if not isinstance(stmt, ast.Import):
        return set()
    return {a.name for a in stmt.names if a.asname is None and a.name in _STDLIB}


# -- values ------------------------------------------------------------------------------------


class _Bad(ValueError):
    pass


def decode_value(text: str) -> object:
    """The plain data a probe's report encodes; `ValueError` for anything else.

    The grammar: literals of None, bools, numbers, str and bytes, lists, tuples, dicts and
    sets of them, `set()`, `frozenset({...})`, `complex(re, im)`, `Fraction(n, d)`,
    `Decimal('...')`, and the names `nan` and `inf`. Nothing is evaluated.
    """
    try:
        if _long_decimal_number(text):
            raise _Bad("a long decimal number")
        tree = parse(text, mode="eval")
        return _decode(tree.body)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError, ZeroDivisionError, ArithmeticError) as e:
        raise ValueError(f"not a plain value: {type(e).__name__}") from None


#: Longest decimal number the grader writes (an int of up to 4,096 bits; larger ones are hex).
#: Reading a longer one costs time quadratic in its length, where the interpreter does not
#: cap it (`sys.set_int_max_str_digits`, from Python 3.11): a forged line, refused.
_DECIMAL_DIGITS = 1240
_DIGITS = re.compile(rf"[0-9_]{{{_DECIMAL_DIGITS + 1},}}")


def _long_decimal_number(text: str) -> bool:
    """Whether `text` holds a decimal number literal longer than `_DECIMAL_DIGITS` (a run
    of digits inside a string is fine: only when there is one are the tokens read)."""
    if _DIGITS.search(text) is None:
        return False
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            long = token.type == tokenize.NUMBER and len(token.string) > _DECIMAL_DIGITS
            if long and token.string[:2].lower() not in ("0x", "0o", "0b"):
                return True
    except (tokenize.TokenError, SyntaxError):
        return True  # (nor can it be parsed)
    return False


_ATOMS = (type(None), bool, int, float, str, bytes)
_FRACTION_BITS = 1 << 14
_DECIMAL_CHARS = 5000
#: Most items of one set or dict that may share a hash. Numbers hash alike on purpose
#: (`hash(n) == n % (2**61 - 1)`): a set of many such ints takes quadratic time to build
#: (seconds for one reported value), and reported values are decoded on the host.
_SAME_HASH = 8


def _hashed(items: list[Any]) -> list[Any]:
    """`items`, unless too many of them share a hash to go in a set or dict cheaply."""
    counts: dict[int, int] = {}
    for item in items:
        h = hash(item)  # (TypeError for an unhashable item, as the set would raise)
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > _SAME_HASH:
            raise _Bad("items crafted to share a hash")
    return items


def _decode(node: ast.expr) -> object:
    if isinstance(node, ast.Constant) and type(node.value) in _ATOMS:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _decode(node.operand)
        if type(value) in (int, float):
            return -value  # type: ignore[operator]
        raise _Bad("minus on a non-number")
    if isinstance(node, ast.Name) and node.id in ("nan", "inf"):
        return float(node.id)
    if isinstance(node, ast.List):
        return [_decode(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_decode(e) for e in node.elts)
    if isinstance(node, ast.Set):
        return set(_hashed([_decode(e) for e in node.elts]))
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _Bad("** in a dict")
        keys = _hashed([_decode(k) for k in node.keys])  # type: ignore[arg-type]
        return dict(zip(keys, [_decode(v) for v in node.values], strict=True))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        name = node.func.id
        args: list[Any] = [_decode(a) for a in node.args]
        types = [type(a) for a in args]
        if name == "set" and not args:
            return set()
        if name == "frozenset" and types in ([], [set]):
            return frozenset(*args)
        if name == "complex" and len(args) == 2 and all(t in (int, float) for t in types):
            return complex(args[0], args[1])
        # (normalising a fraction of huge ints would tie up the host)
        if name == "Fraction" and types == [int, int] and all(abs(a).bit_length() <= _FRACTION_BITS for a in args):
            return Fraction(args[0], args[1])
        if name == "Decimal" and types == [str] and len(args[0]) <= _DECIMAL_CHARS:
            return Decimal(args[0])
    raise _Bad(f"unexpected {type(node).__name__}")


def encode_value(value: object) -> str:
    """Source text for `value` (as `decode_value` returns it) in the same grammar."""
    t = type(value)
    if t is float:
        f: float = value  # type: ignore[assignment]
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return repr(f)
    if t in (type(None), bool, str, bytes):
        return repr(value)
    if t is int:
        n: int = value  # type: ignore[assignment]
        return hex(n) if n.bit_length() > 4096 else repr(n)
    if t is complex:
        c: complex = value  # type: ignore[assignment]
        return f"complex({encode_value(c.real)}, {encode_value(c.imag)})"
    if t is Fraction:
        q: Fraction = value  # type: ignore[assignment]
        return f"Fraction({encode_value(q.numerator)}, {encode_value(q.denominator)})"
    if t is Decimal:
        return f"Decimal({str(value)!r})"
    if t is list:
        return "[" + ", ".join(encode_value(v) for v in value) + "]"  # type: ignore[attr-defined]
    if t is tuple:
        items = [encode_value(v) for v in value]  # type: ignore[attr-defined]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if t is dict:
        return "{" + ", ".join(f"{encode_value(k)}: {encode_value(v)}" for k, v in value.items()) + "}"  # type: ignore[attr-defined]
    if t in (set, frozenset):
        inner = "{" + ", ".join(encode_value(v) for v in value) + "}" if value else ""  # type: ignore[attr-defined]
        return f"frozenset({inner})" if t is frozenset else (inner or "set()")
    raise TypeError(f"not plain data: {t.__name__}")
