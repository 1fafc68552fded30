"""toolenv envs in TRL's GRPOTrainer through `environment_factory`.

The adapter is checked the way TRL uses it: transformers builds each tool's schema from
the method (`get_json_schema`), the methods are called with the model's arguments, and
`get_reward` scores the rollout. Then TRL's real GRPOTrainer trains one step on CPU with
the tiny offline Qwen2 model, TRL's own Qwen2.5 chat template and response parser, and
a policy whose generation is scripted (its forward pass, and so the loss, is the real
model's): the tool calls go through TRL's tool loop into a real env. An image env
(`toolenv/VisualSearch-v0`) trains the same way with a tiny random Qwen3-VL and a real
Qwen3-VL processor, its images in the prompt and in the crop tool's results.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

import gymnasium as gym
import pytest
from _tiny_vlm import tiny_qwen3_vl
from pydantic import BaseModel, Field

import toolenv
from toolenv.integrations.trl import ToolCallError, TRLEnvironment, dataset_rows, environment_factory

from ..conftest import TASKS, Add

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
ANSWERED = "Your answer is recorded; the episode is over."
#: What `reset` puts before the question for a row without a prompt (the system message `dataset_rows` writes).
NOTE = "Give your final answer by calling the `answer` tool.\n\n"


class Search(toolenv.Tool):
    """Search the notes.

    Returns the matching lines.
    """

    name = "search"

    class Args(BaseModel):
        query: str = Field(description="What to look for.")
        k: int = Field(default=3, ge=1, le=10, description="How many lines.")
        mode: Literal["exact", "fuzzy"] = Field(default="fuzzy", description="How to match.")
        tags: list[str] = Field(default_factory=list)
        since: int | None = None

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"{args.query}|{args.k}|{args.mode}|{','.join(args.tags)}|{args.since}")


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


class _Unanswered(toolenv.Reward):
    name = "unanswered"

    async def final(self, episode: toolenv.Episode) -> float:
        return -0.5 if episode.answer is None else 0.0


def one_step_config(tmp_path: Path, *, batch: int, completion: int, **extra: Any) -> Any:
    """A GRPOConfig for one CPU training step with groups of two, logging every step, saving nothing."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=batch,
        num_generations=2,
        max_steps=1,
        max_completion_length=completion,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        **extra,
    )


def shown_box(task: dict[str, Any]) -> list[float]:
    """The code's box of a VisualSearch task in pixels of the overview the model sees (the crop
    tool's convention), from the task's box in the original image's pixels."""
    from toolenv_vision import box_in

    ctx = task["context"]
    return box_in(ctx["box"], ctx["size"], "pixels", ctx["overview"])


def make_env(**kw: Any) -> toolenv.ToolEnv:
    kw.setdefault("tools", [Add(), Search()])
    kw.setdefault("tasks", TASKS)
    kw.setdefault("max_turns", 10)
    return toolenv.ToolEnv(**kw)


def tool_methods(env: TRLEnvironment) -> dict[str, Any]:
    """The methods TRL offers as tools (its own rule: public functions of the class but reset/get_reward)."""
    import inspect

    return {
        n: getattr(env, n)
        for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if n not in ("reset", "get_reward") and not n.startswith("_")
    }


# ---------------------------------------------------------------------- the adapter
def test_methods_carry_each_tools_schema_as_transformers_reads_it() -> None:
    get_json_schema = pytest.importorskip(
        "transformers.utils", reason="schemas are read by transformers"
    ).get_json_schema
    env = environment_factory(make_env)()
    methods = tool_methods(env)
    assert sorted(methods) == ["add", "answer", "search"]
    fn = get_json_schema(methods["search"])["function"]
    assert fn["name"] == "search" and fn["description"].startswith("Search the notes.")
    props = fn["parameters"]["properties"]
    assert fn["parameters"]["required"] == ["query"]
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["k"] == {"type": "integer", "description": "How many lines."}
    assert props["mode"]["enum"] == ["exact", "fuzzy"] and props["mode"]["type"] == "string"
    assert props["tags"]["type"] == "array" and props["tags"]["items"] == {"type": "string"}
    assert props["since"]["type"] == "integer" and props["since"]["nullable"] is True
    assert all(p["description"] for p in props.values())  # transformers refuses an argument without one
    answer = get_json_schema(methods["answer"])["function"]
    assert answer["parameters"]["required"] == ["answer"]


class Query(toolenv.Tool):
    """Run a query. Returns: the rows as a table. Raises: nothing the model must handle."""

    name = "query"

    class Args(BaseModel):
        sql: str = Field(description="The SQL. Returns: at most 100 rows.")
        order: str = Field(default="asc", description="Sort order (choices: asc, desc)")
        scale: int | float = Field(default=1, description="A factor.")

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"{args.sql}|{args.order}|{args.scale}")


def test_descriptions_transformers_docstring_parser_would_misread_reach_the_model_whole() -> None:
    """transformers cuts a docstring at `Args:`/`Returns:`/`Raises:` anywhere and reads a trailing
    `(choices: ...)` as JSON: a tool's own words must neither crash the chat template nor be cut."""
    get_json_schema = pytest.importorskip(
        "transformers.utils", reason="schemas are read by transformers"
    ).get_json_schema
    env = environment_factory(lambda: make_env(tools=[Query()]))()
    fn = get_json_schema(tool_methods(env)["query"])["function"]
    assert "the rows as a table" in fn["description"] and "nothing the model must handle" in fn["description"]
    props = fn["parameters"]["properties"]
    assert "at most 100 rows" in props["sql"]["description"]
    assert "choices: asc, desc" in props["order"]["description"] and "enum" not in props["order"]
    assert props["scale"]["type"] == ["integer", "number"]  # `int | float` keeps its types
    env.reset(task_id="t1")
    assert env.query(sql="SELECT 1", scale=2.5) == "SELECT 1|asc|2.5"


class Plot(toolenv.Tool):
    """Plot points."""

    name = "plot"

    class Args(BaseModel):
        points: list[Any] = Field(description="The points.")
        size: tuple[int, int] = Field(default=(4, 3), description="Width and height.")
        style: Literal["line", "dots"] | None = Field(default=None, description="How to draw.")
        kind: Literal["xy"] = Field(default="xy", description="The axes.")  # pydantic writes `const`, not `enum`
        ticks: int | list[int] = Field(default=5, description="How many ticks, or where.")  # `anyOf`

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"{len(args.points)}|{args.size}|{args.style}|{args.kind}|{args.ticks}")


def test_arrays_without_item_types_and_optional_enums_keep_their_schema() -> None:
    """A `list[Any]` or tuple argument is an array, not an object; an optional or one-value `Literal`
    keeps its choices; a union with a list keeps its types: the model writes what the schema shows,
    and toolenv would refuse `{}` for a list."""
    get_json_schema = pytest.importorskip(
        "transformers.utils", reason="schemas are read by transformers"
    ).get_json_schema
    env = environment_factory(lambda: make_env(tools=[Plot()]))()
    props = get_json_schema(tool_methods(env)["plot"])["function"]["parameters"]["properties"]
    assert props["points"]["type"] == "array"
    assert props["size"]["type"] == "array"
    assert props["style"]["enum"] == ["line", "dots"] and props["style"]["nullable"] is True
    assert props["kind"]["enum"] == ["xy"]
    assert sorted(props["ticks"]["type"]) == ["array", "integer"]
    env.reset(task_id="t1")
    assert env.plot(points=[[0, 1], [2, 3]], size=[5, 5], style="dots", ticks=[0, 2]) == "2|(5, 5)|dots|xy|[0, 2]"


