"""toolenv envs as skyrl-gym text envs, driven the way SkyRL-train's generator drives them.

Each env is made with the real `skyrl_gym.make(env_class, env_config=..., extras=row)` from
a row whose `prompt` and `env_class` were taken off (what SkyRL's `PromptDataset` hands the
generator), with `extras["max_turns"]` set as the generator sets it; then `init(prompt)`,
`step(text)` until `done`, `get_metrics()` and `close()`. The envs are real: Spider on its
bundled SQLite files, HotpotQA on its bundled BM25 index, and a hermes-format calculator.
Observations are tokenized with the tiny offline Qwen tokenizer the way the generator does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import BaseModel

skyrl_gym = pytest.importorskip(
    "skyrl_gym", reason="the SkyRL integration needs skyrl-gym: pip install 'toolenv[skyrl]' (CI installs it)"
)

import gymnasium as gym  # noqa: E402

import toolenv  # noqa: E402
from toolenv.integrations.skyrl import (  # noqa: E402
    ToolEnvTextEnv,
    adataset_rows,
    close_pooled_envs,
    dataset_rows,
    register,
    task_options,
)
from toolenv.integrations.skyrl.env import _POOL  # noqa: E402
from toolenv.integrations.verl.data import build_rows  # noqa: E402
from toolenv.integrations.verl.envs import make_env  # noqa: E402

from ..conftest import TASKS, Add  # noqa: E402

SPIDER = "toolenv/Spider-v0"
HOTPOT = "toolenv/HotpotQA-v0"
CALC = "toolenv-test/SkyRLCalc-v0"
CLOSING = "toolenv-test/SkyRLClosing-v0"
SNAP = "toolenv-test/SkyRLSnap-v0"
TOLL = "toolenv-test/SkyRLToll-v0"
LOOPS = "toolenv-test/SkyRLLoops-v0"
FAILING = "toolenv-test/SkyRLFailing-v0"
FAILING_TOLL = "toolenv-test/SkyRLFailingToll-v0"
CALL = '<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'


class ClosingAdd(Add):
    """`add` that counts how often its env closed it."""

    closed = 0
    closing = threading.Event()  # set by a close, for a close run on another thread

    async def close(self) -> None:
        type(self).closed += 1
        type(self).closing.set()


class LoopAdd(Add):
    """`add` that notes the event loop it ran on (as a per-loop client or batcher is made once per
    loop) and adds on the loop's default thread pool (as the BM25 search backend searches)."""

    loops: set[int] = set()  # noqa: RUF012 - shared on purpose

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        type(self).loops.add(id(asyncio.get_running_loop()))
        return toolenv.ToolResult(text=str(await asyncio.to_thread(sum, (args.a, args.b))))


class Snapshot(toolenv.Tool):
    """Return a 2x2 red image."""

    name = "snapshot"

    class Args(BaseModel):
        pass

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        from PIL import Image

        return toolenv.ToolResult(
            text="a red square", images=[toolenv.ToolImage.from_pil(Image.new("RGB", (2, 2), "red"))]
        )


class HoldingAdd(ClosingAdd):
    """`add` that holds something per episode and counts its releases (and, as `ClosingAdd`, its closes)."""

    released = 0

    async def release(self, ctx: toolenv.ToolContext) -> None:
        type(self).released += 1


class FailingJudge(toolenv.rewards.Reward):
    """A final reward whose backend is down: scoring an ended episode raises."""

    name = "judge"

    async def final(self, episode: Any) -> float:
        raise ConnectionError("the judge is unreachable")


def _failing_env(**kw: Any) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[HoldingAdd()], tasks=TASKS, parser="hermes", reward=FailingJudge(), **kw)


def _failing_toll_env(**kw: Any) -> toolenv.ToolEnv:
    """The failing judge plus a per-turn reward: each tool call costs 0.25."""
    reward = [(FailingJudge(), 1.0), (toolenv.rewards.ToolCallPenalty(-0.25), 1.0)]
    return toolenv.ToolEnv(tools=[HoldingAdd()], tasks=TASKS, parser="hermes", reward=reward, **kw)


def _snap_env(**kw: Any) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[Snapshot()], tasks=TASKS, parser="hermes", **kw)


def _calc_env(**kw: Any) -> toolenv.ToolEnv:
    kw.setdefault("max_turns", 6)
    kw.setdefault("parser", "hermes")
    return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, reward="exact_match", **kw)


def _closing_env(**kw: Any) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[ClosingAdd()], tasks=TASKS, parser="hermes", reward="exact_match", **kw)


def _toll_env(**kw: Any) -> toolenv.ToolEnv:
    """The calculator with a per-turn reward: each tool call costs 0.25."""
    reward = [("exact_match", 1.0), (toolenv.rewards.ToolCallPenalty(-0.25), 1.0)]
    return toolenv.ToolEnv(tools=[Add()], tasks=TASKS, parser="hermes", reward=reward, **kw)


def _loops_env(**kw: Any) -> toolenv.ToolEnv:
    return toolenv.ToolEnv(tools=[LoopAdd()], tasks=TASKS, parser="hermes", reward="exact_match", **kw)


_TEST_ENVS = (
    (CALC, _calc_env),
    (CLOSING, _closing_env),
    (SNAP, _snap_env),
    (TOLL, _toll_env),
    (LOOPS, _loops_env),
    (FAILING, _failing_env),
    (FAILING_TOLL, _failing_toll_env),
)
for _id, _factory in _TEST_ENVS:
    if _id not in gym.registry:
        gym.register(_id, entry_point=_factory)


@pytest.fixture(autouse=True)
def _registered() -> Iterator[None]:
    register([SPIDER, HOTPOT, CALC, CLOSING, SNAP, TOLL, LOOPS, FAILING, FAILING_TOLL])
    yield
    close_pooled_envs()


def need_sql() -> None:
    pytest.importorskip("toolenv_sql", reason="the Spider env needs toolenv-sql")


def need_search() -> None:
    pytest.importorskip("toolenv_search", reason="the HotpotQA env needs toolenv-search")


def make(row: dict[str, Any], *, generator_max_turns: int = 5, env_config: Any = None) -> tuple[Any, list[Any]]:
    """What SkyRL does per sample: split the row, set extras['max_turns'], make the env, init it."""
    row = json.loads(json.dumps(row))  # a copy, as the dataset hands each sample its own
    prompt = row.pop("prompt")
    env_class = row.pop("env_class")
    extras = {**row, "max_turns": generator_max_turns}
    env = skyrl_gym.make(env_class, env_config=env_config if env_config is not None else {}, extras=extras)
    messages, meta = env.init(prompt)
    assert meta == {"env_id": env.env_id, "task_id": row["extra_info"]["task_id"]}
    return env, messages


