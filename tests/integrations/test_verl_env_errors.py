"""ToolEnvAgentLoop when the env itself fails a reset or a step (a remote env's server lost the
session): that episode ends, the batch goes on."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

import gymnasium as gym

from toolenv.env import ToolEnv
from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS, Calculator
from toolenv.integrations.verl.envs import EnvPool
from toolenv.remote.client import RemoteEnvError

FLAKY = "toolenv-test/FlakyCalc-v0"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'


class FlakyEnv(ToolEnv):
    """The calculator env, whose server goes away at the `fail_at`-th step of an episode (and,
    with `fail_truncate`, when the loop ends the episode)."""

    #: Every env made, in order, to see which the pool hands out and which it closes.
    made: ClassVar[list[FlakyEnv]] = []

    def __init__(self, fail_at: int = 2, fail_truncate: bool = False, fail_reset: bool = False, **kwargs: Any) -> None:
        super().__init__(tools=[Calculator()], tasks=DEMO_TASKS, **kwargs)
        self.fail_at, self.fail_truncate, self.fail_reset = fail_at, fail_truncate, fail_reset
        self.closes = 0
        FlakyEnv.made.append(self)

    async def aclose(self) -> None:
        self.closes += 1
        await super().aclose()

    async def areset(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_reset:
            raise RemoteEnvError("the server refused the session")
        return await super().areset(*args, **kwargs)

    async def astep(self, action: str, **kwargs: Any) -> Any:
        ep = self.episode
        if ep is not None and len(ep.turns) + 1 == self.fail_at:
            raise RemoteEnvError("the server lost the session")
        return await super().astep(action, **kwargs)

    async def atruncate(self) -> float:
        if self.fail_truncate:
            raise RemoteEnvError("the server is gone")
        return await super().atruncate()


if FLAKY not in gym.registry:
    gym.register(FLAKY, entry_point=FlakyEnv)


async def _row(**env_kwargs: Any) -> dict[str, Any]:
    row = (await abuild_rows(FLAKY, env_kwargs=env_kwargs))[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"]}


async def _failing_row(**env_kwargs: Any) -> dict[str, Any]:
    """A row whose env is made with `env_kwargs` (built by an env that works: a failing reset
    cannot write its prompt)."""
    row = await _row(fail_at=99)
    row["extra_info"] = {**row["extra_info"], "env_kwargs": json.dumps(env_kwargs)}
    return row


async def test_an_env_step_that_raises_ends_that_episode_only(tiny_tokenizer, scripted_server, make_loop, caplog):
    """verl gathers a batch's episodes with `asyncio.gather`: one env's exception would fail the
    whole training step. The episode ends on the reply the env could not step; the env scored
    nothing for it, so its tokens are not trained on (mask 0) and the error is reported."""
    import asyncio

    pool = EnvPool()
    good = make_loop(scripted_server([CALL, "<answer>42</answer>"]), pool=pool)
    flaky_server = scripted_server([CALL, "<answer>42</answer>"])
    flaky = make_loop(flaky_server, pool=pool)
    ok_row, bad_row = await _row(fail_at=99), await _row(fail_at=2)
    with caplog.at_level("WARNING"):
        ok, bad = await asyncio.gather(good.run({"logprobs": True}, **ok_row), flaky.run({"logprobs": True}, **bad_row))
    assert ok.reward_score == 1.0 and ok.extra_fields["toolenv_error"] == ""
    assert bad.extra_fields["toolenv_stop_reason"] == "env_error"
    assert "RemoteEnvError: the server lost the session" in bad.extra_fields["toolenv_error"]
    assert "the server lost the session" in caplog.text
    # The stream is the two generations and the first observation, nothing after the failed turn.
    assert len(flaky_server.calls) == 2
    assert bad.response_ids[-len(flaky_server.emitted[1]) :] == flaky_server.emitted[1]
    assert bad.response_mask == [0] * len(bad.response_ids)
    assert len(bad.response_logprobs) == len(bad.response_ids)
    assert bad.reward_score == 0.0 and bad.extra_fields["turn_scores"] == [0.0, 0.0]
    assert set(bad.extra_fields["reward_extra_info"]) == set(ok.extra_fields["reward_extra_info"])
    assert bad.extra_fields["reward_extra_info"]["truncated"] == 0.0
    await pool.aclose()


async def test_a_final_reward_the_env_cannot_give_ends_the_episode_as_an_env_error(scripted_server, make_loop):
    """The loop ends an unfinished episode with `env.atruncate()`; when that fails too, the
    episode is reported as an env error rather than failing the batch."""
    loop = make_loop(scripted_server([CALL]), max_turns=1, pool=EnvPool())
    out = await loop.run({}, **await _row(fail_at=99, fail_truncate=True))
    assert out.extra_fields["toolenv_stop_reason"] == "env_error"
    assert "the server is gone" in out.extra_fields["toolenv_error"]
    assert out.response_mask == [0] * len(out.response_ids) and out.response_ids


async def test_an_env_reset_that_raises_ends_that_episode_only(tiny_tokenizer, scripted_server, make_loop, caplog):
    """A remote env's server that refuses the session at reset fails that episode as a failing
    step does (verl gathers a batch's episodes: the exception stopped the training step). The
    sample is the row's prompt with an empty response, reward 0, the error reported; nothing
    is generated for a task the env could not start."""
    import asyncio

    pool = EnvPool()
    good = make_loop(scripted_server([CALL, "<answer>42</answer>"]), pool=pool)
    bad_server = scripted_server([CALL])
    bad = make_loop(bad_server, pool=pool)
    ok_row, bad_row = await _row(fail_at=99), await _row(fail_at=99)
    bad_row["extra_info"] = {**bad_row["extra_info"], "env_kwargs": json.dumps({"fail_at": 99, "fail_reset": True})}
    with caplog.at_level("WARNING"):
        ok, out = await asyncio.gather(good.run({"logprobs": True}, **ok_row), bad.run({"logprobs": True}, **bad_row))
    assert ok.reward_score == 1.0
    assert out.extra_fields["toolenv_stop_reason"] == "env_error"
    assert "RemoteEnvError: the server refused the session" in out.extra_fields["toolenv_error"]
    assert "the server refused the session" in caplog.text
    assert bad_server.calls == []
    prompt = tiny_tokenizer.apply_chat_template(bad_row["raw_prompt"], tokenize=False, add_generation_prompt=True)
    assert out.prompt_ids == tiny_tokenizer.encode(prompt, add_special_tokens=False)
    # One masked-out turn-end token carries the score: verl's v1 trainer fails an empty response.
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert out.response_ids == [im_end] and out.response_mask == [0] and out.response_logprobs == [0.0]
    assert out.reward_score == 0.0 and out.extra_fields["turn_scores"] == []
    assert set(out.extra_fields["reward_extra_info"]) == set(ok.extra_fields["reward_extra_info"])
    await pool.aclose()


@pytest.mark.parametrize("failure", ["step", "reset", "truncate"])
async def test_an_env_that_failed_is_closed_and_not_handed_to_the_next_sample(scripted_server, make_loop, failure):
    """An env whose reset, step or final reward raised may hold broken state (a tool mid-call, a
    half-closed connection to its server): the pool closes it and makes a new env for the next
    sample rather than handing the failed one on."""
    kwargs = {"fail_at": 2 if failure == "step" else 99, "fail_reset": failure == "reset"}
    kwargs["fail_truncate"] = failure == "truncate"
    row = await _failing_row(**kwargs)
    FlakyEnv.made.clear()
    loop_kwargs = {"max_turns": 1} if failure == "truncate" else {}
    pool = EnvPool()
    outs = []
    for _ in range(2):
        loop = make_loop(scripted_server([CALL, "<answer>42</answer>"]), pool=pool, **loop_kwargs)
        outs.append(await loop.run({}, **row))
    assert [o.extra_fields["toolenv_stop_reason"] for o in outs] == ["env_error", "env_error"]
    first, second = FlakyEnv.made
    assert first is not second, "the failed env was handed to the next sample"
    assert first.closes == 1 and second.closes == 1
    assert list(pool.envs()) == [] and pool.created == 2
    await pool.aclose()


async def test_an_env_that_finished_its_episode_is_pooled_open(scripted_server, make_loop):
    """A healthy env goes back to the pool, open, and the next sample gets it."""
    row = await _row(fail_at=99)
    FlakyEnv.made.clear()
    pool = EnvPool()
    for _ in range(2):
        out = await make_loop(scripted_server([CALL, "<answer>42</answer>"]), pool=pool).run({}, **row)
        assert out.reward_score == 1.0
    assert pool.created == 1 and FlakyEnv.made[0].closes == 0
    assert list(pool.envs()) == [FlakyEnv.made[0]]
    await pool.aclose()
    assert FlakyEnv.made[0].closes == 1


async def test_an_episode_that_raises_closes_its_env(scripted_server, make_loop):
    """An exception out of the episode (a reset that fails on a row with no prompt to fall back
    on) propagates, and the env it left behind is closed, not pooled."""
    row = await _failing_row(fail_reset=True)
    del row["raw_prompt"]
    FlakyEnv.made.clear()
    pool = EnvPool()
    with pytest.raises(RemoteEnvError):
        await make_loop(scripted_server([CALL]), pool=pool).run({}, **row)
    assert list(pool.envs()) == [] and FlakyEnv.made[-1].closes == 1


async def test_a_lease_that_loses_the_last_idle_env_to_another_thread_makes_one():
    """verl's reward workers borrow from the same process-wide pool from several threads: one
    that saw an idle env, which another thread took before it could, gets a new env rather
    than failing its sample with an IndexError."""

    class Raced(list[ToolEnv]):
        def __bool__(self) -> bool:
            return True  # it looked non-empty; the other thread took the env meanwhile

    pool = EnvPool()
    kwargs = {"fail_at": 99}
    pool._idle[pool.key(FLAKY, kwargs)] = Raced()
    async with pool.lease(FLAKY, kwargs) as env:
        assert isinstance(env, FlakyEnv)
    assert pool.created == 1
    await pool.aclose()
