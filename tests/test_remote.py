"""RemoteToolEnv against real `create_app` servers on 127.0.0.1 (uvicorn in a thread, real httpx)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
import pickle
import sys
import threading
import time
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest

pytest.importorskip("starlette", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")
pytest.importorskip("uvicorn", reason="the env server needs the serve extra: pip install 'toolenv[serve]'")

from _remote import (
    CALL_ADD,
    CALL_SWATCH,
    TASKS,
    Counted,
    HeldUntilClosed,
    Scripted,
    StuckClose,
    StuckRelease,
    add,
    asgi_server,
    hang,
    make_env,
    older_server,
    serving,
)

import toolenv
from toolenv.remote import RemoteEnvError, RemoteToolEnv, SessionGoneError
from toolenv.rewards.base import record_reward_info
from toolenv.trajectory import Trajectory
from toolenv.vector import ToolVectorEnv


@pytest.fixture(scope="module")
def url() -> Any:
    with serving(make_env) as u:
        yield u


def play(env: Any, actions: list[str], **reset: Any) -> tuple[list[Any], tuple[Any, ...]]:
    """Reset, step until the episode ends, and return every return value plus the episode."""
    out: list[Any] = [env.reset(**reset)]
    for action in actions:
        step = env.step(action)
        out.append(step)
        if step[2] or step[3]:
            break
    ep = env.unwrapped.episode
    return out, (ep.task, ep.turns, ep.messages, ep.answer, ep.terminated, ep.truncated, ep.reward_info)


# ---------------------------------------------------------------------- parity with a local env
@pytest.mark.parametrize(
    ("reset", "actions"),
    [
        ({"seed": 0, "options": {"task_id": "t1"}}, [CALL_ADD, "<answer>5</answer>"]),
        ({"seed": 3, "options": {"task_id": "t3"}}, [CALL_SWATCH, "<answer>blue</answer>"]),
        # malformed JSON, no action, an unknown tool, bad arguments: error observations, then truncation
        (
            {"options": {"task_index": 1}},
            [
                "<tool_call>{",
                "I am thinking...",
                '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                '<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>',
            ],
        ),
        ({"options": {"task": {"question": "2+2?", "answer": "4"}}}, ["<answer>4</answer>"]),
    ],
)
def test_episode_equals_the_local_one(url: str, reset: dict[str, Any], actions: list[str]) -> None:
    local, remote = make_env(), RemoteToolEnv(url)
    try:
        local_out, local_ep = play(local, actions, **reset)
        remote_out, remote_ep = play(remote, actions, **reset)
    finally:
        local.close()
        remote.close()
    assert remote_out == local_out  # observations, rewards, flags and every info field
    assert remote_ep == local_ep  # the mirrored episode: task, turns (parsed, results, records), messages
    assert isinstance(remote, toolenv.ToolEnv) and remote.episode is not None


def test_images_survive_the_trip(url: str) -> None:
    env = RemoteToolEnv(url)
    env.reset(options={"task_id": "t3"})
    _, _, _, _, info = env.step(CALL_SWATCH)
    env.close()
    (image,) = info["tool_results"][0].images
    assert (image.mime, image.width, image.height) == ("image/png", 8, 6)
    assert image.to_pil().convert("RGB").getpixel((3, 2)) == (40, 80, 220)
    assert info["messages"][1].images == [image]


def test_metadata_stands_in_for_the_env(url: str) -> None:
    env = RemoteToolEnv(url)
    local = make_env().unwrapped
    assert env.tool_schemas() == local.tool_schemas()
    assert env.max_turns == 4 and env.parser.name == "hermes" and env.parser.stop == local.parser.stop
    assert env.reward_fn.weights == {"exact_match": 1.0}
    assert env.tools == [] and env.remote.num_tasks == len(TASKS)
    assert [t.id for t in env.tasks] == [t["id"] for t in TASKS]
    env.close()


def test_parser_arguments_are_rebuilt_on_the_client() -> None:
    tags = {"calc": ("add", "a")}
    with serving(lambda: make_env(parser="tags", parser_kwargs={"tags": tags, "result_open": "<r>"})) as u:
        env = RemoteToolEnv(u)
    assert env.parser.name == "tags" and env.parser.result_open == "<r>"  # type: ignore[attr-defined]
    assert env.parser.format_call("add", {"a": "1"}) == "<calc>1</calc>"


def test_a_reasoning_parser_is_rebuilt_on_the_client() -> None:
    with serving(lambda: make_env(parser="tags", parser_kwargs={"result_open": "<r>", "reasoning": True})) as u:
        env = RemoteToolEnv(u)
    assert isinstance(env.parser, toolenv.parsers.ReasoningParser) and env.parser.tags == ("<think>", "</think>")
    assert env.parser.inner.result_open == "<r>"  # type: ignore[attr-defined]
    assert env.parser.parse("<think><answer>draft</answer></think>").answer is None


async def test_async_api_and_end_episode(url: str) -> None:
    env = RemoteToolEnv(url)
    obs, info = await env.areset(options={"task_id": "t2"})
    assert "10+4?" in obs and info["turn"] == 0
    obs, reward, term, trunc, info = await env.astep(CALL_ADD)
    assert obs == "<tool_response>\n5\n</tool_response>" and (reward, term, trunc) == (0.0, False, False)
    await env.aend_episode()  # a sample cut short: the server's tools free the episode now
    assert env.episode is not None and env.episode.released
    await env.aend_episode()  # idempotent
    await env.aclose()


async def test_a_second_step_while_one_is_in_flight_is_refused(url: str) -> None:
    """Two steps at once on one remote env were both sent naming the same turn: the server ran
    the first and answered the second with the first's answer (2 for 1+1 and for 40+2), and the
    client recorded two turns where the server ran one. As a local env, it refuses the second."""
    env = RemoteToolEnv(url)
    await env.areset(options={"task_id": "t2"})
    first = asyncio.ensure_future(env.astep(CALL_ADD))
    await asyncio.sleep(0)  # the first is sent and waits for its answer
    with pytest.raises(gym.error.AlreadyPendingCallError, match="in flight"):
        await env.astep('<tool_call>{"name": "add", "arguments": {"a": 40, "b": 2}}</tool_call>')
    with pytest.raises(gym.error.AlreadyPendingCallError, match="in flight"):
        await env.areset()
    obs, *_ = await first
    assert obs == "<tool_response>\n5\n</tool_response>"
    assert env.episode is not None and len(env.episode.turns) == 1
    obs, *_ = await env.astep('<tool_call>{"name": "add", "arguments": {"a": 40, "b": 2}}</tool_call>')
    assert "42" in obs and len(env.episode.turns) == 2
    await env.aclose()


@pytest.mark.parametrize(
    "copy_env", [copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))], ids=["deepcopy", "pickle"]
)
def test_a_remote_env_copies_and_the_copy_has_a_session_of_its_own(url: str, copy_env: Any) -> None:
    """As a local env, a remote one pickles and deep-copies (fresh, and mid-episode); the copy does
    not share the original's session (its close would end the original's episode), and it cannot
    step the original's episode, which lives on the server: one clear error, then its own reset."""
    env = RemoteToolEnv(url)
    fresh = copy_env(env)
    assert fresh.reset(options={"task_id": "t1"})[1]["task_id"] == "t1"
    fresh.close()
    env.reset(options={"task_id": "t1"})
    env.step(CALL_ADD)
    branch = copy_env(env)
    assert branch.episode is not None and branch.episode.turns == env.episode.turns  # type: ignore[union-attr]
    with pytest.raises(RemoteEnvError, match="copy"):
        branch.step("<answer>5</answer>")
    assert branch.reset(options={"task_id": "t2"})[1]["task_id"] == "t2"
    assert branch._session is not None and branch._session != env._session
    branch.close()  # deletes the copy's session only
    assert env.step("<answer>5</answer>")[1:3] == (1.0, True)
    env.close()


async def test_a_remote_env_does_not_score_on_the_client_as_zero(url: str) -> None:
    """The reward runs on the server; asked to score here (verl's `compute_score` on rows built
    from `toolenv/Remote-v0`), the client's stand-in parts scored 0.0: a right answer got 0,
    silently. Now that is one clear error; steps still bring the server's rewards."""
    from toolenv.integrations.verl.reward import acompute_score

    row = {"env_id": "toolenv/Remote-v0", "env_kwargs": json.dumps({"url": url}), "task": json.dumps(TASKS[0])}
    with pytest.raises(RuntimeError, match="computed on the server"):
        await acompute_score("toolenv/Remote-v0", "<answer>5</answer>", None, row)
    env = RemoteToolEnv(url)
    await env.areset(options={"task_id": "t1"})
    assert env.reward_fn.zero_components() == {"exact_match": 0.0}
    assert (await env.astep("<answer>5</answer>"))[1] == 1.0
    await env.aclose()


class _Unanswered(toolenv.Reward):
    name = "unanswered"

    async def final(self, episode: toolenv.Episode) -> float:
        return -0.5 if episode.answer is None else 0.0


