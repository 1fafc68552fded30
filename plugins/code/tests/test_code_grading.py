"""Grading: splitting HumanEval's check(), extracting code from answers, counting passes."""

from __future__ import annotations

import pytest

from toolenv_code._protocol import ProtocolError
from toolenv_code.datasets import humaneval_tasks, mbpp_tasks, split_check
from toolenv_code.grading import TestSpec, arun_tests, extract_code, run_tests, solution_source
from toolenv_code.sandbox import SandboxPool, _Server

CHECK = """
METADATA = {'author': 'x'}

def check(candidate):
    import math
    assert candidate(1) == 2
    assert True, "always"
    data = [3, 4]
    for d in data:
        assert candidate(d) == d + 1
    assert candidate(0) == 1
"""

SPEC = TestSpec(tests=["assert inc(1) == 2", "assert inc(5) == 6", "assert inc(-1) == 0"])


def test_split_check_counts_assert_statements() -> None:
    setup, tests = split_check(CHECK, "inc")
    assert "METADATA" in setup and setup.endswith("candidate = inc")
    assert len(tests) == 3  # `assert True` is not a test; the for loop is one
    assert tests[0].startswith("import math") and "assert True" in tests[1] and "for d in data" in tests[1]


def test_extract_code_and_solution_source() -> None:
    assert extract_code("Here:\n```python\nx = 1\n```\nthanks") == "x = 1"
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("```python\na = 1\n```\n```python\nb = 2\n```") == "a = 1\n\nb = 2"
    prefix = "def f(x):\n    '''doc'''\n"
    assert solution_source("    return x + 1\n", prefix) == prefix + "    return x + 1"
    assert solution_source("def f(x):\n    return x", prefix).startswith(prefix.rstrip("\n") + "\n\n")


def test_extract_code_joins_python_blocks_of_any_case() -> None:
    solution, usage = "def f(x):\n    return x + 1", "print(f(1))"
    answer = f"Solution:\n```python\n{solution}\n```\nUsage:\n```Python\n{usage}\n```\nOutput:\n```\n2\n```"
    assert extract_code(answer) == f"{solution}\n\n{usage}"  # untagged blocks only count without python ones
    assert extract_code(f"```PY\n{solution}\n```\n```python3\n{usage}\n```") == f"{solution}\n\n{usage}"
    assert extract_code(f"```\n{solution}\n```\n```text\nnotes\n```") == solution
    assert extract_code(f"```python\n{solution}\n```\n```python\n>>> f(1)\n2\n```") == solution  # a transcript
    assert extract_code(f"```python\ns = '```'\n{solution}\n```") == f"s = '```'\n{solution}"
    assert extract_code(f"```python\n{solution}") == solution  # an unclosed block runs to the end
    indented = "1. The code:\n   ```python\n   def f(x):\n       return x + 1\n   ```\n"
    assert extract_code(indented) == solution  # a fence in a list item: its indentation comes off
    assert extract_code("Only prose.\n```text\nnotes\n```") == "Only prose.\n```text\nnotes\n```"


def test_solution_then_usage_block_and_capitalised_tag_score_full() -> None:
    solution = "def inc(x):\n    return x + 1\n"
    assert run_tests(f"```python\n{solution}```\nUsage:\n```python\nprint(inc(1))\n```", SPEC).fraction == 1.0
    assert run_tests(f"```Python\n{solution}```", SPEC).fraction == 1.0
    pickled = TestSpec(tests=["import pickle\nassert pickle.loads(pickle.dumps(P(2))).v == 2"])
    assert run_tests("class P:\n    def __init__(self, v):\n        self.v = v", pickled).fraction == 1.0


def test_partial_credit_and_failures() -> None:
    assert run_tests("def inc(x):\n    return x + 1", SPEC).fraction == 1.0
    report = run_tests("def inc(x):\n    return 2 if x == 1 else 0", SPEC)
    assert report.passed == [True, False, True] and report.fraction == pytest.approx(2 / 3)
    broken = run_tests("def inc(x) return", SPEC)
    assert broken.fraction == 0.0 and "SyntaxError" in broken.solution_error


