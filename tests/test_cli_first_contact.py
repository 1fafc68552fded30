"""A user's first commands (`toolenv --help`, `list`, `check`, `doctor`), as real `toolenv`
processes: with a broken plugin installed, with an env that is not under `toolenv/`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLENV = str(Path(sys.executable).parent / "toolenv")


def _toolenv(*args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run([TOOLENV, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def broken_plugin(tmp_path: Path) -> Path:
    """A distribution whose package raises on import, advertising a tool, an env, a doctor
    report and a command (in a submodule of that package)."""
    pkg = tmp_path / "brokenplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('broken on import')\n")
    (pkg / "cmd.py").write_text("HELP = 'A command of a broken plugin.'\n")
    info = tmp_path / "brokenplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[toolenv.tools]\nbroke = brokenplug:Tool\n"
        "[toolenv.envs]\nBroke-v0 = brokenplug:make_env\n"
        "[toolenv.doctor]\nbroke = brokenplug:report\n"
        "[toolenv.commands]\nbroke = brokenplug.cmd\n"
    )
    return tmp_path


@pytest.mark.parametrize("argv", [["--help"], []])
def test_help_lists_commands_though_a_plugin_package_is_broken(broken_plugin: Path, argv: list[str]) -> None:
    """`toolenv --help` reads each command's HELP from its source without importing anything:
    a plugin whose package raises on import is listed, and the others still are."""
    out = _toolenv(*argv, path=broken_plugin)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == (0 if argv else 2)
    text = " ".join(out.stdout.split())
    assert "broke A command of a broken plugin." in text
    assert "check Check an env" in text


def test_a_broken_plugin_command_is_one_error_line(broken_plugin: Path) -> None:
    out = _toolenv("broke", path=broken_plugin)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("toolenv broke: not available (RuntimeError: broken on import)")


def test_list_and_doctor_with_a_broken_plugin(broken_plugin: Path) -> None:
    listed = _toolenv("list", path=broken_plugin)
    assert listed.returncode == 0, listed.stderr
    assert "toolenv/Broke-v0" in listed.stdout and "toolenv/Spider-v0" in listed.stdout
    doctor = _toolenv("doctor", path=broken_plugin)
    assert doctor.returncode == 0, doctor.stderr
    assert "broke:\n  error: RuntimeError: broken on import\n" in doctor.stdout


@pytest.fixture
def own_env_module(tmp_path: Path) -> Path:
    """A module that registers a ToolEnv with Gymnasium under an id without a namespace, as
    Gymnasium's docs do (`gym.make("my_envs:Calc-v0")` imports the module first)."""
    (tmp_path / "my_envs.py").write_text(
        "import gymnasium as gym\n"
        "from toolenv.env import ToolEnv\n\n"
        "def make(**kwargs):\n"
        "    return ToolEnv(tasks=[{'question': 'q', 'answer': 'a'}], **kwargs)\n\n"
        "gym.register('Calc-v0', entry_point=make)\n"
    )
    return tmp_path


def test_check_an_env_id_without_a_namespace(own_env_module: Path) -> None:
    """An env id is not always `namespace/Name-vN`: `module:Name-vN` (Gymnasium's way of making
    an env its module registers) is checked as an env, not looked up as a tool plugin."""
    out = _toolenv("check", "my_envs:Calc-v0", path=own_env_module)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "ok  gymnasium" in out.stdout and "0 failed" in out.stdout


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("CartPole-v1", "toolenv check: error: CartPole-v1 is not a toolenv ToolEnv"),
        ("Nope-v0", "toolenv check: error: Environment `Nope` doesn't exist"),
        ("nope", "toolenv check: error: no tool named 'nope'"),
        ("toolenv/ToolEnv-v0 --kwargs [1]", "toolenv check: error: --kwargs must be a JSON object"),
    ],
)
def test_check_names_what_the_target_is_not(target: str, message: str) -> None:
    """A Gymnasium env id is looked up as an env (`CartPole-v1` is one, but not a ToolEnv), a
    bare name as a tool plugin."""
    out = _toolenv("check", *target.split())
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(message), out.stderr


def test_a_gymnasium_checker_warning_fails_the_check(tmp_path: Path) -> None:
    """Gymnasium's `check_env` reports some problems as warnings only (here: `close()` raising
    when called again, which Gymnasium allows); `toolenv check` fails the gymnasium check with
    the warning as its message and exits 1, so that CI does not pass a broken env."""
    (tmp_path / "close_twice_env.py").write_text(
        "import gymnasium as gym\n"
        "from toolenv.env import ToolEnv\n\n"
        "class CloseOnce(ToolEnv):\n"
        "    closed = False\n\n"
        "    def close(self):\n"
        "        if self.closed:\n"
        "            raise RuntimeError('already closed')\n"
        "        self.closed = True\n"
        "        super().close()\n\n"
        "def make(**kwargs):\n"
        "    return CloseOnce(tasks=[{'question': 'q', 'answer': 'a'}], **kwargs)\n\n"
        "gym.register('CloseOnce-v0', entry_point=make)\n"
    )
    out = _toolenv("check", "close_twice_env:CloseOnce-v0", path=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    fail = next(line for line in out.stdout.splitlines() if line.startswith("FAIL gymnasium"))
    assert "Calling `env.close()` on the closed environment should be allowed" in fail
    assert "already closed" in fail and "\x1b[" not in fail


@pytest.fixture
def half_plugin(tmp_path: Path) -> Path:
    """A distribution whose command modules import but do not make a command: one has no
    `add_arguments`, the other's raises."""
    pkg = tmp_path / "halfplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nothing.py").write_text("HELP = 'A command with no options.'\n")
    (pkg / "raising.py").write_text(
        "HELP = 'A command whose options fail.'\n\n"
        "def add_arguments(parser):\n"
        "    raise ImportError('needs a newer toolenv')\n\n"
        "def run(args):\n"
        "    return 0\n"
    )
    info = tmp_path / "halfplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: halfplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[toolenv.commands]\nnothing = halfplug.nothing\nraising = halfplug.raising\n"
    )
    return tmp_path


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("nothing", "AttributeError: module 'halfplug.nothing' has no attribute 'add_arguments'"),
        ("raising", "ImportError: needs a newer toolenv"),
    ],
)
def test_a_plugin_command_that_cannot_build_its_options_is_one_error_line(
    half_plugin: Path, command: str, why: str
) -> None:
    out = _toolenv(command, path=half_plugin)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"toolenv {command}: not available ({why})"), out.stderr
    listed = _toolenv("--help", path=half_plugin)  # the others still work
    assert listed.returncode == 0 and "A command with no options." in listed.stdout
