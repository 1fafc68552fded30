from __future__ import annotations

import asyncio
import warnings
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from pydantic import BaseModel

import toolenv
from toolenv.env import NO_ACTION, ToolEnv
from toolenv.parsers import get_parser, parser_names

from .conftest import TASKS, Add, Meet, Sleep

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def make(**kw: object) -> ToolEnv:
    kw.setdefault("tools", [Add()])
    kw.setdefault("tasks", TASKS)
    return ToolEnv(**kw)  # type: ignore[arg-type]


def test_issue_example_through_gym_make() -> None:
    env = gym.make(
        "toolenv/ToolEnv-v0",
        tools=[Add()],
        tasks=[{"question": "2+3?", "answer": "5"}],
        parser="hermes",
        reward="exact_match",
        max_turns=4,
    )
    obs, info = env.reset(seed=0)
    assert "2+3?" in obs and '"name": "add"' in obs
    assert [m.role for m in info["messages"]] == ["system", "user"]
    obs, reward, terminated, truncated, info = env.step(CALL)
    assert obs == "<tool_response>\n5\n</tool_response>"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_results"][0].text == "5" and info["turn"] == 1
    assert [m.role for m in info["messages"]] == ["assistant", "tool"]
    assert info["messages"][0].tool_calls[0].arguments == {"a": 2, "b": 3}
    obs, reward, terminated, truncated, info = env.step("<answer>5</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["reward_components"] == {"exact_match": 1.0}
    assert info["episode_stats"] == {"return": 1.0, "turns": 2, "tool_calls": 1, "tool_errors": 0}
    env.close()


def test_wrong_answer_scores_zero_and_multiple_gold_answers() -> None:
    env = make()
    env.reset(options={"task_id": "t3"})
    assert env.step("<answer>The Paris</answer>")[1] == 1.0
    env.reset(options={"task_id": "t1"})
    assert env.step("<answer>6</answer>")[1] == 0.0


def test_max_turns_truncates_and_no_action_gives_error_observation() -> None:
    env = make(max_turns=2)
    env.reset(seed=1)
    obs, r, term, trunc, info = env.step("I am thinking...")
    assert NO_ACTION in obs and info["tool_results"][0].is_error and not (term or trunc)
    obs, r, term, trunc, info = env.step(CALL)
    assert trunc and not term and r == 0.0 and info["answer"] is None
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(CALL)


def test_malformed_actions_never_raise() -> None:
    env = make(max_turns=50)
    env.reset(seed=0)
    for bad in ["<tool_call>{", "<tool_call>[1]</tool_call>", "<tool_call>{}</tool_call>", "\x00\ud7ff" * 100, ""]:
        obs, *_, info = env.step(bad)
        assert info["tool_results"] and all(r.is_error for r in info["tool_results"]), bad


def test_reset_picks_tasks_by_seed_id_index_and_sequence() -> None:
    env = make()
    a, _ = env.reset(seed=7)
    b, _ = env.reset(seed=7)
    assert a == b
    assert env.reset(options={"task_index": 1})[1]["task_id"] == "t2"
    assert env.reset(options={"task": {"id": "new", "question": "1+1?"}})[1]["task_id"] == "new"
    with pytest.raises(KeyError):
        env.reset(options={"task_id": "missing"})
    seq = make(task_order="sequential")
    assert [seq.reset()[1]["task_id"] for _ in range(4)] == ["t1", "t2", "t3", "t1"]
    # A seeded reset starts the sequence again at task seed % n (Gymnasium: seeded resets repeat).
    assert [seq.reset(seed=4)[1]["task_id"], seq.reset()[1]["task_id"]] == ["t2", "t3"]
    assert seq.reset(seed=4)[1]["task_id"] == "t2"


def test_seeded_generator_matches_gymnasium_though_made_lazily() -> None:
    import numpy as np
    from gymnasium.error import Error
    from gymnasium.utils import seeding

    env = make()
    env.reset(seed=11, options={"task_index": 0})  # the task is given: nothing drawn yet
    expected, _ = seeding.np_random(11)
    assert env.np_random_seed == 11
    assert env.np_random.integers(10**9, size=4).tolist() == expected.integers(10**9, size=4).tolist()
    env.reset(seed=11)  # a random task draws from a fresh generator of the same seed
    first = env.unwrapped.np_random.integers(10**9)
    again = make()
    again.reset(seed=11)
    assert again.np_random.integers(10**9) == first
    env.reset()  # no seed: the generator carries on
    assert env.np_random_seed == 11
    env.np_random = np.random.default_rng(3)  # Gymnasium's setter: seed unknown
    assert env.np_random_seed == -1
    with pytest.raises(Error, match="greater or equal to zero"):
        env.reset(seed=-1)
    single = make(tasks=TASKS[:1])
    assert single.reset(seed=5)[1]["task_id"] == TASKS[0]["id"]
    assert single.np_random_seed == 5


def test_tags_parser_with_information_markers() -> None:
    from toolenv import tool

    @tool
    def search(query: str) -> str:
        return f"Doc 1: about {query}"

    env = make(tools=[search], parser="tags")
    env.reset(seed=0)
    obs, *_ = env.step("<search>paris</search>")
    assert obs == "<information>Doc 1: about paris</information>"


def test_prompt_template_uses_task_context() -> None:
    env = make(
        prompt_template="{instructions}\nSchema: {schema}\nQ: {question} {missing}",
        tasks=[{"question": "q?", "context": {"schema": "CREATE TABLE t(x)"}}],
    )
    obs, _ = env.reset()
    assert "Schema: CREATE TABLE t(x)\nQ: q? {missing}" in obs
    # Chat agents, verl and SkyRL read the messages: the template's own text reaches them too
    # (the user message held the question alone, without the schema), the instructions apart.
    system, user = env.episode.messages  # type: ignore[union-attr]
    assert user.role == "user" and user.content == "Schema: CREATE TABLE t(x)\nQ: q? {missing}"
    assert system.role == "system" and system.content and system.content not in user.content
    whole = make(prompt_template="{question}", tasks=[{"question": "Answer briefly.\nQ: q?\n"}])
    obs, _ = whole.reset()  # Search-R1's prompt is all in the question: the message is the text, as written
    assert whole.episode.messages[1].content == obs == "Answer briefly.\nQ: q?\n"  # type: ignore[union-attr]
    default = make(tasks=[{"question": "q?", "context": {"schema": "CREATE TABLE t(x)"}}])
    default.reset()
    assert default.episode.messages[1].content == "q?"  # type: ignore[union-attr]  # the default: the question


def test_a_prompt_template_keeps_braces_that_are_no_task_field_as_written() -> None:
    """docs/env.md: a field the task does not have stays as written, so templates may hold
    braces. A JSON example in the template (`{"answer": 1}`: `str.format` reads a field
    `"answer"` with the format spec ` 1`) raised a ValueError at every reset, `{a.b}` an
    AttributeError, `{0}` "positional fields", and `{a[0]}` rendered as a lone `{`."""
    template = (
        '{instructions}\nQ: {question}\nReply as {"answer": "...", "steps": [1, 2]} or {"a": {"b": 1}}.'
        " {a.b} {a[0]} {0} {} {missing!r} {missing:>9} {width} {schema!r} {schema:>{width}} {schema:>{nowidth}}"
    )
    env = make(prompt_template=template, tasks=[{"question": "q?", "context": {"schema": "s", "width": 3}}])
    try:
        obs, _ = env.reset(seed=0)
    finally:
        env.close()
    assert obs.endswith(
        'Q: q?\nReply as {"answer": "...", "steps": [1, 2]} or {"a": {"b": 1}}.'
        " {a.b} {a[0]} {0} {} {missing!r} {missing:>9} 3 's'   s {schema:>{nowidth}}"
    )


def test_a_prompt_template_that_would_lose_the_question_is_refused_or_warned_of() -> None:
    """Unknown fields stay as written (templates may hold braces), so a misspelt `{questoin}`
    built prompts without the question, silently; a template `str.format` cannot read failed
    only at the first reset."""
    with pytest.warns(UserWarning, match=r"has no \{question\} field"):
        make(prompt_template="{instructions}\n\nQ: {questoin}")
    with pytest.raises(ValueError, match=r"not a str\.format template"):
        make(prompt_template="{instructions}\n\nQ: {question")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(prompt_template="{question.strip} {{braces}} {question!r:>3}")


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown parser 'nope'"):
        make(parser="nope")
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        make(reward="nope")
    with pytest.raises(ValueError, match="max_turns"):
        make(max_turns=0)


def test_gymnasium_checker_passes() -> None:
    check_env(make())
    check_env(make(parser="tags"))
    check_env(make(task_order="sequential"))
    check_env(gym.make("toolenv/ToolEnv-v0", tools=[Add()], tasks=TASKS).unwrapped)


async def test_async_twins_and_sync_calls_inside_a_loop() -> None:
    env = make(tools=[Add(), Sleep()])
    obs, info = await env.areset(seed=0)
    obs, r, term, trunc, info = await env.astep(CALL)
    assert obs.endswith("5\n</tool_response>")
    obs, *_ = env.step(CALL)  # a sync call inside a running loop (a notebook cell) runs off the loop
    assert obs.endswith("5\n</tool_response>")
    await env.aclose()


def test_many_calls_per_turn_are_concurrent_in_step() -> None:
    env = make(tools=[Meet(4)], max_turns=3)
    env.reset(seed=0)
    action = '<tool_call>{"name": "meet", "arguments": {}}</tool_call>' * 4
    obs, *_, info = env.step(action)
    assert [r.text for r in info["tool_results"]] == ["met"] * 4  # all four in flight at once
    assert obs.count("met") == 4
    assert len(info["tool_calls"]) == 4
    env.close()


def test_render_ansi() -> None:
    env = make(render_mode="ansi")
    env.reset(seed=0)
    env.step(CALL)
    out = env.render()
    assert out is not None and "[assistant]" in out and "[tool] 5" in out


def test_step_info_is_fresh_each_call() -> None:
    env = make()
    env.reset(seed=0)
    i1 = env.step(CALL)[-1]
    i2 = env.step(CALL)[-1]
    assert i1 is not i2 and i1["reward_components"] is not i2["reward_components"]
    assert isinstance(toolenv.ToolEnv, type)


def test_areset_renders_through_the_async_hook() -> None:
    import threading

    class Threaded(toolenv.ToolEnv):
        rendered_in: list[str] = []  # noqa: RUF012 - test bookkeeping

        def render_prompt(self, task: toolenv.Task) -> tuple[str, list[toolenv.Message]]:
            self.rendered_in.append(threading.current_thread().name)
            return super().render_prompt(task)

        async def arender_prompt(self, task: toolenv.Task) -> tuple[str, list[toolenv.Message]]:
            return await asyncio.to_thread(self.render_prompt, task)

    env = Threaded(tools=[Add()], tasks=TASKS)
    obs, info = env.reset(seed=0)
    assert "Question:" in obs and info["messages"][-1].role == "user"
    assert Threaded.rendered_in and Threaded.rendered_in[0] != threading.current_thread().name
    env.close()


def test_episode_ids_are_unique_and_a_forked_child_draws_new_ones() -> None:
    import os
    import warnings

    from toolenv.episode import new_episode_id

    ids = {new_episode_id() for _ in range(10_000)}
    assert len(ids) == 10_000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns about fork in a threaded process; the child only writes and exits
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report one id and leave at once
        os.write(write, new_episode_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    mine = new_episode_id()
    assert len(child) == 32 and child[:16] != mine[:16] and child not in ids


async def test_a_step_keeps_few_objects_for_the_garbage_collector() -> None:
    """What finished steps keep alive is what every full collection walks while 1,024 episodes
    run at once: a regression here shows up as wall time at scale (docs/benchmarks.md)."""
    import gc

    envs = [ToolEnv(tools=[Add()], tasks=TASKS, max_turns=4) for _ in range(200)]
    for env in envs:  # each env holds an episode already, so only what steps keep is counted
        await env.areset(seed=0)
    gc.collect()
    before = len(gc.get_objects())
    for env in envs:
        await env.areset(seed=0)
        for _ in range(4):
            await env.astep('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    gc.collect()
    per_step = (len(gc.get_objects()) - before) / (200 * 4)
    for env in envs:
        await env.aclose()
    # 13 today: the turn, the parsed action and its call, the result and the call record, two
    # chat messages, and six lists holding them. One stray object kept per step fails this.
    assert per_step < 14, per_step


class _Unanswered(toolenv.Reward):
    """-0.5 for an episode that ends with no answer, so a truncation's final reward shows."""

    name = "unanswered"

    async def final(self, episode: toolenv.Episode) -> float:
        return -0.5 if episode.answer is None else 0.0


def test_step_runs_a_turn_a_trainer_already_parsed() -> None:
    from toolenv.env import written_turn
    from toolenv.types import ParsedAction, ToolCall

    env = make()
    env.reset(options={"task_id": "t1"})
    parsed = ParsedAction(tool_calls=[ToolCall(name="add", arguments={"a": 2, "b": 4}, id="c9")])
    obs, reward, term, trunc, info = env.step(written_turn(env.parser, parsed), parsed=parsed)
    assert obs == "<tool_response>\n6\n</tool_response>" and not (term or trunc)
    assert info["tool_results"][0].call_id == "c9"
    turn = env.episode.turns[0]  # type: ignore[union-attr]
    # The turn's text is the calls written in the env's own format, so reports and exports read as usual
    assert env.parser.parse(turn.action).tool_calls[0].arguments == {"a": 2, "b": 4}
    obs, reward, term, trunc, info = env.step("five", parsed=ParsedAction(answer="5"))
    assert (reward, term) == (1.0, True) and env.episode.turns[-1].action == "five"  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="has ended"):
        env.step("", parsed=ParsedAction(answer="6"))


def test_truncate_scores_an_open_episode_once_and_adds_to_its_last_turn() -> None:
    env = make(reward=[("exact_match", 1.0), (_Unanswered(), 1.0)])
    env.reset(options={"task_id": "t1"})
    env.step(CALL)
    assert env.truncate() == -0.5
    ep = env.episode
    assert ep is not None and ep.truncated and not ep.terminated and ep.released
    assert ep.turns[-1].reward == -0.5 and ep.turns[-1].reward_components["unanswered"] == -0.5
    assert env.truncate() == 0.0  # already over: nothing more
    env.reset(options={"task_id": "t1"})
    env.step("<answer>5</answer>")
    assert env.truncate() == 0.0  # an answered episode is left as it is
    env.reset(options={"task_id": "t1"})
    assert env.truncate() == -0.5 and env.episode.turns == []  # type: ignore[union-attr]
    # With no turn to hold them, the final reward's components are still the episode's.
    assert env.episode.final_components == {"exact_match": 0.0, "unanswered": -0.5}  # type: ignore[union-attr]
    env.reset(options={"task_id": "t1"})
    env.step("<answer>5</answer>")
    assert env.episode.final_components == {"exact_match": 1.0, "unanswered": 0.0}  # type: ignore[union-attr]


def test_written_turn_uses_the_env_format_or_json_lines() -> None:
    import json

    from toolenv.env import written_turn
    from toolenv.types import ParsedAction, ToolCall

    parsed = ParsedAction(tool_calls=[ToolCall(name="add", arguments={"a": 1, "b": 2})], answer="3", text="Sure.")
    hermes = make().parser
    text = written_turn(hermes, parsed)
    back = hermes.parse(text)
    assert back.tool_calls[0].arguments == {"a": 1, "b": 2} and back.answer == "3" and text.startswith("Sure.")
    tags = make(parser="tags").parser  # a prompted format has no writer for calls: JSON lines instead
    assert tags.format_call("add", {"a": 1, "b": 2}) is None
    assert json.loads(written_turn(tags, parsed).splitlines()[1]) == {"name": "add", "arguments": {"a": 1, "b": 2}}


@pytest.mark.parametrize("name", parser_names())
def test_written_turn_parses_back_to_its_calls_and_answer(name: str) -> None:
    """What TRL and native-call agents record as a turn's text reads back as the same calls and
    answer in every format (pythonic's call list must end the turn: the answer goes first)."""
    from toolenv.env import written_turn
    from toolenv.types import ParsedAction, ToolCall

    # A call each format can write (tags only its mapped tools, codeblock only code; string
    # arguments: qwen3_xml reads every value as text until a tool's schema types it).
    tool, args = ("python", {"code": "print(1)"}) if name == "codeblock" else ("search", {"query": "x"})
    parsed = ParsedAction(tool_calls=[ToolCall(name=tool, arguments=args, id="c1")], answer="3", text="Sure.")
    parser = get_parser(name)
    back = parser.parse(written_turn(parser, parsed))
    assert [(c.name, c.arguments) for c in back.tool_calls] == [(tool, args)], back
    assert back.answer == "3" and not back.errors


def test_gymnasiums_episode_statistics_wrappers_work_on_toolenv_envs() -> None:
    """`RecordEpisodeStatistics` writes `info["episode"]` at an episode's end and asserts that
    the key is free: toolenv's own figures go under `episode_stats`."""
    from gymnasium.wrappers import RecordEpisodeStatistics
    from gymnasium.wrappers.vector import RecordEpisodeStatistics as RecordVectorStatistics

    env = RecordEpisodeStatistics(gym.make("toolenv/ToolEnv-v0", tools=[Add()], tasks=TASKS))
    env.reset(seed=0)
    *_, info = env.step("<answer>no idea</answer>")
    assert info["episode"]["l"] == 1 and info["episode_stats"]["turns"] == 1
    venv = RecordVectorStatistics(toolenv.ToolVectorEnv([lambda: make(), lambda: make()]))
    venv.reset(seed=0)
    *_, infos = venv.step(["<answer>a</answer>", "<answer>b</answer>"])
    assert list(infos["episode"]["l"]) == [1, 1] and list(infos["episode_stats"]["turns"]) == [1, 1]
    venv.close()
    env.close()


def test_a_reset_with_native_tools_leaves_the_tools_to_the_chat_template() -> None:
    """An agent that sends `tool_schemas()` as the API's `tools` (or through its chat template)
    resets with `native_tools`: the prompt says how to answer, not the tools a second time."""
    env = make(system_prompt="You are careful.", prompt_template="{instructions}\n\nQuestion: {question}\n")
    full_obs, full = env.reset(seed=0)
    assert '"name": "add"' in full["messages"][0].content and '"name": "add"' in full_obs
    obs, info = env.reset(seed=0, options={"native_tools": True})
    system = info["messages"][0]
    assert system.role == "system"
    assert system.content == "You are careful.\n\nWhen you know the final answer, write it as <answer>...</answer>."
    assert "add" not in obs and obs.endswith(f"Question: {info['messages'][1].content}\n")
    assert env.episode is not None and env.episode.messages[0].content == system.content  # what is recorded
    obs, reward, *_ = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    assert obs == "<tool_response>\n5\n</tool_response>"  # the env still reads and runs the calls
    again_obs, again = env.reset(seed=0)  # the next reset without the option is as before
    assert again["messages"][0].content == full["messages"][0].content and again_obs == full_obs


@pytest.mark.parametrize("copier", ["pickle", "deepcopy"])
def test_an_env_copies_with_and_without_an_episode(copier: str) -> None:
    """A sync `reset` makes the env's private event loop, which cannot be pickled or deep-copied:
    copying an env mid-episode (to branch a rollout, or to send it to a worker) used to fail."""
    import copy
    import pickle

    def clone(env: ToolEnv) -> ToolEnv:
        return pickle.loads(pickle.dumps(env)) if copier == "pickle" else copy.deepcopy(env)  # type: ignore[no-any-return]

    env = make()
    fresh = clone(env)
    assert fresh.reset(options={"task_id": "t1"})[0] == env.reset(options={"task_id": "t1"})[0]
    env.step(CALL)
    branch = clone(env)
    assert branch.episode is not None and len(branch.episode.turns) == 1
    assert branch.step("<answer>5</answer>")[1:3] == (1.0, True)  # the copy goes on from the same turn...
    assert env.episode is not None and not env.episode.terminated  # ...and leaves the original where it was
    assert env.step("<answer>4</answer>")[1:3] == (0.0, True)
    for e in (env, fresh, branch):
        e.close()


def test_a_task_index_out_of_range_is_refused_not_wrapped() -> None:
    """`reset(options={"task_index": 5})` of a three-task env ran task 2 (`5 % 3`): a dataset row
    naming a task the env does not have trained on another task, silently."""
    env = make()
    assert env.reset(options={"task_index": 2})[1]["task_id"] == "t3"
    assert env.reset(options={"task_index": -1})[1]["task_id"] == "t3"  # Python's indexing
    for index in (3, 5, -4):
        with pytest.raises(IndexError, match=f"task_index {index} is out of range: this env has 3 tasks"):
            env.reset(options={"task_index": index})
    env.close()


def test_calls_parsed_elsewhere_without_ids_get_ids_their_results_answer() -> None:
    """`step(text, parsed=...)` with calls that carry no id (a trainer's own parser need not
    make them) gave every result the call id "": the assistant message's calls and the tool
    messages were not paired, and `reply_messages` (verl, SkyRL) sent the results as a user
    message, as if they were parse errors. The env names them as a parser does: call_0, ..."""
    from toolenv.env import written_turn
    from toolenv.types import ParsedAction, ToolCall, reply_messages

    env = make()
    env.reset(options={"task_id": "t1"})
    given = [ToolCall(name="add", arguments={"a": 1, "b": 2}), ToolCall(name="add", arguments={"a": 3, "b": 4}, id="x")]
    parsed = ParsedAction(tool_calls=given)
    *_, info = env.step(written_turn(env.parser, parsed), parsed=parsed)
    assistant, *tools = info["messages"]
    assert [c.id for c in assistant.tool_calls] == ["call_0", "x"] == [c.id for c in info["action"].tool_calls]
    assert [(m.role, m.tool_call_id, m.content) for m in tools] == [("tool", "call_0", "3"), ("tool", "x", "7")]
    assert [m.role for m in reply_messages(info["tool_results"])] == ["tool", "tool"]
    assert [r.call_id for r in info["tool_calls"]] == ["call_0", "x"]
    assert given[0].id == "" and parsed.tool_calls[0] is given[0]  # the caller's objects are left as they were
    env.close()


def test_tools_may_be_given_as_references() -> None:
    """`tools=["module:Name"]` (a YAML config, `gym.make` from a command line) builds the tool
    for this env; it failed with "'str' object has no attribute 'name'"."""
    env = toolenv.ToolEnv(tools=[f"{Add.__module__}:Add"], tasks=TASKS, parser="hermes")
    other = toolenv.ToolEnv(tools=[f"{Add.__module__}:Add"], tasks=TASKS, parser="hermes")
    try:
        assert [type(t) for t in env.tools] == [Add] and env.tools[0] is not other.tools[0]
        env.reset(options={"task_index": 0})
        obs, *_ = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
        assert "5" in obs
        with pytest.raises(ValueError, match="cannot import tool 'no_such_module:X'"):
            toolenv.ToolEnv(tools=["no_such_module:X"], tasks=TASKS)
    finally:
        env.close()
        other.close()


class _Gated(toolenv.Tool):
    """Waits for its gate; records its calls' ends and its close, in order."""

    name = "gated"

    class Args(BaseModel):
        x: int

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.events: list[str] = []

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        await self.gate.wait()
        self.events.append("call ended")
        return toolenv.ToolResult(text="ok")

    async def close(self) -> None:
        self.events.append("closed")


_GATED = '<tool_call>{"name": "gated", "arguments": {"x": 1}}</tool_call>'


async def test_a_step_or_reset_while_a_step_is_in_flight_is_refused() -> None:
    """Two tasks stepping one env both ran: the episode got two interleaved turns of one
    model turn each, and neither caller saw the other's. Gymnasium's AsyncVectorEnv refuses
    such a call; so does the env now, and the step in flight is unharmed."""
    tool = _Gated()
    env = ToolEnv(tools=[tool], tasks=[{"question": "q", "answer": "a"}], parser="hermes")
    await env.areset()
    first = asyncio.ensure_future(env.astep(_GATED))
    await asyncio.sleep(0)  # the first step is waiting on its tool
    with pytest.raises(gym.error.AlreadyPendingCallError, match="in flight"):
        await env.astep(_GATED)
    with pytest.raises(gym.error.AlreadyPendingCallError, match="in flight"):
        await env.areset()
    tool.gate.set()
    obs, *_ = await first
    assert "ok" in obs and env.episode is not None and len(env.episode.turns) == 1
    await env.astep(_GATED)  # the next step, once the first has ended, runs
    assert len(env.episode.turns) == 2
    await env.aclose()


async def test_aclose_during_a_step_waits_for_it_before_closing_the_tools() -> None:
    """`aclose` while a step's tool call was running closed the tools under it: the call then
    went on with a closed tool (or reopened what close had freed: a sandbox, a connection)."""
    tool = _Gated()
    env = ToolEnv(tools=[tool], tasks=[{"question": "q", "answer": "a"}], parser="hermes")
    await env.areset()
    step = asyncio.ensure_future(env.astep(_GATED))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(env.aclose())
    await asyncio.sleep(0.01)
    assert not closing.done() and tool.events == []  # the close waits for the step
    tool.gate.set()
    await closing
    assert (await step)[0].strip().endswith("</tool_response>")
    assert tool.events == ["call ended", "closed"]


async def test_a_copy_of_an_env_made_during_a_step_can_step() -> None:
    """The flag of a step in flight is the original's, not a copy's (which would refuse every step)."""
    import copy

    env = ToolEnv(tools=[Sleep()], tasks=[{"question": "q", "answer": "a"}], parser="hermes")
    await env.areset()
    nap = '<tool_call>{"name": "sleep", "arguments": {"seconds": 0.05}}</tool_call>'
    step = asyncio.ensure_future(env.astep(nap))
    await asyncio.sleep(0)
    twin = copy.deepcopy(env)
    await step
    await twin.areset()
    assert "slept" in (await twin.astep(nap))[0]
    await twin.aclose()
    await env.aclose()


async def test_a_sync_close_inside_the_loop_of_a_step_in_flight_does_not_wait_for_it() -> None:
    """A notebook's `env.close()` runs on the thread of the loop the step is on: waiting for the
    step there would never end (the loop cannot run while close waits). It closes, and says so."""
    tool = _Gated()
    env = ToolEnv(tools=[tool], tasks=[{"question": "q", "answer": "a"}], parser="hermes")
    await env.areset()
    step = asyncio.ensure_future(env.astep(_GATED))
    await asyncio.sleep(0)
    with pytest.warns(RuntimeWarning, match="step is in flight"):
        env.close()
    assert tool.events == ["closed"]
    tool.gate.set()
    await step  # the step ends with the closed tool, as the warning said


def test_tools_given_as_one_string_is_a_clear_error() -> None:
    """`tools="sql"` (a config's or `--kwargs` slip for `["sql"]`) was read letter by letter:
    "no tool named 's'". It says what to write instead."""
    with pytest.raises(TypeError, match=r"tools must be a list.*got the string 'nope'.*\['nope'\]"):
        ToolEnv(tools="nope", tasks=TASKS)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["abc", "4", 2.5, True, None])
def test_max_turns_that_is_not_a_whole_number_is_refused_in_one_line(bad: object) -> None:
    """`--env-arg max_turns=abc` (or a float, or True) reached a comparison and failed with
    "'<' not supported between instances of 'str' and 'int'", naming nothing the user gave."""
    with pytest.raises(ValueError, match=r"max_turns must be at least 1 \(a whole number\), got "):
        toolenv.ToolEnv(tools=[], tasks=[{"question": "q"}], max_turns=bad)  # type: ignore[arg-type]


def test_max_turns_takes_a_numpy_integer() -> None:
    import numpy as np

    assert toolenv.ToolEnv(tools=[], tasks=[{"question": "q"}], max_turns=np.int64(3)).max_turns == 3