def test_truncate_and_parsed_turns_match_a_local_env() -> None:
    from toolenv.env import written_turn
    from toolenv.types import ParsedAction, ToolCall

    def factory() -> Any:
        return make_env(reward=[("exact_match", 1.0), (_Unanswered(), 1.0)])

    parsed = ParsedAction(tool_calls=[ToolCall(name="add", arguments={"a": 2, "b": 3}, id="call_7")])
    with serving(factory) as u:
        remote = RemoteToolEnv(u)
        local = factory().unwrapped
        for env in (remote, local):
            env.reset(options={"task_id": "t1"})
            obs, *_ = env.step(written_turn(env.parser, parsed), parsed=parsed)
            assert obs == "<tool_response>\n5\n</tool_response>"
            assert env.truncate() == -0.5 and env.truncate() == 0.0
        for env in (remote, local):
            ep = env.episode
            assert ep.truncated and ep.released and ep.turns[-1].reward == -0.5
            assert ep.turns[-1].reward_components == {"exact_match": 0.0, "unanswered": -0.5}
            assert ep.turns[0].results[0].call_id == "call_7"
        remote.close()


def test_gym_make_and_the_env_checkers() -> None:
    from gymnasium.utils.env_checker import check_env

    from toolenv.checker import check_env as toolenv_check

    with serving(lambda: make_env(task_order="random")) as u:  # seeded resets: the checkers need them
        env = gym.make("toolenv/Remote-v0", url=u)
        assert env.spec is not None and env.spec.id == "toolenv/Remote-v0"
        check_env(env.unwrapped, skip_render_check=True)
        results = toolenv_check(env.unwrapped)
        assert all(r.ok for r in results), [r for r in results if not r.ok]
        env.close()


# ---------------------------------------------------------------------- rollouts and vector envs
def _comparable(trajs: list[Trajectory]) -> list[dict[str, Any]]:
    out = []
    for t in sorted(trajs, key=lambda t: t.key):
        d = t.model_dump(exclude={"env_id", "episode_id", "started_at", "duration_s"})
        for turn in d["turns"]:
            del turn["agent_latency_s"], turn["env_latency_s"]
            for call in turn["calls"]:
                del call["latency_s"]
        out.append(d)
    return out


def test_rollout_through_remote_envs_equals_local(url: str) -> None:
    local = toolenv.rollout(lambda: make_env(), Scripted(), concurrency=3, samples=2)
    remote = toolenv.rollout(lambda: RemoteToolEnv(url), Scripted(), concurrency=3, samples=2)
    assert remote.summary.success_rate == 1.0
    assert _comparable(remote.trajectories) == _comparable(local.trajectories)
    assert any(turn.results and turn.results[0].images for t in remote.trajectories for turn in t.turns)


def test_an_agent_with_native_tools_gets_the_same_prompt_remotely(url: str) -> None:
    """`native_tools` (the prompt leaves the tools to the chat template) crosses the wire as a
    reset option: the served env renders the same system message a local one does."""

    class Native(Scripted):
        native_tools = True

    local = toolenv.rollout(lambda: make_env(), Native(), n=1)
    remote = toolenv.rollout(lambda: RemoteToolEnv(url), Native(), n=1)
    system = remote.trajectories[0].prompt_messages[0].content
    assert system == local.trajectories[0].prompt_messages[0].content
    assert '"name": "add"' not in system and system.endswith(make_env().unwrapped.parser.answer_instructions())


def test_rollout_by_env_id_takes_the_servers_tasks(url: str, tmp_path: Any) -> None:
    res = toolenv.rollout("toolenv/Remote-v0", Scripted(), env_kwargs={"url": url}, n=2, out=tmp_path / "run")
    assert sorted(t.task.id for t in res.trajectories) == ["t1", "t2"]  # listed as they finished
    assert all(t.env_id == "toolenv/Remote-v0" and t.success for t in res.trajectories)


def test_vector_env_over_remote_envs_equals_local(url: str) -> None:
    remote = ToolVectorEnv([lambda: RemoteToolEnv(url)] * 3)
    local = ToolVectorEnv([lambda: make_env().unwrapped] * 3)
    try:
        for actions in (None, [CALL_ADD] * 3, ["<answer>5</answer>", "x", CALL_SWATCH], ["y"] * 3):
            if actions is None:
                (r_obs, r_info), (l_obs, l_info) = remote.reset(seed=0), local.reset(seed=0)
                r_rest: tuple[Any, ...] = ()
                l_rest: tuple[Any, ...] = ()
            else:
                r_obs, *r_rest, r_info = remote.step(actions)
                l_obs, *l_rest, l_info = local.step(actions)
            assert r_obs == l_obs
            for a, b in zip(r_rest, l_rest, strict=True):
                assert np.array_equal(a, b)
            for key in ("turn", "tool_results", "messages", "reward_components"):
                assert (key in r_info) == (key in l_info)
                if key in r_info:
                    assert list(r_info[key]) == list(l_info[key]), key
    finally:
        remote.close()
        local.close()


def test_make_vec_builds_remote_envs(url: str) -> None:
    envs = gym.make_vec("toolenv/Remote-v0", num_envs=2, vectorization_mode="vector_entry_point", url=url)
    obs, _ = envs.reset(seed=0)  # env i is seeded with i: in sequential order, task i
    assert len(obs) == 2 and "2+3?" in obs[0] and "10+4?" in obs[1]
    envs.close()


# ---------------------------------------------------------------------- the protocol and its errors
def test_session_lifecycle_over_raw_http(url: str) -> None:
    with httpx.Client(base_url=url) as http:
        before = http.get("/health").json()["sessions"]
        created = http.post("/sessions")
        assert created.status_code == 201
        body = created.json()
        sid, meta = body["session_id"], body["metadata"]
        assert meta["parser"] == "hermes" and meta["max_turns"] == 4 and meta["env_id"] == "toolenv/ToolEnv-v0"
        assert [s["function"]["name"] for s in meta["tool_schemas"]] == ["add", "swatch"]
        assert http.get("/metadata").json() == meta
        assert http.get("/health").json() == {"status": "ok", "sessions": before + 1, "max_sessions": 128}
        reset = http.post(f"/sessions/{sid}/reset", json={"options": {"task_id": "t1"}}).json()
        assert reset["task"]["id"] == "t1" and [m["role"] for m in reset["messages"]] == ["system", "user"]
        step = http.post(f"/sessions/{sid}/step", json={"action": "<answer>5</answer>"}).json()
        assert step["reward"] == 1.0 and step["terminated"] and step["info"]["episode"]["turns"] == 1
        assert http.post(f"/sessions/{sid}/end").status_code == 204
        assert http.delete(f"/sessions/{sid}").status_code == 204
        gone = http.post(f"/sessions/{sid}/step", json={"action": "x"})
        assert gone.status_code == 404 and "no session" in gone.json()["error"]
        assert http.get("/health").json()["sessions"] == before
        assert {"StepRequest", "StepResponse", "EnvMetadata"} <= set(http.get("/schema").json())


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("step", b'{"actionn": "x"}', 422, "invalid StepRequest: action: Field required"),
        ("step", b"{not json", 422, "invalid StepRequest"),
        ("step", b'{"action": 5}', 422, "action: Input should be a valid string"),
        ("reset", b'{"seed": -1}', 422, "invalid ResetRequest: seed"),
        ("reset", b'{"options": {"task": {"question": 5}}}', 422, "options.task.question"),
        ("reset", b'{"options": {"task_id": "nope"}}', 400, "no task with id 'nope'"),
        ("step", b'{"action": "x"}', 409, "call reset() before step()"),
    ],
)
def test_bad_requests_get_json_errors(url: str, path: str, body: bytes, status: int, message: str) -> None:
    with httpx.Client(base_url=url) as http:
        sid = http.post("/sessions").json()["session_id"]
        try:
            resp = http.post(f"/sessions/{sid}/{path}", content=body, headers={"content-type": "application/json"})
        finally:
            http.delete(f"/sessions/{sid}")
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    assert message in resp.json()["error"], resp.json()


def test_unknown_routes_and_methods_are_json_errors(url: str) -> None:
    with httpx.Client(base_url=url) as http:
        missing, wrong = http.get("/nothing"), http.get("/sessions")
    assert missing.status_code == 404 and missing.json() == {"error": "GET /nothing: Not Found"}
    assert wrong.status_code == 405 and "Method Not Allowed" in wrong.json()["error"]


def test_env_errors_are_raised_as_locally(url: str) -> None:
    remote, local = RemoteToolEnv(url), make_env().unwrapped
    for env in (remote, local):
        with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
            env.step("x")
    errors = []
    for env in (remote, local):
        with pytest.raises(KeyError) as exc:
            env.reset(options={"task_id": "nope"})
        errors.append(str(exc.value))
        env.reset(options={"task_id": "t4"})
        env.step("<answer>Paris</answer>")
        with pytest.raises(RuntimeError, match="this episode has ended"):
            env.step("x")
        env.close()
    assert errors[0] == errors[1]
    with serving(lambda: make_env(tasks=[])) as empty:
        env = RemoteToolEnv(empty)
        assert env.tasks == []
        with pytest.raises(ValueError, match="this env has no tasks"):
            env.reset()
        env.close()


class Boom(toolenv.Reward):
    name = "boom"

    async def final(self, episode: toolenv.Episode) -> float:
        return 1 / 0


