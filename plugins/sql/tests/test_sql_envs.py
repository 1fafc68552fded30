"""Spider-v0 / Chinook-v0: construction, the checker, the oracle on every task, and the reward."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import toolenv
from toolenv import Task, ToolEnv
from toolenv.registry import load
from toolenv.rewards import reward_names
from toolenv_sql.envs import chinook_oracle, make_chinook_env, make_spider_env, spider_oracle
from toolenv_sql.reward import ExecutionMatch, clean_sql, rows_match

Oracle = Callable[[Task, int, str], str]


@pytest.mark.parametrize(("env_id", "count"), [("toolenv/Spider-v0", 697), ("toolenv/Chinook-v0", 84)])
def test_gym_make_and_check_env(env_id: str, count: int) -> None:
    env = gym.make(env_id)
    inner = env.unwrapped
    assert isinstance(inner, ToolEnv) and len(inner.tasks) == count
    assert inner.parser.name == "tags"
    check_env(inner)
    obs, info = env.reset(seed=3)
    assert "CREATE TABLE" in obs and "Question: " in obs and "<sql>" in obs
    env.close()


def test_entry_points_are_registered() -> None:
    assert load("oracles", "Spider-v0") is spider_oracle
    assert load("oracles", "Chinook-v0") is chinook_oracle
    assert "execution_match" in reward_names()
    tool = toolenv.load_tool("sql", max_rows=7)
    assert tool.name == "sql" and tool.max_rows == 7


def test_question_carries_the_schema_in_the_messages_view() -> None:
    env = make_chinook_env(limit=1)
    _, info = env.reset(seed=0)
    user = info["messages"][-1]
    assert user.role == "user" and "CREATE TABLE [Album]" in user.content and "How many albums" in user.content


def test_overrides() -> None:
    env = make_spider_env(limit=5, max_turns=2, parser="hermes", max_rows=3, dialect="mysql")
    assert len(env.tasks) == 5 and env.max_turns == 2 and env.parser.name == "hermes"
    assert env.tools[0].max_rows == 3 and env.tools[0].dialect == "mysql"
    custom = [
        {"id": "x", "question": "q", "context": {"db_path": "chinook/Chinook_Sqlite.sqlite", "gold_sql": "SELECT 1"}}
    ]
    env = make_spider_env(tasks=custom, reward="exact_match")
    assert [t.id for t in env.tasks] == ["x"]


async def _run_oracle(env: ToolEnv, oracle: Oracle, task: Task) -> tuple[float, int]:
    obs, _ = await env.areset(options={"task": task})
    total, turn, done = 0.0, 0, False
    while not done:
        action = oracle(task, turn, obs)
        obs, reward, terminated, truncated, info = await env.astep(action)
        assert not any(r.is_error for r in info["tool_results"]), (task.id, obs)
        total += float(reward)
        turn += 1
        done = terminated or truncated
    return total, turn


@pytest.mark.parametrize(
    ("factory", "oracle", "count"), [(make_spider_env, spider_oracle, 697), (make_chinook_env, chinook_oracle, 84)]
)
async def test_oracle_scores_one_on_every_task(factory: Callable[..., ToolEnv], oracle: Oracle, count: int) -> None:
    template = factory()
    tasks = list(template.tasks)
    assert len(tasks) == count
    lanes = 4
    envs = [factory() for _ in range(lanes)]

    async def lane(i: int) -> list[tuple[str, float, int]]:
        return [(t.id, *(await _run_oracle(envs[i], oracle, t))) for t in tasks[i::lanes]]

    scored = [row for part in await asyncio.gather(*(lane(i) for i in range(lanes))) for row in part]
    assert len(scored) == count
    failed = [(tid, score) for tid, score, _ in scored if score != 1.0]
    assert failed == []
    assert {turns for _, _, turns in scored} == {2}


def test_hermes_parser_works() -> None:
    env = make_chinook_env(parser="hermes", limit=1)
    env.reset(seed=0, options={"task_index": 0})
    call = {"name": "sql", "arguments": {"query": "SELECT COUNT(*) FROM Album"}}
    obs, reward, terminated, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert "<tool_response>" in obs and "347" in obs and not terminated and reward == 0.0
    obs, reward, terminated, _, info = env.step("<answer>SELECT count(*) FROM Album</answer>")
    assert terminated and reward == 1.0 and info["reward_components"] == {"execution_match": 1.0}


def _episode_reward(env: ToolEnv, task_id: str, answer: str) -> float:
    env.reset(options={"task_id": task_id})
    return float(env.step(f"<answer>{answer}</answer>")[1])


def test_execution_match_scores() -> None:
    env = make_chinook_env()
    # "How many albums are there?" — any query returning 347 matches
    assert _episode_reward(env, "spiderman-train-chinook_1-000", "SELECT COUNT(AlbumId) FROM Album") == 1.0
    # the right number typed in reads no table: 0 (`require_table`, on by default)
    assert _episode_reward(env, "spiderman-train-chinook_1-000", "```sql\nSELECT 347;\n```") == 0.0
    assert _episode_reward(make_chinook_env(require_table=False), "spiderman-train-chinook_1-000", "SELECT 347") == 1.0
    assert _episode_reward(env, "spiderman-train-chinook_1-000", "SELECT COUNT(*) FROM Artist") == 0.0
    assert _episode_reward(env, "spiderman-train-chinook_1-000", "SELECT nope FROM Album") == 0.0
    assert _episode_reward(env, "spiderman-train-chinook_1-000", "DROP TABLE Album") == 0.0
    assert _episode_reward(env, "spiderman-train-chinook_1-000", "four hundred") == 0.0
    assert _episode_reward(env, "spiderman-train-chinook_1-000", "SELECT 347; SELECT 1") == 0.0


def test_a_trailing_comment_neither_refuses_the_query_nor_zeroes_the_reward() -> None:
    env = make_spider_env()
    env.reset(options={"task_id": "spider-dev-0000"})  # SELECT count(*) FROM singer
    obs, *_ = env.step("<sql>SELECT count(*) FROM singer; -- count them</sql>")
    assert obs.startswith("<information>count(*)") and "(1 row)" in obs, obs
    for answer in [
        "SELECT count(*) FROM singer; -- final",
        "SELECT count(*) FROM singer; /* final */",
        "```sql\nSELECT count(*) FROM singer; -- final\n```",
    ]:
        assert _episode_reward(env, "spider-dev-0000", answer) == 1.0, answer
    assert _episode_reward(env, "spider-dev-0000", "SELECT count(*) FROM singer; -- x\nSELECT 1") == 0.0


def test_execution_match_order_sensitivity() -> None:
    env = make_spider_env()
    ordered = next(t for t in env.tasks if t.id == "spider-dev-0002")  # ... ORDER BY age DESC
    assert "ORDER BY" in ordered.context["gold_sql"]
    reversed_sql = "SELECT name, country, age FROM singer ORDER BY age ASC"
    assert _episode_reward(env, ordered.id, ordered.context["gold_sql"]) == 1.0
    assert _episode_reward(env, ordered.id, reversed_sql) == 0.0
    unordered = "spider-dev-0000"  # SELECT count(*) FROM singer
    assert _episode_reward(env, unordered, "SELECT count(*) FROM singer ORDER BY 1") == 1.0


def test_execution_match_with_a_dialect() -> None:
    env = make_chinook_env(dialect="mysql")
    assert _episode_reward(env, "spiderman-train-chinook_1-000", "SELECT COUNT(*) FROM `Album` LIMIT 5") == 1.0


async def test_reward_without_answer_is_zero() -> None:
    env = make_chinook_env(max_turns=1, limit=1)
    await env.areset(options={"task_index": 0})
    _, reward, terminated, truncated, _ = await env.astep("I am not sure.")
    assert truncated and not terminated and reward == 0.0
    assert isinstance(env.reward_fn.parts["execution_match"][0], ExecutionMatch)


def test_helpers() -> None:
    assert clean_sql("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert clean_sql("  SELECT 2 ;; ") == "SELECT 2"
    assert rows_match([(1,), (2,), (2,)], [(2,), (1,), (2,)], ordered=False)
    assert not rows_match([(1,), (2,)], [(2,), (1,)], ordered=True)
    assert not rows_match([(1,), (1,)], [(1,)], ordered=False)
    assert rows_match([(0.1 + 0.2,)], [(0.3,)], ordered=True)


def test_vector_env_shares_the_query_pool() -> None:
    from toolenv_sql import executor

    vec = gym.make_vec("toolenv/Spider-v0", num_envs=4, vectorization_mode="vector_entry_point")
    vec.reset(seed=0)
    tasks = [e.episode.task for e in vec.envs]
    _, rewards, terminated, _, _ = vec.step([spider_oracle(t, 0, "") for t in tasks])
    assert list(rewards) == [0.0] * 4 and not any(terminated)
    _, rewards, terminated, _, _ = vec.step([spider_oracle(t, 1, "") for t in tasks])
    assert list(rewards) == [1.0] * 4 and all(terminated)
    pool = executor._executor()
    assert executor._executor() is pool  # one pool per process, however many envs
    vec.close()


def test_bad_actions_are_observations_through_step() -> None:
    env = make_spider_env(query_timeout=0.3, max_rows=2, max_turns=4)
    env.reset(options={"task_id": "spider-dev-0000"})
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    steps = {
        "<sql>DROP TABLE singer</sql>": "this is DROP",
        f"<sql>{runaway}</sql>": "longer than 0.3 s",
        "<sql>SELECT 1; SELECT 2</sql>": "found 2",
        "<sql>SELECT * FROM singer</sql>": "6 rows in total; showing the first 2",
    }
    for action, needle in steps.items():
        obs, reward, terminated, truncated, info = env.step(action)
        assert needle in obs and obs.startswith("<information>") and reward == 0.0
    assert truncated and not terminated  # four turns of errors and no answer: truncated


def test_cache_option_shares_results_by_task_across_envs() -> None:
    # Two envs of one config share the process's cache; the key holds the task (its database).
    envs = [make_spider_env(cache={"maxsize": 64}), make_spider_env(cache={"maxsize": 64})]
    assert envs[0].tools[0].cache is envs[1].tools[0].cache is not None
    assert make_spider_env(cache={"maxsize": 64}, max_rows=3).tools[0].cache is not envs[0].tools[0].cache
    assert make_chinook_env(cache={"maxsize": 64}).tools[0].cache is not envs[0].tools[0].cache
    assert make_spider_env().tools[0].cache is None
    shared = envs[0].tools[0].cache
    assert shared is not None
    shared.clear()  # the process's cache for these settings: start from empty whatever ran before
    first = envs[0].tasks[0]
    other = next(t for t in envs[0].tasks if t.context["db_path"] != first.context["db_path"])
    query = "<sql>SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name</sql>"
    seen = []
    for env, task in ((envs[0], first), (envs[1], first), (envs[1], other)):
        env.reset(options={"task": task})
        obs, _, _, _, info = env.step(query)
        seen.append((obs, info["tool_calls"][0].cached))
    assert seen[0] == (seen[1][0], False) and seen[1][1] is True
    assert seen[2][1] is False and seen[2][0] != seen[0][0]  # another database: run, another answer
    for env in envs:
        env.close()


def test_cache_option_refuses_unknown_settings() -> None:
    with pytest.raises(ValueError, match="unknown cache setting"):
        make_spider_env(cache={"size": 5})


def test_tasks_whose_gold_result_is_empty_can_be_left_out_for_training() -> None:
    """Any empty query matches an empty gold result: a reward a policy learns to take.
    `exclude_empty_gold=True` leaves those tasks out; the default keeps the standard set. (With
    `require_table` on, as by default, only an empty query that reads a table games them.)"""
    from toolenv_sql.envs import make_chinook_env, make_spider_env

    empty = "<answer>SELECT 1 WHERE 1 = 0</answer>"
    for make, total, hackable in ((make_spider_env, 697, 13), (make_chinook_env, 84, 2)):
        full, kept = make(require_table=False), make(exclude_empty_gold=True, require_table=False)
        assert len(full.tasks) == total and len(kept.tasks) == total - hackable
        gone = [t for t in full.tasks if t.id not in {k.id for k in kept.tasks}]
        for task in gone:  # what was left out is exactly what the empty query games
            full.reset(options={"task": task})
            assert full.step(empty)[1] == 1.0, task.id
        for task in kept.tasks:
            kept.reset(options={"task": task})
            assert kept.step(empty)[1] == 0.0, task.id
        full.close()
        kept.close()


def test_a_limit_with_exclude_empty_gold_runs_only_the_gold_queries_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    """`limit=N` keeps the first N tasks whose gold is not empty, and runs their gold queries
    (and the empty ones met on the way) only: not all 697 of Spider's, some of them slow."""
    import toolenv_sql.envs as envs

    ran: list[str] = []
    real = envs._gold_is_empty

    def counting(task: Task, root: object) -> bool:
        ran.append(task.id)
        return real(task, root)

    monkeypatch.setattr(envs, "_gold_is_empty", counting)
    env = envs.make_spider_env(exclude_empty_gold=True, limit=5)
    assert len(env.tasks) == 5
    assert len(ran) < 30, len(ran)
    everything = envs.make_spider_env(exclude_empty_gold=True)
    assert [t.id for t in env.tasks] == [t.id for t in everything.tasks[:5]]
    env.close()
    everything.close()