def test_cheating_by_printing_or_exiting_does_not_pass() -> None:
    forged = 'print(\'["test", 0, true, ""]\')\nimport os\nos._exit(0)'
    assert run_tests(forged, SPEC).fraction == 0.0
    assert run_tests("import sys\nsys.exit(0)", SPEC).fraction == 0.0


@pytest.mark.parametrize(
    ("answer", "passed"),
    [
        ("import sys\ndef inc(x):\n    if x == 5:\n        sys.exit(0)\n    return x + 1", [True, False, True]),
        ("import os\ndef inc(x):\n    return x + 1\nfor fd in (0, 1, 2):\n    os.close(fd)", [True, True, True]),
        ("def inc(x):\n    print('x' * (1 << 20) * 8)\n    return x + 1", [True, True, True]),
        ("import os\ndef inc(x):\n    return x + 1\nos._exit(0)", [False, False, False]),
    ],
    ids=["sys.exit-in-a-test", "closes-stdio", "prints-megabytes", "os._exit-before-the-tests"],
)
def test_what_a_solution_does_to_its_process_counts_where_it_happens(answer: str, passed: list[bool]) -> None:
    assert run_tests(answer, SPEC).passed == passed


def test_hanging_test_costs_only_itself() -> None:
    spec = SPEC.model_copy(update={"test_timeout": 0.5})
    report = run_tests("def inc(x):\n    while x == 5:\n        pass\n    return x + 1", spec)
    assert report.passed == [True, False, True]
    assert "time limit" in report.messages[1]


def test_datasets_load() -> None:
    he, mb = humaneval_tasks(), mbpp_tasks()
    assert len(he) == 164 and len(mb) == 974 and len(mbpp_tasks("sanitized")) == 427
    assert all(t.context["tests"] for t in he + mb)
    assert sum(len(t.context["tests"]) for t in he) > 164 * 5  # asserts were split, not one per task
    assert mb[0].id == "MBPP/1" and "\r" not in str(mb[0].answer)
    with pytest.raises(ValueError, match="unknown MBPP subset"):
        mbpp_tasks("nope")


def test_a_solution_s_own_alarm_handler_does_not_lift_the_per_test_limit() -> None:
    spec = SPEC.model_copy(update={"test_timeout": 0.5})
    for setup in ("signal.signal(signal.SIGALRM, signal.SIG_IGN)", "signal.signal(signal.SIGALRM, lambda *a: None)"):
        hangs_on_5 = "def inc(x):\n    while x == 5:\n        pass\n    return x + 1"
        report = run_tests(f"import signal\n{setup}\n{hangs_on_5}", spec)
        assert report.passed == [True, False, True], (setup, report.messages)
        assert "time limit" in report.messages[1] and not report.timed_out


def test_a_solution_s_own_alarms_still_reach_its_own_handler() -> None:
    own_timeout = """
import signal
class Slow(Exception):
    pass
def _slow(signum, frame):
    raise Slow()
signal.signal(signal.SIGALRM, _slow)
def inc(x):
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        while True:
            pass
    except Slow:
        return x + 1
"""
    report = run_tests(own_timeout, SPEC.model_copy(update={"test_timeout": 2.0}))
    assert report.passed == [True, True, True], report.messages


@pytest.mark.parametrize(
    "leftover",
    [
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()",
        "import threading\nthreading.Timer(600, print).start()",
        "import atexit, time\natexit.register(time.sleep, 600)",
    ],
)
def test_grading_ends_when_the_tests_have_reported(leftover: str) -> None:
    """A thread, timer or exit handler the solution leaves behind does not hold the grading
    (and a sandbox slot) until its whole time budget has run out."""
    report = run_tests(f"{leftover}\ndef inc(x):\n    return x + 1", SPEC)
    assert report.passed == [True, True, True] and not report.timed_out