def task_of(row: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(row["extra_info"]["task"]))


def gold(row: dict[str, Any]) -> str:
    answer = task_of(row)["answer"]
    return str(answer[0] if isinstance(answer, list) else answer)


def plain_env_step(env_id: str, row: dict[str, Any], text: str) -> str:
    """The observation a plain `gym.make` env gives for `text` on the row's task."""
    env = make_env(env_id)
    try:
        env.reset(options={"task": task_of(row)})
        return env.step(text)[0]
    finally:
        env.close()


# ---------------------------------------------------------------------------- imports
def test_importing_toolenv_and_building_rows_never_imports_skyrl_gym_or_verl() -> None:
    code = (
        "import sys, toolenv, toolenv.integrations.skyrl as s\n"
        "assert 'skyrl_gym' not in sys.modules\n"
        "rows = s.dataset_rows('toolenv/ToolEnv-v0', env_kwargs={'tasks': [{'question': 'q', 'answer': 'a'}]})\n"
        "assert rows[0]['env_class'] == 'toolenv/ToolEnv-v0'\n"
        "assert 'skyrl_gym' not in sys.modules and 'verl' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------------------- rows
def test_dataset_rows_have_skyrls_columns_and_the_envs_prompt() -> None:
    need_sql()
    rows = dataset_rows(SPIDER, n=3)
    assert len(rows) == 3
    env = make_env(SPIDER)
    try:
        for i, row in enumerate(rows):
            assert set(row) == {"prompt", "env_class", "reward_spec", "extra_info", "data_source"}
            assert row["env_class"] == SPIDER and row["data_source"] == SPIDER
            assert row["reward_spec"] == {"method": "rule", "ground_truth": gold(row)}
            assert set(row["extra_info"]) == {"index", "split", "env_id", "task_id", "task", "env_kwargs"}
            assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == "all"
            task = env.tasks[i]
            assert row["extra_info"]["task_id"] == task.id and task_of(row) == task.model_dump(mode="json")
            _, messages = env.render_prompt(task)  # the env's own prompt: the format it parses
            assert row["prompt"] == [{"role": m.role, "content": m.content} for m in messages]
    finally:
        env.close()
    json.dumps(rows)  # plain JSON all the way down (parquet-ready)
    assert dataset_rows(SPIDER, n=1, env_class="toolenv")[0]["env_class"] == "toolenv"
    assert dataset_rows(SPIDER, n=1, data_source="spider")[0]["data_source"] == "spider"


def test_rows_are_verls_rows_in_skyrls_columns() -> None:
    kwargs = {"tasks": TASKS, "max_turns": 3, "parser": "hermes"}
    skyrl = dataset_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs)
    verl = build_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs)
    assert len(skyrl) == len(TASKS)
    assert [r["prompt"] for r in skyrl] == [r["prompt"] for r in verl]
    assert [r["reward_spec"]["ground_truth"] for r in skyrl] == [r["reward_model"]["ground_truth"] for r in verl]
    for s, v in zip(skyrl, verl, strict=True):
        assert s["extra_info"] == {k: x for k, x in v["extra_info"].items() if k != "tools_kwargs"}
        assert json.loads(s["extra_info"]["env_kwargs"]) == {"max_turns": 3, "parser": "hermes"}  # not `tasks`
    register("toolenv/ToolEnv-v0", generic=False)
    env, _ = make(skyrl[0])  # the worker's env has no tasks: the row's own task is run
    assert env.env.tasks == [] and env.max_turns == 5
    assert env.step(f"<answer>{gold(skyrl[0])}</answer>")["reward"] == 1.0
    env.close()


def test_dataset_rows_split_n_and_their_errors() -> None:
    every = {r["extra_info"]["task_id"] for r in dataset_rows(CALC)}
    train = {r["extra_info"]["task_id"] for r in dataset_rows(CALC, split="train")}
    test = {r["extra_info"]["task_id"] for r in dataset_rows(CALC, split="test")}
    assert train | test == every and not train & test
    assert len(dataset_rows(CALC, n=2)) == 2
    with pytest.raises(ValueError, match="n must be at least 1"):
        dataset_rows(CALC, n=0)
    with pytest.raises(TypeError, match=r"^dataset_rows\(\) got an unexpected keyword argument 'bogus'"):
        dataset_rows(CALC, bogus=1)  # type: ignore[call-arg]  # named as the user called it
    pytest.importorskip("toolenv_vision", reason="the image-prompt case uses the VisualSearch env (toolenv-vision)")
    with pytest.raises(ValueError, match="has images in its prompt"):
        dataset_rows("toolenv/VisualSearch-v0", n=1)


async def test_adataset_rows_inside_an_event_loop() -> None:
    rows = await adataset_rows(CALC, n=2)
    assert [r["extra_info"]["task_id"] for r in rows] == [t["id"] for t in TASKS[:2]]


def test_rows_round_trip_through_skyrl_gym_make() -> None:
    need_sql()
    rows = list(dataset_rows(SPIDER, n=4))
    assert len(rows) == 4  # an empty dataset would pass the loop below without a check
    for row in rows:
        env, messages = make(row)
        assert isinstance(env, ToolEnvTextEnv) and env.env_id == SPIDER
        assert messages == row["prompt"]
        assert env.env.episode is not None and env.env.episode.task.id == row["extra_info"]["task_id"]
        env.close()


def test_rows_round_trip_through_parquet_as_skyrls_prompt_dataset_reads_them(tmp_path: Any) -> None:
    need_sql()
    datasets = pytest.importorskip("datasets", reason="SkyRL's PromptDataset reads rows with HF datasets")
    rows = dataset_rows(SPIDER, n=2) + dataset_rows(CALC, n=1, env_class="toolenv")  # two kinds of extra_info
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    loaded = datasets.load_dataset("parquet", data_files=str(path), keep_in_memory=True)["train"]
    for i in range(len(loaded)):
        item = dict(loaded[i])  # PromptDataset.__getitem__: prompt and env_class off, the rest is extras
        prompt, env_class = item.pop("prompt"), item.pop("env_class")
        env = skyrl_gym.make(env_class, env_config={}, extras={**item, "max_turns": 3})
        messages, meta = env.init(prompt)
        assert meta["task_id"] == rows[i]["extra_info"]["task_id"] and env.env_id == rows[i]["extra_info"]["env_id"]
        assert messages == rows[i]["prompt"]
        env.close()


