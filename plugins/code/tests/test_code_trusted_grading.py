"""Split grading: the solution's process never holds what its tests check it against.

Each test that allows it is split into probes (the calls of the solution), run in the
solution's process and reported as plain data, and the rest (the expected values), checked
outside it. A solution that walks the grader's frames or objects can forge result lines or
read the tests it finds there; these tests show it finds neither a way to pass nor the
answers, and that every honest reference solution of HumanEval and MBPP still scores 1.0.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest

from toolenv import Task
from toolenv_code._split import decode_value, encode_value, split_tests
from toolenv_code.datasets import humaneval_tasks, mbpp_tasks
from toolenv_code.grading import TestSpec, _entry_points, run_tests

SECRETS = TestSpec(tests=["assert answer(1) == 'secret-one'", "assert answer(2) == 'secret-two'"])

#: Finds the grader's globals through the frames above the solution, then reports every
#: test as passed (and every probe as True) on the grader's own descriptor, and exits.
FRAME_FORGE = """
import os, sys

def _forge():
    frame = sys._getframe(1)
    while frame is not None and "_NONCE" not in frame.f_globals:
        frame = frame.f_back
    grader = frame.f_globals
    count, f = 0, frame
    while f is not None:  # the longest list in the grader's frames: its tests
        count = max([count] + [len(v) for v in f.f_locals.values() if isinstance(v, list)])
        f = f.f_back
    for i in range(count):
        for line in [("test", i, True, "")] + [("probe", i, k, 0, True, "True") for k in range(3)]:
            os.write(grader["_OUT"], (grader["_NONCE"] + repr(line) + "\\n").encode())
    os._exit(0)

_forge()
"""

#: The same, finding the grader's globals among the objects the garbage collector tracks.
GC_FORGE = """
import gc, os

def _forge():
    grader = next(o for o in gc.get_objects() if isinstance(o, dict) and "_NONCE" in o and "_OUT" in o)
    for i in range(50):
        for line in [("test", i, True, "")] + [("probe", i, k, 0, True, "True") for k in range(3)]:
            os.write(grader["_OUT"], (grader["_NONCE"] + repr(line) + "\\n").encode())
    os._exit(0)

_forge()
"""

#: Returns the expected value it reads from the code that called it.
CALLER_READER = """
import sys

def answer(x):
    consts = sys._getframe(1).f_code.co_consts
    return next((c for c in consts if isinstance(c, str) and c.startswith("secret-")), None)
"""

#: Returns the expected value it finds in its own process's memory (the grader's test list).
GC_READER = """
import gc, re

def answer(x):
    for o in gc.get_objects():
        if isinstance(o, (list, tuple, dict)):
            for s in (o.values() if isinstance(o, dict) else o):
                if isinstance(s, str) and f"answer({x})" in s:
                    found = re.search(r"secret-[a-z]+", s)
                    if found:
                        return found.group(0)
    return None
