from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolenv.cli import main

TOOLENV = str(Path(sys.executable).parent / "toolenv")


def test_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"name": "toolenv/ToolEnv-v0", "dist": "toolenv (core)", "target": "toolenv.env:ToolEnv"} in data["envs"]
    assert {"hermes", "tags", "codeblock"} <= {p["name"] for p in data["parsers"]}
    assert {"exact_match", "f1"} <= {r["name"] for r in data["rewards"]}


def test_check_env_with_kwargs_passes(capsys: pytest.CaptureFixture[str]) -> None:
    kwargs = json.dumps({"tasks": [{"question": "q", "answer": "a"}]})
    assert main(["check", "toolenv/ToolEnv-v0", "--kwargs", kwargs]) == 0
    out = capsys.readouterr().out
    assert "ok  gymnasium" in out and "0 failed" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "toolenv/Nope-v0"], "toolenv check: error: Environment `Nope` doesn't exist"),
        (["check", "no_such_tool"], "toolenv check: error: no tool named 'no_such_tool'"),
        (["check", "toolenv/ToolEnv-v0", "--kwargs", "{bad"], "toolenv check: error: --kwargs is not valid JSON"),
    ],
)
def test_errors_are_one_line_and_nonzero(argv: list[str], message: str) -> None:
    out = subprocess.run([TOOLENV, *argv], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith(message)
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_check_reports_failures_with_exit_1() -> None:
    # ToolEnv-v0 without tasks cannot reset: every env check fails, cleanly
    out = subprocess.run([TOOLENV, "check", "toolenv/ToolEnv-v0"], capture_output=True, text=True)
    assert out.returncode == 1
    assert "FAIL reset_gives_prompt" in out.stdout and "this env has no tasks" in out.stdout


def test_doctor_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["toolenv"] and rep["python"].startswith("3.")


def test_no_command_prints_help() -> None:
    assert main([]) == 2
