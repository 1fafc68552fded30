"""`toolenv verl-data`, the row builder, compute_score and the runnable example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the parquet writer needs pyarrow (pip install 'toolenv[verl]')")

from toolenv.integrations.verl.data import build_rows, write_parquet
from toolenv.integrations.verl.demo import DEMO_TASKS
from toolenv.integrations.verl.reward import compute_score

ROOT = Path(__file__).resolve().parents[2]
CALC = "toolenv.integrations.verl.demo:Calculator"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolenv.cli", "verl-data", *args], capture_output=True, text=True, timeout=120
    )


def test_rows_round_trip_through_parquet(tmp_path):
    import pyarrow.parquet as pq

    tasks = [*DEMO_TASKS, {"id": "multi", "question": "2+3?", "answer": ["5", "five"]}]
    rows = build_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC], "tasks": tasks, "max_turns": 3}, limit=4)
    path = write_parquet(rows, tmp_path / "sub" / "d.parquet")
    back = pq.read_table(path).to_pylist()
    assert back == rows
    first = back[0]
    assert first["agent_name"] == "toolenv_agent" and first["data_source"] == "toolenv/ToolEnv-v0"
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["prompt"][1]["content"] == "What is 6 * 7?"
    assert '"name": "calculator"' in first["prompt"][0]["content"]
    assert first["reward_model"] == {"style": "rule", "ground_truth": "42"}
    extra = first["extra_info"]
    assert extra["env_id"] == "toolenv/ToolEnv-v0" and extra["task_id"] == "calc-0" and extra["split"] == "all"
    assert json.loads(extra["task"])["answer"] == "42"
    assert json.loads(extra["env_kwargs"]) == {"tools": [CALC], "max_turns": 3}  # tasks are not copied per row
    assert json.loads(extra["tools_kwargs"]["calculator"]["create_kwargs"]["task"])["id"] == "calc-0"
    assert json.loads(back[3]["reward_model"]["ground_truth"]) == ["5", "five"]


def test_cli_writes_parquet_and_limit(tmp_path):
    import pyarrow.parquet as pq

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in DEMO_TASKS))
    out = tmp_path / "calc.parquet"
    proc = _cli(
        "toolenv/ToolEnv-v0",
        "--out",
        str(out),
        "--limit",
        "2",
        "--data-source",
        "calc",
        "--env-kwargs",
        json.dumps({"tools": [CALC], "tasks": str(tasks)}),
    )
    assert proc.returncode == 0, proc.stderr
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["task_id"] for r in rows] == ["calc-0", "calc-1"]
    assert {r["data_source"] for r in rows} == {"calc"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["toolenv/NoSuch-v0"], "cannot make env 'toolenv/NoSuch-v0'"),
        (["toolenv/ToolEnv-v0", "--env-kwargs", "{bad"], "--env-kwargs is not valid JSON"),
        (["toolenv/ToolEnv-v0"], "has no tasks"),
        (["toolenv/ToolEnv-v0", "--split", "dev"], "invalid choice: 'dev'"),
        (["toolenv/ToolEnv-v0", "--limit", "0"], "--limit must be at least 1"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, args, message):
    proc = _cli(*args, "--out", str(tmp_path / "x.parquet"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "x.parquet").exists()


def test_compute_score_uses_the_env_reward():
    row = build_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC], "tasks": DEMO_TASKS})[0]
    extra, gt = row["extra_info"], row["reward_model"]["ground_truth"]
    response = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>\n'
        "<tool_response>\n42\n</tool_response>\nSo <answer>42</answer>"
    )
    good = compute_score("toolenv/ToolEnv-v0", response, gt, extra)
    assert good == {"score": 1.0, "answered": 1.0, "reward/exact_match": 1.0}
    assert compute_score("toolenv/ToolEnv-v0", "<answer>41</answer>", gt, extra)["score"] == 0.0
    assert compute_score("toolenv/ToolEnv-v0", "no answer", gt, extra) == {
        "score": 0.0,
        "answered": 0.0,
        "reward/exact_match": 0.0,
    }
    with pytest.raises(ValueError, match=r"extra_info\.env_id"):
        compute_score("x", "<answer>1</answer>", "1", {})


def test_compute_score_scores_turn_rewards_on_the_response():
    """Format and per-turn rewards score the response as the episode's one turn: before, the
    episode had no turns, so `format` was 0 for every response and penalties never applied."""
    kwargs = {"tools": [CALC], "tasks": DEMO_TASKS, "reward": {"exact_match": 1.0, "format": 0.5}}
    row = build_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs)[0]
    extra, gt = row["extra_info"], row["reward_model"]["ground_truth"]
    good = compute_score("toolenv/ToolEnv-v0", "<answer>42</answer>", gt, extra)
    assert good["reward/format"] == 1.0 and good["score"] == 1.5
    broken = compute_score("toolenv/ToolEnv-v0", '<tool_call>{"name": </tool_call> <answer>42</answer>', gt, extra)
    assert broken["reward/format"] == 0.0 and broken["reward/exact_match"] == 1.0
    assert compute_score("toolenv/ToolEnv-v0", "no answer", gt, extra)["reward/format"] == 0.0


async def test_compute_score_refuses_a_running_loop():
    with pytest.raises(RuntimeError, match="acompute_score"):
        compute_score("x", "", "", {})


def test_example_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "verl" / "demo_data.py"), "--out", str(tmp_path / "demo.parquet")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 rows" in proc.stdout and "score 1.0" in proc.stdout
    assert (tmp_path / "demo.parquet").stat().st_size > 0


def test_verl_is_imported_only_by_the_integration():
    import re

    pattern = re.compile(r"^\s*(import verl|from verl[. ])", re.MULTILINE)
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "toolenv").rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8")) and "integrations/verl" not in p.as_posix()
    ]
    assert offenders == []
    # and the builder/CLI side of the integration does not pull verl (or torch) in either
    code = "import sys, toolenv.integrations.verl.data_cmd; print('verl' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_split_is_deterministic_and_disjoint():
    from toolenv.integrations.verl.data import split_tasks
    from toolenv.types import load_tasks

    tasks = load_tasks([{"id": f"t{i}", "question": "q"} for i in range(500)])
    train, test = split_tasks(tasks, "train"), split_tasks(tasks, "test")
    assert {t.id for t in train} | {t.id for t in test} == {t.id for t in tasks}
    assert not {t.id for t in train} & {t.id for t in test}
    assert 20 <= len(test) <= 80  # about 10 %
    assert [t.id for t in split_tasks(list(reversed(tasks)), "test")] == [t.id for t in reversed(test)]
    with pytest.raises(ValueError, match="unknown split"):
        split_tasks(tasks, "dev")


def test_tasks_of_one_split_group_stay_in_one_split():
    """Spider asks most questions twice (paraphrases, one gold query): split by task id, 69 of 80
    held-out Spider tasks had their twin in training. Tasks with `metadata["split_group"]` are
    split by it."""
    from toolenv.integrations.verl.data import split_tasks
    from toolenv.types import load_tasks

    tasks = load_tasks(
        [{"id": f"t{i}-{k}", "question": "q", "metadata": {"split_group": f"g{i}"}} for i in range(300) for k in (0, 1)]
    )
    test = {t.id for t in split_tasks(tasks, "test")}
    assert 10 <= len(test) / 2 <= 60 and all(f"t{i}-0" in test for i in range(300) if f"t{i}-1" in test)
    assert {t.id for t in split_tasks(tasks, "train")} == {t.id for t in tasks} - test


def test_spider_held_out_tasks_share_no_gold_query_with_training():
    pytest.importorskip("toolenv_sql", reason="Spider-v0 comes from toolenv-sql")
    rows = {s: build_rows("toolenv/Spider-v0", split=s) for s in ("train", "test")}

    def pairs(split: str) -> set[tuple[str, str]]:
        tasks = [json.loads(r["extra_info"]["task"]) for r in rows[split]]
        return {(t["context"]["db_id"], " ".join(t["context"]["gold_sql"].lower().split())) for t in tasks}

    assert 40 <= len(rows["test"]) <= 110 and len(rows["train"]) + len(rows["test"]) == 697
    assert not pairs("train") & pairs("test")


def test_a_dataset_with_splits_of_its_own_keeps_them():
    """MBPP's tasks carry MBPP's split: `--split test` is MBPP's test split (500 tasks), not a
    tenth of all 974 by hash, which put MBPP test tasks into the training file."""
    pytest.importorskip("toolenv_code", reason="MBPP-v0 comes from toolenv-code")
    rows = {s: build_rows("toolenv/MBPP-v0", split=s) for s in ("train", "test")}
    ids = {s: {r["extra_info"]["task_id"] for r in rs} for s, rs in rows.items()}
    assert len(ids["train"]) == 374 and len(ids["test"]) == 500 and not ids["train"] & ids["test"]
    assert {r["extra_info"]["split"] for r in rows["test"]} == {"test"}
    assert "MBPP/11" in ids["test"] and "MBPP/601" in ids["train"]


def test_rows_of_several_envs_keep_their_images_whatever_comes_first(tmp_path):
    """pyarrow's `from_pylist` takes its columns from the first row only: text rows written before
    image rows (rows of two envs in one file) silently lost the `images` column."""
    import pyarrow.parquet as pq

    pytest.importorskip("toolenv_vision", reason="the image rows come from toolenv-vision's VisualSearch-v0")
    text = build_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC], "tasks": DEMO_TASKS}, limit=1)
    vision = build_rows("toolenv/VisualSearch-v0", env_kwargs={"num_tasks": 1}, limit=1)
    assert len(vision[0]["images"]) == 1 and "images" not in text[0]
    for rows in (text + vision, vision + text):
        back = pq.read_table(write_parquet(rows, tmp_path / "mixed.parquet")).to_pylist()
        by_env = {r["extra_info"]["env_id"]: r for r in back}
        assert by_env["toolenv/VisualSearch-v0"]["images"] == vision[0]["images"]
        assert by_env["toolenv/ToolEnv-v0"]["images"] is None  # RLHFDataset reads None as no images


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("12345 * 6789", "83810205"),
        ("6 * 7", "42"),
        ("7 / 2", "3.5"),
        ("1 / 3", "0.333333333333"),
        ("-2 * 1e20", "-2e+20"),
    ],
)
def test_the_demo_calculator_shows_its_results_exactly(expression, shown):
    """The demo tool's text is what the model reads and copies into its answer: an 8-digit
    product shown as `8.38102e+07` can never match the gold answer."""
    import asyncio

    from toolenv import ToolContext
    from toolenv.integrations.verl.demo import Calculator
    from toolenv.types import Task

    tool = Calculator()
    result = asyncio.run(tool.run(Calculator.Args(expression=expression), ToolContext(task=Task())))
    assert result.text == shown and not result.is_error


def test_tool_objects_are_refused_with_what_to_pass_instead():
    """A row rebuilds its env in a worker from JSON: a Tool object cannot travel there. The row
    builder says so (a ValueError naming the reference forms), not json's TypeError."""
    from toolenv.integrations.verl.demo import Calculator

    with pytest.raises(ValueError, match=r"'module:Name'.*Calculator"):
        build_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [Calculator()], "tasks": DEMO_TASKS})


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    """pyarrow deletes a file it fails to write (and a killed write leaves it truncated): writing
    over the training file in place lost the old data when the new rows could not be written."""
    import pyarrow.parquet as pq

    rows = build_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC], "tasks": DEMO_TASKS})
    out = write_parquet(rows, tmp_path / "d.parquet")
    bad = [{**rows[0], "extra_info": {**rows[0]["extra_info"], "meta": {}}}]  # an empty struct: parquet refuses it
    with pytest.raises(Exception, match="no child field"):
        write_parquet(bad, out)
    assert pq.read_table(out).to_pylist() == rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.parquet"]  # no temporary file left behind
    assert write_parquet(rows[:1], out) == out and pq.read_table(out).num_rows == 1  # replaced when it works