"""


def _spec(task: Task, **changes: object) -> TestSpec:
    fields = {k: task.context[k] for k in TestSpec.model_fields if k in task.context}
    return TestSpec.model_validate({**fields, **changes})


@pytest.mark.parametrize(
    "hack",
    [FRAME_FORGE, GC_FORGE, CALLER_READER, GC_READER],
    ids=["frame-walk-forge", "gc-forge", "reads-caller-frame", "reads-gc-objects"],
)
def test_what_the_solution_finds_in_its_process_does_not_pass(hack: str) -> None:
    report = run_tests(hack, SECRETS)
    assert report.passed == [False, False] and report.split == [True, True], report.messages
    # the same code passes when the tests run in the solution's process: the hacks are real
    assert run_tests(hack, SECRETS.model_copy(update={"split_tests": False})).passed == [True, True]


def test_a_frame_walk_forge_scores_zero_on_real_tasks() -> None:
    he = next(t for t in humaneval_tasks() if t.id == "HumanEval/2")  # abs(candidate(3.5) - 0.5) < 1e-6
    mbpp = next(t for t in mbpp_tasks() if t.id == "MBPP/11")
    for task in (he, mbpp):
        for forge in (FRAME_FORGE, GC_FORGE):
            report = run_tests(forge, _spec(task))
            assert report.fraction == 0.0 and all(report.split), (task.id, report.messages)


def test_honest_answers_still_pass_and_the_reader_passes_only_the_honest_way() -> None:
    honest = "def answer(x):\n    return {1: 'secret-one', 2: 'secret-two'}[x]"
    report = run_tests(honest, SECRETS)
    assert report.passed == [True, True] and report.split == [True, True]


def test_every_reference_solution_scores_full_marks_and_most_tests_split() -> None:
    """All 164 HumanEval and 974 + 427 MBPP (full and sanitized) reference solutions (~10-20 s on 2 cores)."""
    from concurrent.futures import ThreadPoolExecutor

    tasks = humaneval_tasks() + mbpp_tasks() + mbpp_tasks("sanitized")
    with ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda t: run_tests(str(t.answer), _spec(t)), tasks))
    failed = [(t.id, t.context["dataset"]) for t, r in zip(tasks, reports, strict=True) if r.fraction != 1.0]
    assert failed == []
    he, mb = reports[:164], reports[164:]
    he_split = sum(sum(r.split) for r in he) / sum(len(r.split) for r in he)
    mb_split = sum(sum(r.split) for r in mb) / sum(len(r.split) for r in mb)
    assert he_split > 0.99 and mb_split == 1.0, (he_split, mb_split)


def test_wrong_solutions_fail_the_same_tests_split_or_not() -> None:
    """Answers that return a changed value get the same verdicts as the in-process grader's."""
    wrap = (
        "\n_orig_{n} = {n}\ndef {n}(*a, **k):\n    r = _orig_{n}(*a, **k)\n"
        "    if isinstance(r, bool):\n        return not r\n"
        "    if isinstance(r, int):\n        return r + 1\n"
        "    if isinstance(r, float):\n        return r * 1.5 + 0.25\n"
        "    return r[1:] if isinstance(r, (list, str, tuple)) else r\n"
    )
    tasks = humaneval_tasks()[::4] + mbpp_tasks()[::25]
    for task in tasks:
        wrong = str(task.answer) + "".join(wrap.format(n=n) for n in task.context["entry_points"])
        split, whole = run_tests(wrong, _spec(task)), run_tests(wrong, _spec(task, split_tests=False))
        assert split.passed == whole.passed, (task.id, split.messages, whole.messages)
    assert run_tests("def has_close_elements(numbers, threshold):\n    return None", _spec(tasks[0])).fraction < 1


def test_unsplittable_tests_run_whole_in_the_solution_s_process() -> None:
    spec = TestSpec(
        tests=[
            "x = [3, 1]\nsort_in_place(x)\nassert x == [1, 3]",  # the solution's effect on a variable
            "x = [2, 1]\nassert sort_in_place(x) == x",  # the same object on both sides
            "for i in range(3):\n    x = [i]\n    assert sort_in_place(x) == x",  # a loop that hands the solution x
            "assert all(double(i) == 2 * i for i in range(3))",
            "def check(f):\n    assert f(2) == 4\ncheck(double)",
            "assert double(2) == 4",
        ]
    )
    honest = "def sort_in_place(x):\n    x.sort()\n    return x\ndef double(x):\n    return 2 * x"
    report = run_tests(honest, spec)
    assert report.passed == [True] * 6, report.messages
    assert report.split == [False, False, False, False, False, True]


def test_values_cross_as_plain_data_with_their_types() -> None:
    spec = TestSpec(
        tests=[
            "assert math.isnan(v('nan')) and v('inf') == float('inf') and v('-inf') < -1e308",
            "assert math.copysign(1, v('-0.0')) == -1",
            "assert v('set') == {1, 2} and isinstance(v('set'), set) and isinstance(v('frozenset'), frozenset)",
            "assert v('complex') == 1 - 2j and v('big') == 3 ** 20000 and v('bytes') == b'\\x00\\xff'",
            "assert v('fraction') == Fraction(1, 3) and v('decimal') == Decimal('0.1')",
            "assert v('nested') == {'a': [(1, None), {True}], 'b': {}} and type(v('nested')['a'][0]) is tuple",
            "assert list(v('generator')) == [0, 1] and sorted(v('keys')) == ['a', 'b'] and len(v('keys')) == 2",
            "assert v('namedtuple') == (1, 2) and v('namedtuple').x == 1",
            "assert v('generator') == [0, 1]",  # a generator is not a list: it fails, as it would in Python
            "assert v('object') is not None",  # not plain data: fails with a message saying so
        ],
        setup="import math\nfrom fractions import Fraction\nfrom decimal import Decimal",
    )
    answer = """
import collections, fractions, decimal
P = collections.namedtuple("P", "x y")
class Thing:
    pass
def v(kind):
    return {
        "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "-0.0": -0.0,
        "set": {1, 2}, "frozenset": frozenset(), "complex": complex(1, -2), "big": 3 ** 20000,
        "bytes": bytes([0, 255]), "fraction": fractions.Fraction(1, 3), "decimal": decimal.Decimal("0.1"),
        "nested": {"a": [(1, None), {True}], "b": {}}, "generator": (i for i in range(2)),
        "keys": {"a": 1, "b": 2}.keys(), "namedtuple": P(1, 2), "object": Thing(),
    }[kind]
"""
    report = run_tests(answer, spec)
    assert report.passed == [True] * 8 + [False, False], report.messages
    assert all(report.split)
    assert "not plain data" in report.messages[9] and "Thing" in report.messages[9]