def test_a_failing_env_is_a_500_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with serving(lambda: make_env(reward=Boom())) as u:
        env = RemoteToolEnv(u)
        env.reset(options={"task_id": "t1"})
        with caplog.at_level(logging.ERROR, logger="toolenv.remote"), pytest.raises(RemoteEnvError) as exc:
            env.step("<answer>5</answer>")
        assert exc.value.status == 500
        assert "env step failed: ZeroDivisionError: division by zero" in str(exc.value)
        assert "Traceback" not in str(exc.value)
        assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)
        with pytest.raises(RemoteEnvError, match="this episode was lost"):
            env.step("<answer>5</answer>")
        env.reset(options={"task_id": "t1"})  # a new episode is fine
        env.close()


# ---------------------------------------------------------------------- limits and failures
def test_session_limit_is_a_clear_429() -> None:
    with serving(make_env, max_sessions=2) as u:
        envs = [RemoteToolEnv(u, session_wait=0) for _ in range(3)]  # fail at once rather than wait for a slot
        envs[0].reset()
        envs[1].reset()
        with pytest.raises(RemoteEnvError, match="limit of 2 sessions") as exc:
            envs[2].reset()
        assert exc.value.status == 429
        envs[0].close()
        assert "2+3?" in envs[2].reset()[0]
        for e in envs[1:]:
            e.close()


def _wait_for_sessions(url: str, n: int) -> None:
    deadline = time.monotonic() + 20
    while httpx.get(f"{url}/health").json()["sessions"] != n:
        assert time.monotonic() < deadline, f"the server never got to {n} sessions"
        time.sleep(0.05)


def test_idle_sessions_are_reaped_and_reset_opens_a_new_one() -> None:
    with serving(make_env, session_ttl=0.2) as u:
        env = RemoteToolEnv(u)
        env.reset(options={"task_id": "t1"})
        _wait_for_sessions(u, 0)
        with pytest.raises(RemoteEnvError, match="no session") as exc:
            env.step(CALL_ADD)
        assert exc.value.status == 404
        # A public name: the runner records `type(exc).__name__` in the trajectory's error.
        assert isinstance(exc.value, SessionGoneError) and type(exc.value).__name__ == "SessionGoneError"
        obs, _ = env.reset(options={"task_id": "t1"})  # a fresh session, transparently
        assert "2+3?" in obs and env.step("<answer>5</answer>")[1] == 1.0
        env.close()
        _wait_for_sessions(u, 0)


async def test_a_session_mid_call_is_reaped_only_once_its_client_sent_nothing_for_the_ttl() -> None:
    from toolenv.remote.sessions import SessionStore, UnknownSessionError

    store = SessionStore(make_env, max_sessions=2, ttl=60)
    s = await store.create()
    started = asyncio.Event()

    async def forever() -> None:  # a tool stuck on a dead backend
        started.set()
        await asyncio.sleep(3600)

    async def step() -> None:
        async with store.use(s.id) as session:
            await session.run(forever())

    stepping = asyncio.create_task(step())
    await asyncio.wait_for(started.wait(), 30)
    assert await store.reap() == 0 and len(store) == 1  # its client asked just now: kept, mid-call
    s.last_used = float("-inf")  # no request from its client for longer than the TTL
    assert await store.reap() == 1
    with pytest.raises(UnknownSessionError) as exc:
        await stepping  # the call was cancelled; its answer says why
    assert exc.value.why is not None and "no request came from its client for 60 s" in exc.value.why
    await store.aclose()
    assert len(store) == 0


def test_an_unreachable_server_is_a_clear_error() -> None:
    from toolenv.commands.serve_cmd import bind_socket

    sock = bind_socket("127.0.0.1", 0)  # a port nobody serves on once closed
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(RemoteEnvError, match=f"cannot reach the toolenv server at http://127.0.0.1:{port}"):
        RemoteToolEnv(f"http://127.0.0.1:{port}")
    with pytest.raises(RemoteEnvError, match="cannot reach"):
        gym.make("toolenv/Remote-v0", url=f"http://127.0.0.1:{port}")


def test_a_server_stopped_mid_episode_is_a_remote_env_error() -> None:
    with serving(make_env) as u:
        env = RemoteToolEnv(u, timeout=10)
        env.reset(options={"task_id": "t1"})
    with pytest.raises(RemoteEnvError, match="cannot reach") as exc:
        env.step(CALL_ADD)
    assert exc.value.status is None
    with pytest.raises(RemoteEnvError, match="this episode was lost"):
        env.step(CALL_ADD)
    with pytest.raises(RemoteEnvError, match="cannot reach"):
        env.reset()
    env.close()  # best effort: the server is gone, nothing raised


# ---------------------------------------------------------------------- values a local env returns
@toolenv.tool
def shell(cmd: str) -> toolenv.ToolResult:
    """Output as a sandbox decodes it (undecodable bytes as lone surrogates), numpy stats in metadata."""
    out = b"caf\xe9 \xf0\x9f\x98\x80 ok".decode("utf-8", "surrogateescape")
    return toolenv.ToolResult(text=out, metadata={"rc": np.int64(0), "mean": np.float32(0.5), "v": np.arange(3)})


class NumpyReward(toolenv.Reward):
    """Scores and details as numpy values, as rewards built on numpy return them."""

    name = "np_score"

    async def final(self, episode: toolenv.Episode) -> float:
        record_reward_info(episode, self.name, hits=np.int64(2), ok=np.bool_(True))
        return np.float32(1.0)  # type: ignore[no-any-return]


def test_numpy_values_and_lone_surrogates_cross_the_wire() -> None:
    def factory() -> Any:
        env = make_env(tools=[shell], reward=NumpyReward())
        env.unwrapped.reset_options = toolenv.ToolEnv.reset_options | {"tag"}  # an option of its own
        return env

    call = '<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>'
    with serving(factory) as u:
        env = RemoteToolEnv(u)
        env.reset(options={"task_id": "t1", "tag": np.float32(1.5)})  # the env's own options cross the wire
        obs, *_, info = env.step(call)
        result = info["tool_results"][0]
        assert result.text == "caf\ufffd \U0001f600 ok" and "caf\ufffd" in obs
        assert result.metadata == {"rc": 0, "mean": 0.5, "v": [0, 1, 2]}
        obs, reward, terminated, _, info = env.step("<answer>5 \ud83d</answer>")  # half an emoji from the model
        assert (reward, terminated) == (1.0, True)
        assert info["reward_info"] == {"np_score": {"hits": 2, "ok": True}}
        assert info["answer"] == "5 \ufffd"
        env.close()


class _TerseInfo(toolenv.ToolEnv):
    """A served env subclass whose `step` info leaves out keys the wire needs."""

    async def astep(self, action: str, *, parsed: Any = None) -> Any:
        obs, reward, terminated, truncated, info = await super().astep(action, parsed=parsed)
        return obs, reward, terminated, truncated, {"turn": info["turn"]}


