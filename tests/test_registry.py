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

LOUD = Shout()  # a plugin may name a ready-made instance
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
                "toolenv.tools": {"shout": "shout_plugin:Shout", "loud": "shout_plugin:LOUD"},
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


def test_arguments_for_a_tool_plugin_that_is_an_instance_are_refused(site: Path) -> None:
    """A plugin naming a ready-made Tool instance cannot take arguments: `load_tool("loud",
    timeout=1)` (`toolenv check loud --kwargs ...`) returned the instance with them ignored."""
    res = run_py(
        site,
        """
        import json
        from toolenv.registry import PluginError, load_tool
        plain = load_tool("loud").name
        try:
            load_tool("loud", max_rows=7)
            err = None
        except PluginError as e:
            err = str(e)
        print(json.dumps({"plain": plain, "err": err}))
        """,
    )
    assert res["plain"] == "shout"
    assert res["err"] is not None and "'loud'" in res["err"] and "max_rows" in res["err"]


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


def test_gym_registration_works_when_gymnasium_is_found_off_sys_path() -> None:
    """Gymnasium found by a finder of its own (an editable install of Gymnasium, a bundler such as
    PyInstaller), not on `sys.path`: toolenv's import hook looked only on `sys.path`, found nothing,
    and never registered, so `gym.make("toolenv/...")` failed after `import toolenv, gymnasium`."""
    code = (
        "import importlib.machinery, sys\n"
        "site = [p for p in sys.path if p.endswith('site-packages')]\n"
        "sys.path[:] = [p for p in sys.path if p not in site]\n"
        "class Bundled:\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        return importlib.machinery.PathFinder.find_spec(name, site) if path is None else None\n"
        "sys.meta_path.append(Bundled)\n"
        "import toolenv, gymnasium as gym\n"
        "print(gym.__file__.startswith(tuple(site)), 'toolenv/ToolEnv-v0' in gym.registry)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


@pytest.fixture(scope="module")
def clashing_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Env plugins Gymnasium cannot register as named, and two that claim the same id."""
    tmp = tmp_path_factory.mktemp("clashing")
    wheels = [
        build_wheel(
            tmp,
            "odd-names",
            {"odd_names": PLUGIN},
            {"toolenv.envs": {"Odd Name-v0": "odd_names:make_env", "Clash": "odd_names:make_env"}},
        ),
        build_wheel(tmp, "clash-v", {"clash_v": PLUGIN}, {"toolenv.envs": {"Clash-v0": "clash_v:make_env"}}),
        build_wheel(tmp, "twin-one", {"twin_one": PLUGIN}, {"toolenv.envs": {"Twin-v0": "twin_one:make_env"}}),
        build_wheel(tmp, "twin-two", {"twin_two": PLUGIN}, {"toolenv.envs": {"Twin-v0": "twin_two:make_env"}}),
        build_wheel(tmp, "fine-env", {"fine_env": PLUGIN}, {"toolenv.envs": {"Fine-v0": "fine_env:make_env"}}),
        build_wheel(
            tmp,
            "broken-env",
            {"broken_env": "raise ImportError('missing dependency frobnicate')\n"},
            {"toolenv.envs": {"Broken-v0": "broken_env:make_env"}},
        ),
    ]
    target = tmp / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target)]
    subprocess.run([*cmd, *map(str, wheels)], check=True)
    return target


@pytest.mark.parametrize("order", ["toolenv, gymnasium", "gymnasium, toolenv"])
def test_an_env_plugin_gymnasium_refuses_is_warned_of_not_fatal(clashing_site: Path, order: str) -> None:
    """A plugin's env name Gymnasium cannot register (not an id, or unversioned next to a
    versioned one) used to raise out of `import gymnasium` (or `import toolenv`) itself."""
    res = run_py(
        clashing_site,
        f"""
        import json, warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            import {order}
        import gymnasium as gym
        env = gym.make("toolenv/Fine-v0")
        env.reset(seed=0)
        print(json.dumps({{
            "ids": sorted(i for i in gym.registry if i.startswith("toolenv/")),
            "warnings": [str(w.message) for w in caught],
        }}))
        """,
    )
    assert "toolenv/Fine-v0" in res["ids"] and "toolenv/ToolEnv-v0" in res["ids"]
    warned = "\n".join(res["warnings"])
    assert "'Odd Name-v0'" in warned and "odd-names 1.0" in warned
    assert "Clash" in warned


def test_an_env_id_two_distributions_claim_is_refused_by_name_at_make(clashing_site: Path) -> None:
    """Two plugins advertising the same env name: `gym.make` used to pick one silently (the
    first by distribution name); now it says which distributions clash, as `load_tool` does."""
    res = run_py(
        clashing_site,
        """
        import json, toolenv, gymnasium as gym
        errors = []
        for make in (lambda: gym.make("toolenv/Twin-v0"), lambda: gym.make_vec("toolenv/Twin-v0", num_envs=2)):
            try:
                make()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        print(json.dumps(errors))
        """,
    )
    assert len(res) == 2
    for error in res:
        assert error.startswith("PluginError") and "provided by 2 distributions" in error
        assert "twin-one 1.0" in error and "twin-two 1.0" in error


def test_unreadable_entry_points_do_not_break_importing_gymnasium(tmp_path: Path) -> None:
    """Registration runs inside `import gymnasium` (or `import toolenv`): a distribution whose
    entry_points.txt cannot be parsed used to make that import itself fail."""
    info = tmp_path / "bad_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[toolenv.envs]\nthis line has no equals sign\n")
    for order in ("toolenv, gymnasium", "gymnasium, toolenv"):
        res = run_py(
            tmp_path,
            f"""
            import json, warnings
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                import {order}
            import gymnasium as gym
            print(json.dumps([[str(w.message) for w in caught], "toolenv/ToolEnv-v0" in gym.registry]))
            """,
        )
        assert any("could not register its envs with Gymnasium" in w for w in res[0]), res
        assert res[1]  # the core ids are registered before the plugins are listed


def test_an_env_plugin_that_fails_to_import_is_a_plugin_error_naming_its_distribution(clashing_site: Path) -> None:
    """docs/plugins.md: an entry point that fails to import gives a `PluginError` naming the
    distribution. `gym.make` used to import the plugin itself and raise the bare ImportError."""
    res = run_py(
        clashing_site,
        """
        import json, toolenv, gymnasium as gym
        errors = []
        for make in (lambda: gym.make("toolenv/Broken-v0"), lambda: gym.make_vec("toolenv/Broken-v0", num_envs=2)):
            try:
                make()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        env = gym.make("toolenv/Fine-v0")
        print(json.dumps({"errors": errors, "fine": env.reset(seed=0)[1]["task_id"]}))
        """,
    )
    assert len(res["errors"]) == 2 and res["fine"] == "a"
    for error in res["errors"]:
        assert error.startswith("PluginError") and "broken-env 1.0" in error and "frobnicate" in error