def test_calls_run_through_the_env_and_only_what_the_model_wrote_is_passed() -> None:
    env = environment_factory(make_env)()
    assert env.reset(prompt=[{"role": "user", "content": "2+3?"}], task_id="t1") is None  # the row has the prompt
    assert env.search(query="q") == "q|3|fuzzy||None"  # the Args model's own defaults apply
    assert env.search(query="q", k=5, mode="exact", tags=["a", "b"], since=2) == "q|5|exact|a,b|2"
    assert env.add(a=2, b=3) == "5"
    with pytest.raises(ToolCallError, match=r"^Invalid arguments for tool 'search'.*\bk\b"):
        env.search(query="q", k=99)
    with pytest.raises(ToolCallError, match=r"unknown argument\(s\) 'c'"):
        env.add(a=1, b=2, c=3)
    ep = env.env.episode
    assert ep is not None and [t.results[0].text for t in ep.turns][:3] == ["q|3|fuzzy||None", "q|5|exact|a,b|2", "5"]
    assert [t.results[0].call_id for t in ep.turns] == ["call_1", "call_2", "call_3", "call_4", "call_5"]
    assert env.answer(answer="5") == "Your answer is recorded; the episode is over."
    assert env.get_reward() == 1.0
    with pytest.raises(ToolCallError, match=r"^The episode has ended \(the answer was given\)"):
        env.add(a=1, b=1)
    assert len(ep.turns) == 6  # the late call was not run


def test_a_failed_call_raises_for_trls_failure_count_after_the_env_recorded_it() -> None:
    """TRL counts a tool call as failed when the method raises (`tools/failure_frequency`) and shows
    the model `{'error': str(exc)}`: a failure comes back so, with toolenv's error text, unless the
    factory says to return it as the tool's result."""
    env = environment_factory(make_env)()
    env.reset(task_id="t1")
    with pytest.raises(ToolCallError) as caught:
        env.add(a="two", b=3)
    ep = env.env.episode
    assert ep is not None and len(ep.turns) == 1 and ep.turns[0].results[0].is_error  # run and recorded
    assert str(caught.value) == ep.turns[0].results[0].text and caught.value.result is ep.turns[0].results[0]
    assert isinstance(caught.value, Exception)  # what TRL's loop catches
    quiet = environment_factory(make_env, raise_tool_errors=False)()
    quiet.reset(task_id="t1")
    assert quiet.add(a="two", b=3) == str(caught.value)
    assert quiet.answer(answer="5") == ANSWERED
    assert quiet.add(a=1, b=1).startswith("The episode has ended (the answer was given)")
    sent = pickle.loads(pickle.dumps(environment_factory("toolenv/ToolEnv-v0", raise_tool_errors=False)))
    assert sent.raise_tool_errors is False and sent.environment_class._raise_tool_errors is False


def test_reset_reads_the_task_from_json_dict_id_or_columns() -> None:
    env = environment_factory(make_env)()
    task = {"id": "x", "question": "7+1?", "answer": "8", "context": {"k": 1}}
    assert env.reset(task=json.dumps(task)) == NOTE + "7+1?"  # no prompt column: the note and question are
    assert env.env.episode is not None and env.env.episode.task.context == {"k": 1}
    env.reset(task=task, prompt=[{"role": "user", "content": "7+1?"}])
    assert env.env.episode.task.id == "x"
    assert env.reset(task_id="t3") == NOTE + "Capital of France?"
    env.reset(question="9+1?", answer="10")
    assert env.answer(answer="10") and env.get_reward() == 1.0
    with pytest.raises(ValueError, match="names no task"):
        env.reset(prompt=[{"role": "user", "content": "hi"}])
    with pytest.raises(KeyError, match="nope"):
        env.reset(task_id="nope")


def test_reset_reads_rows_as_a_datasets_table_fills_them(tmp_path: Path) -> None:
    """A `datasets.Dataset` gives every row every column, None where the row had none, and every
    key of a dict column: a `task` dict without `context`, or a `question` row beside `task_id`
    rows, still names its own task."""
    datasets = pytest.importorskip("datasets", reason="the rows are read back through datasets (TRL needs it)")
    env = environment_factory(make_env)()
    tasks = datasets.Dataset.from_list(
        [
            {"task": {"id": "a", "question": "2+2?", "answer": "4"}},
            {"task": {"id": "b", "question": "3+3?", "answer": "6", "context": {"k": 1}}},
        ]
    )
    assert [env.reset(**row) for row in tasks] == [NOTE + "2+2?", NOTE + "3+3?"]
    assert env.env.episode is not None and env.env.episode.task.context == {"k": 1}
    lines = tmp_path / "rows.jsonl"  # one row by id, one by its own columns
    lines.write_text('{"task_id": "t2"}\n{"question": "9+1?", "answer": "10"}\n')
    mixed = datasets.Dataset.from_json(str(lines), cache_dir=str(tmp_path / "cache"))
    assert [env.reset(**row) for row in mixed] == [NOTE + "10+4?", NOTE + "9+1?"]
    assert env.answer(answer="10") and env.get_reward() == 1.0


def test_an_open_episode_is_ended_and_scored_with_no_answer_once() -> None:
    make = environment_factory(lambda: make_env(reward=[("exact_match", 1.0), (_Unanswered(), 1.0)]))
    env = make()
    env.reset(task_id="t1")
    env.add(a=2, b=3)
    assert env.get_reward() == -0.5 and env.get_reward() == -0.5  # scored once, however often TRL asks
    ep = env.env.episode
    assert ep is not None and ep.truncated and ep.released
    env.reset(task_id="t1")  # TRL reuses instances: a new episode starts from zero
    assert env.get_reward() == -0.5


class _Broken(toolenv.Reward):
    """A final reward that fails (a judge server down, a bug in a reward of one's own)."""

    name = "broken"

    async def final(self, episode: toolenv.Episode) -> float:
        raise ZeroDivisionError("division by zero")


