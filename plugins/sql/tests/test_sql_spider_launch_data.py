"""examples/verl/run_spider_*.sh: the training data they build leaves out the tasks whose gold
query returns no rows, where any query returning none scores 1 (docs/plugins/sql.md: use
`exclude_empty_gold=True` for training). The scripts run for real, with `toolenv verl-data`,
up to the trainer, which a stub `python` stands in for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "verl"


def _task_sets() -> tuple[set[str], set[str]]:
    """Every Spider task id, and those whose gold query returns no rows."""
    from toolenv_sql.envs import make_spider_env

    full, kept = make_spider_env(), make_spider_env(exclude_empty_gold=True)
    every = {t.id for t in full.tasks}
    full.close()
    kept.close()
    return every, every - {t.id for t in kept.tasks}


def _task_ids(parquet: Path) -> list[str]:
    import pyarrow.parquet as pq

    return [row["task_id"] for row in pq.read_table(parquet).column("extra_info").to_pylist()]


@pytest.mark.parametrize("script", ["run_spider_grpo.sh", "run_spider_ppo.sh"])
def test_the_training_data_leaves_out_tasks_with_an_empty_gold_result(script: str, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    stub = tmp_path / "bin"
    stub.mkdir()
    trainer_args = tmp_path / "trainer_args.json"
    (stub / "python").write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(trainer_args)!r}, 'w'))\n"
    )
    (stub / "python").chmod(0o755)
    data = tmp_path / "data"
    path = os.pathsep.join([str(stub), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    subprocess.run(
        ["bash", str(EXAMPLES / script)],
        env={**os.environ, "PATH": path, "DATA_DIR": str(data)},
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert json.loads(trainer_args.read_text())[:2] == ["-m", "verl.trainer.main_ppo"]  # it ran to the trainer
    every, empty = _task_sets()
    assert len(empty) == 13
    train, val = _task_ids(data / "spider_train.parquet"), _task_ids(data / "spider_val.parquet")
    assert empty.isdisjoint(train)
    # Only those left training: the rest of the train split is kept, and validation keeps the standard set.
    assert set(train) == every - set(val) - empty and len(train) == len(set(train))
    assert val and set(val) <= every