def test_a_failing_probe_fails_its_test_only_where_it_is_evaluated() -> None:
    spec = TestSpec(
        tests=[
            "assert f(1) == 1 or f(0) == 0",  # f(0) raises, but is not reached
            "assert f(0) == 0",
            "assert g(2) == 4 and abs(f(4) - 0.25) < 1e-9",
            "assert (f(2) if g(0) == 0 else f(0)) == 0.5",
        ]
    )
    report = run_tests("def f(x):\n    return 1 / x\ndef g(x):\n    return x * x", spec)
    assert report.passed == [True, False, True, True], report.messages
    assert report.messages[1].startswith("ZeroDivisionError") and all(report.split)


def test_split_tests_respects_what_the_test_needs() -> None:
    (split, whole), trusted_setup = split_tests(
        ("lst = [1, 2]\nexpected = sum(lst) * 2\nassert double_all(lst) == [2, 4] and expected == 6", "assert foo"),
        "METADATA = {}\ncandidate = double_all\nHELPER = candidate",
        "import math\n\ndef double_all(xs):\n    '''doc'''\n",
        ("double_all",),
    )
    assert whole is None  # a name of the solution used as a value
    assert split is not None and trusted_setup == "METADATA = {}"
    assert split.context == "lst = [1, 2]"  # the probe's input, not the expected side
    assert [p.levels for p in split.probes] == [("double_all(lst)",)]
    assert split.trusted_source([0]).splitlines()[-1] == "assert __toolenv_probe__(0) == [2, 4] and expected == 6"


@pytest.mark.parametrize(
    "value",
    [None, True, -3, 2**5000, -0.0, math.inf, -math.inf, 1e-300, 1 + 2j, complex(math.nan, -math.inf), "é\x00'",
     b"\xff", [1, (2,), {3: {4}}], (), set(), frozenset({1, frozenset()}), Fraction(-1, 3), Decimal("-1.5E+7")],
)  # fmt: skip
def test_plain_values_round_trip(value: object) -> None:
    decoded = decode_value(encode_value(value))
    assert type(decoded) is type(value) and repr(decoded) == repr(value)


@pytest.mark.parametrize(
    "text",
    ["__import__('os')", "x", "f(1)", "[1, 2][0]", "(1).real", "{**{}}", "set([1])", "complex(1, real=2)",
     "Decimal(1)", "frozenset([1])", "-'a'", "lambda: 1", "[" * 300 + "]" * 300, "1 +", "Fraction(1, 0)"],
)  # fmt: skip
def test_decoding_a_reported_value_evaluates_nothing(text: str) -> None:
    with pytest.raises(ValueError, match="not a plain value"):
        decode_value(text)


def test_a_value_too_large_or_too_deep_to_report_fails_its_test_only() -> None:
    spec = TestSpec(tests=["assert big() == 'x' * 10 ** 7", "assert deep() == []", "assert small() == 1"])
    answer = (
        "def big():\n    return 'x' * 10 ** 7\n"
        "def deep():\n    v = []\n    for _ in range(150):\n        v = [v]\n    return v\n"
        "def small():\n    return 1"
    )
    report = run_tests(answer, spec)
    assert report.passed == [False, False, True], report.messages
    assert "too large" in report.messages[0] and "too deeply" in report.messages[1]