def test_an_env_failure_on_the_answer_is_logged_and_ends_the_episode(caplog: pytest.LogCaptureFixture) -> None:
    """The answer's step failed (its reward raised): TRL caught the exception, showed the model
    `{'error': 'division by zero'}`, and `get_reward()` gave 0.0 as for a wrong answer, with
    nothing logged and the episode's tools left held. As verl's agent loop does, the failure is now
    logged with the env and task, kept as `error`, and ends the episode; the model is told so."""
    env = environment_factory(lambda: make_env(tools=[Add()], reward=[("exact_match", 1.0), (_Broken(), 1.0)]))()
    env.reset(task_id="t1")
    assert env.add(a=2, b=3) == "5"
    failed = r"^The environment failed \(ZeroDivisionError: division by zero\)"
    with caplog.at_level("WARNING", logger="toolenv.integrations.trl"), pytest.raises(ToolCallError, match=failed):
        env.answer(answer="5")
    [record] = caplog.records
    assert record.getMessage() == (
        f"toolenv: {type(env).__name__} failed on task t1; the episode ends here: ZeroDivisionError: division by zero"
    )
    assert env.error == "ZeroDivisionError: division by zero" and env.last_info["error"] == env.error
    ep = env.env.episode
    assert ep is not None and ep.released  # its tools are freed now, not at the next reset
    with pytest.raises(ToolCallError, match=r"^The episode has ended \(the environment failed\)"):
        env.add(a=1, b=1)
    assert len(ep.turns) == 2  # the late call was not run
    assert env.get_reward() == 0.0 and len(caplog.records) == 1  # not scored again
    env.reset(task_id="t1")  # TRL reuses instances: the next episode starts clean
    assert env.error is None and "error" not in env.last_info
    quiet = environment_factory(lambda: make_env(reward=_Broken()), raise_tool_errors=False)()
    quiet.reset(task_id="t1")
    assert quiet.answer(answer="5").startswith("The environment failed (ZeroDivisionError: division by zero)")


def test_an_env_failure_scoring_an_unanswered_episode_ends_it_rather_than_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The model stopped calling tools without answering, and the final reward that scores the
    truncation failed (a judge server down). `get_reward()` raised it into TRL's reward step,
    which catches nothing: the whole run stopped, where the same failure on an answer only ends
    that episode. It now ends the episode alike: logged, kept as `error`, the return so far."""
    env = environment_factory(lambda: make_env(tools=[Add()], reward=[("exact_match", 1.0), (_Broken(), 1.0)]))()
    env.reset(task_id="t1")
    assert env.add(a=2, b=3) == "5"
    with caplog.at_level("WARNING", logger="toolenv.integrations.trl"):
        assert env.get_reward() == 0.0
    [record] = caplog.records
    assert record.getMessage().endswith("failed on task t1; the episode ends here: ZeroDivisionError: division by zero")
    assert env.error == "ZeroDivisionError: division by zero" and env.last_info["error"] == env.error
    ep = env.env.episode
    assert ep is not None and ep.released
    assert env.get_reward() == 0.0 and len(caplog.records) == 1  # asked again: the same, not scored again
    env.reset(task_id="t1")
    assert env.error is None


class _CountingAdd(Add):
    """`add` that counts how often it was closed."""

    closed = 0

    async def close(self) -> None:
        type(self).closed += 1


def test_an_env_that_failed_is_closed_and_the_next_episode_gets_a_new_one() -> None:
    """TRL keeps one environment per sample slot for the whole run. An env whose step raised may
    hold broken state (a tool mid-call, a half-closed connection): its tools are closed, and the
    next reset runs on a new env from the factory, as verl's env pool does."""
    _CountingAdd.closed = 0
    make = environment_factory(
        lambda: make_env(tools=[_CountingAdd()], reward=[("exact_match", 1.0), (_Broken(), 1.0)])
    )
    env = make()
    env.reset(task_id="t1")
    failed = env.env
    with pytest.raises(ToolCallError, match="The environment failed"):
        env.answer(answer="5")
    assert _CountingAdd.closed == 1  # closed at once
    assert failed.episode is not None and failed.episode.released  # still readable by reward functions
    env.reset(task_id="t1")
    assert env.env is not failed and env.add(a=2, b=3) == "5"
    env.reset(task_id="t1")  # a healthy env is kept
    assert _CountingAdd.closed == 1


def test_an_env_whose_reset_fails_ends_that_episode_rather_than_the_run(caplog: pytest.LogCaptureFixture) -> None:
    """TRL resets every environment of a batch before generating and catches nothing: one env
    whose reset raised (a task it does not have, a tool backend that cannot open, a remote env's
    server refusing the session) stopped the whole run. As a failed step does, it now ends that
    episode only: logged, kept as `error`, the row's prompt shown as it is, every call refused
    with that reason, and a reward of 0; the next reset starts clean."""
    env = environment_factory(lambda: make_env(tools=[Add()]))()
    prompt = [{"role": "user", "content": "What is 2 + 3?"}]
    with caplog.at_level("WARNING", logger="toolenv.integrations.trl"):
        assert env.reset(prompt=prompt, task_id="no-such-task") is None  # the row's prompt stands
    [record] = caplog.records
    assert record.getMessage().endswith("failed on task no-such-task; the episode ends here: " + str(env.error))
    assert env.error is not None and env.error.startswith("KeyError") and "no-such-task" in env.error
    assert env.last_info["error"] == env.error and env.last_info["task_id"] == "no-such-task"
    with pytest.raises(ToolCallError, match=r"^The episode has ended \(the environment failed\)"):
        env.add(a=2, b=3)
    with pytest.raises(ToolCallError, match=r"^The episode has ended \(the environment failed\)"):
        env.answer(answer="5")
    assert env.get_reward() == 0.0 and len(caplog.records) == 1
    env.reset(prompt=prompt, task_id="t1")  # TRL reuses instances: the next episode starts clean
    assert env.error is None and env.add(a=2, b=3) == "5"
    with pytest.raises(KeyError, match="no-such-task"):  # no prompt to show: nothing to degrade to
        env.reset(task_id="no-such-task")


async def test_calls_from_a_thread_that_runs_an_event_loop() -> None:
    """GRPOTrainer calls reset, the tools and get_reward on its own thread; in Jupyter or Colab
    that thread runs an event loop, where a sync ToolEnv call cannot run its coroutine."""
    env = environment_factory(make_env)()
    assert env.reset(task_id="t1") == NOTE + "2+3?"
    assert env.add(a=2, b=3) == "5"
    assert env.answer(answer="5") == "Your answer is recorded; the episode is over."
    assert env.get_reward() == 1.0
    env.reset(task_id="t1")
    assert env.get_reward() == 0.0  # an open episode is ended there too


def test_max_turns_ends_the_episode_and_later_calls_are_refused() -> None:
    env = environment_factory(lambda: make_env(max_turns=2))()
    env.reset(task_id="t1")
    env.add(a=1, b=1)
    env.add(a=1, b=2)
    with pytest.raises(ToolCallError, match="limit of 2 turns"):
        env.add(a=1, b=3)
    assert env.get_reward() == 0.0


def test_a_tool_image_comes_back_as_content_blocks() -> None:
    pytest.importorskip("PIL", reason="images need Pillow")
    env = environment_factory(lambda: make_env(tools=[Snapshot()]))()
    env.reset(task_id="t1")
    blocks = env.snapshot()
    assert blocks[0]["type"] == "image" and blocks[0]["image"].size == (2, 2)
    assert blocks[-1] == {"type": "text", "text": "a red square"}
    # TRL's async trainer (text only) sends the model `str(result)`: the text, not the blocks' repr
    assert str(blocks) == "a red square"