def test_the_same_row_gives_the_same_task() -> None:
    need_sql()
    row = dataset_rows(SPIDER, n=5)[3]
    seen = set()
    for _ in range(3):
        env, _ = make(row)
        seen.add(env.env.episode.task.id)
        env.close()
    assert seen == {row["extra_info"]["task_id"]}


def test_task_options_read_skyrl_rows_and_hand_written_ones() -> None:
    task = toolenv.Task(id="x", question="1+1?", answer="2")
    assert task_options({"extra_info": {"task": task.model_dump_json(), "task_id": "ignored"}}) == {"task": task}
    assert task_options({"extra_info": {"task_id": "t2"}}) == {"task_id": "t2"}
    assert task_options({"task_id": "t3", "extra_info": {}}) == {"task_id": "t3"}  # the row's top level
    assert task_options({"task_index": 1, "extra_info": {"task_id": None}}) == {"task_index": 1}  # None: absent
    inline = task_options({"extra_info": {"question": "2+3?"}, "reward_spec": {"ground_truth": "5"}})
    assert inline["task"].question == "2+3?" and inline["task"].answer == "5"
    gold = task_options({"extra_info": {"question": "2+3?", "answer": "2+3 = 5"}, "reward_spec": {"ground_truth": "5"}})
    assert gold["task"].answer == "5"  # SkyRL's envs score against reward_spec.ground_truth
    with pytest.raises(ValueError, match="names no task"):
        task_options({"reward_spec": {"ground_truth": "5"}})


# ---------------------------------------------------------------------------- episodes on real envs
def test_spider_query_result_comes_back_and_the_answer_ends_with_the_envs_reward() -> None:
    need_sql()
    from toolenv_sql.datasets import DATA_DIR

    row = dataset_rows(SPIDER, n=1)[0]
    context = task_of(row)["context"]
    with sqlite3.connect(DATA_DIR / context["db_path"]) as db:
        [(count,)] = db.execute(context["gold_sql"]).fetchall()
    text = f"Let me look.\n<sql>{gold(row)}</sql>"
    env, _ = make(row)
    out = env.step(text)
    assert out["done"] is False and out["reward"] == 0.0
    [obs] = out["observations"]
    assert obs == {"role": "user", "content": plain_env_step(SPIDER, row, text)}  # the env's own observation
    assert obs["content"].startswith("<information>") and str(count) in obs["content"]
    [call] = out["metadata"]["tool_calls"]
    assert call["name"] == "sql" and call["error"] is None and out["metadata"]["tool_errors"] == 0
    json.dumps(out["metadata"])
    out = env.step(f"<answer>{gold(row)}</answer>")
    assert out["done"] is True and out["reward"] == 1.0 and out["observations"] == []
    assert out["metadata"]["terminated"] is True and out["metadata"]["answer"] == gold(row)
    assert out["metadata"]["episode"]["return"] == 1.0
    json.dumps(out["metadata"])
    metrics = env.get_metrics()
    assert metrics["return"] == 1.0 and metrics["turns"] == 2 and metrics["tool_calls"] == 1
    assert metrics["answered"] == 1.0 and metrics["terminated"] == 1.0 and metrics["truncated"] == 0.0
    env.close()


def test_spider_wrong_answer_scores_zero() -> None:
    need_sql()
    row = dataset_rows(SPIDER, n=1)[0]
    env, _ = make(row)
    out = env.step("<answer>SELECT 1</answer>")
    assert out["done"] is True and out["reward"] == 0.0 and env.get_metrics()["return"] == 0.0
    env.close()


def test_malformed_text_is_an_error_observation_and_the_episode_goes_on() -> None:
    need_sql()
    row = dataset_rows(SPIDER, n=1)[0]
    env, _ = make(row)
    out = env.step("I think the answer is six.")
    assert out["done"] is False and out["reward"] == 0.0
    [obs] = out["observations"]
    assert obs["role"] == "user" and "No tool call and no final answer" in obs["content"]
    out = env.step("<sql>SELECT nonsense FROM nowhere</sql>")  # a failing query: also an observation
    assert out["done"] is False and out["metadata"]["tool_errors"] == 1
    assert out["metadata"]["tool_calls"][0]["error"] is not None
    assert "no such table: nowhere" in out["observations"][0]["content"]  # SQLite's own message
    out = env.step(f"<answer>{gold(row)}</answer>")
    assert out["done"] is True and out["reward"] == 1.0
    metrics = env.get_metrics()
    assert metrics["tool_errors"] == 1 and metrics["parse_errors"] == 1  # the failed query; the missing call
    env.close()


def test_generator_max_turns_ends_the_episode() -> None:
    need_sql()
    row = dataset_rows(SPIDER, n=1)[0]
    env, _ = make(row, generator_max_turns=2)
    assert env.max_turns == 2
    assert env.step("<sql>SELECT 1</sql>")["done"] is False
    out = env.step("<sql>SELECT 2</sql>")
    assert out["done"] is True and out["observations"] == []
    assert out["metadata"]["truncated"] is True and out["metadata"]["terminated"] is False
    assert env.get_metrics()["truncated"] == 1.0 and env.get_metrics()["answered"] == 0.0
    after = env.step("<answer>x</answer>")  # past `done`: nothing more is run
    assert after["done"] is True and after["reward"] == 0.0 and len(env.env.episode.turns) == 2
    env.close()


def test_max_turns_precedence_and_the_pooled_env_restored() -> None:
    row = dataset_rows(CALC, n=1)[0]
    env, _ = make(row, generator_max_turns=9, env_config={"max_turns": 1})  # the config's wins
    out = env.step(CALL.format(a=1, b=1))
    assert out["done"] is True and out["metadata"]["truncated"] is True
    env.close()
    register(CALC, max_turns=2)
    env, _ = make(row, generator_max_turns=9)  # then the registration's
    assert env.max_turns == 2 and env.env.max_turns == 2
    env.close()
    register(CALC)
    env, _ = make(row, generator_max_turns=9)  # then SkyRL's; the pooled env keeps no earlier limit
    assert env.max_turns == 9 and env.env.max_turns == 9
    env.close()
    env = skyrl_gym.make(CALC, env_config={}, extras={"extra_info": {"task_id": "t1"}})  # none: the env's own
    assert env.max_turns == 6
    env.close()
    with pytest.raises(ValueError, match="max_turns must be at least 1"):
        skyrl_gym.make(CALC, env_config={"max_turns": 0}, extras={"extra_info": {"task_id": "t1"}})


