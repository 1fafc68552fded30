"""`reward_extra_info`'s tool counts under `ToolEnvAgentLoop`: failed calls apart from parse errors.

`tool_calls` counted the calls (the parser's results excluded) while `tool_errors` counted every
error result, the parser's included: an episode of four turns with no action reported
`tool_errors` 4 for `tool_calls` 0, so a "tool error rate" passed 1 and mixed two faults (a tool
that fails, a model that writes no readable call). Scripted server, tiny tokenizer, real env.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS

CALC = "toolenv.integrations.verl.demo:Calculator"
GOOD_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
FAILING_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 ** 7"}}\n</tool_call>'
UNREADABLE_CALL = '<tool_call>\n{"name": "calculator", "arguments": \n</tool_call>'


async def _row() -> dict[str, Any]:
    kwargs = {"tools": [CALC], "tasks": DEMO_TASKS, "max_turns": 6}  # room for five turns
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs))[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"], "data_source": row["data_source"]}


async def test_turns_without_an_action_are_parse_errors_not_tool_errors(scripted_server, make_loop):
    """The reviewer's case H: a model that never acts, for four turns."""
    out = await make_loop(scripted_server(["I do not know."]), max_turns=4).run({}, **await _row())
    info = out.extra_fields["reward_extra_info"]
    assert info["turns"] == 4.0 and info["tool_calls"] == 0.0
    assert info["tool_errors"] == 0.0  # was 4.0: more errors than calls
    assert info["parse_errors"] == 4.0
    assert out.extra_fields["tool_metrics"]["parse_errors"] == 4.0


async def test_failed_calls_and_parse_errors_are_counted_apart(scripted_server, make_loop):
    replies = ["I am not sure.", UNREADABLE_CALL, FAILING_CALL, GOOD_CALL, "<answer>42</answer>"]
    loop = make_loop(scripted_server(replies), max_turns=10)
    out = await loop.run({}, **await _row())
    info = out.extra_fields["reward_extra_info"]
    assert info["answered"] == 1.0 and info["turns"] == 5.0
    assert info["tool_calls"] == 2.0  # the failing call and the good one
    assert info["tool_errors"] == 1.0  # the failing call only: a failure rate of 1/2
    assert info["parse_errors"] == 2.0  # no action, then a call the parser could not read
    assert out.extra_fields["tool_metrics"] == {k: info[k] for k in out.extra_fields["tool_metrics"]}


async def test_every_sample_has_the_same_keys_whatever_its_errors(scripted_server, make_loop):
    """verl needs the same `reward_extra_info` keys on every sample of a batch."""
    keys = []
    for replies in (["<answer>42</answer>"], ["I do not know."], [FAILING_CALL, "<answer>41</answer>"]):
        out = await make_loop(scripted_server(replies), max_turns=3).run({}, **await _row())
        keys.append(set(out.extra_fields["reward_extra_info"]))
    assert keys[0] == keys[1] == keys[2]
    assert {"tool_calls", "tool_errors", "parse_errors"} <= keys[0]
