"""Judges of the same settings share one reply cache and one request per answer in flight,
process-wide: each env (each rollout worker, each `gym.make`) builds its own `LLMJudge`, and a
GRPO group's identical answers must still make one request to the judge server and score alike.
Against a real chat-completions server on 127.0.0.1 that counts what it is asked."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _judge_server import FakeServer, Reply

import toolenv
from toolenv.caller import ToolCaller
from toolenv.episode import Episode
from toolenv.rewards import LLMJudge, reward_info
from toolenv.rewards import judge as judge_module
from toolenv.types import Task


class CountingJudgeServer:
    """A sampled judge: it answers "yes" and "no" in turn (as a judge at temperature 0.7 may
    score one answer two ways), after `delay` seconds, and counts the requests it got."""

    def __init__(self, delay: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._answered = 0
        self._reply = Reply(delay=delay, reply_to=self._verdict)
        self._server = FakeServer()
        self._server.script = [self._reply]  # one entry: every request gets it
        self._server.__enter__()
        self.url = self._server.url

    def _verdict(self, prompt: str) -> str:
        with self._lock:
            self._answered += 1
            return "yes" if self._answered % 2 else "no"

    @property
    def delay(self) -> float:
        return self._reply.delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        self._reply.delay = seconds

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self._server.requests]

    @property
    def requests(self) -> int:
        return len(self._server.requests)

    def close(self) -> None:
        self._server.__exit__()


@pytest.fixture
def server() -> Iterator[CountingJudgeServer]:
    s = CountingJudgeServer(delay=0.3)
    try:
        yield s
    finally:
        s.close()


def episode(answer: str) -> Episode:
    ep = Episode(
        task=Task(id="t", question="What is the capital of France?", answer="Paris"),
        episode_id="e",
        caller=ToolCaller([]),
    )
    ep.answer = answer
    return ep


def spec(server: CountingJudgeServer, **kw: Any) -> dict[str, Any]:
    return {"base_url": server.url, "model": "judge-model", "api_key_env": None, "backoff": 0.01, **kw}


def make_judge(server: CountingJudgeServer, **kw: Any) -> LLMJudge:
    return LLMJudge(**spec(server, **kw))


async def test_two_judges_of_one_setting_judging_one_answer_at_once_make_one_request(
    server: CountingJudgeServer,
) -> None:
    """Two envs' judges (two objects, same settings) on one loop, as `toolenv rollout -c 4`
    runs its workers: one request, and both get its verdict."""
    first, second = make_judge(server), make_judge(server)
    assert first is not second
    eps = [episode("Paris") for _ in range(4)]
    scores = await asyncio.gather(*(j.final(ep) for j, ep in zip([first, second, first, second], eps, strict=True)))
    assert server.requests == 1
    assert scores == [1.0] * 4
    assert sorted(reward_info(ep)["judge"]["cached"] for ep in eps) == [False, True, True, True]


async def test_two_judges_of_one_setting_judging_one_answer_in_turn_make_one_request(
    server: CountingJudgeServer,
) -> None:
    """The second judge's episode ends after the first's reply came: it is kept for it too, so a
    sampled judge cannot score the group's identical answers two ways."""
    first, second = make_judge(server), make_judge(server)
    a, b = episode("Paris"), episode("Paris")
    assert await first.final(a) == 1.0
    assert await second.final(b) == 1.0  # the server's next reply would be "no"
    assert server.requests == 1
    assert reward_info(b)["judge"]["cached"] is True


async def test_judges_of_other_settings_each_ask(server: CountingJudgeServer) -> None:
    """Whatever changes the request (the model, sampling fields, the prompt's system message) or
    how it is made (the key variable) is a judge of its own: each asks."""
    base = make_judge(server)
    others = [
        make_judge(server, model="another-judge"),
        make_judge(server, extra_body={"temperature": 0}),
        make_judge(server, max_tokens=64),
        make_judge(server, system="Be strict."),
        make_judge(server, api_key_env="TOOLENV_TEST_OTHER_JUDGE_KEY"),
    ]
    await base.final(episode("Paris"))
    for i, other in enumerate(others, start=2):
        await other.final(episode("Paris"))
        assert server.requests == i, other
    assert [b["model"] for b in server.bodies[:2]] == ["judge-model", "another-judge"]


async def test_a_judge_of_another_class_does_not_take_its_replies(server: CountingJudgeServer) -> None:
    """A subclass may ask its model another way (`complete` overridden): same arguments, no sharing."""

    class Strict(LLMJudge):
        async def complete(self, messages: list[dict[str, str]]) -> tuple[str, int]:
            return "no", 1

    assert await make_judge(server).final(episode("Paris")) == 1.0
    assert await Strict(**spec(server)).final(episode("Paris")) == 0.0
    assert server.requests == 1


async def test_the_name_does_not_split_the_cache(server: CountingJudgeServer) -> None:
    """`name` only labels the component in reward info: judges named apart still share."""
    a, b = episode("Paris"), episode("Paris")
    assert await make_judge(server, name="j1").final(a) == 1.0
    assert await make_judge(server, name="j2").final(b) == 1.0
    assert server.requests == 1 and reward_info(b)["j2"]["cached"] is True


@pytest.mark.parametrize("kw", [{"share_cache": False}, {"cache_size": 0}])
async def test_a_judge_can_keep_its_own_cache_or_none(server: CountingJudgeServer, kw: dict[str, Any]) -> None:
    """`share_cache=False` keeps a judge's replies to itself (each judge asks once per answer);
    `cache_size=0` asks every time, as before."""
    first, second = make_judge(server, **kw), make_judge(server, **kw)
    await first.final(episode("Paris"))
    await second.final(episode("Paris"))
    assert server.requests == 2
    await first.final(episode("Paris"))
    assert server.requests == (2 if kw.get("share_cache") is False else 3)