def test_a_value_other_tests_read_keeps_its_test_whole() -> None:
    """A test that binds a variable another test reads: that binding has to run in the solution's
    process (the other test runs whole there), so its expected value would be readable there too;
    the test is not reported as split."""
    spec = TestSpec(
        tests=["expected = [1, 2]\nassert f(1) == expected", "assert f(2) == expected + [3]"],
        entry_points=["f"],
    )
    report = run_tests("def f(n):\n    return [1, 2] if n == 1 else [1, 2, 3]", spec)
    assert report.passed == [True, True] and report.split == [False, False]


#: Reads the expected value from the test's own variables, which it finds in its caller's globals.
CONTEXT_READER = """
import sys

def answer(x):
    names = sys._getframe(1).f_globals
    if "cases" in names:
        return dict(names["cases"])[x]
    return names.get("expected")
"""


def test_the_expected_side_is_not_computed_in_the_solution_s_process() -> None:
    """A probe's input computed from a variable that also holds the expected value (a table of
    cases, or the expected value itself): that variable would be in the solution's process, so
    the test is not split; one whose expected value is computed from the input still is."""
    spec = TestSpec(
        tests=[
            "cases = [(1, 'secret-one'), (2, 'secret-two')]\nx = cases[0][0]\nassert answer(x) == cases[0][1]",
            "expected = 'secret-three'\nn = len(expected)\nassert answer(n) == expected",
            "a, b = 2, 'secret-two'\nassert answer(a) == b",
            "nums = [1, 2]\nwant = sum(nums)\nassert total(nums) == want",
        ]
    )
    report = run_tests(CONTEXT_READER + "\ndef total(xs):\n    return sum(xs)", spec)
    assert report.split == [False, False, False, True], report.messages
    assert report.passed[3]


def test_the_expected_side_is_not_read_from_the_setup() -> None:
    """The setup runs in the solution's process: a test that checks against a value or a
    function the setup binds is not split (one that only hands such a value to the solution is)."""
    spec = TestSpec(
        tests=["assert answer(1) == EXPECTED[1]", "assert answer(2) == want(2)", "assert answer(len(INPUTS)) == 'two'"],
        setup="EXPECTED = {1: 'secret-one'}\ndef want(n):\n    return 'secret-two'\nINPUTS = [0, 0]",
    )
    reader = (
        "import sys\ndef answer(x):\n    g = sys._getframe(1).f_globals\n"
        "    return g['EXPECTED'][1] if x == 1 else g['want'](2) if x == 2 else None"
    )
    report = run_tests(reader, spec)
    assert report.split == [False, False, True], report.messages
    assert report.passed == [True, True, False]  # (graded whole, the reader passes: as documented)


#: Distinct ints that all hash alike (hash(n) is n modulo 2**61 - 1): a set of many of them takes
#: quadratic time to build, which a reported value must not cost the host.
COLLIDING = [i * (2**61 - 1) for i in range(1, 41)]


@pytest.mark.parametrize(
    "text",
    [
        "{" + ", ".join(map(str, COLLIDING)) + "}",
        "frozenset({" + ", ".join(map(str, COLLIDING)) + "})",
        "{" + ", ".join(f"{n}: 0" for n in COLLIDING) + "}",
        "[1, {" + ", ".join(f"({n}, 1.5)" for n in COLLIDING) + "}]",
    ],
    ids=["set", "frozenset", "dict", "nested"],
)
def test_a_value_crafted_to_collide_in_a_hash_table_is_not_decoded(text: str) -> None:
    with pytest.raises(ValueError, match="not a plain value"):
        decode_value(text)


def test_sets_and_dicts_of_ordinary_values_still_decode() -> None:
    assert decode_value("{-1, -2, 0, 1, 2**61 - 1}".replace("2**61 - 1", str(2**61 - 1))) == {-1, -2, 0, 1, 2**61 - 1}
    assert len(decode_value("{" + ", ".join(map(str, range(5000))) + "}")) == 5000  # type: ignore[arg-type]


def test_a_forged_report_line_is_read_with_the_same_guards() -> None:
    from toolenv_code.grading import _Results

    nonce = "@@n@@"
    colliding = "{" + ", ".join(map(str, COLLIDING)) + "}"
    lines = [("probe", 0, 0, 0, True, "1"), ("test", 1, True, ""), ("solution", -1, False, "boom")]
    stdout = "\n".join(nonce + repr(line) for line in lines)
    stdout += f"\n{nonce}{colliding}\n{nonce}('probe', 0, 1, 0, True, {colliding})\n{nonce}__import__('os')"
    results = _Results(stdout, nonce)
    assert results.probes == {(0, 0): (0, True, "1")}
    assert results.lines == [("test", 1, True, ""), ("solution", -1, False, "boom")]


