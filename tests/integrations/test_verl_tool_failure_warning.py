"""ToolEnvAgentLoop warns when most episodes' tool calls fail (a retriever down, a wrong URL).

A failed call is an error observation, never an exception: the episodes go on, verl trains on
them, and only `tool_errors` in `reward_extra_info` shows it. The loop logs one WARNING line at
the 1st, 10th, 100th ... such episode of the process, naming the tool and its last error, as
`toolenv rollout` warns at the end of a run.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

from toolenv.integrations.verl import _turns
from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS

CALC = "toolenv.integrations.verl.demo:Calculator"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
#: A call the calculator refuses: the model's own mistake.
BAD = CALL.replace("6 * 7", "6 * ")
LOGGER = "toolenv.integrations.verl.agent_loop"
_SERIAL = itertools.count()

# A calculator whose server is down: every call raises, as an HTTP client does on a 500.
DOWN = """
import toolenv
from pydantic import BaseModel


class Down(toolenv.Tool):
    \"\"\"Evaluate an arithmetic expression (its server is down).\"\"\"

    name = "calculator"

    class Args(BaseModel):
        expression: str

    async def run(self, args, ctx):
        raise ConnectionError("HTTP 500 from http://127.0.0.1:9/calc\\n<html>busy</html>")
"""


@pytest.fixture(autouse=True)
def fresh_tally(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count is process-wide: each test starts from none."""
    monkeypatch.setattr(_turns, "TOOL_FAILURES", _turns.ToolFailures())


@pytest.fixture
def down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A reference to a fresh module's calculator whose server is down."""
    name = f"verl_down_tools_{next(_SERIAL)}"
    (tmp_path / f"{name}.py").write_text(DOWN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:Down"


async def _row(tool: str) -> dict[str, Any]:
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [tool], "tasks": DEMO_TASKS}))[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"]}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and "tool calls failed" in r.getMessage()
    ]


async def _episodes(make_loop: Any, scripted_server: Any, row: dict[str, Any], replies: list[str], n: int) -> None:
    for _ in range(n):
        out = await make_loop(scripted_server(replies)).run({}, **row)
        assert out.extra_fields["toolenv_error"] == ""  # a failed call ends no episode


async def test_a_tool_down_warns_at_the_1st_and_10th_failing_episode(scripted_server, make_loop, down, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    row = await _row(down)
    await _episodes(make_loop, scripted_server, row, [CALL, "<answer>42</answer>"], 9)
    assert len(_warnings(caplog)) == 1
    await _episodes(make_loop, scripted_server, row, [CALL, "<answer>42</answer>"], 1)
    first, tenth = _warnings(caplog)
    assert "1 of 1 episode" in first and "10 of 10 episodes" in tenth
    for line in (first, tenth):
        assert "'calculator'" in line and "HTTP 500 from http://127.0.0.1:9/calc <html>busy</html>" in line
        assert "\n" not in line


async def test_working_tools_log_no_warning(scripted_server, make_loop, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    await _episodes(make_loop, scripted_server, await _row(CALC), [CALL, "<answer>42</answer>"], 3)
    assert _warnings(caplog) == []


async def test_an_occasional_bad_call_among_working_episodes_logs_no_warning(scripted_server, make_loop, caplog):
    """A model's own bad call in one episode of five is not a tool that keeps failing."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    row = await _row(CALC)
    await _episodes(make_loop, scripted_server, row, [CALL, "<answer>42</answer>"], 4)
    await _episodes(make_loop, scripted_server, row, [BAD, "<answer>42</answer>"], 1)
    assert _warnings(caplog) == []


async def test_an_episode_with_one_failed_call_of_three_is_not_failing(scripted_server, make_loop, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    await _episodes(make_loop, scripted_server, await _row(CALC), [CALL, CALL, BAD, "<answer>42</answer>"], 1)
    assert _warnings(caplog) == []


async def test_an_episode_with_two_failed_calls_of_three_is_failing(scripted_server, make_loop, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    await _episodes(make_loop, scripted_server, await _row(CALC), [BAD, BAD, CALL, "<answer>42</answer>"], 1)
    (line,) = _warnings(caplog)
    assert "'calculator'" in line and "Cannot evaluate '6 * '" in line


async def test_parse_errors_are_not_tool_failures(scripted_server, make_loop, caplog):
    """A reply the parser cannot read is the model's format, not a tool that is down."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    broken = '<tool_call>\n{"name": "calculator", "arguments": \n</tool_call>'
    await _episodes(make_loop, scripted_server, await _row(CALC), [broken, "<answer>42</answer>"], 2)
    assert _warnings(caplog) == []