def test_no_answer_tool_and_names_that_cannot_be_methods() -> None:
    env = environment_factory(make_env, answer_tool=None)()
    assert sorted(tool_methods(env)) == ["add", "search"]
    env = environment_factory(make_env, answer_tool="submit")()
    assert "submit" in tool_methods(env)

    class Reset(Add):
        name = "reset"

    class Dashed(Add):
        name = "web-search"

    class Error(Add):  # the instance's `error` (None) would hide the method: TRL would call None
        name = "error"

    class LastInfo(Add):
        name = "last_info"

    for bad in (Reset(), Dashed(), Error(), LastInfo()):
        with pytest.raises(ValueError, match="cannot be offered to TRL"):
            environment_factory(lambda bad=bad: make_env(tools=[bad]))

    class Translate(Add):
        name = "translate"

        class Args(BaseModel):
            text: str
            source: str = Field(alias="from")

    with pytest.raises(ValueError, match="argument 'from' is a Python keyword"):
        environment_factory(lambda: make_env(tools=[Translate()]))
    with pytest.raises(ValueError, match="answer_tool"):
        environment_factory(make_env, answer_tool="get_reward")
    with pytest.raises(ValueError, match="cannot be offered"):
        environment_factory(make_env, answer_tool="add")


def test_dataset_rows_carry_the_prompt_and_the_task() -> None:
    rows = dataset_rows(lambda: make_env(system_prompt="Be brief."), n=2)
    assert len(rows) == 2
    system, user = rows[0]["prompt"]
    assert system == {"role": "system", "content": "Be brief.\n\nGive your final answer by calling the `answer` tool."}
    assert user == {"role": "user", "content": "2+3?"}
    assert json.loads(rows[1]["task"])["id"] == "t2"
    env = environment_factory(make_env)()
    assert env.reset(**rows[1]) is None and env.env.episode is not None and env.env.episode.task.answer == "14"
    assert dataset_rows(make_env, answer_tool=None)[0]["prompt"] == [{"role": "user", "content": "2+3?"}]


def test_dataset_rows_refuse_a_bad_n_and_an_env_without_tasks() -> None:
    assert len(dataset_rows(make_env, n=len(TASKS) + 5)) == len(TASKS)  # more than there are: all of them
    for bad in (0, -1):
        with pytest.raises(ValueError, match="n must be at least 1"):
            dataset_rows(make_env, n=bad)
    with pytest.raises(ValueError, match="has no tasks"):
        dataset_rows(lambda: make_env(tasks=[]))


# ---------------------------------------------------------------------- image envs
def visual_rows(n: int = 2) -> list[dict[str, Any]]:
    pytest.importorskip("toolenv_vision", reason="the VisualSearch env needs toolenv-vision")
    return dataset_rows("toolenv/VisualSearch-v0", n=n, env_kwargs={"limit": n})


def test_dataset_rows_of_an_image_env_carry_the_prompt_images_as_trl_reads_them() -> None:
    """TRL's GRPOTrainer reads a row's `images` column and puts the images before the first user
    message's text (`prepare_multimodal_messages`); `datasets` must keep them as they were."""
    pytest.importorskip(
        "datasets", reason="TRL's dataloader rows need datasets (pip install toolenv[trl]); CI installs it"
    )
    from datasets import Dataset
    from trl.data_utils import prepare_multimodal_messages

    rows = visual_rows()
    with gym.make("toolenv/VisualSearch-v0", limit=2) as env:
        _, info = env.reset(options={"task_id": json.loads(rows[0]["task"])["id"]})
    overview = info["messages"][-1].images[0].to_pil()
    assert [len(r["images"]) for r in rows] == [1, 1]
    question = info["messages"][-1].content.replace(" as <answer>CODE</answer>", " by calling the `answer` tool")
    assert rows[0]["prompt"][-1] == {"role": "user", "content": question}  # the answer given with the tool
    stored = Dataset.from_list(rows)[0]  # what TRL's dataloader hands the trainer
    assert stored["images"][0].tobytes() == overview.tobytes()  # the same pixels, not re-encoded
    messages = prepare_multimodal_messages(stored["prompt"], images=stored["images"])
    user = messages[-1]["content"]
    assert [part["type"] for part in user] == ["image", "text"] and user[0]["image"].size == overview.size
    assert user[1]["text"] == question
    factory = environment_factory("toolenv/VisualSearch-v0", env_kwargs={"limit": 2})
    assert factory().reset(**stored) is None  # the row's prompt (and images) are the prompt


def test_reset_without_a_prompt_returns_the_task_image_and_question_as_blocks() -> None:
    """TRL appends `reset`'s return to the prompt's last message; for an image task it must hold the image."""
    task = json.loads(visual_rows(1)[0]["task"])
    env = environment_factory("toolenv/VisualSearch-v0", env_kwargs={"limit": 1})()
    image, text = env.reset(task_id=task["id"])
    assert image["type"] == "image" and max(image["image"].size) == 448  # the overview the env shows
    question = task["question"].replace(" as <answer>CODE</answer>", " by calling the `answer` tool")
    assert text == {"type": "text", "text": NOTE + question}


def test_the_crop_tools_image_reaches_trls_async_tool_loop_as_its_text(trl_parts: Any) -> None:
    """TRL's async trainer is text only: its tool loop sends `str(result)`. The crop's text gets there."""
    import asyncio

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    worker_module = pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")
    from datasets import Dataset

    _, tok, _ = trl_parts
    rows = visual_rows(1)
    task = json.loads(rows[0]["task"])
    loop = worker_module._AsyncRolloutLoop(
        model_name="tiny",
        dataset=Dataset.from_list(rows),
        reward_funcs=[],
        processing_class=tok,
        eos_token_ids=[tok.eos_token_id],
        rollout_buffer=None,
        model_version_value=None,
        heartbeat_value=None,
        failed_event=None,
        exception_info_queue=None,
        metrics_queue=None,
        environment_factory=environment_factory("toolenv/VisualSearch-v0", env_kwargs={"limit": 1}),
    )
    env = loop._environment_pool[None][0]
    env.reset(**rows[0])
    call = {"type": "function", "function": {"name": "crop", "arguments": {"bbox": shown_box(task)}}}
    try:
        messages, calls, failures = asyncio.run(loop._execute_tool_calls([call], {"crop": env.crop}))
    finally:
        loop._tool_pool.shutdown()
    assert (calls, failures) == (1, 0)
    assert messages[0]["content"] == env.env.episode.turns[0].results[0].text
    assert messages[0]["content"].startswith("Cropped region") and "Image" not in messages[0]["content"]