@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
def test_the_function_a_prompt_declares_is_the_solution_s_without_entry_points(split: bool) -> None:
    """A HumanEval-style spec that leaves `entry_points` out: the function the prompt only
    declares (signature and docstring) is the one the answer writes, and the tests see the
    answer's; a helper the prompt defines stays the prompt's."""
    prefix = 'def helper(x):\n    return x\n\ndef add(a, b):\n    """Add a and b."""\n'
    spec = TestSpec(tests=["assert add(1, 2) == 3", "assert helper(add(2, 2)) == 4"], solution_prefix=prefix)
    spec.split_tests = split
    assert run_tests("    return helper(a) + b\n", spec).passed == [True, True]
    hack = "def helper(x):\n    return 4\n\ndef add(a, b):\n    return 3\n"
    assert run_tests(hack, spec).passed == [True, False]


#: A huge int meets a Decimal on the host: converting the int costs time quadratic in its size
#: (~0.3 s for 10**150000, once per element of a list of Decimals an `in` walks through).
HUGE = 1 << 500_000


@pytest.mark.parametrize(
    ("test", "values"),
    [
        ("assert f(1) == g(2)", {0: Decimal(1), 1: HUGE}),
        ("assert f(1) == g(2)", {0: HUGE, 1: Decimal(1)}),
        ("assert g(2) in f(1)", {0: HUGE, 1: [Decimal(n) for n in range(1000)]}),
        ("assert f(1) == g(2)", {0: {HUGE}, 1: {Decimal(HUGE % (2**61 - 1))}}),  # same hash: compared
        ("assert f(1) == g(2)", {0: [(1, HUGE)], 1: [(1, Decimal(2))]}),
        ("assert f(1) in g(2)", {0: Fraction(1, 3**20000), 1: [Decimal(n) for n in range(1000)]}),
        (f"assert f(1) in [1, {3**2000}]", {0: Decimal(1)}),  # the test's own big literal
    ],
)
def test_the_host_leaves_a_decimal_against_a_huge_number_to_the_sandbox(test: str, values: dict[int, object]) -> None:
    """The host compares only what costs it time linear in the values; a Decimal against a
    huge int or Fraction is checked in the trusted sandboxed run instead."""
    (split,), _ = split_tests((test,), "", "", ("f", "g"))
    assert split is not None and split.checks is not None
    assert split.decide(values, {}) is None


def test_the_host_still_decides_numbers_it_compares_cheaply() -> None:
    (split,), _ = split_tests(("assert f(1) == g(2)",), "", "", ("f", "g"))
    assert split is not None
    assert split.decide({0: HUGE, 1: HUGE}, {}) == (True, "")
    assert split.decide({0: Decimal("1e999999"), 1: 10**300}, {}) == (False, "AssertionError: ")
    assert split.decide({0: [Decimal(5)], 1: [5]}, {}) == (True, "")


def test_a_decimal_against_a_huge_int_is_graded_right_in_the_sandbox() -> None:
    spec = TestSpec(tests=["assert f() == g()", "assert f() == g() + 1", "assert f() in h()"])
    answer = (
        "import decimal\n"
        "def f():\n    return decimal.Decimal(3 ** 2000)\n"
        "def g():\n    return 3 ** 2000\n"
        "def h():\n    return [decimal.Decimal(n) for n in range(50)] + [3 ** 2000]\n"
    )
    report = run_tests(answer, spec)
    assert report.passed == [True, False, True], report.messages
    assert all(report.split)


@pytest.mark.parametrize("digits", [1300, 5000, 400_000])
def test_a_long_decimal_int_literal_is_not_decoded(digits: int) -> None:
    """The grader writes ints past 4,096 bits in hex: a long decimal literal is a forged line,
    and parsing it costs time quadratic in its length where the interpreter does not cap it
    (Python 3.10, or `sys.set_int_max_str_digits(0)`)."""
    import sys

    old = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else None
    if old is not None:
        sys.set_int_max_str_digits(0)
    try:
        for text in ("7" * digits, f"[1, ('a', -{'7' * digits})]", "1." + "7" * digits):
            with pytest.raises(ValueError, match="not a plain value"):
                decode_value(text)
        assert decode_value(repr("7" * digits)) == "7" * digits  # digits in a string are fine
        assert decode_value(repr([1, "a " + "7" * digits])) == [1, "a " + "7" * digits]
        assert decode_value(encode_value(3**2500)) == 3**2500
        assert decode_value(encode_value(3**20000)) == 3**20000
    finally:
        if old is not None:
            sys.set_int_max_str_digits(old)


