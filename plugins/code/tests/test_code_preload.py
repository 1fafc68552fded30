"""`preload`: modules the fork servers import once, so that a run's `import` of them is free."""

from __future__ import annotations

import importlib.util
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import toolenv
from toolenv.registry import resolved_tools
from toolenv_code import sandbox
from toolenv_code.sandbox import SandboxPool, get_pool, preload_names
from toolenv_code.tool import PythonTool

CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
#: Prints which of the modules are loaded before the code imports anything.
LOADED = "import sys\nprint(*(m in sys.modules for m in ('csv', 'xml.dom.minidom')))"


@pytest.fixture
def private_pools() -> Iterator[list[SandboxPool]]:
    pools: list[SandboxPool] = []
    yield pools
    for pool in pools:
        pool.close()


@pytest.fixture
def shared_pools() -> Iterator[None]:
    """Close the process-wide pools with a `preload` that a test made (the plain one stays)."""
    before = set(sandbox._POOLS)
    yield
    for key in set(sandbox._POOLS) - before:
        sandbox._POOLS.pop(key).close()


def test_a_preloaded_module_is_loaded_before_the_code_imports_it(private_pools: list[SandboxPool]) -> None:
    plain = SandboxPool(size=1)
    loaded = SandboxPool(size=1, preload=["csv", "xml.dom.minidom"])
    private_pools += [plain, loaded]
    assert plain.run(LOADED).stdout == "False False\n"
    assert loaded.run(LOADED).stdout == "True True\n"
    # and it works as the module itself, in one-shot runs and in a session's every call
    assert loaded.run("import csv, io\ncsv.writer(w := io.StringIO()).writerow([1, 2])\nprint(w.getvalue())").ok
    assert loaded.run(LOADED, session="s").stdout == "True True\n"
    assert loaded.run("import csv\nprint(csv.QUOTE_ALL)", session="s").stdout == "1\n"
    assert [s["preload"] for s in loaded.stats()] == [["csv", "xml.dom.minidom"]]


def test_preload_names_are_read_from_a_string_or_a_list_each_once_in_order() -> None:
    assert preload_names("csv, xml.dom , csv,,") == ("csv", "xml.dom")
    assert preload_names(["xml.dom", "csv", "xml.dom"]) == ("xml.dom", "csv")
    assert preload_names(()) == () == preload_names("")


@pytest.mark.parametrize("bad", ["csv;import os", "1csv", "csv.", "../csv"])
def test_a_preload_that_is_not_a_module_name_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a module name"):
        SandboxPool(preload=[bad])


def test_a_preload_module_this_python_lacks_is_refused_at_once_with_its_name() -> None:
    assert importlib.util.find_spec("toolenv_no_such_module") is None
    with pytest.raises(ValueError, match="no module named 'toolenv_no_such_module' in this Python"):
        SandboxPool(preload="csv, toolenv_no_such_module.sub")


def test_a_module_that_fails_to_import_in_the_server_is_an_error_observation_and_the_env_goes_on(
    private_pools: list[SandboxPool],
) -> None:
    """Found here (its package exists) yet failing in the server: the tool's error says why,
    call after call, and the episode goes on."""
    pool = SandboxPool(size=1, preload="json.no_such_submodule")
    private_pools.append(pool)
    failed = "could not pre-import 'json.no_such_submodule': ModuleNotFoundError"
    with pytest.raises(RuntimeError, match=re.escape(failed)):
        pool.run("print(1)")
    env = toolenv.ToolEnv(tools=[PythonTool(pool=pool, preload="json.no_such_submodule")], tasks=[{"question": "q"}])
    env.reset(seed=0)
    for _ in range(2):
        obs, _, terminated, truncated, info = env.step(CALL)
        assert not (terminated or truncated)
        assert "could not pre-import 'json.no_such_submodule'" in obs, obs
        assert info["tool_results"][0].is_error
    env.close()


