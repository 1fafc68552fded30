"""The launch scripts in examples/verl/ build their data for the agent loop they run, and validate
on tasks they do not train on. Read from the script text; nothing is launched."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verl"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("run_*.sh"))


def _variables(text: str) -> dict[str, str]:
    """Plain `NAME=value` and `NAME=${NAME:-value}` assignments (the defaults)."""
    out: dict[str, str] = {}
    for name, value in re.findall(r"^([A-Z_]+)=(.*)$", text, re.MULTILINE):
        default = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
        out[name] = (default.group(1) if default else value).strip("'\"")
    return out


def _expand(arg: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), arg)


def _json_or_text(text: str) -> Any:
    """`text` as JSON, else as it is (a value holding shell-escaped quotes)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _verl_data_calls(text: str, variables: dict[str, str]) -> list[dict[str, str]]:
    calls = []
    for line in text.replace("\\\n", " ").splitlines():
        if not line.startswith("toolenv verl-data"):
            continue
        args = shlex.split(line)[2:]
        opts = {"env_id": args[0]}
        for flag, value in zip(args[1:], args[2:], strict=False):
            if flag.startswith("--"):
                opts[flag[2:]] = _expand(value, variables)
        calls.append(opts)
    return calls


def test_there_are_launch_scripts() -> None:
    assert len(SCRIPTS) == 4


@pytest.mark.parametrize("script", SCRIPTS)
def test_launch_script_rows_name_the_loop_it_configures(script: str) -> None:
    """verl runs each row's `agent_name` and uses `default_agent_loop` only for rows without one,
    so the rows must name the loop the script configures (with its stop strings)."""
    pytest.importorskip("omegaconf", reason="omegaconf comes with verl (pip install 'toolenv[verl]'); CI installs it")
    from omegaconf import OmegaConf

    text = (EXAMPLES / script).read_text()
    variables = _variables(text)
    loop = re.search(r"actor_rollout_ref\.rollout\.agent\.default_agent_loop=(\S+)", text)
    assert loop is not None
    default_loop = _expand(loop.group(1).strip("'\""), variables)
    calls = _verl_data_calls(text, variables)
    assert len(calls) == 2
    assert [c.get("agent-name") for c in calls] == [default_loop, default_loop]
    registered = {entry["name"]: entry for entry in OmegaConf.load(EXAMPLES / "toolenv_agent.yaml")}
    assert default_loop in registered and registered[default_loop].get("stop")


@pytest.mark.parametrize("script", SCRIPTS)
def test_launch_script_validates_on_held_out_tasks(script: str) -> None:
    text = (EXAMPLES / script).read_text()
    calls = _verl_data_calls(text, _variables(text))
    by_file = {Path(c["out"]).name.rsplit("_", 1)[-1]: c for c in calls}
    assert by_file["train.parquet"].get("split") == "train"
    assert by_file["val.parquet"].get("split") == "test"
    assert by_file["train.parquet"]["env_id"] == by_file["val.parquet"]["env_id"]
    train_kwargs, val_kwargs = (_json_or_text(by_file[f]["env-kwargs"]) for f in ("train.parquet", "val.parquet"))
    if isinstance(train_kwargs, dict):
        train_kwargs.pop("exclude_empty_gold", None)  # training may leave out tasks a reward cannot score
    assert train_kwargs == val_kwargs
    for name in ("train", "val"):
        assert f'data.{name}_files="$DATA_DIR/{Path(by_file[f"{name}.parquet"]["out"]).name}"' in text
