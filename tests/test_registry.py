"""Entry-point discovery against real distributions built and pip-installed into a temp dir."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

PLUGIN = '''
from pydantic import BaseModel
import toolenv

class Shout(toolenv.Tool):
    """Upper-case a text."""
    name = "shout"
    class Args(BaseModel):
        text: str
    async def run(self, args, ctx):
        return toolenv.ToolResult(text=args.text.upper() + "!")

def make_env(**kw):
    kw.setdefault("tasks", [{"id": "a", "question": "shout hi", "answer": "HI!"}])
    return toolenv.ToolEnv(tools=[Shout()], **kw)
'''


def build_wheel(out: Path, dist: str, modules: dict[str, str], entry_points: dict[str, dict[str, str]]) -> Path:
    """Write a minimal valid wheel (PEP 427) by hand so the test needs no build backend or network."""
    files: dict[str, bytes] = {f"{m}.py": src.encode() for m, src in modules.items()}
    info = f"{dist.replace('-', '_')}-1.0.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    eps = "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) for g, items in entry_points.items())
    files[f"{info}/entry_points.txt"] = eps.encode()
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out / f"{dist.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("plugins")
    wheels = [
        build_wheel(
            tmp,
            "shout-plugin",
            {"shout_plugin": PLUGIN},
            {
                "toolenv.tools": {"shout": "shout_plugin:Shout"},
                "toolenv.envs": {"Shout-v0": "shout_plugin:make_env"},
            },
        ),
        build_wheel(
            tmp,
            "broken-plugin",
            {"broken_plugin": "raise ImportError('missing dependency frobnicate')\n"},
            {"toolenv.tools": {"broken": "broken_plugin:Tool"}},
        ),
        build_wheel(
            tmp,
            "copycat-plugin",
            {"copycat_plugin": PLUGIN},
            {"toolenv.tools": {"twin": "copycat_plugin:Shout"}},
        ),
        build_wheel(
            tmp,
            "copycat-two",
            {"copycat_two": PLUGIN},
            {"toolenv.tools": {"twin": "copycat_two:Shout"}},
        ),
    ]
    target = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            *map(str, wheels),
        ],
        check=True,
    )
    return target


def run_py(site: Path, code: str) -> dict:  # type: ignore[type-arg]
    env_path = {"PYTHONPATH": str(site)}
    import os

    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env_path},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_listing_imports_no_plugin_module(site: Path) -> None:
    res = run_py(
        site,
        """
        import json, sys, toolenv
        from toolenv.registry import entries
        names = [(e.name, e.dist) for e in entries("tools")]
        print(json.dumps({"names": names, "imported": [m for m in sys.modules if m.endswith("_plugin")]}))
        """,
    )
    assert ["shout", "shout-plugin 1.0"] in res["names"]
    assert ["broken", "broken-plugin 1.0"] in res["names"]
    assert res["imported"] == []


def test_plugin_tool_is_discovered_and_callable(site: Path) -> None:
    res = run_py(
        site,
        """
        import asyncio, json, toolenv
        from toolenv import ToolContext
        t = toolenv.load_tool("shout")
        r = asyncio.run(t.run(t.Args(text="hi"), ToolContext(task=toolenv.Task())))
        print(json.dumps({"text": r.text, "schema": t.schema()["function"]["name"]}))
        """,
    )
    assert res == {"text": "HI!", "schema": "shout"}


def test_plugin_env_registered_with_gymnasium(site: Path) -> None:
    res = run_py(
        site,
        """
        import json, toolenv, gymnasium as gym
        env = gym.make("toolenv/Shout-v0")
        env.reset(seed=0)
        obs, r, term, trunc, info = env.step('<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>')
        obs2, r2, *_ = env.step("<answer>HI!</answer>")
        print(json.dumps({"obs": obs, "reward": r2}))
        """,
    )
    assert res == {"obs": "<tool_response>\nHI!\n</tool_response>", "reward": 1.0}


def test_broken_and_duplicate_plugins_give_clear_errors(site: Path) -> None:
    res = run_py(
        site,
        """
        import json, toolenv
        from toolenv.registry import PluginError, load_tool, entries
        errs = {}
        for name in ["broken", "twin", "missing"]:
            try:
                load_tool(name)
            except PluginError as e:
                errs[name] = str(e)
        errs["still_works"] = load_tool("shout").name
        print(json.dumps(errs))
        """,
    )
    assert "broken-plugin 1.0" in res["broken"] and "missing dependency frobnicate" in res["broken"]
    assert "provided by 2 distributions" in res["twin"]
    assert "copycat-plugin 1.0" in res["twin"] and "copycat-two 1.0" in res["twin"]
    assert "no tool named 'missing'" in res["missing"]
    assert res["still_works"] == "shout"


def test_import_toolenv_is_lazy() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, toolenv; heavy = ('gymnasium', 'numpy', 'pydantic', 'httpx', 'torch', 'verl'); "
            "print(sorted(m for m in heavy if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_gym_registration_works_in_either_import_order() -> None:
    code = "import {a}, {b}, gymnasium as gym; print('toolenv/ToolEnv-v0' in gym.registry)"
    for a, b in [("toolenv", "gymnasium"), ("gymnasium", "toolenv")]:
        out = subprocess.run([sys.executable, "-c", code.format(a=a, b=b)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "True"