# ---------------------------------------------------------------------- TRL's trainer
@pytest.fixture(scope="module")
def trl_parts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny Qwen2 with TRL's Qwen2.5 template, and a model class whose generation follows a script."""
    pytest.importorskip("trl", reason="the TRL tests need trl (pip install toolenv[trl]); CI installs it")
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    from toolenv.integrations.verl.tiny import build_tiny_qwen2

    root = build_tiny_qwen2(tmp_path_factory.mktemp("trl-model"))
    tok = AutoTokenizer.from_pretrained(root)
    tok.chat_template = qwen2_5_chat_template  # TRL knows this template: it parses its tool calls

    class ScriptedQwen2(Qwen2ForCausalLM):  # type: ignore[misc]
        """A policy that writes `script(context, row)[turn]`: its forward pass (the loss) is the real model's."""

        script: ClassVar[Callable[[str, int], list[str]]]

        def generate(self, input_ids: Any = None, **kw: Any) -> Any:
            outs = []
            for i, row in enumerate(input_ids.tolist()):
                text = tok.decode(row)
                turn = text.count("<|im_start|>assistant") - 1
                replies = type(self).script(text, i)
                outs.append(tok.encode(replies[min(turn, len(replies) - 1)] + "<|im_end|>", add_special_tokens=False))
            width = max(map(len, outs))
            pad = tok.pad_token_id
            return torch.cat([input_ids, torch.tensor([o + [pad] * (width - len(o)) for o in outs])], dim=1)

    return root, tok, ScriptedQwen2