def test_hotpotqa_search_on_the_bundled_index() -> None:
    need_search()
    row = dataset_rows(HOTPOT, n=1)[0]
    env, messages = make(row)
    assert "<search>" in messages[0]["content"]
    text = "<think>look it up</think><search>VIVA Media AG new name 2004</search>"
    out = env.step(text)
    assert out["done"] is False
    [obs] = out["observations"]
    assert obs == {"role": "user", "content": plain_env_step(HOTPOT, row, text)}
    assert obs["content"].startswith("<information>") and "Doc 1" in obs["content"]
    out = env.step(f"<answer>{gold(row)}</answer>")
    assert out["done"] is True and out["reward"] == 1.0
    env.close()


def test_hermes_env_sends_tool_messages_and_the_generic_class_reads_the_env_from_the_row() -> None:
    rows = dataset_rows(CALC, env_class="toolenv")
    row = next(r for r in rows if r["extra_info"]["task_id"] == "t1")
    env, messages = make(row)
    assert env.env_id == CALC and env.observation_role == "tool"
    assert '"name": "add"' in messages[0]["content"]  # hermes instructions with the tool schema
    out = env.step(CALL.format(a=2, b=3))
    assert out["observations"] == [{"role": "tool", "content": "5", "name": "add", "tool_call_id": "call_0"}]
    out = env.step("oops")  # no call: its error answers no call, so it goes as a user message
    [obs] = out["observations"]
    assert obs["role"] == "user" and "No tool call and no final answer" in obs["content"]
    out = env.step("<answer>5</answer>")
    assert out["done"] is True and out["reward"] == 1.0
    env.close()


def test_a_tools_images_are_dropped_and_its_text_kept() -> None:
    pytest.importorskip("PIL", reason="the image tool needs Pillow")
    env = skyrl_gym.make(SNAP, env_config={}, extras={"extra_info": {"task_id": "t1"}, "max_turns": 3})
    env.init(None)
    out = env.step('<tool_call>\n{"name": "snapshot", "arguments": {}}\n</tool_call>')
    assert env.env.episode.turns[0].results[0].images  # the tool did return an image
    assert out["observations"] == [
        {"role": "tool", "content": "a red square", "name": "snapshot", "tool_call_id": "call_0"}
    ]
    env.close()


def test_observation_role_user_for_a_hermes_env() -> None:
    row = dataset_rows(CALC, n=1)[0]
    text = CALL.format(a=1, b=1)
    env, _ = make(row, env_config={"observation_role": "user"})
    assert env.observation_role == "user"
    [obs] = env.step(text)["observations"]
    assert obs == {"role": "user", "content": plain_env_step(CALC, row, text)}
    assert obs["content"].startswith("<tool_response>")
    env.close()
    with pytest.raises(ValueError, match="observation_role must be"):
        make(row, env_config={"observation_role": "system"})


def test_reward_at_end_puts_the_whole_return_on_the_last_step() -> None:
    """With a custom chat template SkyRL keeps only the last step's reward: `reward_at_end`
    puts the episode's return there, so per-turn rewards are not lost."""
    row = dataset_rows(TOLL, n=1)[0]
    env, _ = make(row)  # by default each step carries its own reward
    assert [env.step(CALL.format(a=2, b=3))["reward"], env.step("<answer>5</answer>")["reward"]] == [-0.25, 1.0]
    env.close()
    for settings in ({"env_config": {"reward_at_end": True}}, {}):
        if not settings:
            register(TOLL, reward_at_end=True)
        env, _ = make(row, **settings)
        first = env.step(CALL.format(a=2, b=3))
        assert first["reward"] == 0.0 and first["metadata"]["reward_components"]["tool_call_penalty"] == -0.25
        last = env.step("<answer>5</answer>")
        assert last["done"] and last["reward"] == 0.75 == env.get_metrics()["return"]
        env.close()
    env, _ = make(row, generator_max_turns=1)  # cut by the turn limit: the return is there too
    assert env.step(CALL.format(a=2, b=3))["reward"] == -0.25
    env.close()
    register(TOLL)


def test_settings_from_skyrls_config_objects() -> None:
    """The generator passes `environment.skyrl_gym.<env_class>`: an OmegaConf node or a dataclass."""
    from omegaconf import OmegaConf

    @dataclasses.dataclass
    class Config:
        env_id: str = CALC
        observation_role: str = "user"
        env_kwargs: dict[str, Any] = dataclasses.field(default_factory=lambda: {"max_turns": 4})

    extras = {"extra_info": {"task_id": "t2"}}
    for config in (OmegaConf.create(dataclasses.asdict(Config())), Config()):
        env = skyrl_gym.make("toolenv", env_config=config, extras=extras)
        messages, meta = env.init(None)  # no prompt: the env's own
        assert env.env_id == CALC and env.observation_role == "user" and meta["task_id"] == "t2"
        assert env.max_turns == 4 and messages[-1] == {"role": "user", "content": "10+4?"}
        env.close()


def test_observations_tokenize_as_skyrls_generator_tokenizes_them(tiny_tokenizer: Any) -> None:
    """SkyRL renders `[*base, *observations]` and keeps the tokens after the base conversation."""
    tok = tiny_tokenizer
    base = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "I am a user."}]
    base_ids = tok.apply_chat_template(base, add_generation_prompt=False, tokenize=True, return_dict=False)
    if tok.eos_token_id in base_ids:
        base_ids = base_ids[: len(base_ids) - base_ids[::-1].index(tok.eos_token_id)]

    def obs_text(observations: list[dict[str, Any]], done: bool) -> str:
        ids = tok.apply_chat_template(
            [*base, *observations], add_generation_prompt=not done, tokenize=True, return_dict=False
        )
        return str(tok.decode(ids[len(base_ids) :]))

    row = dataset_rows(CALC, n=1)[0]
    env, messages = make(row)
    tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    out = env.step(CALL.format(a=2, b=2))
    text = obs_text(out["observations"], out["done"])
    assert "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>" in text  # Qwen's tool turn
    assert text.endswith("<|im_start|>assistant\n")  # and the next turn's generation prompt
    env.close()
    env, _ = make(row, env_config={"observation_role": "user"})
    out = env.step("no call here")
    expected = plain_env_step(CALC, row, "no call here")  # hermes wraps the error in <tool_response>
    assert f"<|im_start|>user\n{expected}<|im_end|>" in obs_text(out["observations"], out["done"])
    env.close()