def test_exclude_empty_gold_takes_tasks_given_as_dicts() -> None:
    """`tasks` may be dicts (as everywhere else): leaving out empty-gold ones must not need `Task`s."""
    db = "spider_dev_sample/database/concert_singer/concert_singer.sqlite"
    custom = [
        {"id": "some", "question": "q", "context": {"db_path": db, "gold_sql": "SELECT count(*) FROM singer"}},
        {"id": "none", "question": "q", "context": {"db_path": db, "gold_sql": "SELECT name FROM singer WHERE 0"}},
    ]
    env = make_spider_env(tasks=custom, exclude_empty_gold=True)
    assert [t.id for t in env.tasks] == ["some"]
    env.reset(options={"task_id": "some"})
    assert env.step("<answer>SELECT count(*) FROM singer</answer>")[1] == 1.0
    env.close()


def test_exclude_empty_gold_names_the_task_whose_gold_query_fails() -> None:
    """A gold query that cannot run is reported at construction with the task's id, not as a bare
    engine error that leaves the user to search thousands of tasks for it."""
    db = "spider_dev_sample/database/concert_singer/concert_singer.sqlite"
    custom = [{"id": "broken-7", "question": "q", "context": {"db_path": db, "gold_sql": "SELECT * FROM nowhere"}}]
    with pytest.raises(ValueError, match=r"broken-7.*no such table: nowhere"):
        make_spider_env(tasks=custom, exclude_empty_gold=True)


def test_the_answer_gets_at_least_the_query_timeout_the_tool_gave() -> None:
    """With `query_timeout=30` (slow databases), an answer whose query ran in the tool must not
    time out when it is scored (the reward's own default is 10 s)."""
    slow = make_spider_env(limit=1, query_timeout=30.0)
    assert slow.tools[0].query_timeout == 30.0
    assert slow.reward_fn.parts["execution_match"][0].timeout == 30.0
    quick = make_spider_env(limit=1, query_timeout=1.0)
    assert quick.reward_fn.parts["execution_match"][0].timeout == 10.0
    slow.close()
    quick.close()