def train_one_step(
    trl_parts: Any,
    tmp_path: Path,
    factory: Any,
    script: Callable[[str, int], list[str]],
    rows: list[dict[str, Any]],
    batch: int = 2,
) -> Any:
    """One GRPO step of the scripted policy on `rows`, `batch` completions (2 per prompt), `factory`'s envs."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOTrainer

    root, tok, cls = trl_parts
    cls.script = staticmethod(script)
    model = cls.from_pretrained(root)
    config = one_step_config(tmp_path, batch=batch, completion=256, learning_rate=1e-3)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        train_dataset=Dataset.from_list(rows),
        environment_factory=factory,
        args=config,
    )
    trainer.train()
    return trainer, trainer.state.log_history[0]


def test_grpo_trains_a_step_with_the_env_as_tools_and_reward(trl_parts: Any, tmp_path: Path) -> None:
    from toolenv.integrations.verl.demo import Calculator

    def make() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Calculator()], tasks=[{"id": "q", "question": "What is 6 * 7?", "answer": "42"}])

    calc = CALL.format(name="calculator", args='{"expression": "6 * 7"}')
    script = [  # the two samples of the group: one answers right, one wrong, so the advantage is not zero
        [calc, CALL.format(name="answer", args='{"answer": "42"}'), "Done."],
        [calc, CALL.format(name="answer", args='{"answer": "41"}'), "Done."],
    ]
    trainer, logged = train_one_step(
        trl_parts, tmp_path, environment_factory(make), lambda text, i: script[i % 2], dataset_rows(make) * 2
    )
    assert logged["tools/call_frequency"] == 2.0 and logged["tools/failure_frequency"] == 0.0
    name = next(k for k in logged if k.startswith("rewards/TRL") and k.endswith("/mean"))
    assert logged[name] == 0.5 and logged["reward"] == 0.5 and logged["reward_std"] > 0
    assert logged["grad_norm"] > 0  # the env's reward reached the policy's gradient
    episodes = [e.env.episode for e in trainer.environments]
    assert sorted(e.answer for e in episodes) == ["41", "42"]
    for ep in episodes:
        assert ep.turns[0].results[0].text == "42" and ep.terminated  # the calculator ran in the env


def test_grpo_on_a_real_sqlite_env(trl_parts: Any, tmp_path: Path) -> None:
    pytest.importorskip("toolenv_sql", reason="the Spider env needs toolenv-sql")
    rows = dataset_rows("toolenv/Spider-v0", n=1)
    gold = json.loads(rows[0]["task"])["answer"]
    sql = CALL.format(name="sql", args=json.dumps({"query": gold}))
    script = [sql, CALL.format(name="answer", args=json.dumps({"answer": gold})), "Done."]
    factory = environment_factory("toolenv/Spider-v0")
    trainer, logged = train_one_step(trl_parts, tmp_path, factory, lambda text, i: script, rows * 2)
    assert logged["reward"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    for env in trainer.environments:
        ep = env.env.episode
        assert "(1 row)" in ep.turns[0].results[0].text and not ep.turns[0].results[0].is_error


def test_grpo_mixes_two_envs_picked_by_the_rows_environment_column(trl_parts: Any, tmp_path: Path) -> None:
    pytest.importorskip("toolenv_sql", reason="the Spider env needs toolenv-sql")
    from toolenv.integrations.verl.demo import Calculator

    def calc_env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Calculator()], tasks=[{"id": "q", "question": "What is 6 * 7?", "answer": "42"}])

    spider = dataset_rows("toolenv/Spider-v0", n=1, environment="spider")
    gold = json.loads(spider[0]["task"])["answer"]
    scripts = {
        "calc": [
            CALL.format(name="calculator", args='{"expression": "6 * 7"}'),
            CALL.format(name="answer", args='{"answer": "42"}'),
        ],
        "spider": [
            CALL.format(name="sql", args=json.dumps({"query": gold})),
            CALL.format(name="answer", args=json.dumps({"answer": gold})),
        ],
    }
    factories = {"calc": environment_factory(calc_env), "spider": environment_factory("toolenv/Spider-v0")}
    rows = dataset_rows(calc_env, environment="calc") + spider

    def script(text: str, i: int) -> list[str]:  # each prompt offers only its own env's tools
        return scripts["calc" if '"name": "calculator"' in text else "spider"] + ["Done."]

    trainer, logged = train_one_step(trl_parts, tmp_path, factories, script, rows, batch=4)  # both rows
    assert logged["reward"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    kinds = sorted(type(e).__name__ for e in trainer.environments)
    assert kinds == sorted([factories["calc"].name] * 2 + [factories["spider"].name] * 2)
    assert factories["calc"].name.startswith("TRLCalcEnvEnvironment")
    assert all(e.env.episode.terminated for e in trainer.environments)


def test_grpo_counts_a_failed_tool_call_and_shows_the_model_its_error(trl_parts: Any, tmp_path: Path) -> None:
    from toolenv.integrations.verl.demo import Calculator

    def make() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Calculator()], tasks=[{"id": "q", "question": "What is 6 * 7?", "answer": "42"}])

    seen: list[str] = []

    def script(text: str, i: int) -> list[str]:
        seen.append(text)
        return [
            CALL.format(name="calculator", args='{"expr": "6 * 7"}'),  # a wrong argument name
            CALL.format(name="calculator", args='{"expression": "6 * 7"}'),
            CALL.format(name="answer", args='{"answer": "42"}'),
            "Done.",
        ]

    trainer, logged = train_one_step(trl_parts, tmp_path, environment_factory(make), script, dataset_rows(make) * 2)
    assert logged["tools/call_frequency"] == 3.0 and logged["tools/failure_frequency"] == pytest.approx(1 / 3)
    assert logged["reward"] == 1.0
    assert any("unknown argument(s) 'expr'" in text for text in seen)  # the error text reached the model
    for env in trainer.environments:
        first = env.env.episode.turns[0].results[0]
        assert first.is_error and "unknown argument(s) 'expr'" in first.text


# ---------------------------------------------------------------------- a vision model
@pytest.fixture(scope="module")
def vlm_parts() -> Any:
    """A tiny random Qwen3-VL built here (no download), a real `Qwen3VLProcessor` for images (no video
    processor: that one needs torchvision) with TRL's Qwen3-VL template (TRL adds its response parser),
    and a model class whose generation follows a script after a real forward pass over its images."""
    pytest.importorskip("trl", reason="the TRL tests need trl (pip install toolenv[trl]); CI installs it")
    import torch
    import transformers

    processor, config, tok = tiny_qwen3_vl()

    class ScriptedQwen3VL(transformers.Qwen3VLForConditionalGeneration):  # type: ignore[misc]
        """Writes `script(context, row)[turn]`, after a real forward pass over the inputs TRL generates
        from (the model raises if the image tokens and the pixels it is given disagree)."""

        script: ClassVar[Callable[[str, int], list[str]]]
        seen: ClassVar[list[tuple[int, int, int]]] = []  # (turn, images in the context, images given)

        def generate(self, input_ids: Any = None, **kw: Any) -> Any:
            inputs = {k: v for k, v in kw.items() if k != "generation_config"}
            self(input_ids=input_ids, **inputs)
            given = 0 if kw.get("image_grid_thw") is None else len(kw["image_grid_thw"])
            outs = []
            for i, row in enumerate(input_ids.tolist()):
                text = tok.decode(row)
                turn = text.count("<|im_start|>assistant") - 1
                type(self).seen.append((turn, text.count("<|vision_start|>"), given))
                replies = type(self).script(text, i)
                outs.append(tok.encode(replies[min(turn, len(replies) - 1)] + "<|im_end|>", add_special_tokens=False))
            width = max(map(len, outs))
            pad = tok.pad_token_id
            return torch.cat([input_ids, torch.tensor([o + [pad] * (width - len(o)) for o in outs])], dim=1)

    return processor, config, ScriptedQwen3VL


@pytest.mark.parametrize("rows_kind", ["dataset_rows", "task_id"])
def test_grpo_trains_a_vision_model_on_visualsearch_with_the_crops_images(
    vlm_parts: Any, tmp_path: Path, rows_kind: str
) -> None:
    """TRL's real GRPOTrainer with a (tiny) Qwen3-VL on `toolenv/VisualSearch-v0`: the overview image
    is in the first prompt (from the row's `images` column, or from `reset` for a row naming only a
    task id), each crop's image comes back in the tool message, and both reach the generation and the
    loss's forward pass, whose gradient moves the vision tower."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    processor, config, cls = vlm_parts
    rows = visual_rows(1)
    task = json.loads(rows[0]["task"])
    if rows_kind == "task_id":
        rows = [{"task_id": task["id"]}]
    crop = CALL.format(name="crop", args=json.dumps({"bbox": shown_box(task), "units": "pixels"}))
    script = [  # one answers right, one wrong: a non-zero advantage
        [crop, CALL.format(name="answer", args=json.dumps({"answer": task["answer"]})), "Done."],
        [crop, CALL.format(name="answer", args='{"answer": "ZZZZ"}'), "Done."],
    ]
    cls.script = staticmethod(lambda text, i: script[i % 2])
    cls.seen = []
    torch.manual_seed(0)
    model = cls(config)
    vision_before = [p.detach().clone() for p in model.model.visual.parameters()]
    trainer = GRPOTrainer(
        model=model,
        processing_class=processor,
        train_dataset=Dataset.from_list(rows * 2),
        environment_factory=environment_factory("toolenv/VisualSearch-v0", env_kwargs={"limit": 1}),
        args=one_step_config(tmp_path, batch=2, completion=512, learning_rate=1e-2),
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 2.0 and logged["tools/failure_frequency"] == 0.0
    assert logged["reward"] == 0.5 and logged["reward_std"] > 0
    # generation saw the overview first, then the overview and the crop (in the text and as pixels)
    assert sorted(set(cls.seen)) == [(0, 1, 2), (1, 2, 4), (2, 2, 4)]
    for env in trainer.environments:
        first = env.env.episode.turns[0].results[0]
        assert first.images and not first.is_error and first.text.startswith("Cropped region")
    assert sorted(e.env.episode.answer for e in trainer.environments) == sorted([task["answer"], "ZZZZ"])
    moved = [not torch.equal(a, b) for a, b in zip(vision_before, model.model.visual.parameters(), strict=True)]
    assert any(moved)  # the images were in the loss's forward pass


def test_grpo_mixes_an_image_env_and_a_text_env_in_one_vision_batch(vlm_parts: Any, tmp_path: Path) -> None:
    """docs/trl.md: text rows given `images: []` train beside image rows, each with its own env."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from toolenv.integrations.verl.demo import Calculator

    def calc_env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Calculator()], tasks=[{"id": "q", "question": "What is 6 * 7?", "answer": "42"}])

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    processor, config, cls = vlm_parts
    pytest.importorskip("toolenv_vision", reason="the VisualSearch env needs toolenv-vision")
    vision = dataset_rows("toolenv/VisualSearch-v0", n=1, env_kwargs={"limit": 1}, environment="vision")
    task = json.loads(vision[0]["task"])
    text = [{**row, "images": []} for row in dataset_rows(calc_env, environment="calc")]
    crop = CALL.format(name="crop", args=json.dumps({"bbox": shown_box(task)}))

    def script(context: str, i: int) -> list[str]:  # each prompt offers only its own env's tools
        if '"name": "crop"' in context:
            return [crop, CALL.format(name="answer", args=json.dumps({"answer": task["answer"]})), "Done."]
        return [CALL.format(name="answer", args='{"answer": "42"}'), "Done."]

    cls.script = staticmethod(script)
    cls.seen = []
    torch.manual_seed(0)
    factories = {
        "vision": environment_factory("toolenv/VisualSearch-v0", env_kwargs={"limit": 1}),
        "calc": environment_factory(calc_env),
    }
    trainer = GRPOTrainer(
        model=cls(config),
        processing_class=processor,
        train_dataset=Dataset.from_list(vision + text),
        environment_factory=factories,
        args=one_step_config(tmp_path, batch=4, completion=512),
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["reward"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    assert {(turn, images) for turn, images, _ in cls.seen} == {(0, 1), (0, 0), (1, 2), (1, 0), (2, 2)}
    assert all(e.env.episode.terminated for e in trainer.environments)


# ---------------------------------------------------------------------- pickling and reward names
def test_the_factory_pickles_and_its_copy_runs_the_same_episodes() -> None:
    """TRL's AsyncGRPOTrainer (and multiprocessing spawn, Ray) pickle the factory to another process."""
    from _trl_spawn import CALC_TASKS, run_episode

    from toolenv.integrations.verl.demo import Calculator

    factory = environment_factory("toolenv/ToolEnv-v0", env_kwargs={"tools": [Calculator()], "tasks": CALC_TASKS})
    sent = pickle.loads(pickle.dumps(factory))
    assert run_episode(sent) == run_episode(factory) == (factory.environment_class.__name__, "42", ANSWERED, 1.0)
    assert isinstance(sent(), sent.environment_class) and sorted(tool_methods(sent())) == ["answer", "calculator"]


def test_a_pickled_spider_factory_scores_as_the_original() -> None:
    pytest.importorskip("toolenv_sql", reason="the Spider env needs toolenv-sql")
    row = dataset_rows("toolenv/Spider-v0", n=1)[0]
    gold = json.loads(row["task"])["answer"]
    factory = environment_factory("toolenv/Spider-v0", env_kwargs={"max_turns": 3})
    outcomes = []
    for made in (factory, pickle.loads(pickle.dumps(factory))):
        env = made()
        env.reset(**row)
        outcomes.append((env.sql(query=gold), env.answer(answer=gold), env.get_reward(), env.env.max_turns))
    assert outcomes[0] == outcomes[1] and outcomes[0][2] == 1.0 and outcomes[0][3] == 3


def test_a_factory_of_a_lambda_says_why_it_cannot_be_pickled() -> None:
    factory = environment_factory(lambda: make_env())
    with pytest.raises(pickle.PicklingError, match=r"lambda or a local function.*env id or a module-level function"):
        pickle.dumps(factory)
    assert copy.deepcopy(factory) is factory  # a copy in the same process needs no pickling


def test_trls_async_rollout_worker_sends_the_factory_to_its_spawned_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's real `AsyncRolloutWorker.start()` pickles the factory and spawns its child; the child's
    loop (a stand-in for TRL's vLLM loop, which needs a GPU server) runs an episode with it."""
    pytest.importorskip("trl", reason="the TRL tests need trl (pip install toolenv[trl]); CI installs it")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    worker_module = pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")
    from _trl_spawn import EpisodeLoop, calc_env

    monkeypatch.setattr(worker_module, "is_vllm_available", lambda: True)  # only the child's real loop needs vLLM
    factory = environment_factory(calc_env)
    worker = worker_module.AsyncRolloutWorker(environment_factory=factory, reward_funcs=[], child_ready_timeout=300)
    worker._loop_cls = EpisodeLoop
    try:
        worker.start()
        outcome = worker.rollout_buffer.get(timeout=300)  # a guard against a hang, not a timing check
    finally:
        worker.stop()
    assert outcome == (factory.name, "42", ANSWERED, 1.0)


def test_each_factory_has_its_own_reward_name() -> None:
    """TRL logs an env's reward under its class name: two envs must not share a column."""
    from _trl_spawn import calc_env

    def other_env() -> toolenv.ToolEnv:
        return make_env()

    # A collection between two calls must not change a name (names are kept for the process)
    import gc

    factories = []
    for spec in (calc_env, other_env, other_env):
        factories.append(environment_factory(spec))
        factories[-1].environment_class  # builds the class now
        gc.collect()  # a collection between two calls must not free a live factory's name
    names = [f.environment_class.__name__ for f in factories]
    assert names[0].startswith("TRLCalcEnvEnvironment") and names[1].startswith("TRLOtherEnvEnvironment")
    # The same env and settings twice: the same name (a notebook cell run again logs to the same column)
    assert len(set(names)) == 2 and names[1] == names[2]
    short, long = (environment_factory("toolenv/ToolEnv-v0", env_kwargs={"max_turns": n}) for n in (2, 8))
    assert short.name != long.name and long.name.startswith("TRLToolenvToolEnvV0Environment")
    assert environment_factory(make_env, name="arith").name == "arith"


def test_grpo_logs_each_envs_reward_in_its_own_column(trl_parts: Any, tmp_path: Path) -> None:
    from toolenv.integrations.verl.demo import Calculator

    def mult_env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Calculator()], tasks=[{"id": "m", "question": "What is 6 * 7?", "answer": "42"}])

    def sum_env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Calculator()], tasks=[{"id": "s", "question": "What is 2 + 2?", "answer": "4"}])

    factories = {"mult": environment_factory(mult_env), "sum": environment_factory(sum_env)}
    rows = dataset_rows(mult_env, environment="mult") + dataset_rows(sum_env, environment="sum")

    def script(text: str, i: int) -> list[str]:  # right on the product, wrong on the sum
        answer = "42" if "6 * 7" in text else "5"
        return [CALL.format(name="answer", args=json.dumps({"answer": answer})), "Done."]

    _, logged = train_one_step(trl_parts, tmp_path, factories, script, rows, batch=4)
    columns = {k: v for k, v in logged.items() if k.startswith("rewards/") and k.endswith("/mean")}
    assert columns == {"rewards/TRLMultEnvEnvironment/mean": 1.0, "rewards/TRLSumEnvEnvironment/mean": 0.0}
    assert logged["reward"] == 0.5