@pytest.mark.parametrize(
    ("template", "parser"),
    [
        ("gptoss", "harmony"),
        ("gemma4", "gemma4"),
        ("qwen2_5", "hermes"),
        ("qwen3", "qwen3_xml"),
        ("glm4moe", "glm45"),
        ("llama3_1", "llama3_json"),
        ("llama3_2", "pythonic"),
        ("deepseekv3", "deepseek_v3"),
        ("muse_glimmer", "muse_glimmer"),
    ],
)
def test_tool_results_survive_skyrls_observation_tokenization(tiny_model_dir: Any, template: str, parser: str) -> None:
    """SkyRL tokenizes an observation after a fixed `[system, user]` base, without the assistant's
    call. gpt-oss's template refuses a tool message there and Gemma 4's renders nothing for it:
    the default role must still bring the tool's result to the model, with each parser's own
    model family's template (TRL's copies)."""
    trl = pytest.importorskip("trl", reason="the real chat templates come with trl")
    from pathlib import Path

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)  # a copy of its own: the template changes
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{template}.jinja").read_text("utf-8")
    base = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "I am a user."}]
    base_ids = tok.apply_chat_template(base, add_generation_prompt=False, tokenize=True, return_dict=False)
    env = skyrl_gym.make(
        CALC, env_config={"env_kwargs": {"parser": parser}}, extras={"extra_info": {"task_id": "t1"}, "max_turns": 5}
    )
    env.init(None)
    out = env.step(env.env.parser.format_call("add", {"a": 20, "b": 22}, "call_1"))
    assert out["metadata"]["tool_errors"] == 0
    ids = tok.apply_chat_template(
        [*base, *out["observations"]], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert "42" in tok.decode(ids[len(base_ids) :])
    env.close()


# Mistral's chat templates, as far as SkyRL's observation tokenization meets them: after the
# system message, user and assistant messages must alternate (tool messages and calls are
# skipped in that check), and a tool message needs a 9-character call id. Written here, not
# copied: the behaviour of Mistral's template as vLLM keeps it
# (vllm-project/vllm, examples/tool_chat_template_mistral_official.jinja) and of
# Mistral-Small-3.1-24B-Instruct-2503's (ggml-org/llama.cpp, models/templates/); the real ones
# cannot be fetched offline. The 3.1 template accepts ids of 9 characters or more.
MISTRAL_LIKE = (
    "{%- if messages[0]['role'] == 'system' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for m in loop_messages | rejectattr('role', 'equalto', 'tool') | selectattr('tool_calls', 'undefined') -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in loop_messages -%}"
    "{%- if m['role'] == 'user' -%}[INST] {{ m['content'] }}[/INST]"
    "{%- elif m['role'] == 'assistant' -%} {{ m['content'] }}</s>"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if m['tool_call_id'] is not defined or m['tool_call_id'] | length != 9 -%}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif -%}"
    '[TOOL_RESULTS] {"content": {{ m["content"] }}, "call_id": "{{ m["tool_call_id"] }}"}[/TOOL_RESULTS]'
    "{%- endif -%}{%- endfor -%}"
)


def test_mistral_observations_survive_skyrls_observation_tokenization(tiny_model_dir: Any) -> None:
    """Mistral's templates render a tool message without its call, but refuse a user message
    right after the base's user message: errors that answer no call (a turn without a call, a
    call with broken JSON) must come back in a tool message too, or SkyRL's tokenization of the
    observation raises and the generator with it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)  # a copy of its own: the template changes
    tok.chat_template = MISTRAL_LIKE
    base = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "I am a user."}]
    base_text = tok.apply_chat_template(base, add_generation_prompt=False, tokenize=False)
    env = skyrl_gym.make(
        CALC, env_config={"env_kwargs": {"parser": "mistral"}}, extras={"extra_info": {"task_id": "t1"}, "max_turns": 9}
    )
    env.init(None)
    call = '[TOOL_CALLS]add[ARGS]{"a": 20, "b": 22}'
    turns = [
        (call, ["42"]),
        ("It is probably 5.", ["No tool call and no final answer"]),
        (call + "[TOOL_CALLS]add[ARGS]{oops", ["42", "not valid JSON"]),
    ]
    for text, expected in turns:
        out = env.step(text)
        assert out["done"] is False
        rendered = tok.apply_chat_template([*base, *out["observations"]], add_generation_prompt=True, tokenize=False)
        assert rendered.startswith(base_text)
        for part in expected:
            assert part in rendered[len(base_text) :]
    env.close()


def test_inline_question_rows_score_against_reward_spec() -> None:
    env = skyrl_gym.make(
        "toolenv",
        env_config={"env_id": CALC},
        extras={"extra_info": {"question": "7+8?"}, "reward_spec": {"ground_truth": "15"}, "max_turns": 3},
    )
    messages, _ = env.init([{"role": "user", "content": "7+8?"}])
    assert messages == [{"role": "user", "content": "7+8?"}]  # the row's prompt is used as given
    assert env.env.episode.task.answer == "15"
    assert env.step("<answer>15</answer>")["reward"] == 1.0
    env.close()


def test_use_env_prompt_renders_the_envs_messages() -> None:
    env = skyrl_gym.make("toolenv", env_config={"env_id": CALC, "use_env_prompt": True}, extras={"task_id": "t2"})
    messages, meta = env.init([{"role": "user", "content": "ignored"}])
    _, expected = env.env.render_prompt(env.env.episode.task)
    assert meta["task_id"] == "t2" and messages == [m.to_openai() for m in expected]
    env.close()
    pytest.importorskip("toolenv_vision", reason="the image-prompt case uses the VisualSearch env (toolenv-vision)")
    env = skyrl_gym.make(
        "toolenv", env_config={"env_id": "toolenv/VisualSearch-v0", "use_env_prompt": True}, extras={"task_index": 0}
    )
    with pytest.raises(ValueError, match="has images in its prompt"):
        env.init(None)
    env.close()


# ---------------------------------------------------------------------------- how SkyRL calls it
async def test_sync_calls_inside_the_generators_event_loop() -> None:
    """With `max_env_workers=0` SkyRL makes the env and calls init/step/close on its event loop's thread."""
    row = (await adataset_rows(CALC, n=1))[0]
    env, _ = make(row)
    out = env.step(CALL.format(a=20, b=22))
    assert out["observations"][0]["content"] == "42"
    await asyncio.sleep(0)
    assert env.step("<answer>5</answer>")["reward"] == 1.0
    env.close()