# -- loops: recorded, called, replayed -------------------------------------------------------

#: HumanEval's tests that are loops (the calls of the solution, some on random inputs).
LOOP_TASKS = {"HumanEval/32": 0, "HumanEval/38": 0, "HumanEval/44": 6, "HumanEval/50": 0, "HumanEval/53": 5}


def _loop_tasks() -> list[Task]:
    return [t for t in humaneval_tasks() if t.id in LOOP_TASKS]


def test_every_humaneval_test_splits_and_mbpp_stays_all_split() -> None:
    for tasks, total in ((humaneval_tasks(), 1133), (mbpp_tasks(), 2922)):
        found = []
        for task in tasks:
            spec = _spec(task)
            names = _entry_points(tuple(spec.entry_points), spec.solution_prefix)
            splits, _ = split_tests(tuple(spec.tests), spec.setup, spec.solution_prefix, names)
            found += [s is not None for s in splits]
        assert len(found) == total and all(found), found.count(False)


@pytest.mark.parametrize("forge", [FRAME_FORGE, GC_FORGE], ids=["frame-walk", "gc"])
def test_a_forger_scores_zero_on_the_loop_tests(forge: str) -> None:
    """HumanEval's loops (random inputs, expected values from the prompt's helpers) are graded
    outside the solution's process too: a forger that passed them in-process passes nothing."""
    for task in _loop_tasks():
        whole = run_tests(forge, _spec(task, split_tests=False))
        assert whole.passed[LOOP_TASKS[task.id]], (task.id, whole.messages)  # the forge is real
        report = run_tests(forge, _spec(task))
        assert not report.passed[LOOP_TASKS[task.id]] and all(report.split), (task.id, report.messages)
        # (the forger's values are True: HumanEval/53's `candidate(0, 1) == 1` and `(1, 0)` pass with them)
        assert report.fraction == (2 / 6 if task.id == "HumanEval/53" else 0.0), (task.id, report.messages)


def test_the_loop_tests_pass_the_reference_and_fail_wrong_answers_as_in_process() -> None:
    wrong_bodies = {
        "HumanEval/32": "def find_zero(xs):\n    return 0.5",
        "HumanEval/38": "def decode_cyclic(s):\n    return s",
        "HumanEval/44": "def change_base(x, base):\n    return str(x) if x < 5 else '0'",
        "HumanEval/50": "def decode_shift(s):\n    return encode_shift(s)",
        "HumanEval/53": "def add(x, y):\n    return x + y if x < 700 else x - y",
    }
    for task in _loop_tasks():
        i = LOOP_TASKS[task.id]
        report = run_tests(str(task.answer), _spec(task))
        assert report.fraction == 1.0 and all(report.split), (task.id, report.messages)
        wrong = task.context["solution_prefix"] + "\n" + wrong_bodies[task.id]
        split, whole = run_tests(wrong, _spec(task)), run_tests(wrong, _spec(task, split_tests=False))
        assert not whole.passed[i] and not split.passed[i] and split.split[i], (task.id, split.messages)
        assert split.passed == whole.passed, (task.id, split.messages, whole.messages)


#: Reads the loop's expected value from its caller's variables.
LOOP_READER = """
import sys

def answer(x):
    return sys._getframe(1).f_globals.get("want")
"""


def test_a_loop_s_expected_values_are_not_in_the_solution_s_process() -> None:
    spec = TestSpec(tests=["for x in range(3):\n    want = 'secret-' + str(x * 7)\n    assert answer(x) == want"])
    assert run_tests(LOOP_READER, spec.model_copy(update={"split_tests": False})).passed == [True]
    report = run_tests(LOOP_READER, spec)
    assert report.passed == [False] and report.split == [True], report.messages
    honest = run_tests("def answer(x):\n    return 'secret-' + str(x * 7)", spec)
    assert honest.passed == [True] and honest.split == [True], honest.messages


