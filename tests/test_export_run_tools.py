"""`toolenv export RUN --tools ENV_ID`: the schemas of the env the run used, built with the
env arguments its run.json records (they were the default env's, silently); a warning when
the exported calls name tools the schemas lack; a build failure that points at a schema file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from _examples import load_example

from toolenv.cli import main

example = load_example("rollout_example")
ROOT = Path(__file__).resolve().parents[1]
MCP_SERVER = ROOT / "plugins" / "mcp" / "tests" / "mcp_test_server.py"
TOOLS = ["rollout_example:add", "rollout_example:Lookup"]
TASKS = [
    {"id": "sum", "question": "2+3?", "answer": "5", "context": {"call": ["add", {"a": 2, "b": 3}]}},
    {"id": "pear", "question": "pear?", "answer": "5", "context": {"call": ["lookup", {"fruit": "pear"}]}},
]


def _rollout(out: Path, env_id: str, *env_args: str) -> None:
    """A real run through the CLI, its env made from `--env-arg`s (run.json records them)."""
    args = [a for kv in env_args for a in ("--env-arg", kv)]
    agent = ["--agent", "rollout_example:ScriptedAgent", "--no-progress", "--out", str(out)]
    assert main(["rollout", env_id, *args, *agent]) == 0


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _names(schemas: list[dict[str, Any]]) -> list[str]:
    return [s["function"]["name"] for s in schemas]


def _called(line: dict[str, Any]) -> set[str]:
    return {c["function"]["name"] for m in line["messages"] for c in m.get("tool_calls") or []}


def _warnings(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith("toolenv export: warning:")]


@pytest.fixture(scope="module")
def run_with_args(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`toolenv/ToolEnv-v0` (no tools of its own) given its tools and tasks by `--env-arg`."""
    out = tmp_path_factory.mktemp("runs") / "args"
    _rollout(out, "toolenv/ToolEnv-v0", f"tools={json.dumps(TOOLS)}", f"tasks={json.dumps(TASKS)}")
    return out


def test_tools_of_the_runs_env_are_built_with_its_env_arguments(
    run_with_args: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sft.jsonl"
    argv = ["export", str(run_with_args), "--out", str(out), "--tools", "toolenv/ToolEnv-v0", "--calls", "structured"]
    assert main(argv) == 0
    lines = _lines(out)
    assert len(lines) == 2
    for line in lines:
        assert _names(line.get("tools", [])) == ["add", "lookup"]
        assert _called(line) <= {"add", "lookup"} and _called(line)
    assert _warnings(capsys.readouterr().err) == []


def test_calls_of_tools_the_schemas_lack_warn_in_one_line(
    run_with_args: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schemas = tmp_path / "tools.json"
    schemas.write_text(json.dumps([example.add.schema()]))  # lookup left out
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run_with_args), "--out", str(out), "--tools", str(schemas)]) == 0
    assert [_names(x["tools"]) for x in _lines(out)] == [["add"], ["add"]]  # written as asked
    (warning,) = _warnings(capsys.readouterr().err)
    assert "lookup" in warning and "'add'" not in warning and "--tools" in warning, warning