# ---------------------------------------------------------------------- a batch of environments
def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_a_batch_of_1024_environments_holds_no_event_loop_each() -> None:
    """TRL keeps one environment per sample of a generation batch for the whole run (its pool grows to
    the batch, and nothing closes it). An env's own event loop is three open files (epoll, self-pipe):
    3,072 for 1,024 samples, past the usual limit of 1,024 open files."""
    import threading

    factory = environment_factory(make_env)
    factory().reset(task_id="t1")  # the shared loop (if any) is started before counting
    fds, threads = _open_fds(), threading.active_count()
    envs = [factory() for _ in range(1024)]
    for env in envs:
        env.reset(task_id="t1")
        assert env.add(a=2, b=3) == "5"
    assert all(env.get_reward() == 0.0 for env in envs)
    assert _open_fds() - fds < 16 and threading.active_count() - threads < 8


# ---------------------------------------------------------------------- what the episode records
def _as_chat(messages: list[toolenv.Message]) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def rewritten_env() -> toolenv.ToolEnv:
    """An env whose system prompt and question say to write `<answer>`, reworded for TRL's answer tool."""
    from toolenv.integrations.verl.demo import Calculator

    return toolenv.ToolEnv(
        tools=[Calculator()],
        tasks=[{"id": "q", "question": "What is 6 * 7? Reply inside <answer>...</answer>.", "answer": "42"}],
        system_prompt="Be exact. Reply inside <answer>...</answer>.",
        answer_tool_rewrites={"inside <answer>...</answer>": "with the `{answer_tool}` tool"},
    )