def test_an_unexpected_server_failure_is_a_clear_500_on_a_live_connection() -> None:
    import http.client
    import json
    from urllib.parse import urlsplit

    with serving(lambda: _TerseInfo(tasks=TASKS)) as u:
        parts = urlsplit(u)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        headers = {"content-type": "application/json"}

        def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
            conn.request("POST", path, body=json.dumps(body), headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None

        try:
            status, created = post("/sessions", {})
            sid = created["session_id"]
            assert post(f"/sessions/{sid}/reset", {})[0] == 200
            status, body = post(f"/sessions/{sid}/step", {"action": "<answer>5</answer>"})
            assert status == 500
            assert "KeyError" in body["error"] and "task_id" in body["error"], body
            # the same keep-alive connection serves the next request (no spurious failure after a 500)
            conn.request("DELETE", f"/sessions/{sid}")
            assert conn.getresponse().status == 204
        finally:
            conn.close()


async def test_the_reaper_closes_the_idle_session_and_keeps_one_whose_client_came_back() -> None:
    from toolenv.remote.sessions import SessionStore

    store = SessionStore(make_env, max_sessions=4, ttl=60)
    a, b = await store.create(), await store.create()
    a_closed, closed = asyncio.Event(), []

    async def close_a() -> None:
        closed.append("a")
        a_closed.set()

    async def close_b() -> None:
        closed.append("b")

    a.env.aclose, b.env.aclose = close_a, close_b  # type: ignore[method-assign]
    a.last_used = b.last_used = float("-inf")  # both idle for long
    async with store.use(b.id):  # ... when b's client comes back and steps
        assert await store.reap() == 1
        await asyncio.wait_for(a_closed.wait(), 10)  # a closes in the background
        assert closed == ["a"] and len(store) == 1  # b, mid-step, is neither closed nor dropped
    await store.aclose()
    assert closed == ["a", "b"]


async def test_a_cancelled_step_is_never_sent_again() -> None:
    import threading

    started, finish = threading.Event(), threading.Event()
    runs: list[int] = []

    @toolenv.tool
    async def slow(n: int) -> str:
        """A tool call with side effects (a write, a payment) that takes a while."""
        runs.append(n)
        started.set()
        await asyncio.to_thread(finish.wait, 30)
        return "done"

    call = '<tool_call>{"name": "slow", "arguments": {"n": 1}}</tool_call>'
    with serving(lambda: make_env(tools=[slow])) as u:
        env = RemoteToolEnv(u)
        await env.areset(options={"task_id": "t1"})
        stepping = asyncio.create_task(env.astep(call))
        assert await asyncio.to_thread(started.wait, 30)
        stepping.cancel()  # e.g. the runner's episode timeout: the server goes on with the step
        with pytest.raises(asyncio.CancelledError):
            await stepping
        finish.set()
        with pytest.raises(RemoteEnvError, match="this episode was lost"):
            await env.astep(call)  # sending it again would run the call twice
        assert runs == [1]
        await env.areset(options={"task_id": "t1"})  # a new episode is fine
        await env.aclose()


def test_a_url_that_is_not_a_toolenv_server_is_a_clear_error() -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def models(request: Any) -> JSONResponse:
        return JSONResponse({"data": []})

    # e.g. the model server's URL given by mistake: it answers 404 to every toolenv path
    with asgi_server(Starlette(routes=[Route("/v1/models", models)])) as other, pytest.raises(RemoteEnvError) as exc:
        RemoteToolEnv(other)
    assert exc.value.status == 404
    assert f"the toolenv server at {other} answered 404" in str(exc.value), str(exc.value)


def test_a_server_of_another_protocol_is_one_error_that_says_so() -> None:
    """A newer server's metadata has fields this client does not know (what a protocol bump
    brings): the error names both protocols, not a field the client refuses."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    newer = {"protocol": 3, "toolenv_version": "9.0", "parser": "hermes", "max_turns": 4, "sandboxes": {}}

    async def metadata(request: Any) -> JSONResponse:
        return JSONResponse(newer)

    with asgi_server(Starlette(routes=[Route("/metadata", metadata)])) as u, pytest.raises(RemoteEnvError) as exc:
        RemoteToolEnv(u)
    assert str(exc.value) == (
        f"the server at {u} speaks toolenv protocol 3 (toolenv 9.0), this client protocol 2; "
        "install the same toolenv version on both sides"
    )


async def test_tasks_are_listed_after_steps_through_a_given_transport(url: str) -> None:
    env = RemoteToolEnv(url, transport=httpx.AsyncHTTPTransport(retries=2))
    await env.areset(options={"task_id": "t1"})
    await env.astep(CALL_ADD)  # the transport now keeps a connection of this event loop
    assert [t.id for t in env.tasks] == [t["id"] for t in TASKS]
    await env.aclose()


# ---------------------------------------------------------------------- answers lost on the way back
class LosesAnswers(httpx.AsyncBaseTransport):
    """The real transport, but the answer to the first `lose` requests matching `method path`
    is dropped after the server handled them, as when a connection breaks on the way back."""

    def __init__(self, method: str, path_end: str, lose: int = 1, *, retry: bool = False) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.method, self.path_end, self.lose, self.retry = method, path_end, lose, retry
        self.sent: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        while True:
            self.sent.append(request)
            response = await self.real.handle_async_request(request)
            if not (request.method == self.method and request.url.path.endswith(self.path_end) and self.lose):
                return response
            self.lose -= 1
            await response.aread()  # the server made it: only its answer is lost
            await response.aclose()
            if not self.retry:  # a retrying transport sends the same request again
                raise httpx.ReadError("connection closed before the answer", request=request)

    async def aclose(self) -> None:
        await self.real.aclose()


def _sessions(url: str) -> int:
    return int(httpx.get(f"{url}/health").json()["sessions"])


async def test_a_create_whose_answer_was_lost_does_not_leak_a_session() -> None:
    with serving(make_env, max_sessions=1) as u:
        transport = LosesAnswers("POST", "/sessions")
        env = RemoteToolEnv(u, transport=transport, retries=0)  # the next reset sends it again
        with pytest.raises(RemoteEnvError, match="open a session: cannot reach"):
            await env.areset(options={"task_id": "t1"})
        assert await asyncio.to_thread(_sessions, u) == 1  # the server made it
        # the next reset (the runner's next episode) gets that session, not a second one (a 429 here)
        obs, _ = await env.areset(options={"task_id": "t1"})
        assert "2+3?" in obs and (await env.astep("<answer>5</answer>"))[1] == 1.0
        creates = [r for r in transport.sent if r.url.path == "/sessions"]
        assert len(creates) == 2 and creates[0].headers["idempotency-key"] == creates[1].headers["idempotency-key"]
        await env.aclose()
        assert await asyncio.to_thread(_sessions, u) == 0  # nothing left behind

        env = RemoteToolEnv(u, transport=LosesAnswers("POST", "/sessions", retry=True))
        await env.areset(options={"task_id": "t2"})  # a transport that retries the create itself
        assert await asyncio.to_thread(_sessions, u) == 1
        await env.aclose()
        assert await asyncio.to_thread(_sessions, u) == 0


async def test_a_create_sent_again_while_the_first_still_builds_waits_for_it() -> None:
    import threading

    from toolenv.remote.sessions import SessionStore

    gate, builds = threading.Event(), []

    def slow_factory() -> Any:  # an env that takes a while to build (data, a sandbox)
        builds.append(1)
        if len(builds) == 1:
            gate.wait(30)
            raise OSError("the first build failed")
        return make_env()

    store = SessionStore(slow_factory, max_sessions=2, ttl=60)
    first = asyncio.create_task(store.create("k"))
    while not builds:  # the first build has started
        await asyncio.sleep(0.01)
    again = asyncio.create_task(store.create("k"))  # the client timed out and sent it again
    for _ in range(3):
        await asyncio.sleep(0)  # it has run up to where it waits
    assert not again.done() and store._pending == 1  # it waits rather than building a second env
    gate.set()
    with pytest.raises(OSError, match="first build failed"):
        await first
    session = await again  # the first failed: the retry built one of its own
    assert len(builds) == 2 and len(store) == 1
    assert await store.create("k") is session  # sent a third time: the same session
    await store.delete(session.id)
    assert (await store.create("k")) is not session  # a deleted session's key makes a new one
    await store.aclose()


def test_an_idempotency_key_over_raw_http(url: str) -> None:
    with httpx.Client(base_url=url) as http:
        before = http.get("/health").json()["sessions"]
        one = http.post("/sessions", headers={"Idempotency-Key": "abc"})
        two = http.post("/sessions", headers={"Idempotency-Key": "abc"})
        other = http.post("/sessions", headers={"Idempotency-Key": "xyz"})
        assert one.status_code == two.status_code == 201
        assert one.json() == two.json() and other.json()["session_id"] != one.json()["session_id"]
        assert http.get("/health").json()["sessions"] == before + 2
        too_long = http.post("/sessions", headers={"Idempotency-Key": "k" * 256})
        assert too_long.status_code == 422 and "Idempotency-Key" in too_long.json()["error"]
        for sid in {one.json()["session_id"], other.json()["session_id"]}:
            assert http.delete(f"/sessions/{sid}").status_code == 204
        assert http.get("/health").json()["sessions"] == before


async def test_a_truncate_whose_answer_was_lost_is_not_scored_zero_on_retry() -> None:
    def factory() -> Any:
        return make_env(reward=[("exact_match", 1.0), (_Unanswered(), 1.0)])

    with serving(factory) as u:
        env = RemoteToolEnv(u, transport=LosesAnswers("POST", "/truncate"), retries=0)
        await env.areset(options={"task_id": "t1"})
        await env.astep(CALL_ADD)
        with pytest.raises(RemoteEnvError, match="truncate: cannot reach"):
            await env.atruncate()  # the server scored it (-0.5); the answer never came back
        # sent again, the server has nothing left to score: a 0.0 here would be a wrong final reward
        with pytest.raises(RemoteEnvError, match="this episode was lost"):
            await env.atruncate()
        with pytest.raises(RemoteEnvError, match="this episode was lost"):
            await env.astep("<answer>5</answer>")
        await env.areset(options={"task_id": "t1"})  # a new episode is fine
        assert (await env.astep("<answer>5</answer>"))[1] == 1.0
        await env.aclose()


async def test_a_reset_after_a_cancelled_step_does_not_wait_for_that_step() -> None:
    """The runner cancels a step at its episode timeout and resets for the next episode: the
    server still runs the cancelled step, and the next episode must not queue behind it."""
    import threading

    started, finish = threading.Event(), threading.Event()

    @toolenv.tool(timeout=None)
    async def stuck(n: int) -> str:
        """A call on a backend that stopped answering."""
        started.set()
        await asyncio.to_thread(finish.wait, 60)
        return "done"

    call = '<tool_call>{"name": "stuck", "arguments": {"n": 1}}</tool_call>'
    with serving(lambda: make_env(tools=[stuck])) as u:
        env = RemoteToolEnv(u, timeout=10)  # the old code waits here for the step, then times out
        try:
            await env.areset(options={"task_id": "t1"})
            stepping = asyncio.create_task(env.astep(call))
            assert await asyncio.to_thread(started.wait, 30)
            stepping.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stepping
            obs, _ = await env.areset(options={"task_id": "t2"})  # at once, in a session of its own
            assert "10+4?" in obs and (await env.astep("<answer>14</answer>"))[1] == 1.0
            await env.aclose()  # nor does close wait for the stuck step
            await asyncio.to_thread(_wait_for_sessions, u, 0)  # the deleted one's stuck step was cancelled
        finally:
            finish.set()


async def test_end_episode_whose_answer_was_lost_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """As a local env's: a failing release is logged (verl's pool calls it in a `finally`)."""
    with serving(make_env) as u:
        env = RemoteToolEnv(u, transport=LosesAnswers("POST", "/end"), retries=0)
        await env.areset(options={"task_id": "t1"})
        await env.astep(CALL_ADD)
        with caplog.at_level(logging.WARNING, logger="toolenv.remote"):
            await env.aend_episode()
        assert env.episode is not None and env.episode.released
        assert any("end_episode" in r.getMessage() for r in caplog.records)
        await env.areset(options={"task_id": "t2"})  # the env goes on
        assert (await env.astep("<answer>14</answer>"))[1] == 1.0
        await env.aclose()
        assert await asyncio.to_thread(_sessions, u) == 0


async def test_close_after_a_create_whose_answer_was_lost_deletes_that_session() -> None:
    with serving(make_env) as u:
        env = RemoteToolEnv(u, transport=LosesAnswers("POST", "/sessions"), retries=0)
        with pytest.raises(RemoteEnvError, match="open a session"):
            await env.areset()
        assert await asyncio.to_thread(_sessions, u) == 1
        await env.aclose()  # e.g. the runner's last episode: no reset comes to pick that session up
        assert await asyncio.to_thread(_sessions, u) == 0


# ---------------------------------------------------------------------- steps sent again: answered, not run again
def _counted() -> tuple[Any, list[int]]:
    """`add`, counting its runs: a tool with side effects (a write, a payment) must run once per call."""
    runs: list[int] = []

    @toolenv.tool(name="add")
    def counted_add(a: int, b: int) -> str:
        """Add two integers."""
        runs.append(a)
        return str(a + b)

    return counted_add, runs


async def test_a_step_whose_answer_was_lost_is_sent_again_and_runs_once() -> None:
    """A blip between trainer and env server no longer loses the episode, nor runs a tool twice."""
    tool, runs = _counted()
    with serving(lambda: make_env(tools=[tool])) as u:
        transport = LosesAnswers("POST", "/step", lose=2)  # the first step's answer, and its first retry's
        env = RemoteToolEnv(u, transport=transport)
        await env.areset(options={"task_id": "t1"})
        obs, reward, terminated, _, info = await env.astep(CALL_ADD)
        assert obs == "<tool_response>\n5\n</tool_response>" and (reward, terminated, info["turn"]) == (0.0, False, 1)
        assert runs == [2]  # three requests, one run
        steps = [r for r in transport.sent if r.url.path.endswith("/step")]
        assert len(steps) == 3 and len({r.content for r in steps}) == 1  # the same step, named the same
        transport.lose = 1  # the final step's answer is lost too: it is scored once, as the first time
        obs, reward, terminated, _, info = await env.astep("<answer>5</answer>")
        assert (reward, terminated, info["turn"], info["episode_stats"]["turns"]) == (1.0, True, 2, 2)
        ep = env.episode
        assert ep is not None and len(ep.turns) == 2 and ep.answer == "5" and runs == [2]
        await env.aclose()

        # more lost answers than retries: the episode is lost, as before, and the tool still ran once
        runs.clear()
        env = RemoteToolEnv(u, transport=LosesAnswers("POST", "/step", lose=3), retries=2)
        await env.areset(options={"task_id": "t1"})
        with pytest.raises(RemoteEnvError, match="step: cannot reach"):
            await env.astep(CALL_ADD)
        with pytest.raises(RemoteEnvError, match="this episode was lost"):
            await env.astep(CALL_ADD)
        assert runs == [2]
        await env.aclose()


async def test_a_retrying_transport_does_not_run_a_step_twice() -> None:
    tool, runs = _counted()
    with serving(lambda: make_env(tools=[tool])) as u:
        env = RemoteToolEnv(u, transport=LosesAnswers("POST", "/step", retry=True))  # resends the POST itself
        await env.areset(options={"task_id": "t1"})
        _, _, _, _, info = await env.astep(CALL_ADD)
        assert runs == [2] and info["turn"] == 1  # not a second run, not turn 2
        obs, reward, terminated, _, info = await env.astep("<answer>5</answer>")
        assert (reward, terminated, info["episode_stats"]) == (
            1.0,
            True,
            {"return": 1.0, "turns": 2, "tool_calls": 1, "tool_errors": 0},
        )
        await env.aclose()


async def test_a_step_whose_answer_timed_out_gets_that_steps_answer() -> None:
    """No answer in time (a stalled connection): the step sent again waits for the first run and
    gets its answer, rather than running the tools a second time behind it."""
    import threading

    go_on, runs = threading.Event(), []

    @toolenv.tool(timeout=None)
    async def slow(n: int) -> str:
        """A tool call that takes longer than the client waits for one answer."""
        runs.append(n)
        await asyncio.to_thread(go_on.wait, 60)
        return "done"

    class OpensTheGateOnTheRetry(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.real, self.steps = httpx.AsyncHTTPTransport(), 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/step"):
                self.steps += 1
                if self.steps == 2:  # the first request timed out: let its step finish now
                    go_on.set()
            return await self.real.handle_async_request(request)

        async def aclose(self) -> None:
            await self.real.aclose()

    call = '<tool_call>{"name": "slow", "arguments": {"n": 1}}</tool_call>'
    with serving(lambda: make_env(tools=[slow])) as u:
        transport = OpensTheGateOnTheRetry()
        env = RemoteToolEnv(u, transport=transport, timeout=2)  # a reset takes milliseconds
        try:
            await env.areset(options={"task_id": "t1"})
            obs, _, _, _, info = await env.astep(call)
        finally:
            go_on.set()
        assert obs == "<tool_response>\ndone\n</tool_response>" and info["turn"] == 1
        assert runs == [1] and transport.steps == 2
        await env.aclose()


async def test_a_truncate_whose_answer_was_lost_is_sent_again_and_keeps_its_reward() -> None:
    def factory() -> Any:
        return make_env(reward=[("exact_match", 1.0), (_Unanswered(), 1.0)])

    with serving(factory) as u:
        env = RemoteToolEnv(u, transport=LosesAnswers("POST", "/truncate"))
        await env.areset(options={"task_id": "t1"})
        await env.astep(CALL_ADD)
        assert await env.atruncate() == -0.5  # the first run's score, not the 0.0 of a second truncate
        ep = env.episode
        assert ep is not None and ep.truncated and ep.turns[-1].reward == -0.5
        assert ep.turns[-1].reward_components == {"exact_match": 0.0, "unanswered": -0.5}
        async with httpx.AsyncClient(base_url=u) as http:  # a bare truncate (nothing open) keeps the answer kept
            truncate = f"/sessions/{env._session}/truncate"
            assert (await http.post(truncate)).json()["reward"] == 0.0
            assert (await http.post(truncate, json={"episode_id": ep.episode_id})).json()["reward"] == -0.5
        await env.aclose()


def test_step_identity_over_raw_http(url: str) -> None:
    """Old clients send bare steps and still work; a named step is run once, answered again when
    sent again, and refused (409) when it is older than the last, ahead, or of another episode."""
    with httpx.Client(base_url=url) as http:
        sid = http.post("/sessions").json()["session_id"]
        try:
            ep = http.post(f"/sessions/{sid}/reset", json={"options": {"task_id": "t1"}}).json()["episode_id"]
            bare = http.post(f"/sessions/{sid}/step", json={"action": CALL_ADD})  # an old client's step
            assert bare.status_code == 200 and bare.json()["info"]["turn"] == 1
            named = {"action": CALL_ADD, "episode_id": ep, "turn": 2}
            first = http.post(f"/sessions/{sid}/step", json=named)
            again = http.post(f"/sessions/{sid}/step", json=named)
            assert first.status_code == again.status_code == 200 and first.json()["info"]["turn"] == 2
            assert again.content == first.content  # answered again, not run again (that would be turn 3)
            stale = http.post(f"/sessions/{sid}/step", json={**named, "turn": 1})
            assert stale.status_code == 409 and "turn 1 of episode" in stale.json()["error"]
            assert "taken already" in stale.json()["error"]
            ahead = http.post(f"/sessions/{sid}/step", json={**named, "turn": 9})
            assert ahead.status_code == 409 and "ahead" in ahead.json()["error"]
            other = http.post(f"/sessions/{sid}/step", json={**named, "episode_id": "another", "turn": 3})
            assert other.status_code == 409 and "not this session's episode" in other.json()["error"]
            half = http.post(f"/sessions/{sid}/step", json={"action": "x", "turn": 3})
            assert half.status_code == 422 and "episode_id and turn go together" in half.json()["error"]
            truncated = http.post(f"/sessions/{sid}/truncate", json={"episode_id": ep})
            assert truncated.status_code == 200
            assert http.post(f"/sessions/{sid}/truncate", json={"episode_id": ep}).content == truncated.content
            assert http.post(f"/sessions/{sid}/truncate").json()["reward"] == 0.0  # bare, as before: nothing open
            assert http.post(f"/sessions/{sid}/truncate", json={"episode_id": ep}).content == truncated.content
            http.post(f"/sessions/{sid}/reset", json={"options": {"task_id": "t2"}})
            late = http.post(f"/sessions/{sid}/step", json=named)  # the last episode's step, after a reset
            assert late.status_code == 409 and repr(ep) in late.json()["error"]
            late = http.post(f"/sessions/{sid}/truncate", json={"episode_id": ep})
            assert late.status_code == 409 and "not this session's episode" in late.json()["error"]
            steps = http.post(f"/sessions/{sid}/step", json={"action": "<answer>14</answer>"}).json()
            assert steps["reward"] == 1.0 and steps["info"]["turn"] == 1
        finally:
            http.delete(f"/sessions/{sid}")


async def test_against_a_server_that_does_not_replay_nothing_is_sent_twice() -> None:
    """A server before step identity (no `Toolenv-Features: replay`, unknown fields refused): the
    client sends bare steps and truncates, and a step whose answer was lost loses the episode."""
    from toolenv.remote.server import create_app

    tool, runs = _counted()
    bodies: list[bytes] = []
    with asgi_server(older_server(create_app(lambda: make_env(tools=[tool])), features=None, bodies=bodies)) as u:
        env = RemoteToolEnv(u, transport=LosesAnswers("POST", "/step"))
        await env.areset(options={"task_id": "t1"})
        with pytest.raises(RemoteEnvError, match="step: cannot reach"):
            await env.astep(CALL_ADD)
        assert runs == [2]  # sent once: that server would have run it again
        await env.areset(options={"task_id": "t1"})
        assert (await env.astep("<answer>5</answer>"))[1] == 1.0
        await env.areset(options={"task_id": "t1"})
        await env.atruncate()
        await env.aclose()
    assert bodies and not any(b"episode_id" in b for b in bodies)


async def test_a_reset_whose_answer_was_lost_is_sent_again_when_it_names_its_task() -> None:
    with serving(make_env) as u:
        transport = LosesAnswers("POST", "/reset")
        env = RemoteToolEnv(u, transport=transport)
        obs, info = await env.areset(options={"task_id": "t2"})  # the runner and verl name the task
        assert "10+4?" in obs and info["task_id"] == "t2"
        assert (await env.astep("<answer>14</answer>"))[1] == 1.0
        transport.lose = 1
        with pytest.raises(RemoteEnvError, match="reset: cannot reach"):
            await env.areset()  # the env's own order: sent again, it would skip a task
        assert len([r for r in transport.sent if r.url.path.endswith("/reset")]) == 3
        await env.aclose()


# ---------------------------------------------------------------------- stuck calls never keep a slot
async def _wait_for_ever(started: Any, cancelled: Any) -> None:
    """Set `started`, wait an hour (for ever, to a test), and set `cancelled` if cancelled."""
    started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.set()
        raise


class _Stuck:
    """A tool that never returns (a backend that stopped answering, no timeout of its own), and
    records whether the server cancelled it: a stuck call must not hold its session's slot."""

    CALL = '<tool_call>{"name": "stuck", "arguments": {}}</tool_call>'

    def __init__(self) -> None:
        import threading

        self.started, self.cancelled = threading.Event(), threading.Event()
        started, cancelled = self.started, self.cancelled

        @toolenv.tool(timeout=None)
        async def stuck() -> str:
            """Wait for ever."""
            await _wait_for_ever(started, cancelled)
            return "woke"

        self.tool = stuck


