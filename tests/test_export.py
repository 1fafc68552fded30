"""Trajectories as chat-format SFT data: the layout, the filters, the CLI, a real chat template reading it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import toolenv
from toolenv.agent import Agent, EnvInfo
from toolenv.cli import main
from toolenv.export import chat_messages, export_chat
from toolenv.trajectory import Trajectory, read_trajectories

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
TASKS = [{"id": "right", "question": "2+3?", "answer": "5"}, {"id": "wrong", "question": "2+3?", "answer": "6"}]


@toolenv.tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


class Scripted(Agent):
    """A broken call, a good call, then the answer 5 (right for one task, wrong for the other)."""

    async def act(self, observation: str, messages: list[toolenv.Message], env_info: EnvInfo) -> str:
        return ['<tool_call>{"name": "add", "arguments": </tool_call>', CALL, "It is <answer>5</answer>"][env_info.turn]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    res = toolenv.rollout(
        lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS, max_turns=4), Scripted(), out=out, concurrency=1
    )
    assert sorted((t.task.id, t.success) for t in res.trajectories) == [("right", True), ("wrong", False)]
    return out


def _trajectory(run_dir: Path, task_id: str) -> Trajectory:
    return next(t for t in read_trajectories(run_dir / "trajectories.jsonl") if t.task.id == task_id)


def test_messages_follow_the_episode(run_dir: Path) -> None:
    msgs = chat_messages(_trajectory(run_dir, "right"))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["content"].startswith('<tool_call>{"name": "add"')  # the action as written
    assert "not valid JSON" in msgs[3]["content"]  # a parse error answers no call: said as the user
    assert msgs[4] == {"role": "assistant", "content": CALL}
    assert msgs[5] == {"role": "tool", "content": "5", "name": "add", "tool_call_id": "call_0"}
    assert msgs[6] == {"role": "assistant", "content": "It is <answer>5</answer>"}  # no reply after the last turn


def test_structured_calls_leave_the_format_to_the_template(run_dir: Path) -> None:
    msgs = chat_messages(_trajectory(run_dir, "right"), calls="structured")
    call = msgs[4]
    assert call["content"] == "" and call["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    assert msgs[6] == {"role": "assistant", "content": "It is <answer>5</answer>"}  # no call: the text as written
    with pytest.raises(ValueError, match="calls must be"):
        chat_messages(_trajectory(run_dir, "right"), calls="xml")  # type: ignore[arg-type]
    objects = chat_messages(_trajectory(run_dir, "right"), calls="structured", arguments="object")
    assert objects[4]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}
    assert objects[:4] == msgs[:4] and objects[5:] == msgs[5:]
    with pytest.raises(ValueError, match="arguments must be"):
        chat_messages(_trajectory(run_dir, "right"), calls="structured", arguments="yaml")  # type: ignore[arg-type]


def test_filters_and_file(run_dir: Path, tmp_path: Path) -> None:
    trajs = read_trajectories(run_dir / "trajectories.jsonl")
    assert export_chat(trajs, tmp_path / "all.jsonl") == 2
    assert export_chat(trajs, tmp_path / "ok.jsonl", success_only=True) == 1
    assert export_chat(trajs, tmp_path / "none.jsonl", min_reward=1.5) == 0
    (line,) = [json.loads(x) for x in (tmp_path / "ok.jsonl").read_text().splitlines()]
    assert line["metadata"] == {"task_id": "right", "sample": 0, "reward": 1.0, "env_id": ""}
    assert line["messages"] == chat_messages(_trajectory(run_dir, "right"))
    tools = [add.schema()]
    export_chat(trajs, tmp_path / "tools.jsonl", tools=tools)
    assert all(json.loads(x)["tools"] == tools for x in (tmp_path / "tools.jsonl").read_text().splitlines())
    failed = trajs[0].model_copy(update={"error": "agent failed on turn 0: boom"})
    assert export_chat([failed], tmp_path / "err.jsonl") == 0  # an episode that broke teaches nothing


def test_cli(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run_dir), "--out", str(out), "--success-only", "--calls", "structured"]) == 0
    assert f"wrote 1 of 2 trajectories to {out}" in capsys.readouterr().out
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["messages"][4]["tool_calls"][0]["function"]["name"] == "add"
    assert line["messages"][4]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    args = ["export", str(run_dir), "--out", str(out), "--calls", "structured", "--arguments", "object"]
    assert main(args) == 0
    line = json.loads(out.read_text().splitlines()[0])
    assert line["messages"][4]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}


def test_a_chat_template_renders_the_export_back_into_calls_the_env_reads(run_dir: Path) -> None:
    """Structured calls rendered by a real chat template (the tiny Qwen2's) come out in the
    model's format, and the env's parser reads the same call back."""
    pytest.importorskip("transformers", reason="the chat-template check needs transformers (CI installs it)")
    import tempfile

    from transformers import AutoTokenizer

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    tokenizer: Any = AutoTokenizer.from_pretrained(build_tiny_qwen2(Path(tempfile.mkdtemp())))
    # Qwen's template wants arguments as a mapping, as most templates do.
    msgs = chat_messages(_trajectory(run_dir, "right"), calls="structured", arguments="object")
    text = tokenizer.apply_chat_template(msgs, tools=[add.schema()], tokenize=False)
    assistant = text.split("<|im_start|>assistant\n")[2].split("<|im_end|>")[0]
    (call,) = toolenv.get_parser("hermes").parse(assistant).tool_calls
    assert (call.name, call.arguments) == ("add", {"a": 2, "b": 3})
    assert "<tool_response>\n5\n</tool_response>" in text


def test_a_failed_export_leaves_no_tmp_file(run_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # the final rename onto a directory fails
    with pytest.raises(OSError):
        export_chat(read_trajectories(run_dir / "trajectories.jsonl"), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no taken.tmp left behind


def _live_trajectories() -> int:
    import gc

    gc.collect()
    return sum(type(o) is Trajectory for o in gc.get_objects())


def test_cli_streams_a_run_of_any_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`toolenv export` of a big run holds one trajectory at a time, not the whole file."""
    import toolenv.export

    run = tmp_path / "run"
    toolenv.rollout(
        lambda: toolenv.ToolEnv(tools=[add], tasks=TASKS, max_turns=4), Scripted(), samples=40, out=run, tune_gc=False
    )
    live: list[int] = []
    real = toolenv.export.chat_messages

    def counting(trajectory: Trajectory, **kwargs: Any) -> list[dict[str, Any]]:
        live.append(_live_trajectories())
        return real(trajectory, **kwargs)

    monkeypatch.setattr(toolenv.export, "chat_messages", counting)
    assert main(["export", str(run), str(run / "trajectories.jsonl"), "--out", str(tmp_path / "sft.jsonl")]) == 0
    assert len(live) == 160 and max(live) <= 3
    assert len((tmp_path / "sft.jsonl").read_text().splitlines()) == 160


def test_cli_with_an_invalid_line_writes_nothing(run_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = (run_dir / "trajectories.jsonl").read_text().splitlines(keepends=True)
    bad.write_text(lines[0] + "{not json}\n" + lines[1])
    assert main(["export", str(bad), "--out", str(tmp_path / "sft.jsonl")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