def test_a_module_that_starts_a_thread_at_import_is_refused(tmp_path: Path) -> None:
    """A fork copies only the forking thread: children would hold the module without its thread."""
    (tmp_path / "starts_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    (tmp_path / "quiet.py").write_text("VALUE = 1\n")
    root = Path(sandbox.__file__).resolve().parent.parent
    script = (
        f"import sys; sys.path[:0] = [{str(root)!r}, {str(tmp_path)!r}]\n"
        "from toolenv_code._server import preload_modules\n"
        "print(preload_modules(['quiet']))\n"
        "print(preload_modules(['quiet', 'starts_thread']))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    quiet, threaded = out.stdout.splitlines()
    assert quiet == "None"
    assert "pre-importing quiet, starts_thread started 1 thread(s)" in threaded, threaded


def test_the_process_wide_pool_is_one_per_preload(shared_pools: None) -> None:
    csv_pool = get_pool("csv")
    assert get_pool(["csv"]) is csv_pool and get_pool(" csv,") is csv_pool
    assert get_pool() is not csv_pool and get_pool().preload == ()
    assert csv_pool.preload == ("csv",)
    assert pickle.loads(pickle.dumps(csv_pool)) is csv_pool  # a copy in this process is that pool
    assert csv_pool.run(LOADED).stdout == "True False\n"


def test_a_private_pool_copies_with_its_preload(private_pools: list[SandboxPool]) -> None:
    pool = SandboxPool(size=1, preload="csv")
    copy = pickle.loads(pickle.dumps(pool))
    private_pools += [pool, copy]
    assert copy is not pool and copy.preload == ("csv",) and copy.size == 1
    assert copy.run(LOADED).stdout == "True False\n"


def test_the_python_tool_runs_on_the_pool_for_its_preload(shared_pools: None) -> None:
    tool = PythonTool(preload="csv")
    assert tool.preload == ("csv",) and tool.pool is get_pool("csv")
    assert PythonTool().pool is get_pool()
    copied = pickle.loads(pickle.dumps(tool))
    assert copied.pool is get_pool("csv")


def test_a_pool_given_to_the_tool_must_preload_what_the_tool_asks(private_pools: list[SandboxPool]) -> None:
    pool = SandboxPool(size=1, preload="csv")
    private_pools.append(pool)
    assert PythonTool(pool=pool, preload="csv").pool is pool
    with pytest.raises(ValueError, match=re.escape("does not pre-import xml.dom; pass preload= to that SandboxPool")):
        PythonTool(pool=pool, preload="csv, xml.dom")


@pytest.mark.parametrize("env_id", ["toolenv/MBPP-v0", "toolenv/HumanEval-v0"])
def test_the_code_envs_take_preload_as_an_env_arg(env_id: str, shared_pools: None) -> None:
    env = gym.make(env_id, preload="csv,xml.dom.minidom", limit=1)
    try:
        inner = env.unwrapped
        assert isinstance(inner, toolenv.ToolEnv)
        (tool,) = inner.tools
        assert isinstance(tool, PythonTool) and tool.preload == ("csv", "xml.dom.minidom")
        inner.reset(seed=0)
        obs = inner.step(f"```python\n{LOADED}\n```")[0]
        assert "True True" in obs, obs
    finally:
        env.close()
    with pytest.raises(ValueError, match="preload= applies to the env's own python tool"):
        gym.make(env_id, preload="csv", tools=[PythonTool()])


@pytest.mark.skipif(importlib.util.find_spec("sympy") is None, reason="sympy is not installed (pip install sympy)")
def test_sympy_preloaded_for_math_code(shared_pools: None) -> None:
    """The ToRL case: sympy in nearly every block. Preloaded, the code finds it imported."""
    env = toolenv.ToolEnv(tools=[PythonTool(preload="sympy")], tasks=[{"question": "q"}], parser="codeblock")
    try:
        env.reset(seed=0)
        code = "import sys\nprint('sympy' in sys.modules)\nimport sympy\nprint(sympy.factorint(360))"
        obs = env.step(f"```python\n{code}\n```")[0]
        assert "True\n{2: 3, 3: 2, 5: 1}" in obs, obs
    finally:
        env.close()


def test_a_tools_entry_gives_the_python_tool_its_preload(shared_pools: None) -> None:
    """What `--env-arg 'tools=[{"tool": "python", "tool_kwargs": {"preload": "sympy"}}]'` builds."""
    entry = {"tool": "python", "tool_kwargs": {"preload": "csv", "stateful": True}}
    (tool,) = resolved_tools({"tools": [entry]})["tools"]
    assert isinstance(tool, PythonTool) and tool.preload == ("csv",) and tool.stateful
    env = toolenv.ToolEnv(tools=[entry], tasks=[{"question": "q"}], parser="codeblock")
    try:
        env.reset(seed=0)
        assert "True False" in env.step(f"```python\n{LOADED}\n```")[0]
    finally:
        env.close()