def test_a_loop_on_unseeded_random_inputs_is_recorded_and_replayed() -> None:
    """The test's `random` is drawn by the grader (seeded per grading, the same in both of its
    runs), so the values checked are those of the inputs the solution was called with."""
    spec = TestSpec(
        tests=[
            "import random\nfor _ in range(50):\n    xs = [random.randint(-9, 9) for _ in range(random.randint(0, 6))]"
            "\n    got = total(list(xs))\n    assert got == sum(xs), (got, xs)",
            "import random\nfor n in range(20):\n    s = ''.join(random.choice('ab') for _ in range(n))\n"
            "    assert sorted(letters(s)) == sorted(set(s)) and n >= 0",
        ]
    )
    honest = "def total(xs):\n    return sum(xs)\ndef letters(s):\n    return (c for c in set(s))"
    report = run_tests(honest, spec)
    assert report.passed == [True, True] and report.split == [True, True], report.messages
    wrong = "def total(xs):\n    return sum(x for x in xs if x > -9)\ndef letters(s):\n    return iter(s[:1])"
    report = run_tests(wrong, spec)
    assert report.passed == [False, False] and report.split == [True, True], report.messages


def test_a_loop_the_replay_cannot_reproduce_runs_whole() -> None:
    """Loops whose inputs depend on the solution's outputs, that hand it an object they keep (it
    could change it), whose inputs are not plain data or not reproducible from `random`'s seed
    run whole in the solution's process, as before, and pass as they did there."""
    spec = TestSpec(
        tests=[
            "x = 1\nfor _ in range(3):\n    x = double(x)\n    assert x > 0",  # inputs from outputs
            "for n in range(3):\n    xs = [n, 1]\n    assert sort_in_place(xs) == xs",  # the same object
            "import fractions\nfor m in range(1, 3):\n    assert double(fractions.Fraction(1, m)) == 2 / m",
            "import os\nfor _ in range(2):\n    b = os.urandom(4)\n    assert double(b) == b + b",  # not seeded
            "class Box:\n    pass\nfor n in range(2):\n    assert double(n) == 2 * n",  # a class statement
            "for j in range(2):\n    assert double(Ellipsis) is Ellipsis",  # not plain data
            "ys = [0, 2, 4]\nfor _ in range(3):\n    assert double(len(ys) - 1) == ys.pop()",  # checks change inputs
            "for k in range(3):\n    assert double(k) == 2 * k",
        ]
    )
    honest = (
        "def double(x):\n    return x if x is Ellipsis else x + x if isinstance(x, bytes) else 2 * x\n"
        "def sort_in_place(x):\n    x.sort()\n    return x"
    )
    report = run_tests(honest, spec)
    assert report.passed == [True] * 8, report.messages
    assert report.split == [False, False, True, False, False, False, False, True]


def test_a_truth_test_takes_a_value_that_is_not_plain_data_as_python_does() -> None:
    """`assert f(x)` and `assert not f(x)` ask only whether the value is true: a `re.Match` (the
    reference solutions of sanitized MBPP 737, 787 and 794 return one), an object of the
    solution's own class or a generator passes or fails them as in Python, split or not."""
    spec = TestSpec(
        tests=[
            "assert vowel('annie')",
            "assert not vowel('dawood')",
            "assert vowel('Else') and vowel('id')",
            "assert (vowel('x') or vowel('ant')) and not (vowel('b') or vowel('c'))",
            "assert not thing(0) and thing(1)",
            "assert gen(1) if gen(0) else False",
        ]
    )
    answer = (
        "import re\ndef vowel(s):\n    return re.match('[aeiouAEIOU]', s)\n"
        "class T:\n    def __init__(self, v):\n        self.v = v\n"
        "    def __bool__(self):\n        return bool(self.v)\n"
        "def thing(v):\n    return T(v)\n"
        "def gen(n):\n    return (i for i in range(n))\n"
    )
    for split in (True, False):
        report = run_tests(answer, spec.model_copy(update={"split_tests": split}))
        assert report.passed == [True] * 6, (split, report.messages)
    assert all(run_tests(answer, spec).split)
    wrong = answer.replace("re.match('[aeiouAEIOU]', s)", "re.match('[a-z]', s)")
    assert run_tests(wrong, spec).passed == [True, False, False, False, True, True]
    for task_id in ("MBPP/737", "MBPP/787", "MBPP/794"):
        task = next(t for t in mbpp_tasks("sanitized") if t.id == task_id)
        report = run_tests(str(task.answer), _spec(task))
        assert report.fraction == 1.0 and all(report.split), (task_id, report.messages)
