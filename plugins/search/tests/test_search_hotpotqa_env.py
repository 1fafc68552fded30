"""`toolenv/HotpotQA-v0`: Search-R1 format, oracle, rewards, hermes, sharing and the env checker."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import toolenv
from toolenv.registry import load
from toolenv_search.backend import Passage
from toolenv_search.envs import (
    SEARCH_R1_PROMPT,
    gold_query,
    hotpotqa_oracle,
    hotpotqa_tasks,
    make_hotpotqa_env,
    nq_open_tasks,
)


def test_registered_through_entry_points() -> None:
    env = gym.make("toolenv/HotpotQA-v0")
    assert isinstance(env.unwrapped, toolenv.ToolEnv)
    assert len(env.unwrapped.tasks) == 100
    assert load("oracles", "HotpotQA-v0") is hotpotqa_oracle
    env.close()


def test_prompt_is_search_r1s() -> None:
    env = make_hotpotqa_env(task_order="sequential")
    obs, info = env.reset(seed=0)
    task = env.tasks[0]
    question = task.context["question"]
    assert question.endswith("?")
    assert obs == SEARCH_R1_PROMPT.format(question=question)
    assert "<search> query </search>" in obs and "<information> and </information>" in obs
    assert obs.endswith(f"Question: {question}\n")
    assert info["messages"][1].content == obs
    assert env.parser.name == "tags"


def test_questions_are_prepared_as_search_r1_prepares_them() -> None:
    """Search-R1's data scripts (`scripts/data_process/nq_search.py`, `qa_search_*_merge.py`) strip the
    question and end it with "?" before `make_prefix`: NQ-open's questions have none, so without this
    no NQ prompt was the text a Search-R1 checkpoint was trained and evaluated on."""
    tasks = {t.id: t for t in hotpotqa_tasks()}
    no_mark = tasks["5ac4db1d554299076e296e1a"]  # "who is a British physicist ... adviser" (no "?")
    assert no_mark.prompt.endswith(
        "Question: who is a British physicist  and also a  British government's chief scientific adviser?\n"
    )
    padded = tasks["5a881d2355429938390d3eeb"]  # " If You Ever Get Lonely was covered by ...?" (leading space)
    assert "Question: If You Ever Get Lonely was covered by what Lyric Street Records-affiliated band?\n" in (
        padded.prompt
    )
    trailing = tasks["5ac532335542994611c8b41c"]  # "...community? " (trailing space)
    assert trailing.prompt.endswith("1917 Progressive Era community?\n")
    assert trailing.context["question"].endswith("1917 Progressive Era community? ")  # the dataset's, as it is
    moon = nq_open_tasks()[0]
    assert moon.prompt.endswith("Question: when was the last time anyone was on the moon?\n")
    assert moon.prompt == SEARCH_R1_PROMPT.format(question="when was the last time anyone was on the moon?")
    hermes = make_hotpotqa_env(parser="hermes", tasks=None)
    assert all(t.prompt.endswith("?\n") for t in hermes.tasks)


def test_oracle_scores_one_on_every_task() -> None:
    env = make_hotpotqa_env()
    total = 0.0
    gold_found = both_found = 0
    for task in env.tasks:
        obs, _ = env.reset(options={"task_id": task.id})
        turn = 0
        terminated = truncated = False
        while not (terminated or truncated):
            obs, reward, terminated, truncated, info = env.step(hotpotqa_oracle(task, turn, obs))
            if turn == 0:
                assert obs.startswith("<information>Doc 1(Title: ") and obs.endswith("</information>")
                gold_found += any(f'(Title: "{t}")' in obs for t in task.context["gold_titles"])
                both_found += all(f'(Title: "{t}")' in obs for t in task.context["gold_titles"])
            turn += 1
        assert terminated and turn == 2
        total += float(reward)
    assert total == 100.0
    assert gold_found == 100  # the gold-passage query does retrieve a gold paragraph every time
    assert both_found == 86  # and both of them for 86 (docs/plugins/search.md says so)
    env.close()


def test_f1_reward_and_exact_match_default() -> None:
    env = make_hotpotqa_env(reward="f1", task_order="sequential")
    env.reset(options={"task_id": "5ae6316d5542996de7b71b87"})  # gold: "Ricard Rubio i Vives"
    _, reward, terminated, _, info = env.step("<answer> Ricard Rubio </answer>")
    assert terminated and info["reward_components"] == {"f1": pytest.approx(2 * (2 / 2) * (2 / 4) / (1 + 2 / 4))}
    em = make_hotpotqa_env()
    em.reset(options={"task_id": "5ae6316d5542996de7b71b87"})
    _, reward, *_ = em.step("<answer> Ricard Rubio </answer>")
    assert reward == 0.0
    em.reset(options={"task_id": "5ae6316d5542996de7b71b87"})
    _, reward, *_ = em.step("<answer> ricard rubio i vives. </answer>")
    assert reward == 1.0


def test_action_penalties() -> None:
    env = make_hotpotqa_env(invalid_action_penalty=0.1, search_penalty=0.05, task_order="sequential")
    task = env.tasks[0]
    env.reset(options={"task_id": task.id})
    obs, reward, *_, info = env.step("I am not sure what to do.")
    assert "No tool call and no final answer" in obs
    assert reward == pytest.approx(-0.1)
    obs, reward, *_ = env.step("<search> first </search><search> second </search>")
    assert obs.count("<information>") == 2
    assert reward == pytest.approx(-0.1)  # two searches at 0.05
    obs, reward, *_ = env.step(f"<search>{'x' * 5000}</search>")  # a failed search is also invalid
    assert "too long" in obs
    assert reward == pytest.approx(-0.15)
    _, reward, terminated, _, info = env.step(hotpotqa_oracle(task, 1, obs))
    assert terminated and reward == pytest.approx(1.0)
    assert info["episode_stats"]["return"] == pytest.approx(0.65)
    assert set(info["reward_components"]) == {"exact_match", "invalid_call_penalty", "tool_call_penalty"}


def test_hermes_tool_calls_work() -> None:
    env = make_hotpotqa_env(parser="hermes", task_order="sequential")
    obs, _ = env.reset(options={"task_index": 0})
    assert "<tools>" in obs and '"name": "search"' in obs
    assert "call the search tool" in obs and "<search> query </search>" not in obs
    task = env.tasks[0]
    payload = {"name": "search", "arguments": {"query": gold_query(task), "topk": 2}}
    call = f"<tool_call>{json.dumps(payload)}</tool_call>"
    obs, reward, terminated, _, info = env.step(call)
    assert obs.startswith("<tool_response>\nDoc 1(Title: ") and obs.count("Doc ") == 2
    assert info["messages"][1].role == "tool" and info["messages"][1].name == "search"
    _, reward, terminated, _, _ = env.step(f"<answer>{task.answers[0]}</answer>")
    assert terminated and reward == 1.0


def test_empty_query_hint_in_hermes_mode_shows_no_tags() -> None:
    env = make_hotpotqa_env(parser="hermes", task_order="sequential")
    env.reset()
    obs, *_ = env.step('<tool_call>{"name": "search", "arguments": {"query": "  "}}</tool_call>')
    assert obs.startswith("<tool_response>") and "The search query is empty" in obs
    assert "<search>" not in obs and "</search>" not in obs


def test_bad_searches_are_observations() -> None:
    env = make_hotpotqa_env(task_order="sequential")
    env.reset()
    obs, *_ = env.step("<search>   </search>")
    assert obs == "<information><search></search> is empty.</information>"
    obs, *_ = env.step(f"<search>{'x' * 50_000}</search>")
    assert "too long (50000 characters" in obs
    obs, _, _, truncated, _ = env.step("<search> the of </search>")
    assert obs == "<information>No results found for: the of</information>"


def test_many_envs_share_one_index_and_limit_works() -> None:
    envs = [make_hotpotqa_env(limit=3) for _ in range(64)]
    assert all(len(e.tasks) == 3 for e in envs)
    indexes = {id(e.tools[0].backend.load()) for e in envs}  # type: ignore[attr-defined]
    assert len(indexes) == 1


def test_custom_tasks_override() -> None:
    env = make_hotpotqa_env(tasks=[{"question": "What is Constantin Medien?", "answer": "a German media group"}])
    env.reset()
    obs, *_ = env.step("<search> Constantin Medien </search>")
    assert "Ismaning" in obs
    _, reward, *_ = env.step("<answer>German media group</answer>")
    assert reward == 1.0


def test_a_users_own_tasks_get_the_envs_instructions() -> None:
    """A task of the user's own is put in the env's prompt as the bundled ones are (the prompt
    lives in their question): before, the model saw the bare question, told nothing of
    `<search>` or `<answer>`. Tasks already prepared, or with a prompt of their own, are kept."""
    mine = {"question": "  What is Constantin Medien ", "answer": "a German media group"}
    env = make_hotpotqa_env(tasks=[mine])
    obs, _ = env.reset()
    assert obs == SEARCH_R1_PROMPT.format(question="What is Constantin Medien?")
    assert env.tasks[0].context["question"] == mine["question"]
    hermes = make_hotpotqa_env(tasks=[mine], parser="hermes")
    obs, _ = hermes.reset()
    assert "What is Constantin Medien?" in obs and "<answer>" in obs
    bundled = hotpotqa_tasks()[:2]
    assert make_hotpotqa_env(tasks=bundled).tasks == bundled
    own = {"question": "q", "prompt": "My whole prompt", "answer": "a"}
    assert make_hotpotqa_env(tasks=[own]).reset()[0] == "My whole prompt"
    for e in (env, hermes):
        e.close()


def test_check_env_passes() -> None:
    env = gym.make("toolenv/HotpotQA-v0", limit=10)
    check_env(env.unwrapped)
    env.close()


def test_vector_env() -> None:
    vec = gym.make_vec("toolenv/HotpotQA-v0", num_envs=4, vectorization_mode="vector_entry_point", limit=4)
    obs, _ = vec.reset(seed=3)
    assert all(o.startswith("Answer the given question.") for o in obs)
    obs, rewards, *_ = vec.step(["<search> VIVA Media </search>"] * 4)
    assert all(o.startswith("<information>Doc 1(Title: ") for o in obs)
    vec.close()


def test_bundled_tasks_are_read_once_and_a_users_file_every_time(tmp_path: Path) -> None:
    a, b = make_hotpotqa_env(), make_hotpotqa_env()
    assert a.tasks == b.tasks and a.tasks[0] is b.tasks[0]  # one read, shared by every env
    a.tasks.pop()  # each env has its own list
    assert len(b.tasks) == 100 and len(hotpotqa_tasks()) == 100
    mine = tmp_path / "q.jsonl"
    row = {"id": "x", "question": "Who?", "answers": ["me"]}
    mine.write_text(json.dumps(row) + "\n")
    assert [t.id for t in hotpotqa_tasks(mine)] == ["x"]
    mine.write_text(json.dumps({**row, "id": "y"}) + "\n")
    assert [t.id for t in hotpotqa_tasks(mine)] == ["y"]


def test_cache_option_shares_searches_across_tasks_and_envs() -> None:
    envs = [make_hotpotqa_env(cache={"maxsize": 128}), make_hotpotqa_env(cache={"maxsize": 128})]
    cache = envs[0].tools[0].cache
    assert cache is not None and cache is envs[1].tools[0].cache and cache.scope == "shared"
    assert make_hotpotqa_env(cache={"maxsize": 128}, topk=5).tools[0].cache is not cache
    assert make_hotpotqa_env().tools[0].cache is None
    cache.clear()  # the process's cache for these settings: start from empty whatever ran before
    records = []
    for env, index in ((envs[0], 0), (envs[1], 1)):
        env.reset(options={"task_index": index})
        obs, _, _, _, info = env.step("<search>Scott Derrickson nationality</search>")
        records.append((obs, info["tool_calls"][0].cached))
        env.close()
    assert records[0][0] == records[1][0] and "<information>" in records[0][0]
    assert [cached for _, cached in records] == [False, True]


class _OneAnswer:
    """A backend whose every passage names its own word."""

    name = "one-answer"

    def __init__(self, word: str) -> None:
        self.word = word

    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        return [[Passage(id=self.word, title=self.word, text=f"the answer is {self.word}")] for _ in queries]

    async def aclose(self) -> None:
        pass


def test_cache_of_one_backend_object_never_answers_for_another() -> None:
    # Envs made one after another, each over a new backend object: CPython reuses the ids
    # of objects that are gone, and an id-keyed cache served the old backend's passages.
    seen = []
    for i in range(12):
        env = make_hotpotqa_env(backend=_OneAnswer(f"w{i}"), cache=True, limit=1)
        env.reset()
        obs, *_ = env.step("<search> who </search>")
        env.close()
        seen.append(obs)
    assert seen == [f'<information>Doc 1(Title: "w{i}") the answer is w{i}</information>' for i in range(12)]
