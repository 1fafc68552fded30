"""Spider-v0 / Chinook-v0: the env's SQL options reach an `execution_match` named in `reward=`.

`dialect`, `column_order`, `root` and the answer's timeout are the env's; a reward spec that
names `execution_match` (alone, weighted, in a list or with settings) must score with them, or
a MySQL answer the tool ran scores 0 and `column_order=False` is silently lost.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from toolenv import ToolEnv
from toolenv_sql.envs import make_chinook_env, make_spider_env
from toolenv_sql.paths import DATA_DIR
from toolenv_sql.reward import ExecutionMatch

SINGER = "spider_dev_sample/database/concert_singer/concert_singer.sqlite"
# Valid MySQL (integer division); SQLite reads `DIV` as a syntax error.
MYSQL_ANSWER = "<answer>SELECT COUNT(*) FROM singer WHERE Age DIV 1 >= 0</answer>"  # gold: SELECT count(*) FROM singer
# spider-dev-0006's gold selects song_name, song_release_year: the same rows, columns swapped.
SWAPPED_ANSWER = "<answer>SELECT song_release_year, song_name FROM singer ORDER BY age LIMIT 1</answer>"

# Every form a spec may name execution_match in (get_reward's), with format beside it where it can be.
SPECS: list[Any] = [
    "execution_match",
    {"execution_match": 1.0, "format": 0.2},
    {"execution_match": {"weight": 1.0}, "format": {"weight": 0.2}},
    ["execution_match", ["format", 0.2]],
    [("execution_match", 1.0), ("format", 0.2)],
    [{"name": "execution_match", "weight": 1.0}, {"name": "format", "weight": 0.2}],
]


def _score(env: ToolEnv, task_id: str, action: str) -> tuple[float, dict[str, Any]]:
    """execution_match's component after answering `task_id` with `action`, and its reward_info."""
    env.reset(options={"task_id": task_id})
    _, _, terminated, _, info = env.step(action)
    assert terminated
    return info["reward_components"]["execution_match"], info["reward_info"]["execution_match"]


@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_the_env_dialect_reaches_a_named_execution_match(spec: Any) -> None:
    env = make_spider_env(dialect="mysql", reward=spec)
    score, detail = _score(env, "spider-dev-0000", MYSQL_ANSWER)
    env.close()
    assert (score, detail["error"]) == (1.0, None)


@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_the_env_column_order_reaches_a_named_execution_match(spec: Any) -> None:
    env = make_spider_env(column_order=False, reward=spec)
    score, _ = _score(env, "spider-dev-0006", SWAPPED_ANSWER)
    env.close()
    assert score == 1.0


def test_the_weights_and_other_parts_of_the_spec_are_kept() -> None:
    env = make_chinook_env(column_order=False, reward={"execution_match": 2.0, "format": 0.2})
    assert env.reward_fn.weights == {"execution_match": 2.0, "format": 0.2}
    env.close()


def test_an_option_the_spec_sets_itself_wins_over_the_env() -> None:
    spec = {"execution_match": {"weight": 1.0, "column_order": True}}
    env = make_spider_env(column_order=False, reward=spec)
    assert _score(env, "spider-dev-0006", SWAPPED_ANSWER)[0] == 0.0
    env.close()
    env = make_spider_env(dialect="mysql", reward=[{"name": "execution_match", "dialect": "sqlite"}])
    score, detail = _score(env, "spider-dev-0000", MYSQL_ANSWER)
    env.close()
    assert score == 0.0 and "DIV" in detail["error"]


def test_a_reward_object_is_used_as_given() -> None:
    """A Reward the caller built is theirs: the env does not rebuild it with its options."""
    reward = ExecutionMatch()  # column_order=True
    env = make_spider_env(column_order=False, reward=reward)
    assert env.reward_fn.parts["execution_match"][0] is reward
    assert _score(env, "spider-dev-0006", SWAPPED_ANSWER)[0] == 0.0
    env.close()


def test_the_env_root_and_timeout_reach_a_named_execution_match(tmp_path: Path) -> None:
    shutil.copy(DATA_DIR / SINGER, tmp_path / "singer.sqlite")
    context = {"db_path": "singer.sqlite", "gold_sql": "SELECT count(*) FROM singer"}
    task = {"id": "t", "question": "How many singers?", "context": context}
    env = make_spider_env(tasks=[task], root=tmp_path, query_timeout=30.0, reward={"execution_match": 1.0})
    reward = env.reward_fn.parts["execution_match"][0]
    assert isinstance(reward, ExecutionMatch) and reward.timeout == 30.0
    score, detail = _score(env, "t", "<answer>SELECT count(*) FROM singer</answer>")
    env.close()
    assert (score, detail["error"]) == (1.0, None)


def test_a_setting_execution_match_does_not_take_is_still_refused() -> None:
    with pytest.raises(ValueError, match="takes no setting"):
        make_spider_env(reward={"execution_match": {"colum_order": False}})