def test_a_call_the_env_refused_as_unknown_is_no_missing_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model that calls a tool the env never had is not a schema the export lost."""
    run = tmp_path / "run"
    tasks = [{"id": "x", "question": "?", "answer": "5", "context": {"call": ["nosuch", {}]}}]
    _rollout(run, "toolenv/ToolEnv-v0", f"tools={json.dumps(TOOLS)}", f"tasks={json.dumps(tasks)}")
    capsys.readouterr()
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run), "--out", str(out), "--tools", "toolenv/ToolEnv-v0"]) == 0
    assert _names(_lines(out)[0]["tools"]) == ["add", "lookup"]
    assert _warnings(capsys.readouterr().err) == []


def test_an_env_that_cannot_be_built_points_at_a_schema_file(
    run_with_args: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """toolenv/Remote-v0 needs its url (the run here is another env's): the error said only
    `RemoteToolEnv.__init__() missing 1 required positional argument: 'url'`."""
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run_with_args), "--out", str(out), "--tools", "toolenv/Remote-v0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("toolenv export: error: --tools toolenv/Remote-v0: ") and err.count("\n") == 1, err
    assert "'url'" in err and "FILE.json" in err
    assert not out.exists()


def test_runs_of_one_env_with_other_env_arguments_are_refused_together(
    run_with_args: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One `tools` column for runs whose envs had other tools would be wrong for some: refused,
    naming both runs; runs with the same env arguments export together."""
    other = tmp_path / "other"
    _rollout(other, "toolenv/ToolEnv-v0", f"tools={json.dumps(TOOLS[:1])}", f"tasks={json.dumps(TASKS[:1])}")
    capsys.readouterr()
    out = tmp_path / "sft.jsonl"
    argv = ["export", str(run_with_args), str(other), "--out", str(out), "--tools", "toolenv/ToolEnv-v0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("toolenv export: error: --tools toolenv/ToolEnv-v0: ") and err.count("\n") == 1, err
    assert str(run_with_args) in err and str(other) in err
    assert not out.exists()
    same = tmp_path / "same"
    _rollout(same, "toolenv/ToolEnv-v0", f"tools={json.dumps(TOOLS)}", f"tasks={json.dumps(TASKS)}")
    argv = ["export", str(run_with_args), str(same / "trajectories.jsonl"), "--out", str(out), "--tools"]
    assert main([*argv, "toolenv/ToolEnv-v0"]) == 0
    assert [_names(x["tools"]) for x in _lines(out)] == [["add", "lookup"]] * 4


def test_an_mcp_run_exports_the_tools_of_its_servers_and_extra_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's case: `toolenv/MCP-v0` with `servers=`, extra `tools=[...]`: the export
    got the demo servers' `price` and `multiply`."""
    pytest.importorskip("toolenv_mcp", reason="the MCP plugin (plugins/mcp)")
    servers = tmp_path / "mcp.json"
    servers.write_text(json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [str(MCP_SERVER)]}}}))
    tasks = [
        {"id": "echo", "question": "say hi", "answer": "hi", "context": {"call": ["echo", {"text": "hi"}]}},
        {"id": "pear", "question": "pear?", "answer": "5", "context": {"call": ["lookup", {"fruit": "pear"}]}},
    ]
    run = tmp_path / "run"
    _rollout(
        run, "toolenv/MCP-v0", f"servers={servers}", 'tools=["rollout_example:Lookup"]', f"tasks={json.dumps(tasks)}"
    )
    capsys.readouterr()
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run), "--out", str(out), "--tools", "toolenv/MCP-v0", "--calls", "structured"]) == 0
    for line in _lines(out):
        names = _names(line["tools"])
        assert {"lookup", "echo", "add"} <= set(names) and "price" not in names
        assert _called(line) <= set(names)
    assert _warnings(capsys.readouterr().err) == []


def _keyed_env(api_key: str | None = None, **kwargs: Any) -> Any:
    """An env that needs a real key when given one (run.json records it as `***`)."""
    import toolenv

    if api_key == "***":
        raise ValueError("401 Unauthorized: the key is ***")
    return toolenv.ToolEnv(**kwargs)


def test_a_key_run_json_hides_is_left_out_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gymnasium as gym

    if "exporttest/Keyed-v0" not in gym.registry:
        gym.register("exporttest/Keyed-v0", entry_point=_keyed_env)
    run = tmp_path / "run"
    tools, tasks = f"tools={json.dumps(TOOLS)}", f"tasks={json.dumps(TASKS)}"
    _rollout(run, "exporttest/Keyed-v0", tools, tasks, "api_key=sk-not-a-real-one")
    assert json.loads((run / "run.json").read_text())["env_kwargs"]["api_key"] == "***"
    capsys.readouterr()
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run), "--out", str(out), "--tools", "exporttest/Keyed-v0"]) == 0
    assert [_names(x["tools"]) for x in _lines(out)] == [["add", "lookup"]] * 2
    (warning,) = _warnings(capsys.readouterr().err)
    assert "api_key" in warning and "made without" in warning, warning