@pytest.fixture
def mixed_rows() -> list[dict[str, Any]]:
    need_sql()
    return dataset_rows(CALC) + dataset_rows(SPIDER, n=3)


async def test_calls_from_skyrls_thread_pool(mixed_rows: list[dict[str, Any]]) -> None:
    """With `max_env_workers>0` each call may run on another pool thread; episodes run at once."""
    pool = ThreadPoolExecutor(max_workers=3)
    loop = asyncio.get_running_loop()

    async def episode(row: dict[str, Any]) -> float:
        env = await loop.run_in_executor(pool, lambda: make(row)[0])
        tool = "<sql>SELECT 1</sql>" if env.env_id == SPIDER else CALL.format(a=1, b=2)
        first = await loop.run_in_executor(pool, env.step, tool)
        assert first["done"] is False and first["metadata"]["tool_errors"] == 0
        out = await loop.run_in_executor(pool, env.step, f"<answer>{gold(row)}</answer>")
        await loop.run_in_executor(pool, env.close)
        return float(out["reward"])

    rewards = await asyncio.gather(*(episode(r) for r in mixed_rows * 3))
    pool.shutdown()
    assert rewards == [1.0] * len(mixed_rows) * 3


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
async def test_a_batch_of_samples_shares_one_event_loop_not_one_per_env() -> None:
    """SkyRL starts a whole batch at once (every sample makes its env before any closes), so the
    pool grows to the batch size: thousands of envs. Each must not keep an event loop of its
    own (three open files and a thread pool each, and a per-loop judge client or search batcher
    per env)."""
    rows = await adataset_rows(LOOPS)
    LoopAdd.loops.clear()
    close_pooled_envs()
    before, threads_before = _open_fds(), threading.active_count()
    pool = ThreadPoolExecutor(max_workers=4)  # SkyRL's `max_env_workers`
    loop = asyncio.get_running_loop()
    n = 48

    async def episode(i: int) -> float:
        row = dict(rows[i % len(rows)])
        prompt, env_class = row.pop("prompt"), row.pop("env_class")
        env = skyrl_gym.make(env_class, env_config={}, extras={**row, "max_turns": 5})  # on the loop's thread
        await asyncio.sleep(0)  # every sample has its env before any steps
        await loop.run_in_executor(pool, env.init, prompt)
        out = await loop.run_in_executor(pool, env.step, CALL.format(a=i, b=1))
        assert out["observations"][0]["content"] == str(i + 1)
        out = await loop.run_in_executor(pool, env.step, f"<answer>{gold(rows[i % len(rows)])}</answer>")
        await loop.run_in_executor(pool, env.close)
        return float(out["reward"])

    try:
        assert await asyncio.gather(*(episode(i) for i in range(n))) == [1.0] * n
        assert _POOL.created >= n  # a whole batch of envs, each pooled afterwards
        assert len(LoopAdd.loops) <= 4, f"the tools ran on {len(LoopAdd.loops)} event loops for {n} samples"
        assert _open_fds() - before < n, "every pooled env holds open files"
        assert threading.active_count() - threads_before < n, "every pooled env keeps a thread pool"
    finally:
        pool.shutdown()
    assert close_pooled_envs() >= n


def test_envs_are_pooled_across_samples_and_never_shared() -> None:
    row = dataset_rows(CALC, n=1)[0]
    env, _ = make(row)
    first = env.env
    env.close()
    before = _POOL.created
    for _ in range(3):
        env, _ = make(row)
        assert env.env is first  # the idle env is reused
        env.step("<answer>5</answer>")
        env.close()
    assert _POOL.created == before
    a, _ = make(row)
    b, _ = make(row)  # two samples at once: two envs
    assert a.env is not b.env and _POOL.created == before + 1
    a.close()
    b.close()
    assert close_pooled_envs() == 2


def test_an_env_whose_call_raised_is_closed_not_pooled() -> None:
    ClosingAdd.closed = 0
    env = skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"task_id": "no-such-task"}})
    with pytest.raises(KeyError, match="no-such-task"):
        env.init(None)
    env.close()
    assert ClosingAdd.closed == 1  # its env was closed ...
    assert close_pooled_envs() == 0  # ... and not handed to the next sample
    env = skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"task_id": "t1"}})
    env.init(None)
    env.close()
    env.close()  # idempotent
    assert ClosingAdd.closed == 1 and close_pooled_envs() == 1 and ClosingAdd.closed == 2


def test_an_env_whose_init_raised_is_closed_without_waiting_for_close() -> None:
    """SkyRL's generator calls `close()` only after a finished episode: when `init` raises it
    never does, so the env must not wait for it (the pooled env and its tools would leak)."""
    ClosingAdd.closed = 0
    env = skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"task_id": "no-such-task"}})
    with pytest.raises(KeyError, match="no-such-task"):
        env.init(None)
    assert ClosingAdd.closed == 1  # closed already, with no close() call
    assert close_pooled_envs() == 0  # and not handed to another sample
    env.close()  # a later close() changes nothing
    assert ClosingAdd.closed == 1
    env = skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"split": "train"}})
    with pytest.raises(ValueError, match="names no task"):  # raised before the env is reset
        env.init(None)
    assert ClosingAdd.closed == 2 and close_pooled_envs() == 0


