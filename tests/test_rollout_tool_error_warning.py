"""`toolenv rollout` warns (one stderr line, exit code unchanged) when a large share of this
run's tool calls failed: a retriever down made every search fail while the run looked
successful (exit 0, success_rate 1.0, only tool_error_rate at 1.0)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from _examples import load_example

from toolenv.cli import main

example = load_example("rollout_example")
_SERIAL = itertools.count()

# Stand-ins for the example's tools whose backend is down: every call raises, as an HTTP
# client does on a 500; the model sees "Tool 'add' failed: ...".
DOWN = """
import toolenv
from pydantic import BaseModel


class Add(toolenv.Tool):
    \"\"\"Add two integers (its server is down).\"\"\"

    name = "add"

    class Args(BaseModel):
        a: int
        b: int

    async def run(self, args, ctx):
        raise ConnectionError("HTTP 500 from http://127.0.0.1:9/add")


class Lookup(toolenv.Tool):
    \"\"\"Look up a fruit price (its server is down).\"\"\"

    name = "lookup"

    class Args(BaseModel):
        fruit: str

    async def run(self, args, ctx):
        raise ConnectionError("HTTP 500 from http://127.0.0.1:9/lookup")
"""

UP = {"add": "rollout_example:add", "lookup": "rollout_example:Lookup", "swatch": "rollout_example:Swatch"}


@pytest.fixture
def down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a fresh module with the tools whose server is down."""
    name = f"down_tools_{next(_SERIAL)}"
    (tmp_path / f"{name}.py").write_text(DOWN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _rollout(out: Path, n: int, tools: dict[str, str]) -> int:
    return main(
        [
            "rollout", example.ENV_ID, "--agent", "rollout_example:ScriptedAgent", "-n", str(n), "--no-progress",
            "--env-arg", f"tools={json.dumps(list(tools.values()))}", "--out", str(out),
        ]
    )  # fmt: skip


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "tool calls in this run failed" in line]


def test_a_run_whose_every_tool_call_failed_warns_and_still_exits_0(
    down: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _rollout(tmp_path / "run", 2, {**UP, "add": f"{down}:Add"}) == 0
    err = capsys.readouterr().err
    assert _warnings(err) == [
        "toolenv rollout: 2 of 2 tool calls in this run failed (the episodes went on: see tool_error_rate), "
        "e.g.: Tool 'add' failed: ConnectionError: HTTP 500 from http://127.0.0.1:9/add"
    ]
    assert err.strip().splitlines() == _warnings(err)  # the one line, nothing else


def test_most_calls_failing_warns_a_few_does_not(down: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 4 tasks, one call each: add (2 tasks), lookup, swatch
    assert _rollout(tmp_path / "most", 4, {**UP, "add": f"{down}:Add", "lookup": f"{down}:Lookup"}) == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert line.startswith("toolenv rollout: 3 of 4 tool calls in this run failed")
    assert "e.g.: Tool 'add' failed: ConnectionError" in line
    assert _rollout(tmp_path / "few", 4, {**UP, "lookup": f"{down}:Lookup"}) == 0  # 1 of 4: an observation
    assert _warnings(capsys.readouterr().err) == []


def test_a_healthy_run_and_a_run_with_nothing_new_do_not_warn(
    down: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _rollout(tmp_path / "ok", 4, UP) == 0
    assert capsys.readouterr().err == ""
    assert _rollout(tmp_path / "bad", 2, {**UP, "add": f"{down}:Add"}) == 0
    assert len(_warnings(capsys.readouterr().err)) == 1
    # resumed with nothing left to play: this run made no call, whatever the earlier one did
    assert _rollout(tmp_path / "bad", 2, {**UP, "add": f"{down}:Add"}) == 0
    assert _warnings(capsys.readouterr().err) == []
