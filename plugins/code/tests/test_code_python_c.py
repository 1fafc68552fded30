"""One-shot runs behave like `python -c`: a real `__main__`, threads and atexit at the end, whole output."""

from __future__ import annotations

from toolenv_code._server import Capture
from toolenv_code.sandbox import SandboxLimits, SandboxPool, run_code

FAILING_UNITTEST = (
    "import unittest\n"
    "class T(unittest.TestCase):\n"
    "    def test_a(self):\n"
    "        self.assertEqual(1, 2)\n"
    "unittest.main()\n"
)


def test_unittest_main_finds_the_snippets_tests() -> None:
    r = run_code(FAILING_UNITTEST)
    assert "Ran 1 test" in r.stderr and "FAILED (failures=1)" in r.stderr
    assert not r.ok and r.exit_code == 1  # as `python -c` exits after a failing unittest.main()


def test_doctest_pickle_and_a_fresh_main_per_run() -> None:
    code = (
        "import doctest, pickle, dataclasses, enum, sys\n"
        "def double(x):\n"
        "    '''\n"
        "    >>> double(2)\n"
        "    4\n"
        "    '''\n"
        "    return 2 * x\n"
        "@dataclasses.dataclass\n"
        "class P:\n"
        "    x: int\n"
        "class E(enum.Enum):\n"
        "    A = 1\n"
        "print(doctest.testmod())\n"
        "same = lambda obj: pickle.loads(pickle.dumps(obj))\n"
        "print(same(P(1)), same(E.A), same(double)(3))\n"
        "print(sys.modules['__main__'].double is double, __name__)\n"
    )
    r = run_code(code)
    assert r.ok, r.stderr
    assert r.stdout.splitlines() == ["TestResults(failed=0, attempted=1)", "P(x=1) E.A 6", "True __main__"]
    r = run_code("import sys\nprint(sorted(n for n in vars(sys.modules['__main__']) if not n.startswith('__')))")
    assert r.stdout == "['sys']\n"  # nothing left from the previous run's `__main__`


def test_multiprocessing_runs_the_snippets_functions() -> None:
    code = (
        "import multiprocessing\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "def square(x):\n"
        "    return x * x\n"
        "with multiprocessing.Pool(2) as pool:\n"
        "    print(pool.map(square, range(4)))\n"
        "with ProcessPoolExecutor(2) as ex:\n"
        "    print(list(ex.map(square, range(4))))\n"
    )
    r = run_code(code)
    assert r.ok, r.stderr
    assert r.stdout == "[0, 1, 4, 9]\n[0, 1, 4, 9]\n"


def test_threads_and_atexit_handlers_run_before_the_exit() -> None:
    code = (
        "import atexit, threading, time\n"
        "atexit.register(print, 'atexit ran')\n"
        "threading.Thread(target=lambda: (time.sleep(0.1), print('thread done'))).start()\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # not waited for\n"
        "print('main')\n"
    )
    r = run_code(code, SandboxLimits(timeout=10))
    assert r.ok and r.stdout == "main\nthread done\natexit ran\n"
    assert r.duration < 5
    r = run_code("import atexit\ndef bad():\n    raise ValueError('in atexit')\natexit.register(bad)\n")
    assert r.exit_code == 0 and "Exception ignored in atexit callback" in r.stderr and "ValueError" in r.stderr


def test_a_thread_that_never_ends_runs_into_the_timeout() -> None:
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\nprint('main')"
    r = run_code(code, SandboxLimits(timeout=0.5))
    assert r.timed_out and r.stdout == "main\n"  # `python -c` would wait for it too


def test_multibyte_character_on_the_head_tail_boundary() -> None:
    r = run_code("import sys\nsys.stdout.write('a' * 49151 + 'é' + 'b' * 100)")  # 'é' straddles byte 49152
    assert not r.truncated and r.stdout == "a" * 49151 + "é" + "b" * 100


def test_capture_decodes_whole_and_cuts_on_character_boundaries() -> None:
    text = "é" * 700  # 1,400 bytes, every other one a continuation byte
    whole = Capture(2000)
    whole.add(text.encode())
    assert whole.text() == text  # head and tail meet inside a character: decoded as one piece
    for cap in (1000, 1001, 1002, 1003):
        capture = Capture(cap)
        capture.add(("x" + text + "€𝄞" * 50).encode())
        shown = capture.text()
        head, marker, tail = shown.partition("\n...[")
        assert "\ufffd" not in shown and marker, shown
        omitted = int(tail.split(" bytes truncated]...\n")[0])
        kept = len(head.encode()) + len(tail.split("]...\n", 1)[1].encode())
        assert kept + omitted == capture.total  # the count covers the bytes dropped at the cut


def test_annotations_are_evaluated_as_in_python_c() -> None:
    """The sandbox's own `from __future__ import annotations` must not leak into the code."""
    code = "def f(x: int) -> str: ...\nprint(f.__annotations__)\n"
    assert run_code(code).stdout == "{'x': <class 'int'>, 'return': <class 'str'>}\n"
    pool = SandboxPool(size=1)
    try:
        assert pool.run(code, session="ann").stdout == "{'x': <class 'int'>, 'return': <class 'str'>}\n"
    finally:
        pool.close()


def test_code_larger_than_a_pipe_arrives_whole() -> None:
    body = "".join(f"v{i} = {i}\n" for i in range(30000))  # ~300 KB: many reads of the go pipe
    r = run_code(body + "print(v0 + v29999)")
    assert r.ok, r.stderr
    assert r.stdout == "29999\n"


def test_home_tmpdir_are_the_work_dir_for_the_code_and_its_processes() -> None:
    code = (
        "import os, subprocess, tempfile\n"
        "print(os.environ['HOME'] == os.environ['TMPDIR'] == os.getcwd() == tempfile.gettempdir())\n"
        "print(subprocess.run(['sh', '-c', 'echo $HOME $TMPDIR'], capture_output=True, text=True).stdout.split()"
        " == [os.getcwd()] * 2)\n"
        "print(sorted(set(os.environ) - {'HOME', 'TMPDIR'}) == sorted(%r))\n"
    )
    from toolenv_code._child import CHILD_ENV

    code %= (sorted(CHILD_ENV),)
    first, second = run_code(code), run_code(code)
    assert first.stdout == second.stdout == "True\nTrue\nTrue\n", (first, second)
