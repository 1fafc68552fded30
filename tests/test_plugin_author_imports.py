"""Documented `toolenv.<submodule>.X` calls work after a plain `import toolenv`."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_submodules_the_docs_use_are_reachable_after_import_toolenv() -> None:
    out = _run(
        "import toolenv\n"
        "print('exact_match' in toolenv.rewards.reward_names())\n"
        "print(callable(toolenv.registry.resolve_tools))\n"
        "print(callable(toolenv.parsers.get_parser))\n"
    )
    assert out.splitlines() == ["True", "True", "True"]


def test_import_toolenv_still_imports_no_submodule_eagerly() -> None:
    out = _run(
        "import sys, toolenv; print(sorted(m for m in ('toolenv.rewards', 'toolenv.registry') if m in sys.modules))"
    )
    assert out == "[]"


def test_an_unknown_attribute_is_still_an_attribute_error() -> None:
    out = _run(
        "import toolenv\n"
        "try:\n    toolenv.no_such_thing\nexcept AttributeError as e:\n    print(e)\n"
        "print(hasattr(toolenv, '__wrapped__'))\n"
    )
    assert out.splitlines() == ["module 'toolenv' has no attribute 'no_such_thing'", "False"]