def test_a_dead_client_with_a_stuck_step_frees_its_slot() -> None:
    """The client sends a step whose tool hangs, then dies: once no request came for the TTL,
    the session expires, its step is cancelled and its slot freed for new clients."""
    import socket

    stuck = _Stuck()
    with serving(lambda: make_env(tools=[add, stuck.tool]), max_sessions=1, session_ttl=0.5) as u:
        with httpx.Client(base_url=u) as http:
            sid = http.post("/sessions").json()["session_id"]
            assert http.post(f"/sessions/{sid}/reset", json={"options": {"task_id": "t1"}}).status_code == 200
        body = json.dumps({"action": _Stuck.CALL}).encode()
        port = int(u.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as dying:
            dying.sendall(
                f"POST /sessions/{sid}/step HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert stuck.started.wait(30)
        # the client is gone (its socket closed) and never comes back
        _wait_for_sessions(u, 0)
        assert stuck.cancelled.wait(30)  # the step was cancelled, not left to hang for ever
        env = RemoteToolEnv(u)  # the one slot serves a new client
        assert "2+3?" in env.reset(options={"task_id": "t1"})[0]
        env.close()


async def test_a_step_longer_than_the_ttl_with_no_request_is_ended_with_a_clear_error() -> None:
    """A live client without a timeout waiting past the TTL gets an answer that says why."""
    stuck = _Stuck()
    with serving(lambda: make_env(tools=[add, stuck.tool]), session_ttl=0.5) as u:
        env = RemoteToolEnv(u, timeout=None)
        await env.areset(options={"task_id": "t1"})
        with pytest.raises(SessionGoneError, match=r"no request .* for 0.5 s \(the session TTL\)") as exc:
            await asyncio.wait_for(env.astep(_Stuck.CALL), 30)
        assert exc.value.status == 404 and stuck.cancelled.is_set()
        with pytest.raises(RemoteEnvError, match="this episode was lost"):
            await env.astep(CALL_ADD)
        obs, _ = await env.areset(options={"task_id": "t2"})  # a new session
        assert "10+4?" in obs and (await env.astep("<answer>14</answer>"))[1] == 1.0
        await env.aclose()
        assert await asyncio.to_thread(_sessions, u) == 0


async def test_a_deleted_session_cancels_its_stuck_step_and_frees_its_slot() -> None:
    """The runner's episode timeout cancels a step whose tool hangs; the next reset deletes that
    session: nobody can read that step's answer any more, so it is cancelled and its slot freed."""
    stuck = _Stuck()
    with serving(lambda: make_env(tools=[add, stuck.tool]), max_sessions=2) as u:
        env = RemoteToolEnv(u, timeout=10)
        await env.areset(options={"task_id": "t1"})
        stepping = asyncio.create_task(env.astep(_Stuck.CALL))
        assert await asyncio.to_thread(stuck.started.wait, 30)
        stepping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stepping
        await env.areset(options={"task_id": "t2"})  # deletes the old session, opens a new one
        assert await asyncio.to_thread(stuck.cancelled.wait, 30)
        await asyncio.to_thread(_wait_for_sessions, u, 1)  # only the new one
        other = RemoteToolEnv(u)  # the freed slot serves another client
        assert "2+3?" in (await other.areset(options={"task_id": "t1"}))[0]
        await other.aclose()
        await env.aclose()


async def test_a_reset_after_a_cancelled_reset_does_not_wait_for_that_reset() -> None:
    """A reset stuck on the server (a sandbox that never starts) is cancelled by the caller's
    timeout: the next reset moves to a new session rather than queue behind the stuck one."""
    import threading

    started, cancelled = threading.Event(), threading.Event()

    class SlowStart(toolenv.ToolEnv):
        async def arender_prompt(self, task: toolenv.Task) -> Any:
            if task.id == "t4":
                await _wait_for_ever(started, cancelled)
            return await super().arender_prompt(task)

    def factory() -> toolenv.ToolEnv:
        return SlowStart(tools=[add], tasks=TASKS, reward="exact_match", max_turns=4)

    with serving(factory, max_sessions=2) as u:
        env = RemoteToolEnv(u, timeout=60)
        resetting = asyncio.create_task(env.areset(options={"task_id": "t4"}))
        assert await asyncio.to_thread(started.wait, 30)
        resetting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await resetting
        obs, _ = await asyncio.wait_for(env.areset(options={"task_id": "t1"}), 8)  # not 60 s later
        assert "2+3?" in obs and (await env.astep("<answer>5</answer>"))[1] == 1.0
        assert await asyncio.to_thread(cancelled.wait, 30)  # and the stuck reset was cancelled
        await env.aclose()
        await asyncio.to_thread(_wait_for_sessions, u, 0)


def test_a_step_that_times_out_is_one_readable_line() -> None:
    with serving(lambda: make_env(tools=[add, hang])) as u:
        env = RemoteToolEnv(u, timeout=0.5, retries=1)
        env.reset(options={"task_id": "t1"})
        with pytest.raises(RemoteEnvError) as exc:
            env.step('<tool_call>{"name": "hang", "arguments": {"seconds": 30}}</tool_call>')
        # not "in time (ReadTimeout(''))": the limit, what timed out, and how often it was sent
        assert (
            str(exc.value) == f"step: no answer from the toolenv server at {u} within 0.5 s (ReadTimeout; sent 2 times)"
        )
        assert exc.value.status is None
        env.close()


async def test_a_close_that_hangs_does_not_stop_the_reaper() -> None:
    """One env whose teardown hangs (a sandbox daemon that stopped answering) must not keep
    every other idle session from being closed, which would leak their slots."""
    from toolenv.remote.sessions import SessionStore

    store = SessionStore(make_env, max_sessions=4, ttl=60)
    a, b = await store.create(), await store.create()
    release, b_closed, closed = asyncio.Event(), asyncio.Event(), []

    async def close_a() -> None:
        await release.wait()
        closed.append("a")

    async def close_b() -> None:
        closed.append("b")
        b_closed.set()

    a.env.aclose, b.env.aclose = close_a, close_b  # type: ignore[method-assign]
    a.last_used = b.last_used = float("-inf")
    try:
        assert await asyncio.wait_for(store.reap(), 10) == 2  # returns though a's close hangs
        await asyncio.wait_for(b_closed.wait(), 10)
        assert closed == ["b"] and len(store) == 1  # a holds its slot while it closes
    finally:
        release.set()
        await store.aclose()
    assert closed == ["b", "a"] and len(store) == 0


async def test_a_reset_the_server_rejected_keeps_the_session(url: str) -> None:
    """A 400 (no such task) was answered: the session is not busy, so no new one is opened."""
    transport = LosesAnswers("GET", "/nothing", lose=0)  # records what is sent
    env = RemoteToolEnv(url, transport=transport)
    with pytest.raises(KeyError):
        await env.areset(options={"task_id": "nope"})
    await env.areset(options={"task_id": "t1"})
    assert (await env.astep("<answer>5</answer>"))[1] == 1.0
    await env.aclose()
    sent = [(r.method, r.url.path.rsplit("/", 1)[-1]) for r in transport.sent if "/sessions" in r.url.path]
    assert [m for m, _ in sent].count("POST") == 4 and sent[0] == ("POST", "sessions")  # create, 2 resets, a step
    assert sum(1 for m, p in sent if m == "POST" and p == "sessions") == 1 and sent[-1][0] == "DELETE"


def test_a_delete_whose_env_close_hangs_answers_and_frees_the_slot(caplog: pytest.LogCaptureFixture) -> None:
    """A tool whose `close` never returns: the DELETE is answered once the close timeout is
    over, the slot is free for the next session, and the log names the session left behind."""
    caplog.set_level(logging.ERROR, logger="toolenv.remote")
    with (
        serving(lambda: make_env(tools=[add, StuckClose()]), max_sessions=1, close_timeout=0.2) as u,
        httpx.Client(base_url=u, timeout=60) as http,  # the timeout is a failure guard only
    ):
        session = http.post("/sessions").json()["session_id"]
        assert http.delete(f"/sessions/{session}").status_code == 204
        assert http.get("/health").json()["sessions"] == 0
        again = http.post("/sessions")
        assert again.status_code == 201
        http.delete(f"/sessions/{again.json()['session_id']}")
    assert f"the env of session {session} did not close within 0.2 s" in caplog.text


async def test_an_expired_session_whose_env_close_hangs_frees_its_slot() -> None:
    from toolenv.remote.sessions import SessionStore

    store = SessionStore(lambda: make_env(tools=[add, StuckClose()]), max_sessions=1, ttl=60, close_timeout=0.2)
    s = await store.create()
    s.last_used = float("-inf")  # no request from its client for longer than the TTL
    assert await store.reap() == 1
    await asyncio.wait_for(asyncio.gather(*store._closers), 30)  # a failure guard: without the bound, for ever
    assert len(store) == 0
    await store.create()  # the slot is free again
    await asyncio.wait_for(store.aclose(), 30)
    assert len(store) == 0


def test_a_stop_closes_a_shared_tool_a_deleted_session_stuck_in_a_step_still_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tool object every session shares, whose call swallows its cancellation (blocked on a
    subprocess's pipe): the session stepping it is deleted, the other closed, the server stopped.
    The stuck session never let go of the tool, so nobody closed it (its process left running
    until the server's process exited); the stop must close it, once, within bounded time."""
    caplog.set_level(logging.ERROR, logger="toolenv.remote")
    shared = HeldUntilClosed()
    with serving(lambda: make_env(tools=[add, shared]), close_timeout=0.2, graceful_timeout=0.2) as u:
        a, b = RemoteToolEnv(u, timeout=60), RemoteToolEnv(u)
        a.reset(options={"task_id": "t1"})
        b.reset(options={"task_id": "t1"})
        stepping = threading.Thread(target=_catch, args=(a.step, HeldUntilClosed.CALL), daemon=True)
        stepping.start()
        assert shared.started.wait(30)
        session = a._session
        assert httpx.delete(f"{u}/sessions/{session}").status_code == 204
        assert shared.cancelled.wait(30)  # the delete cancelled the step, which waits on
        b.close()
        assert shared.closes == 0  # the stuck session still holds it
    assert shared.closes == 1
    stepping.join(30)
    assert not stepping.is_alive()  # closing the tool ended its call: its client is not left waiting
    if sys.version_info >= (3, 11):
        # Left behind, then let go of. On Python 3.10 a call runs in a task of its own (see
        # `toolenv.caller`), the deleted session's close ends within the stop's close timeout and
        # closes the tool itself: nothing is left behind, and nothing logged.
        assert f"session {session} did not close within 0.2 s of the stop" in caplog.text


def _catch(call: Any, arg: Any) -> None:
    with contextlib.suppress(Exception):  # an answer or an error: either ends the wait
        call(arg)


def test_a_session_whose_env_close_hangs_lets_go_of_a_shared_tool() -> None:
    """A session's env close hangs in a tool's `release` and is left behind: it never let go of
    the tool object it shares with another session, so that one's close left it open, and so
    did the stop. Once the close is left behind, its tools are let go of: the last holder (the
    other session) closes the shared tool, once, and not before."""
    shared = Counted()
    factory = functools.partial(make_env, tools=[add, shared, StuckRelease()])
    with serving(factory, close_timeout=0.2) as u, httpx.Client(base_url=u, timeout=60) as http:
        a, b = RemoteToolEnv(u), RemoteToolEnv(u)
        a.reset(options={"task_id": "t1"})
        b.reset(options={"task_id": "t1"})
        a.close()  # its episode's release hangs: left behind after 0.2 s
        assert shared.closes == 0  # b still holds it
        obs, *_ = b.step('<tool_call>{"name": "count", "arguments": {"word": "still"}}</tool_call>')
        assert "still" in obs
        b.close()  # its release hangs too; then the last holder's let-go closes it
        assert http.get("/health").json()["sessions"] == 0
        assert shared.closes == 1
    assert shared.closes == 1


class _Releasing(Counted):
    """Echo a word, recording the episodes it released (a session, a process per episode)."""

    name = "count"

    def __init__(self) -> None:
        super().__init__()
        self.released: list[str] = []

    async def release(self, ctx: toolenv.ToolContext) -> None:
        self.released.append(ctx.episode_id)


def test_a_session_whose_release_hangs_still_releases_its_episode_from_a_shared_tool() -> None:
    """A session's env close hangs in one tool's `release` and is left behind. The tools released
    one after another, so a tool listed after that one, shared with another session, never
    released the episode: what it held for it (a session, a process) stayed until the other
    session closed the tool. Every tool releases at once now; only the stuck one is left."""
    shared = _Releasing()
    factory = functools.partial(make_env, tools=[add, StuckRelease(), shared])
    with serving(factory, close_timeout=0.2) as u, httpx.Client(base_url=u, timeout=60) as http:
        a, b = RemoteToolEnv(u), RemoteToolEnv(u)
        a.reset(options={"task_id": "t1"})
        b.reset(options={"task_id": "t1"})
        a.close()  # its episode's release hangs in `stuck_release`: left behind after 0.2 s
        assert len(shared.released) == 1 and shared.closes == 0  # a's episode released; b holds the tool
        b.close()
        assert http.get("/health").json()["sessions"] == 0
        assert len(set(shared.released)) == 2 and shared.closes == 1


# ---------------------------------------------------------------------- the env's prompt in the metadata
PROMPTED: dict[str, Any] = {
    "system_prompt": "Be exact. Reply inside <answer>...</answer>.",
    "answer_tool_rewrites": {"inside <answer>...</answer>": "with the `{answer_tool}` tool"},
    "tasks": [{"id": "q", "question": "What is 2 + 3? Reply inside <answer>...</answer>.", "answer": "5"}],
}
#: The fields of `EnvMetadata` at protocol 2 before the `prompt` feature (what an older client accepts).
PROTOCOL_2_METADATA = {
    "protocol",
    "toolenv_version",
    "env_id",
    "parser",
    "parser_kwargs",
    "tool_schemas",
    "max_turns",
    "reward_weights",
    "num_tasks",
}


ANSWER_NOTE = "Give your final answer by calling the `answer` tool."


def _prompted() -> Any:
    return make_env(**PROMPTED)


def test_the_servers_system_prompt_and_answer_tool_rewrites_cross_the_wire() -> None:
    with serving(_prompted) as u:
        env = RemoteToolEnv(u)
        assert env.system_prompt == PROMPTED["system_prompt"]
        assert env.answer_tool_rewrites == PROMPTED["answer_tool_rewrites"]
        assert env.remote.system_prompt == PROMPTED["system_prompt"]
        _, info = env.reset(options={"task_id": "q"})
        assert info["messages"][0].content.startswith("Be exact.")  # the server's prompt, as before
        env.close()


def test_trl_rows_and_resets_of_a_remote_env_use_the_servers_prompt_and_rewrites() -> None:
    """TRL shows the env no reply text: a remote env's rows must say to answer with the tool, as a
    local env's do, rather than keep `<answer>` (and warn) for want of the server's rewrites."""
    import warnings

    from toolenv.integrations.trl import dataset_rows, environment_factory

    local = dataset_rows(_prompted)
    with serving(_prompted) as u:

        def remote() -> RemoteToolEnv:
            return RemoteToolEnv(u)

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "still says to write the answer as <answer>" warning
            rows = dataset_rows(remote)
        assert [r["prompt"] for r in rows] == [r["prompt"] for r in local]
        assert rows[0]["prompt"] == [
            {"role": "system", "content": f"Be exact. Reply with the `answer` tool.\n\n{ANSWER_NOTE}"},
            {"role": "user", "content": "What is 2 + 3? Reply with the `answer` tool."},
        ]
        trl_env = environment_factory(remote)()
        try:
            assert trl_env.reset(task_id="q") == "\n\n".join(m["content"] for m in rows[0]["prompt"])
            trl_env.answer(answer="5")  # type: ignore[attr-defined]
            assert trl_env.get_reward() == 1.0
        finally:
            trl_env.env.close()


def test_a_client_that_does_not_list_the_prompt_feature_gets_the_metadata_it_knows() -> None:
    """An older client refuses metadata fields it does not know (`extra="forbid"`): the server sends
    `system_prompt` and `answer_tool_rewrites` only to a client whose `Toolenv-Features` lists `prompt`."""
    from toolenv.remote.wire import FEATURES_HEADER, PROMPT

    with serving(_prompted) as u, httpx.Client(base_url=u) as http:
        assert set(http.get("/metadata").json()) == PROTOCOL_2_METADATA  # an older client: no header
        created = http.post("/sessions").json()
        assert set(created["metadata"]) == PROTOCOL_2_METADATA
        http.delete(f"/sessions/{created['session_id']}")
        old_features = {FEATURES_HEADER: "replay"}
        assert set(http.get("/metadata", headers=old_features).json()) == PROTOCOL_2_METADATA

        knows = {FEATURES_HEADER: f"replay, {PROMPT}"}
        meta = http.get("/metadata", headers=knows).json()
        assert meta["system_prompt"] == PROMPTED["system_prompt"]
        assert meta["answer_tool_rewrites"] == PROMPTED["answer_tool_rewrites"]
        created = http.post("/sessions", headers=knows).json()
        assert created["metadata"] == meta
        http.delete(f"/sessions/{created['session_id']}")


def test_against_a_server_before_the_prompt_feature_the_client_works_as_before() -> None:
    """A server that does not know the `prompt` feature ignores the client's header and sends no
    such fields: the client has no system prompt and no rewrites, as before, and steps as usual."""
    from toolenv.remote.server import create_app

    with asgi_server(older_server(create_app(_prompted), features=b"replay", deaf=True)) as u:
        env = RemoteToolEnv(u)
        assert env.system_prompt is None and env.answer_tool_rewrites == {}
        assert env.remote.system_prompt is None
        env.reset(options={"task_id": "q"})
        assert env.step("<answer>5</answer>")[1] == 1.0
        env.close()


def test_a_remote_env_built_in_a_forked_child_builds_no_tls_context(url: str) -> None:
    """Gymnasium's AsyncVectorEnv forks its workers from a process with threads; building an
    `ssl.SSLContext` in such a child can hang for ever (an OpenSSL lock a parent thread held at
    the fork: a CI run hung so). Every client shares the one context the parent built, so the
    child builds none: here one would raise."""
    import os
    import ssl

    RemoteToolEnv(url).close()  # the parent has built its clients (and their context) once
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:

            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("an SSLContext was built in the forked child")

            ssl.SSLContext.__new__ = refuse  # type: ignore[method-assign,assignment]
            env = RemoteToolEnv(url)
            obs, _ = env.reset(seed=0)
            env.close()
            os.write(write, b"ok" if obs else b"no prompt")
            code = 0
        except BaseException as exc:
            os.write(write, repr(exc).encode()[:500])
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        said = fh.read().decode()
    _, status = os.waitpid(pid, 0)
    assert said == "ok" and os.waitstatus_to_exitcode(status) == 0, said


# ---------------------------------------------------------------------- a proxy or gateway in front
_BAD_GATEWAY = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


class Gateway(httpx.AsyncBaseTransport):
    """A reverse proxy (nginx) in front of the real server, as the Security section advises: the
    first `fail` requests matching `method path` reach the server, but the proxy answers them
    with its own HTML error page: `status` 502 once the server has answered (its upstream
    connection broke on the way back), or 504 at once while the server still runs the request
    (its `proxy_read_timeout` passed)."""

    def __init__(self, method: str, path_end: str, status: int, fail: int = 1) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.method, self.path_end, self.status, self.fail = method, path_end, status, fail
        self.sent: list[httpx.Request] = []
        self.upstream: list[asyncio.Task[httpx.Response]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        if not (request.method == self.method and request.url.path.endswith(self.path_end) and self.fail):
            return await self.real.handle_async_request(request)
        self.fail -= 1
        upstream = asyncio.ensure_future(self._forward(request))
        self.upstream.append(upstream)
        if self.status != 504:
            await upstream  # the server ran it; its answer does not come back through the proxy
        page = _BAD_GATEWAY.replace(b"502 Bad Gateway", f"{self.status} Gateway Error".encode())
        return httpx.Response(self.status, headers={"content-type": "text/html"}, content=page)

    async def _forward(self, request: httpx.Request) -> httpx.Response:
        response = await self.real.handle_async_request(request)
        await response.aread()
        await response.aclose()
        return response

    async def aclose(self) -> None:
        await asyncio.gather(*self.upstream, return_exceptions=True)
        await self.real.aclose()


async def test_a_gateways_502_on_a_step_is_sent_again_and_the_step_runs_once() -> None:
    """Behind a proxy, a connection that breaks on the way back is the proxy's 502 page, not a
    dropped connection: it is a lost answer all the same, sent again and answered by the replay,
    rather than one more 5xx that loses the episode (with the proxy's HTML as its message)."""
    tool, runs = _counted()
    with serving(lambda: make_env(tools=[tool])) as u:
        transport = Gateway("POST", "/step", 502)
        env = RemoteToolEnv(u, transport=transport)
        await env.areset(options={"task_id": "t1"})
        obs, reward, terminated, _, info = await env.astep(CALL_ADD)
        assert obs == "<tool_response>\n5\n</tool_response>" and info["turn"] == 1
        assert runs == [2] and len([r for r in transport.sent if r.url.path.endswith("/step")]) == 2
        assert (await env.astep("<answer>5</answer>"))[1:3] == (1.0, True)
        await env.aclose()

        # the proxy fails every attempt: one line that says no answer came, and the episode is lost
        env = RemoteToolEnv(u, transport=Gateway("POST", "/step", 502, fail=3), retries=2)
        await env.areset(options={"task_id": "t1"})
        with pytest.raises(RemoteEnvError, match="step: no answer from the toolenv server") as exc:
            await env.astep(CALL_ADD)
        assert "502 Gateway Error" in str(exc.value) and "\n" not in str(exc.value) and "<" not in str(exc.value)
        with pytest.raises(RemoteEnvError, match="this episode was lost"):
            await env.astep(CALL_ADD)
        await env.aclose()


async def test_a_gateway_timeout_on_a_step_still_running_does_not_hold_the_next_reset() -> None:
    """A proxy's 504 (its read timeout) comes while the server still runs the step: the next reset
    moves to a new session, as after the client's own timeout, instead of queueing behind that step."""
    call = '<tool_call>{"name": "hang", "arguments": {"seconds": 3600}}</tool_call>'
    with serving(lambda: make_env(tools=[add, hang])) as u:
        env = RemoteToolEnv(u, transport=Gateway("POST", "/step", 504), retries=0)
        await env.areset(options={"task_id": "t1"})
        stuck = env._session
        with pytest.raises(RemoteEnvError, match="no answer from the toolenv server"):
            await env.astep(call)
        obs, _ = await asyncio.wait_for(env.areset(options={"task_id": "t2"}), 60)  # not 3600 s
        assert "10+4?" in obs and env._session != stuck
        await env.aclose()


def test_an_html_error_page_is_one_line() -> None:
    """An auth proxy's (or another web server's) HTML error page is one readable line, not the page."""
    from starlette.responses import HTMLResponse

    page = "<html>\r\n<head><title>403 Forbidden</title></head>\r\n<body>\r\n<h1>403 &amp; no</h1>\r\n</body></html>"

    async def proxy(scope: Any, receive: Any, send: Any) -> None:
        await HTMLResponse(page, status_code=403)(scope, receive, send)

    with asgi_server(proxy) as u, pytest.raises(RemoteEnvError) as exc:
        RemoteToolEnv(u)
    message = str(exc.value)
    assert exc.value.status == 403 and "\n" not in message and "<" not in message
    assert message.endswith("answered 403: 403 Forbidden")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "http://[::1"}, r"url 'http://\[::1' is not a valid URL"),
        ({"timeout": 0}, "timeout must be a positive number of seconds or None, got 0"),
        ({"timeout": -1.0}, "timeout must be a positive number of seconds or None, got -1.0"),
        ({"timeout": "abc"}, "timeout must be a positive number of seconds or None, got 'abc'"),
    ],
)
def test_bad_arguments_are_one_value_error_before_any_request(kwargs: dict[str, Any], message: str) -> None:
    """A typo in `--env-arg url=...` or `timeout=...` says which argument is wrong, rather than an
    httpx error that names neither (`Invalid port: ':1'`), a timeout after no wait at all, or a
    TypeError from deep inside the first request."""
    with pytest.raises(ValueError, match=message):
        RemoteToolEnv(**{"url": "http://127.0.0.1:9", **kwargs})