def test_an_env_whose_step_raised_ends_its_episode_releases_it_and_is_closed(caplog: Any) -> None:
    """A step whose env raises (here the final reward's backend; a remote env's server alike)
    ends that sample with `done`, not with the exception: SkyRL's generator gathers a batch's
    samples without `return_exceptions`, so one env's exception stopped the whole training step.
    The failed step scores 0 (the earlier steps keep theirs), the error is logged and in the
    metadata and metrics, the episode's tools are released and the env closed right away (no
    `close()` needed), and a caller that steps again gets a clear error."""
    HoldingAdd.closed = HoldingAdd.released = 0
    env = skyrl_gym.make(FAILING, env_config={}, extras={"extra_info": {"task_id": "t1"}, "max_turns": 5})
    env.init(None)
    assert env.step(CALL.format(a=2, b=3))["observations"][0]["content"] == "5"
    with caplog.at_level("WARNING"):
        out = env.step("<answer>5</answer>")
    assert out["done"] is True and out["reward"] == 0.0 and out["observations"] == []
    assert out["metadata"]["error"] == "ConnectionError: the judge is unreachable"
    assert out["metadata"]["task_id"] == "t1" and not out["metadata"]["terminated"]
    assert "the judge is unreachable" in caplog.text
    assert env.get_metrics()["env_error"] == 1.0
    assert HoldingAdd.released == 1 and HoldingAdd.closed == 1
    assert close_pooled_envs() == 0
    with pytest.raises(RuntimeError, match="closed"):
        env.step("<answer>5</answer>")
    env.close()
    assert HoldingAdd.released == 1 and HoldingAdd.closed == 1


def test_an_env_error_under_reward_at_end_carries_the_steps_scored_before() -> None:
    """With `reward_at_end` the earlier steps carried 0: the step that ends the episode on an
    env error carries what the turns scored before it (a tool call's -0.25 here)."""
    extras = {"extra_info": {"task_id": "t1"}, "max_turns": 5}
    env = skyrl_gym.make(FAILING_TOLL, env_config={"reward_at_end": True}, extras=extras)
    env.init(None)
    assert env.step(CALL.format(a=2, b=3))["reward"] == 0.0
    out = env.step("<answer>5</answer>")
    assert out["done"] and out["reward"] == -0.25 and out["metadata"]["error"]
    metrics = env.get_metrics()
    assert metrics["env_error"] == 1.0 and metrics["terminated"] == 0.0
    assert close_pooled_envs() == 0


def test_an_env_dropped_without_close_is_closed() -> None:
    """SkyRL's generator can raise between two env calls (its inference engine, a chat template
    refusing an observation): the sample ends with no `close()`. The env it dropped must not
    keep its pooled env and episode's tools for the rest of the run."""
    ClosingAdd.closed = 0
    ClosingAdd.closing.clear()
    env = skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"task_id": "t1"}, "max_turns": 5})
    env.init(None)
    env.step(CALL.format(a=1, b=1))
    del env
    gc.collect()
    assert ClosingAdd.closing.wait(timeout=60), "the dropped env's tools were never closed"
    assert ClosingAdd.closed == 1 and close_pooled_envs() == 0
    env = skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"task_id": "t1"}})
    env.init(None)
    env.close()  # closed properly: pooled, not closed when dropped
    del env
    gc.collect()
    assert ClosingAdd.closed == 1 and close_pooled_envs() == 1


def test_metrics_aggregate_through_skyrl_gym() -> None:
    from skyrl_gym.metrics import aggregate_for_environment

    row = dataset_rows(CALC, n=1)[0]
    metrics = []
    for answer in ("5", "wrong"):
        env, _ = make(row)
        env.step(f"<answer>{answer}</answer>")
        metrics.append(env.get_metrics())
        env.close()
    assert [m["return"] for m in metrics] == [1.0, 0.0]
    assert metrics[0]["reward/exact_match"] == 1.0  # the env's reward component, by name
    agg = aggregate_for_environment(CALC, metrics)
    assert agg["return"] == 0.5 and agg["answered"] == 1.0 and agg["reward/exact_match"] == 0.5


# ---------------------------------------------------------------------------- registration
def test_register_is_idempotent_and_checks_its_arguments() -> None:
    from skyrl_gym.envs.registration import registry

    ids = register(CALC, env_kwargs={"max_turns": 3})
    assert ids == ["toolenv", CALC]
    assert registry[CALC].kwargs["env_kwargs"] == {"max_turns": 3} and registry[CALC].kwargs["env_id"] == CALC
    assert "env_id" not in registry["toolenv"].kwargs
    register(CALC)  # replaced: the new defaults apply
    assert "env_kwargs" not in registry[CALC].kwargs
    every = register()
    assert SPIDER in every and "toolenv/ToolEnv-v0" in every
    with pytest.raises(ValueError, match="not registered with Gymnasium"):
        register("toolenv/NoSuchEnv-v0")
    with pytest.raises(ValueError, match="env_kwargs must be JSON"):
        register(CALC, env_kwargs={"tools": [Add()]})
    with pytest.raises(ValueError, match="max_turns must be at least 1"):
        register(CALC, max_turns=0)


def test_register_refuses_an_id_skyrl_gym_has_for_another_env_and_registers_nothing() -> None:
    from skyrl_gym.envs.registration import deregister, registry
    from skyrl_gym.envs.registration import register as skyrl_register

    foreign = "toolenv-test/Foreign-v0"
    gym.register(foreign, entry_point=_calc_env)
    skyrl_register(id=foreign, entry_point="skyrl_gym.envs.gsm8k.env:GSM8kEnv")
    deregister(CALC)
    try:
        with pytest.raises(ValueError, match=r"toolenv-test/Foreign-v0.*GSM8kEnv"):
            register([CALC, foreign], generic=False)
        assert CALC not in registry  # all or nothing
    finally:
        deregister(foreign)
        gym.registry.pop(foreign)


def test_a_per_id_class_refuses_a_row_of_another_env() -> None:
    need_sql()
    row = dataset_rows(CALC, n=1)[0]
    row["env_class"] = SPIDER
    with pytest.raises(ValueError, match="names 'toolenv-test/SkyRLCalc-v0'"):
        make(row)


def test_no_env_id_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no toolenv env id"):
        skyrl_gym.make("toolenv", env_config={}, extras={"extra_info": {"task_id": "t1"}})