def test_writing_through_a_symlink_replaces_its_target(tmp_path):
    """The file is renamed into place: over the file a link points to, so the link stays a link."""
    import pyarrow.parquet as pq

    (tmp_path / "v1").mkdir()
    real = write_parquet([{"a": 1}], tmp_path / "v1" / "d.parquet")
    link = tmp_path / "latest.parquet"
    link.symlink_to(real)
    assert write_parquet([{"a": 2}], link) == link
    assert link.is_symlink() and pq.read_table(real).to_pylist() == [{"a": 2}]


def test_compute_score_reports_the_same_keys_for_every_env_with_reward_keys():
    """verl reads the keys of a batch's first sample from every sample (`info[key]`): a batch
    mixing envs whose rewards have different parts failed with a KeyError. `reward_keys`, given
    through `reward.custom_reward_function.reward_kwargs`, fixes them as the agent loop's does."""
    from omegaconf import OmegaConf

    plain = build_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC], "tasks": DEMO_TASKS})[0]
    graded = build_rows(
        "toolenv/ToolEnv-v0",
        env_kwargs={"tools": [CALC], "tasks": DEMO_TASKS, "reward": {"exact_match": 1.0, "format": 0.5}},
    )[0]
    keys = OmegaConf.create({"k": ["exact_match", "format"]}).k  # as verl's config hands them over
    scores = [
        compute_score(r["data_source"], "<answer>42</answer>", None, r["extra_info"], reward_keys=keys)
        for r in (plain, graded)
    ]
    assert [sorted(s) for s in scores] == [["answered", "reward/exact_match", "reward/format", "score"]] * 2
    assert scores[0]["reward/format"] == 0.0 and scores[0]["score"] == 1.0  # not part of this env's reward
    assert scores[1]["reward/format"] == 1.0 and scores[1]["score"] == 1.5
    only = compute_score(plain["data_source"], "<answer>42</answer>", None, plain["extra_info"], reward_keys=[])
    assert only == {"score": 1.0, "answered": 1.0}


