"""toolenv-code: a sandboxed `python` tool and the HumanEval / MBPP environments.

Names are loaded on first use so that the fork server, which imports
`toolenv_code._server`, starts without importing toolenv or Pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "ExecResult": "toolenv_code.sandbox",
    "IsolationReport": "toolenv_code.isolation",
    "PythonTool": "toolenv_code.tool",
    "SandboxLimits": "toolenv_code.sandbox",
    "SandboxPool": "toolenv_code.sandbox",
    "TestsPassed": "toolenv_code.reward",
    "arun_code": "toolenv_code.sandbox",
    "extract_code": "toolenv_code.grading",
    "get_pool": "toolenv_code.sandbox",
    "isolation_report": "toolenv_code.isolation",
    "make_humaneval_env": "toolenv_code.envs",
    "make_mbpp_env": "toolenv_code.envs",
    "run_code": "toolenv_code.sandbox",
    "run_tests": "toolenv_code.grading",
    "solution_source": "toolenv_code.grading",
}

__all__ = [
    "ExecResult",
    "IsolationReport",
    "PythonTool",
    "SandboxLimits",
    "SandboxPool",
    "TestsPassed",
    "arun_code",
    "extract_code",
    "get_pool",
    "isolation_report",
    "make_humaneval_env",
    "make_mbpp_env",
    "run_code",
    "run_tests",
    "solution_source",
]

if TYPE_CHECKING:
    from toolenv_code.envs import make_humaneval_env, make_mbpp_env
    from toolenv_code.grading import extract_code, run_tests, solution_source
    from toolenv_code.isolation import IsolationReport, isolation_report
    from toolenv_code.reward import TestsPassed
    from toolenv_code.sandbox import ExecResult, SandboxLimits, SandboxPool, arun_code, get_pool, run_code
    from toolenv_code.tool import PythonTool


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolenv_code' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