# ---------------------------------------------------------------------------- SkyRL's own datasets and the pool
def test_skyrl_gsm8k_and_search_r1_rows_score_against_reward_spec_ground_truth(tmp_path: Any) -> None:
    """SkyRL's own envs score against `reward_spec.ground_truth`: its GSM8K rows keep the worked
    solution in `extra_info.answer` (the gold is "#### 5" at its end), and its Search-R1 rows
    give the gold answers as `{"target": [...]}`. Either, read through parquet as SkyRL's
    `PromptDataset` reads it, must score the right answer 1.0."""
    datasets = pytest.importorskip("datasets", reason="SkyRL's PromptDataset reads rows with HF datasets")
    prompt = [{"role": "user", "content": "2+3?"}]
    gsm8k = {  # as skyrl-train/examples/gsm8k/gsm8k_dataset.py writes it
        "data_source": "openai/gsm8k",
        "prompt": prompt,
        "env_class": "toolenv",
        "reward_spec": {"method": "rule", "ground_truth": "5"},
        "extra_info": {"split": "train", "index": 0, "answer": "2 and 3 make 2+3 = 5.\n#### 5", "question": "2+3?"},
    }
    search_r1 = {  # as skyrl-train/examples/search/searchr1_dataset.py writes it
        "data_source": "searchR1_nq",
        "prompt": prompt,
        "env_class": "toolenv",
        "reward_spec": {"style": "rule", "ground_truth": {"target": ["five", "5"]}},
        "extra_info": {"index": 0, "need_tools_kwargs": True, "question": "2+3?", "split": "train"},
    }
    for row in (gsm8k, search_r1):
        path = tmp_path / f"{row['data_source'].replace('/', '_')}.parquet"
        datasets.Dataset.from_list([row]).to_parquet(str(path))
        item = dict(datasets.load_dataset("parquet", data_files=str(path), keep_in_memory=True)["train"][0])
        prompt_, env_class = item.pop("prompt"), item.pop("env_class")
        env = skyrl_gym.make(env_class, env_config={"env_id": CALC}, extras={**item, "max_turns": 3})
        env.init(prompt_)
        out = env.step("<answer>5</answer>")
        assert out["done"] is True and out["reward"] == 1.0, row["data_source"]
        env.close()
    numeric = task_options({"extra_info": {"question": "2+3?"}, "reward_spec": {"ground_truth": 5}})
    assert numeric["task"].answer == "5"  # a number column: its text
    own = task_options({"extra_info": {"question": "2+3?", "answer": "five"}})
    assert own["task"].answer == "five"  # no ground truth: the row's own answer


def test_a_pooled_envs_last_episode_does_not_leak_into_the_next_sample() -> None:
    """The next sample borrows the env the last one gave back: before its `init` it has no
    episode (no metrics, and `step` refuses rather than stepping the last sample's released
    episode), and the last sample's metrics stay its own after the env moved on."""
    rows = dataset_rows(CALC)
    first, prompt = make(rows[0])
    first.step(CALL.format(a=1, b=2))  # cut by SkyRL (its input length limit): not done
    first.close()
    second = skyrl_gym.make(CALC, env_config={}, extras={"extra_info": {"task_id": "t2"}, "max_turns": 5})
    assert second.env is first.env  # the same pooled env
    assert second.get_metrics() == {}
    with pytest.raises(RuntimeError, match=r"init\(\) was not called"):
        second.step(CALL.format(a=3, b=4))
    second = skyrl_gym.make(CALC, env_config={}, extras={"extra_info": {"task_id": "t2"}, "max_turns": 5})
    second.init(None)
    second.step("<answer>14</answer>")
    assert first.get_metrics()["turns"] == 1 and first.get_metrics()["tool_calls"] == 1
    assert second.get_metrics()["return"] == 1.0 and second.get_metrics()["turns"] == 1
    second.close()


def test_close_pooled_envs_closes_every_env_when_one_fails_to_close() -> None:
    """One idle env whose tools fail to close must not leave the others (their processes,
    connections) open: every env is closed, then the first failure is raised."""

    class BadClose(Add):
        async def close(self) -> None:
            raise OSError("cannot close")

    close_pooled_envs()
    ClosingAdd.closed = 0
    envs = [skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"task_id": "t1"}}) for _ in range(3)]
    envs[0].env.caller.tools["add"] = BadClose()  # this pooled env's tool cannot close
    for env in envs:
        env.init(None)
        env.close()
    with pytest.raises(OSError, match="cannot close"):
        close_pooled_envs()
    assert ClosingAdd.closed == 2 and close_pooled_envs() == 0


PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.mark.parametrize("reward_at_end", [False, True])
def test_an_env_whose_reset_raises_ends_its_sample_at_the_first_step(caplog: Any, reward_at_end: bool) -> None:
    """SkyRL's generator calls `init` unguarded and gathers a batch without `return_exceptions`:
    an env whose reset raises (a task it does not have, a tool backend that cannot open, a
    remote env's server refusing the session) stopped the whole training step. As a failed
    step does, it ends only its sample: `init` returns the row's prompt, the env is closed at
    once, and the first step says `done`, reward 0, with the error in its metadata and metrics."""
    ClosingAdd.closed = 0
    extras = {"extra_info": {"task_id": "no-such-task"}, "max_turns": 5}
    env = skyrl_gym.make(CLOSING, env_config={"reward_at_end": reward_at_end}, extras=extras)
    with caplog.at_level("WARNING"):
        messages, meta = env.init([dict(m) for m in PROMPT])
    assert messages == PROMPT
    assert meta["env_id"] == CLOSING and "no-such-task" in meta["error"]
    assert "no-such-task" in caplog.text
    assert ClosingAdd.closed == 1 and close_pooled_envs() == 0  # closed now, never pooled
    out = env.step("<answer>5</answer>")
    assert out["done"] is True and out["reward"] == 0.0 and out["observations"] == []
    assert out["metadata"]["error"] == env.error and env.error.startswith("KeyError")
    assert not out["metadata"]["terminated"] and not out["metadata"]["truncated"]
    metrics = env.get_metrics()
    assert metrics["env_error"] == 1.0 and metrics["return"] == 0.0 and metrics["turns"] == 0
    assert metrics["terminated"] == 0.0 and metrics["truncated"] == 0.0
    with pytest.raises(RuntimeError, match="closed"):
        env.step("<answer>5</answer>")
    env.close()
    assert ClosingAdd.closed == 1


def test_an_env_whose_reset_raises_without_a_prompt_still_raises() -> None:
    """With no row prompt there is nothing to give the model: `init` raises, as before."""
    env = skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"task_id": "no-such-task"}})
    with pytest.raises(KeyError, match="no-such-task"):
        env.init([])


def test_a_row_that_names_no_task_raises_even_with_a_prompt() -> None:
    """A row that names no task is the dataset's bug, the same on every sample: it raises rather
    than scoring the whole dataset 0."""
    env = skyrl_gym.make(CLOSING, env_config={}, extras={"extra_info": {"split": "train"}})
    with pytest.raises(ValueError, match="names no task"):
        env.init([dict(m) for m in PROMPT])
    assert close_pooled_envs() == 0