def test_cli_refuses_a_directory_as_out_in_one_line(tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    tasks = json.dumps({"tools": [CALC], "tasks": DEMO_TASKS})
    proc = _cli("toolenv/ToolEnv-v0", "--out", str(out), "--env-kwargs", tasks)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a directory" in lines[0] and str(out) in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"] and not any(out.iterdir())


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    """Renamed over, a FIFO (or /dev/stdout, as root) would become a regular file and its reader
    would get nothing: what is not a regular file is written into, as a shell's `>` does."""
    import io
    import os
    import stat
    import threading

    import pyarrow.parquet as pq

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_parquet([{"a": 1}, {"a": 2}], fifo)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert pq.read_table(io.BytesIO(got[0])).to_pylist() == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(
    ("flags", "listed"),
    [([], True), (["--agent-name", "tool_agent"], False), (["--agent-name", "tool_agent", "--no-native-tools"], True)],
)
def test_cli_rows_for_verls_tool_agent_leave_the_tools_to_the_template(tmp_path, flags, listed):
    """verl's `tool_agent` passes its tools to the chat template: its rows say only how to answer."""
    import pyarrow.parquet as pq

    out = tmp_path / "calc.parquet"
    proc = _cli(
        "toolenv/ToolEnv-v0",
        "--out",
        str(out),
        "--env-kwargs",
        json.dumps({"tools": [CALC], "tasks": DEMO_TASKS}),
        *flags,
    )
    assert proc.returncode == 0, proc.stderr
    system = pq.read_table(out).to_pylist()[0]["prompt"][0]["content"]
    assert ('"name": "calculator"' in system) is listed and "<answer>...</answer>" in system


def test_compute_score_reads_a_lone_surrogate_as_a_step_does():
    """A response holding half an emoji (or its JSON escape) is scored on the text a step would
    record, U+FFFD in its place, and its answer matches the same as the env's own."""
    tasks = [{"id": "e", "question": "Which emoji?", "answer": "\ufffd"}]
    row = build_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC], "tasks": tasks})[0]
    extra, gt = row["extra_info"], row["reward_model"]["ground_truth"]
    assert compute_score("toolenv/ToolEnv-v0", "<answer>\ud83d</answer>", gt, extra)["score"] == 1.0