def test_the_episode_records_the_prompt_trl_shows_not_the_envs_text_prompt() -> None:
    """The episode's (and reset info's) prompt messages are the row's prompt, as TRL shows it the model:
    the system message reworded for the answer tool, not the env's text-format instructions. A row
    without a prompt records TRL's one user message holding what `reset` returned."""
    rows = dataset_rows(rewritten_env)
    env = environment_factory(rewritten_env)()
    assert env.reset(**rows[0]) is None
    ep = env.env.episode
    assert ep is not None and _as_chat(ep.messages) == rows[0]["prompt"]
    assert _as_chat(env.last_info["messages"]) == rows[0]["prompt"]
    assert "<answer>" not in ep.messages[0].content and "<tool_call>" not in ep.messages[0].content
    env.calculator(expression="6 * 7")
    env.answer(answer="42")
    assert [m.role for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert env.get_reward() == 1.0

    shown = env.reset(task_id="q")  # TRL appends it to its empty user message
    assert isinstance(shown, str) and "<answer>" not in shown
    assert _as_chat(env.env.episode.messages) == [{"role": "user", "content": shown}]
    env.reset(task_id="q", prompt=[{"role": "user", "content": "my own prompt"}])
    assert _as_chat(env.env.episode.messages) == [{"role": "user", "content": "my own prompt"}]


@pytest.mark.parametrize("rows_kind", ["dataset_rows", "task_id"])
def test_grpo_episodes_record_the_prompt_the_model_was_shown(trl_parts: Any, tmp_path: Path, rows_kind: str) -> None:
    """Under TRL's real GRPOTrainer, the recorded prompt messages rendered with the chat template and
    the env's tools are exactly the first prompt the policy generated from."""
    rows = dataset_rows(rewritten_env) if rows_kind == "dataset_rows" else [{"task_id": "q"}]
    first_prompts: list[str] = []

    def script(text: str, i: int) -> list[str]:
        if text.count("<|im_start|>assistant") == 1:
            first_prompts.append(text)
        return [CALL.format(name="answer", args='{"answer": "42"}'), "Done."]

    trainer, logged = train_one_step(trl_parts, tmp_path, environment_factory(rewritten_env), script, rows * 2)
    assert logged["reward"] == 1.0 and first_prompts
    _, tok, _ = trl_parts
    for env in trainer.environments:
        ep = env.env.episode
        prompt = ep.messages[: next(i for i, m in enumerate(ep.messages) if m.role == "assistant")]
        tools = list(tool_methods(env).values())
        rendered = tok.apply_chat_template(_as_chat(prompt), tools=tools, add_generation_prompt=True, tokenize=False)
        assert "<answer>" not in rendered
        assert any(text.endswith(rendered) for text in first_prompts), (rendered, first_prompts[0])


def test_an_image_tasks_recorded_prompt_holds_the_image_trl_shows() -> None:
    """TRL puts a row's `images` in its first user message, and `reset`'s blocks in its one user message:
    the episode records the question TRL shows there with the overview image."""
    pytest.importorskip("datasets", reason="the rows are read back through datasets (TRL needs it)")
    from datasets import Dataset

    stored = Dataset.from_list(visual_rows(1))[0]
    env = environment_factory("toolenv/VisualSearch-v0", env_kwargs={"limit": 1})()
    assert env.reset(**stored) is None
    ep = env.env.episode
    assert ep is not None and _as_chat(ep.messages) == stored["prompt"]
    assert [len(m.images) for m in ep.messages] == [0, 1]
    assert ep.messages[1].images[0].to_pil().tobytes() == stored["images"][0].tobytes()
    image, text = env.reset(task_id=json.loads(stored["task"])["id"])
    (user,) = env.env.episode.messages
    assert user.role == "user" and user.content == text["text"] and len(user.images) == 1
    assert user.images[0].to_pil().tobytes() == image["image"].tobytes()
    own = env.reset(task=stored["task"], prompt=[{"role": "user", "content": "Find it."}], images=[image["image"]] * 2)
    assert own is None and [len(m.images) for m in env.env.episode.messages] == [2]


def test_a_few_shot_prompt_is_recorded_with_its_calls() -> None:
    """A row's own conversational prompt (a worked example with a call) is recorded as TRL shows it."""
    prompt = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]},
        {"role": "tool", "name": "add", "content": "2"},
        {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
    ]
    env = environment_factory(make_env)()
    assert env.reset(task_id="t1", prompt=prompt) is None
    messages = env.env.episode.messages
    assert [(m.role, m.content) for m in messages] == [
        ("user", "1+1?"),
        ("assistant", ""),
        ("tool", "2"),
        ("user", "2+3?"),
    ]
    assert [(c.name, c.arguments) for c in messages[1].tool_calls or []] == [("add", {"a": 1})]


# ---------------------------------------------------------------------- a remote env
@pytest.fixture(scope="module")
def served() -> Any:
    """A real `toolenv serve` app of `_remote.make_env` (tools `add` and `swatch`) on 127.0.0.1; yields its URL."""
    pytest.importorskip("starlette", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
    pytest.importorskip("uvicorn", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
    from _remote import make_env as served_env
    from _remote import serving

    with serving(served_env) as url:
        yield url


def test_a_remote_env_offers_the_served_envs_tools_as_the_local_env_does(served: str) -> None:
    """A `RemoteToolEnv` has no local tools (they run on the server): its TRL methods come from the
    server's tool schemas, the same schemas TRL's chat template would show for the env in-process,
    and a call runs on the server through the env's step."""
    get_json_schema = pytest.importorskip(
        "transformers.utils", reason="schemas are read by transformers"
    ).get_json_schema
    from _remote import make_env as served_env

    remote = environment_factory("toolenv/Remote-v0", env_kwargs={"url": served})()
    local = environment_factory(served_env)()
    try:
        remote_methods, local_methods = tool_methods(remote), tool_methods(local)
        assert sorted(remote_methods) == sorted(local_methods) == ["add", "answer", "swatch"]
        for name, method in local_methods.items():
            assert get_json_schema(remote_methods[name]) == get_json_schema(method)
        remote.reset(task_id="t1")
        assert remote.add(a=2, b=3) == "5"
        with pytest.raises(ToolCallError, match=r"^Invalid arguments for tool 'add'"):
            remote.add(a="two", b=3)
        blocks = remote.swatch(color="blue")
        assert blocks[0]["image"].size == (8, 6) and blocks[-1] == {"type": "text", "text": "a blue swatch"}
        assert remote.answer(answer="5") == ANSWERED and remote.get_reward() == 1.0
        ep = remote.env.episode
        assert ep is not None and ep.turns[0].results[0].text == "5" and ep.terminated
    finally:
        remote.env.close()
        local.env.close()


def test_grpo_trains_a_step_on_a_remote_env(trl_parts: Any, tmp_path: Path, served: str) -> None:
    """TRL's real GRPOTrainer on `toolenv/Remote-v0`: the model is offered the server's tools, and its
    call runs on the server."""
    rows = dataset_rows("toolenv/Remote-v0", n=1, env_kwargs={"url": served})
    script = [CALL.format(name="add", args='{"a": 2, "b": 3}'), CALL.format(name="answer", args='{"answer": "5"}')]
    factory = environment_factory("toolenv/Remote-v0", env_kwargs={"url": served})
    offered: list[str] = []

    def reply(text: str, i: int) -> list[str]:
        offered.append(text)
        return [*script, "Done."]

    trainer, logged = train_one_step(trl_parts, tmp_path, factory, reply, rows * 2)
    assert '"name": "add"' in offered[0] and '"name": "swatch"' in offered[0]  # the tools shown to the model
    assert logged["tools/call_frequency"] == 2.0 and logged["tools/failure_frequency"] == 0.0
    assert logged["reward"] == 1.0
    for env in trainer.environments:
        ep = env.env.episode
        assert ep.turns[0].results[0].text == "5" and ep.terminated
        env.env.close()
