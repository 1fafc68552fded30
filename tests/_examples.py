"""The example scripts as modules, loaded once per test process (tests import this helper)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@functools.cache
def load_example(name: str) -> ModuleType:
    """`examples/NAME.py` as the module `NAME` (registered in sys.modules, as an import would:
    gym ids of the form `NAME:ns/Env-v0` and `NAME:Agent` specs then find it)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