def test_two_envs_from_one_spec_judge_an_answer_once(server: CountingJudgeServer) -> None:
    """What `toolenv rollout --samples 4 -c 4` does: an env per worker, each built from the
    same reward spec, each with its judge; the group's identical answers made 4 requests."""
    reward = {"judge": {"weight": 1.0, **spec(server)}}
    envs = [toolenv.ToolEnv(tools=[], tasks=[{"question": "Capital of France?", "answer": "Paris"}], reward=reward)]
    envs.append(toolenv.ToolEnv(tools=[], tasks=envs[0].tasks, reward=reward))
    try:
        judges = [env.reward_fn.parts["judge"][0] for env in envs]
        assert judges[0] is not judges[1]
        rewards = []
        for env in envs:
            env.reset(seed=0)
            rewards.append(env.step("<answer>It is Paris</answer>")[1])
        assert rewards == [1.0, 1.0] and server.requests == 1
    finally:
        for env in envs:
            env.close()


def _judge_in_threads(judges: list[LLMJudge], answer: str) -> list[tuple[float, dict[str, Any]]]:
    """Each judge scores `answer` on a thread of its own with its own event loop, all at once."""
    start = threading.Barrier(len(judges))
    results: list[tuple[float, dict[str, Any]]] = []
    errors: list[BaseException] = []

    def run(j: LLMJudge) -> None:
        try:
            start.wait(timeout=10)
            ep = episode(answer)
            score = asyncio.run(j.final(ep))
            results.append((score, reward_info(ep)[j.name]))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(j,)) for j in judges]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    return results


def test_judges_on_threads_of_their_own_make_one_request(server: CountingJudgeServer) -> None:
    """Sync envs stepped from a trainer's threads: each judge on its own loop waits for the one
    request another loop makes, never awaiting that loop's task itself."""
    results = _judge_in_threads([make_judge(server) for _ in range(3)], "Paris")
    assert server.requests == 1
    assert [score for score, _ in results] == [1.0, 1.0, 1.0]
    assert sorted(info["cached"] for _, info in results) == [False, True, True]


def test_a_judge_whose_loop_stopped_does_not_hold_up_another_judge() -> None:
    """A judge whose thread gave up on its call and stopped its loop leaves its request pending:
    another judge of the same settings asks itself rather than wait for a loop that is not running."""
    slow = CountingJudgeServer(delay=10.0)
    loop = asyncio.new_event_loop()
    try:
        stalled, other = make_judge(slow), make_judge(slow)

        async def give_up() -> None:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(stalled.final(episode("Paris")), 0.6)

        import httpx  # noqa: F401 - imported here, not in the timed call below

        started = time.monotonic()
        threading.Thread(target=loop.run_until_complete, args=(give_up(),)).start()
        deadline = time.monotonic() + 10  # a loaded host may take a while to send it
        while not (slow.requests == 1 and other._pending) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert slow.requests == 1 and other._pending  # the stalled judge's request, seen by the other
        slow.delay = 0.0
        [(score, info)] = _judge_in_threads([other], "Paris")
        assert info["cached"] is False and slow.requests == 2
        assert score == 0.0 and info["error"] is None  # the server's 2nd verdict ("no"): its own request
        assert time.monotonic() - started < 8.0  # did not wait for the stalled request's reply (10 s)
    finally:
        loop.close()
        slow.close()


async def test_a_copy_of_a_judge_shares_with_it(server: CountingJudgeServer) -> None:
    """verl, TRL and SkyRL hand env kwargs (a judge among them) to workers as copies: a copy
    in this process joins the same cache."""
    original = make_judge(server)
    assert await original.final(episode("Paris")) == 1.0
    assert await copy.deepcopy(original).final(episode("Paris")) == 1.0
    assert server.requests == 1


async def test_the_shared_cache_keeps_cache_size_replies_and_goes_with_its_judges(
    server: CountingJudgeServer,
) -> None:
    """Memory stays bounded: one LRU of `cache_size` replies for all judges of a setting (not
    one per env), kept while a judge of that setting lives and for the last few settings
    judges were made with (an env made per episode), then dropped."""
    server.delay = 0.0
    first, second = make_judge(server, cache_size=2), make_judge(server, cache_size=2)
    for i in range(6):
        await (second if i % 2 else first).final(episode(f"Lyon {i}"))
    assert first._replies is second._replies
    assert first._replies is not None and len(first._replies) == 2
    del first, second
    gc.collect()
    asked = server.requests
    await make_judge(server, cache_size=2).final(episode("Lyon 5"))  # the judge of an env made per episode
    assert server.requests == asked  # kept: its setting is a recent one
    for i in range(len(judge_module._RECENT)):  # as many other settings, their judges gone too
        await make_judge(server, model=f"other-{i}").final(episode("Lyon 5"))
    gc.collect()
    assert _cached_settings().count([server.url + "/chat/completions", "judge-model"]) == 0
    asked = server.requests
    await make_judge(server, cache_size=2).final(episode("Lyon 5"))
    assert server.requests == asked + 1  # asked again: that cache was dropped


def _cached_settings() -> list[list[str]]:
    """The URL and model of each shared cache this process still holds."""
    return [json.loads(settings)[:2] for _, settings in list(judge_module._SHARED.keys())]