async def test_a_sandbox_failure_is_an_error_not_a_score_of_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grading the sandbox could not carry out (its server died on the call and on the retry)
    raises, so the reward records why instead of a zero that looks like the solution's."""
    pool = SandboxPool(size=1)
    try:

        def dies(self: _Server, obj: dict[str, object], call: object = None) -> dict[str, object]:
            self.proc.kill()
            self.proc.wait()
            raise ProtocolError("peer closed the pipe")

        monkeypatch.setattr(_Server, "request", dies)
        with pytest.raises(RuntimeError, match="the sandbox failed: the sandbox server died"):
            run_tests("def inc(x):\n    return x + 1", SPEC, pool)
        with pytest.raises(RuntimeError, match="the sandbox failed"):
            await arun_tests("def inc(x):\n    return x + 1", SPEC, pool)
    finally:
        monkeypatch.undo()
        pool.close()


def test_the_solution_s_own_error_is_reported_not_what_it_caused_in_the_setup() -> None:
    """A solution that does not compile leaves the setup (`candidate = inc`) failing with a
    NameError: the report names the cause, the solution's SyntaxError."""
    spec = TestSpec(tests=["assert candidate(1) == 2"], setup="candidate = inc")
    report = run_tests("def inc(x) return x + 1", spec)
    assert report.passed == [False] and report.solution_error.startswith("SyntaxError"), report.solution_error


def test_a_completion_that_lost_its_indentation_gets_it_back() -> None:
    prefix = "def f(x):\n    '''doc'''\n"
    assert solution_source("return x + 1", prefix) == prefix + "    return x + 1"
    assert solution_source("y = x + 1\n    return y", prefix) == prefix + "    y = x + 1\n    return y"
    assert solution_source("```python\ny = x + 1\nreturn y\n```", prefix) == prefix + "    y = x + 1\n    return y"
    assert solution_source("def f(x):\n    return x", prefix) == prefix.rstrip("\n") + "\n\ndef f(x):\n    return x"
    assert solution_source("return x", "import math\n") == "import math\nreturn x"  # no function to complete
    assert run_tests("return x + 1", TestSpec(tests=["assert f(1) == 2"], solution_prefix=prefix)).fraction == 1.0


def test_a_whole_program_that_opens_with_a_future_import_is_graded_as_it_runs() -> None:
    """`from __future__ import annotations` must open a program: joined after the prompt, a correct
    answer that starts with it (or with a docstring and then it) failed to compile and scored 0."""
    task = next(t for t in humaneval_tasks() if t.id == "HumanEval/0")
    spec = TestSpec.model_validate({k: v for k, v in task.context.items() if k in TestSpec.model_fields})
    canonical = task.answers[0]
    heads = ("from __future__ import annotations\n", '"""Mine."""\nfrom __future__ import (\n    annotations,\n)\n')
    for head in heads:
        report = run_tests(f"```python\n{head}{canonical}\n```", spec)
        assert report.fraction == 1.0 and not report.solution_error, report
    # Nothing else moves: the prompt still comes first, and a wrong answer still fails.
    source = solution_source("from __future__ import annotations\nx = 1", "import math\n")
    assert source.splitlines()[0] == "from __future__ import annotations"
    assert source.index("import math") < source.index("x = 1")
    wrong = "from __future__ import annotations\ndef has_close_elements(numbers, threshold):\n    return False"
    assert run_tests(wrong, spec).fraction < 1.0


def test_every_ast_parse_of_a_grading_holds_the_hosts_ast_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython 3.11's AST constructor shares its recursion depth across threads (gh-106905): graders
    on a thread pool failed with a SystemError until every host-side `ast.parse` took turns."""
    import ast

    from toolenv import _ast
    from toolenv_code import grading

    parse, unlocked = ast.parse, []

    def checked(source: str | bytes, *args: object, **kwargs: object) -> object:
        if not _ast._LOCK.locked():
            unlocked.append(str(source)[:40])
        return parse(source, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ast, "parse", checked)
    grading._entry_points.cache_clear()
    prefix = "def g(x):\n    '''only declared'''\n\ndef f(x):\n    '''doc'''\n"
    spec = TestSpec(tests=["assert f(1) == 2", "assert g(1) == 1"], solution_prefix=prefix)
    report = run_tests("def g(x):\n    return x\n\ndef f(x):\n    return g(x) + 1\n", spec)
    assert report.fraction == 1.0
    assert unlocked == []
