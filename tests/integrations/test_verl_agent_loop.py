"""ToolEnvAgentLoop against a scripted server and the tiny Qwen2 tokenizer/model (CPU, offline)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

from toolenv.integrations.verl.data import abuild_rows
from toolenv.integrations.verl.demo import DEMO_TASKS

CALC = "toolenv.integrations.verl.demo:Calculator"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
EXPECTED_KEYS = {
    "score",
    "answered",
    "terminated",
    "truncated",
    "turns",
    "tool_calls",
    "parse_errors",
    "tool_errors",
    "infra_errors",
    "tool_latency_s",
    "reward/exact_match",
}


async def _row(env_kwargs: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
    kwargs = {"tools": [CALC], "tasks": DEMO_TASKS, **(env_kwargs or {})}
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs))[index]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"], "data_source": row["data_source"]}


def _segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of the mask."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


def _assert_stream_is_template(tokenizer: Any, out: Any, messages: list[dict[str, Any]]) -> None:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    rendered = tokenizer.encode(text, add_special_tokens=False)
    stream = out.prompt_ids + out.response_ids
    # The template ends the last assistant turn with "<|im_end|>\n"; generation stops at <|im_end|>.
    assert tokenizer.decode(rendered[len(stream) :]) == "\n"
    assert stream == rendered[: len(stream)]


async def test_tool_call_then_answer_masks_stream_and_reward(tiny_tokenizer, scripted_server, make_loop):
    server = scripted_server([CALL, "The answer is <answer>42</answer>"])
    loop = make_loop(server)
    out = await loop.run({"temperature": 1.0, "logprobs": True}, **await _row())

    # (a) mask segments: model tokens 1, observation tokens 0, exactly.
    runs = _segments(out.response_mask)
    assert [r[0] for r in runs] == [1, 0, 1]
    pieces = [tiny_tokenizer.decode(out.response_ids[s:e]) for _, s, e in runs]
    assert pieces[0] == CALL + "<|im_end|>"
    assert pieces[1] == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert pieces[2] == "The answer is <answer>42</answer><|im_end|>"
    # Model tokens are the server's tokens verbatim (never re-encoded), logprobs aligned.
    assert out.response_ids[runs[0][1] : runs[0][2]] == server.emitted[0]
    assert out.response_ids[runs[2][1] : runs[2][2]] == server.emitted[1]
    flat_lp = [-0.01 * (i + 1) for i in range(sum(len(e) for e in server.emitted))]
    model_lp = [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 1]
    assert model_lp == pytest.approx(flat_lp)
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 0)
    # The second generation saw the whole stream so far (token-in).
    assert server.calls[1]["prompt_ids"] == out.prompt_ids + out.response_ids[: runs[1][2]]
    assert server.calls[0]["sampling_params"]["max_tokens"] == 512

    # (b) the token stream is the chat-template rendering of the final conversation.
    assert [m["role"] for m in loop.messages] == ["system", "user", "assistant", "tool", "assistant"]
    _assert_stream_is_template(tiny_tokenizer, out, loop.messages)

    # (c) reward and extra fields.
    assert out.reward_score == 1.0
    assert out.num_turns == 4
    extra = out.extra_fields
    assert extra["turn_scores"] == [0.0, 1.0]
    assert set(extra["reward_extra_info"]) == EXPECTED_KEYS
    assert extra["reward_extra_info"]["reward/exact_match"] == 1.0
    assert extra["reward_extra_info"]["tool_calls"] == 1.0
    assert extra["reward_components"] == {"exact_match": 1.0}
    assert extra["toolenv_answer"] == "42"
    assert extra["toolenv_stop_reason"] == "terminated"
    assert extra["toolenv_env_id"] == "toolenv/ToolEnv-v0"
    assert out.as_dict()["rm_scores"][-1].item() == 1.0


async def test_wrong_answer_and_tool_error_keep_the_same_keys(scripted_server, make_loop):
    bad_call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 ** 7"}}\n</tool_call>'
    server = scripted_server([bad_call, "<answer>41</answer>"])
    out = await make_loop(server).run({}, **await _row())
    info = out.extra_fields["reward_extra_info"]
    assert set(info) == EXPECTED_KEYS
    assert out.reward_score == 0.0
    assert info["tool_errors"] == 1.0
    assert info["answered"] == 1.0


async def test_a_turn_that_calls_nothing_is_answered_as_the_user(tiny_tokenizer, scripted_server, make_loop):
    """Results that answer no call (a parse error, no action) go back as a user message, not a
    tool message without a call id (which templates pairing results with calls reject)."""
    broken = '<tool_call>\n{"name": "calculator", "arguments": \n</tool_call>'
    server = scripted_server([broken, "I am not sure.", CALL, "The answer is <answer>42</answer>"])
    loop = make_loop(server, max_turns=10)
    out = await loop.run({}, **await _row())
    roles = [m["role"] for m in loop.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "tool", "assistant"]
    assert "not valid JSON" in loop.messages[3]["content"] and "tool_call_id" not in loop.messages[3]
    assert "No tool call and no final answer" in loop.messages[5]["content"]
    assert loop.messages[7]["content"] == "42" and loop.messages[7]["tool_call_id"] == "call_0"
    assert out.reward_score == 1.0
    _assert_stream_is_template(tiny_tokenizer, out, loop.messages)


@pytest.mark.parametrize(("assistant", "user", "turns"), [(10, 1, 2), (2, 10, 2), (10, 0, 10)])
async def test_max_user_turns_caps_the_turns_as_verls_tool_agent(scripted_server, make_loop, assistant, user, turns):
    """verl's `tool_agent` stops after the reply that follows its `max_user_turns`-th observation;
    the loop read only `max_assistant_turns` (0: no cap, as in verl)."""
    server = scripted_server([CALL])
    out = await make_loop(server, max_turns=assistant, max_user_turns=user).run({}, **await _row({"max_turns": 50}))
    assert len(server.calls) == turns
    assert out.extra_fields["toolenv_stop_reason"] == "max_turns"


async def test_stops_at_max_turns_without_appending_the_last_observation(tiny_tokenizer, scripted_server, make_loop):
    server = scripted_server([CALL])
    loop = make_loop(server, max_turns=2)
    out = await loop.run({}, **await _row())
    assert [r[0] for r in _segments(out.response_mask)] == [1, 0, 1]
    assert out.extra_fields["toolenv_stop_reason"] == "max_turns"
    assert out.extra_fields["reward_extra_info"]["answered"] == 0.0
    assert len(server.calls) == 2
    _assert_stream_is_template(tiny_tokenizer, out, loop.messages)


async def test_env_truncation_ends_the_episode(scripted_server, make_loop):
    server = scripted_server([CALL])
    out = await make_loop(server, max_turns=10).run({}, **await _row({"max_turns": 3}))
    assert out.extra_fields["toolenv_stop_reason"] == "truncated"
    assert out.extra_fields["turn_scores"] == [0.0, 0.0, 0.0]
    assert out.extra_fields["reward_extra_info"]["truncated"] == 1.0


async def test_response_length_bounds_the_response(scripted_server, make_loop):
    server = scripted_server([CALL])
    out = await make_loop(server, response_length=60, max_turns=10).run({}, **await _row())
    assert len(out.response_ids) == len(out.response_mask) <= 60
    assert out.extra_fields["toolenv_stop_reason"] == "response_length"
    # Each generation was asked for no more than what was left of the budget.
    used = 0
    for call, emitted in zip(server.calls, server.emitted, strict=True):
        assert call["sampling_params"]["max_tokens"] <= 60 - used
        used += len(emitted)


async def test_tags_parser_user_observations_and_stop_strings(tiny_tokenizer, scripted_server, make_loop):
    env_kwargs = {"parser": "tags", "parser_kwargs": {"tags": {"calc": ["calculator", "expression"]}}}
    # The first reply stops on the stop string, without <|im_end|>: the loop closes the turn itself.
    server = scripted_server([("<calc>(12 + 30) / 2</calc>", False), "<answer>21</answer>"])
    loop = make_loop(server, stop=["</calc>"])
    out = await loop.run({}, **await _row(env_kwargs, index=1))
    assert server.calls[0]["sampling_params"]["stop"] == ["</calc>"]
    runs = _segments(out.response_mask)
    assert [r[0] for r in runs] == [1, 0, 1]
    observation = tiny_tokenizer.decode(out.response_ids[runs[1][1] : runs[1][2]])
    assert (
        observation == "<|im_end|>\n<|im_start|>user\n<information>21</information><|im_end|>\n<|im_start|>assistant\n"
    )
    assert [m["role"] for m in loop.messages][-2:] == ["user", "assistant"]
    assert out.reward_score == 1.0
    _assert_stream_is_template(tiny_tokenizer, out, loop.messages)


async def test_helper_rename_is_followed(scripted_server, make_loop):
    """Newer verl calls the context helper ct_merge_non_assistant_msg; the loop finds either."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    from toolenv.integrations.verl.agent_loop import ToolEnvAgentLoop

    class Renamed(ToolEnvAgentLoop):
        ct_merge_context_msg = None
        ct_merge_non_assistant_msg = AgentLoopBase.ct_merge_context_msg

    server = scripted_server([CALL, "<answer>42</answer>"])
    loop = make_loop(server, cls=Renamed)
    assert loop._merge_context.__func__ is AgentLoopBase.ct_merge_context_msg
    out = await loop.run({}, **await _row())
    assert out.reward_score == 1.0


async def test_real_tiny_model_tokens_pass_through_unchanged(tiny_model_dir, tiny_tokenizer, make_loop):
    """A real (random) Qwen2 behind the server interface: its tokens and logprobs come back as generated."""
    import torch
    from transformers import AutoModelForCausalLM
    from verl.workers.rollout.replica import TokenOutput

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    emitted: list[tuple[list[int], list[float]]] = []

    class HFServer:
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            torch.manual_seed(len(emitted))
            ids = torch.tensor([prompt_ids])
            with torch.no_grad():
                gen = model.generate(
                    ids,
                    max_new_tokens=min(12, sampling_params["max_tokens"]),
                    do_sample=True,
                    output_scores=True,
                    return_dict_in_generate=True,
                    pad_token_id=tiny_tokenizer.pad_token_id,
                )
            new = gen.sequences[0, len(prompt_ids) :].tolist()
            lps = [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(gen.scores, new, strict=False)]
            emitted.append((new, lps))
            return TokenOutput(token_ids=new, log_probs=lps)

    loop = make_loop(HFServer(), max_turns=3)
    out = await loop.run({}, **await _row())
    model_runs = [(s, e) for v, s, e in _segments(out.response_mask) if v == 1]
    # Random text never answers: the env answers each turn with an error observation (mask 0).
    assert out.extra_fields["toolenv_stop_reason"] == "max_turns"
    got = [out.response_ids[s:e] for s, e in model_runs]
    want = [ids for ids, _ in emitted]
    assert got == want
    model_lp = [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 1]
    assert model_lp == pytest.approx([lp for _, lps in emitted for lp in lps])


async def test_yaml_options_arrive_as_omegaconf_and_apply(scripted_server, make_loop):
    """hydra passes nested YAML values as OmegaConf containers: env_kwargs and reward_keys still apply."""
    from omegaconf import OmegaConf

    server = scripted_server([CALL])
    loop = make_loop(
        server,
        env_kwargs=OmegaConf.create({"max_turns": 1}),
        reward_keys=OmegaConf.create(["exact_match", "format"]),
    )
    out = await loop.run({}, **await _row())
    assert out.extra_fields["toolenv_stop_reason"] == "truncated"
    assert out.extra_fields["turn_scores"] == [0.0]
    info = out.extra_fields["reward_extra_info"]
    assert info["reward/format"] == 0.0 and info["reward/exact_match"] == 0.0  # absent parts report 0.0


async def test_rows_without_env_id_fail_clearly(scripted_server, make_loop):
    loop = make_loop(scripted_server([CALL]))
    with pytest.raises(ValueError, match=r"no extra_info\.env_id"):
        await loop.run({}, raw_prompt=[{"role": "user", "content": "hi"}], extra_info={"index": 0})


async def test_envs_are_pooled_across_samples(scripted_server, make_loop):
    """verl builds a loop per sample; envs are reused, one per episode in flight."""
    import asyncio

    from toolenv.integrations.verl.envs import EnvPool

    pool = EnvPool()
    row = await _row()
    for _ in range(2):
        loops = [make_loop(scripted_server([CALL, "<answer>42</answer>"]), pool=pool) for _ in range(4)]
        outs = await asyncio.gather(*(loop.run({}, **row) for loop in loops))
        assert [o.reward_score for o in outs] == [1.0] * 4
    assert pool.created == 4
    assert len(list(pool.envs())) == 4
    await pool.aclose()
    assert list(pool.envs()) == []


async def test_tune_gc_runs_episodes_tuned_and_restores_after_the_last(scripted_server, make_loop):
    import gc

    from toolenv.gc_tuning import DEFAULT_GEN0_THRESHOLD

    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        server = scripted_server([CALL, "The answer is <answer>42</answer>"])
        loop = make_loop(server, tune_gc=True)
        seen: list[int] = []
        episode = loop._episode

        async def spy(*args: Any, **kwargs: Any) -> Any:
            seen.append(gc.get_threshold()[0])
            return await episode(*args, **kwargs)

        loop._episode = spy
        out = await loop.run({}, **await _row())
        assert out.reward_score == 1.0 and seen == [DEFAULT_GEN0_THRESHOLD]
        assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
        plain = make_loop(scripted_server([CALL, "<answer>42</answer>"]))
        plain._episode = spy
        await plain.run({}, **await _row())
        assert seen == [DEFAULT_GEN0_THRESHOLD, 700]  # off by default
    finally:
        gc.set_threshold(*saved)


async def test_formats_written_in_special_tokens_keep_them(scripted_server, make_loop):
    """A parser with `special_tokens` (Harmony's) reads the reply with its special tokens; others without."""
    from toolenv.parsers import HermesParser
    from toolenv.parsers.base import _FACTORIES, register_parser

    seen: dict[bool, list[str]] = {True: [], False: []}

    def recording(keep: bool) -> type[HermesParser]:
        class Recording(HermesParser):
            special_tokens = keep

            def parse(self, text: str) -> Any:
                seen[keep].append(text)
                return super().parse(text)

        return Recording

    for keep in (True, False):
        name = f"test_recording_{keep}"
        register_parser(name, recording(keep))
        try:
            server = scripted_server(["<|im_start|>So <answer>42</answer>"])
            await make_loop(server).run({"temperature": 1.0}, **await _row({"parser": name}))
        finally:  # the registry is global: other tests list every parser name
            _FACTORIES.pop(name, None)
    # The last text each parser read is the model's reply (the first may be the template check's call).
    assert seen[True][-1] == "<|im_start|>So <answer>42</answer><|im_end|>"
    assert seen[False][-1] == "So <answer>42</answer>"


def test_template_mismatch_reads_the_templates_own_call(tiny_tokenizer: Any) -> None:
    """The tiny Qwen2 template writes Hermes calls: hermes reads them, the other formats do not."""
    from toolenv.parsers import get_parser, template_mismatch

    assert template_mismatch(get_parser("hermes"), tiny_tokenizer) is None
    for spec in (
        "mistral",
        "harmony",
        "pythonic",
        "qwen3_xml",
        "tags",
        "glm45",
        "deepseek_v3",
        "gemma4",
        "kimi_k2",
        "muse_glimmer",
    ):
        problem = template_mismatch(get_parser(spec), tiny_tokenizer)
        assert problem is not None and "<tool_call>" in problem and repr(spec) in problem, spec


def test_template_mismatch_follows_the_template_not_the_model_name(tiny_tokenizer: Any) -> None:
    """The same tokenizer with a Mistral-style template: now mistral reads it and hermes does not;
    a template that cannot write tool calls gives no verdict."""
    import copy

    from toolenv.parsers import get_parser, template_mismatch

    mistral_like = copy.deepcopy(tiny_tokenizer)
    mistral_like.chat_template = (
        "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
        "[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}"
        "{% endfor %}{% else %}[INST]{{ m.content }}[/INST]{% endif %}{% endfor %}"
    )
    assert template_mismatch(get_parser("mistral"), mistral_like) is None
    assert "[TOOL_CALLS]lookup[ARGS]" in (template_mismatch(get_parser("hermes"), mistral_like) or "")
    plain = copy.deepcopy(tiny_tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert template_mismatch(get_parser("hermes"), plain) is None


async def test_the_loop_warns_once_when_the_env_cannot_read_the_models_calls(
    scripted_server, make_loop, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from toolenv.integrations.verl import agent_loop

    agent_loop._CHECKED.clear()
    with caplog.at_level(logging.WARNING, logger=agent_loop.__name__):
        for _ in range(2):
            await make_loop(scripted_server(["<answer>42</answer>"])).run({}, **await _row({"parser": "mistral"}))
        await make_loop(scripted_server(["<answer>42</answer>"])).run({}, **await _row())
        # A prompted format (Search-R1's tags) is taught by the prompt: not checked.
        await make_loop(scripted_server(["<answer>42</answer>"])).run({}, **await _row({"parser": "tags"}))
    warnings = [r.getMessage() for r in caplog.records if "chat template" in r.getMessage()]
    assert len(warnings) == 1 and "'mistral'" in warnings[0]


async def test_parser_auto_picks_the_parser_the_chat_template_writes(scripted_server, make_loop, tiny_tokenizer):
    """`env_kwargs: {parser: auto}`: the loop asks the tokenizer's template which format it writes
    (Hermes for the tiny Qwen2) and runs the episode with that parser."""
    import copy

    server = scripted_server([CALL, "<answer>42</answer>"])
    loop = make_loop(server, env_kwargs={"parser": "auto", "parser_kwargs": {"reasoning": True}})
    out = await loop.run({}, **await _row({"parser": "mistral"}))  # the loop's env_kwargs override the row's
    assert out.reward_score == 1.0 and out.extra_fields["reward_extra_info"]["tool_calls"] == 1.0
    assert loop._auto_parser == "hermes"

    plain = copy.deepcopy(tiny_tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    loop = make_loop(scripted_server(["<answer>42</answer>"]), env_kwargs={"parser": "auto"})
    loop.tokenizer = plain
    with pytest.raises(ValueError, match="parser='auto': the model's chat template writes no tool call"):
        await loop.run({}, **await _row())


PENALIZED = {"reward": {"exact_match": 1.0, "answer_avoidance_penalty": 1.0}, "max_turns": 10}


@pytest.mark.parametrize("cause", ["max_turns", "budget", "overflow"])
async def test_episodes_the_loop_cuts_get_the_envs_final_reward(cause, tiny_tokenizer, scripted_server, make_loop):
    """A final-only component (answer_avoidance_penalty) counts whoever ends the episode: the loop
    truncates it through `env.atruncate()` as the env's own max_turns would. Causes: the loop's own
    turn cap (under the env's), a reply that fills response_length, and a reply that fits but
    whose observation would not."""
    reply = len(tiny_tokenizer.encode(CALL + "<|im_end|>", add_special_tokens=False))
    loop_kwargs = {"max_turns": {"max_turns": 2}, "budget": {"response_length": reply - 5}}.get(
        cause, {"response_length": reply + 5}
    )
    server = scripted_server([CALL])
    loop = make_loop(server, **{"max_turns": 10, **loop_kwargs})
    out = await loop.run({}, **await _row(PENALIZED))
    extra = out.extra_fields
    assert extra["toolenv_stop_reason"] == ("max_turns" if cause == "max_turns" else "response_length")
    if cause == "budget":
        assert len(server.calls) == 1 and len(out.response_ids) == reply - 5
    if cause == "overflow":
        assert len(server.calls) == 1 and out.response_ids == server.emitted[0]
    assert out.reward_score == -1.0
    assert extra["turn_scores"][-1] == -1.0 and sum(extra["turn_scores"]) == -1.0
    assert extra["reward_components"]["answer_avoidance_penalty"] == -1.0
    info = extra["reward_extra_info"]
    assert info["reward/answer_avoidance_penalty"] == -1.0 and info["score"] == -1.0
    assert info["truncated"] == 1.0 and info["terminated"] == 0.0
    assert out.as_dict()["rm_scores"].sum().item() == -1.0

    # The env's own truncation scores the same way (and is not scored twice).
    out = await make_loop(scripted_server([CALL]), max_turns=10).run({}, **await _row({**PENALIZED, "max_turns": 2}))
    assert out.reward_score == -1.0 and out.extra_fields["turn_scores"] == [0.0, -1.0]


async def test_answered_episodes_are_not_truncated(scripted_server, make_loop):
    out = await make_loop(scripted_server([CALL, "<answer>42</answer>"])).run({}, **await _row(PENALIZED))
    assert out.reward_score == 1.0 and out.extra_fields["reward_extra_info"]["truncated"] == 0.0


async def test_env_kwargs_that_change_the_prompt_replace_the_dataset_prompt(scripted_server, make_loop):
    """The row was built for the pythonic parser; the loop's env_kwargs switch to hermes. The model
    must be taught hermes (the env's prompt), not the row's pythonic instructions."""
    row = await _row({"parser": "pythonic"})
    assert "[func_name1(" in row["raw_prompt"][0]["content"]
    server = scripted_server([CALL, "<answer>42</answer>"])
    loop = make_loop(server, env_kwargs={"parser": "hermes"})
    out = await loop.run({}, **row)
    system = loop.messages[0]["content"]
    assert "[func_name1(" not in system and "<tool_call>" in system
    assert out.reward_score == 1.0 and out.extra_fields["reward_extra_info"]["tool_calls"] == 1.0
    assert server.calls[0]["prompt_ids"] == out.prompt_ids


async def test_env_kwargs_that_keep_the_prompt_keep_the_dataset_prompt(scripted_server, make_loop):
    """An override that does not touch the prompt (max_turns) leaves the row's prompt as written,
    edits included."""
    row = await _row()
    row["raw_prompt"] = [{**row["raw_prompt"][0], "content": "EDITED SYSTEM PROMPT"}, *row["raw_prompt"][1:]]
    for env_kwargs in ({}, {"max_turns": 3}):
        loop = make_loop(scripted_server([CALL, "<answer>42</answer>"]), env_kwargs=env_kwargs)
        out = await loop.run({}, **row)
        assert loop.messages[0]["content"] == "EDITED SYSTEM PROMPT" and out.reward_score == 1.0


async def test_mm_processor_kwargs_reach_the_server_and_the_output(tiny_tokenizer, make_loop):
    """`data.mm_processor_kwargs` (e.g. max_pixels) go with every generate call, as in verl's
    ToolAgentLoop, so the server renders images as the trainer does; the output carries them."""
    from verl.workers.rollout.replica import TokenOutput

    seen: list[dict[str, Any]] = []

    class Server:
        replies: ClassVar[list[str]] = [CALL, "<answer>42</answer>"]

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            seen.append(kw)
            ids = tiny_tokenizer.encode(self.replies[len(seen) - 1] + "<|im_end|>", add_special_tokens=False)
            return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids))

    loop = make_loop(Server())
    loop.mm_processor_kwargs = {"max_pixels": 200704}  # what verl reads from data.mm_processor_kwargs
    out = await loop.run({}, **await _row())
    assert [kw["mm_processor_kwargs"] for kw in seen] == [{"max_pixels": 200704}] * 2
    assert out.mm_processor_kwargs == {"max_pixels": 200704}


async def test_a_stop_string_turn_whose_observation_overflows_ends_on_the_models_token(
    tiny_tokenizer, scripted_server, make_loop
):
    """verl puts the episode's reward on the last response token, and PPO's GAE drops a reward
    on a mask-0 token. A turn cut by a stop string is closed with a mask-0 turn-end token only
    together with its observation: when the observation does not fit, the response ends on the
    model's last token, as generated, and the reward reaches the advantages."""
    import torch
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    tags = {"parser": "tags", "parser_kwargs": {"tags": {"calc": ["calculator", "expression"]}}}
    reply = "<calc>(12 + 30) / 2</calc>"
    n = len(tiny_tokenizer.encode(reply, add_special_tokens=False))
    server = scripted_server([(reply, False)])
    loop = make_loop(server, stop=["</calc>"], response_length=n + 3, max_turns=10)
    out = await loop.run({"logprobs": True}, **await _row({**PENALIZED, **tags}, index=1))
    assert out.extra_fields["toolenv_stop_reason"] == "response_length"
    assert out.response_ids == server.emitted[0] and out.response_mask == [1] * n
    assert len(out.response_logprobs) == n
    assert out.reward_score == -1.0

    rm_scores = out.as_dict()["rm_scores"]
    mask = torch.tensor([out.response_mask])
    # verl's GAE with zero values: the return of the first token is the reward (whitened
    # advantages of one sample say nothing, so read the returns).
    _, returns = compute_gae_advantage_return(
        rm_scores.unsqueeze(0), torch.zeros_like(rm_scores).unsqueeze(0), mask, gamma=1.0, lam=1.0
    )
    assert returns[0, 0].item() == -1.0


async def test_a_call_whose_markers_the_tokenizer_made_special_is_read(tiny_tokenizer, make_loop):
    """A tokenizer that marks `<tool_call>` special (some fine-tunes do; Qwen's do not): the reply
    was decoded without special tokens, and the env found no call in any turn."""
    import copy

    from tokenizers import AddedToken

    from .conftest import ScriptedServer

    tokenizer = copy.deepcopy(tiny_tokenizer)
    markers = [AddedToken(m, special=True, normalized=False) for m in ("<tool_call>", "</tool_call>")]
    tokenizer.add_special_tokens({"additional_special_tokens": markers})
    assert tokenizer.decode(tokenizer.encode(CALL, add_special_tokens=False), skip_special_tokens=True) != CALL
    server = ScriptedServer(tokenizer, [CALL, "The answer is <answer>42</answer>"])
    loop = make_loop(server, tokenizer=tokenizer)
    out = await loop.run({"temperature": 1.0}, **await _row())
    assert [m["role"] for m in loop.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert loop.messages[2]["content"] == CALL  # the markers kept, the closing <|im_end|> not
    assert out.extra_fields["reward_extra_info"]["tool_calls"] == 1.0 and out.reward_score == 1.0


async def test_preemptions_are_summed_and_unknown_when_the_server_reports_none(tiny_tokenizer, make_loop):
    """`AgentLoopMetrics.num_preempted`: -1 means the server did not report it (verl's servers
    leave it None unless the engine counts it), so a batch's `agent_loop/num_preempted` metrics
    do not claim zero preemptions they never saw; reported counts add up over the turns."""
    from verl.workers.rollout.replica import TokenOutput

    class Server:
        def __init__(self, counts: list[int | None]) -> None:
            self.counts, self.calls = counts, 0

        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
            text = [CALL, "<answer>42</answer>"][min(self.calls, 1)] + "<|im_end|>"
            count = self.counts[self.calls]
            self.calls += 1
            return TokenOutput(token_ids=tiny_tokenizer.encode(text, add_special_tokens=False), num_preempted=count)

    for counts, expected in (([None, None], -1), ([2, 1], 3), ([None, 1], 1)):
        out = await make_loop(Server(counts)).run({}, **await _row())
        assert out.metrics.num_preempted == expected, counts


async def test_a_qwen3_template_rewrites_earlier_turns_and_the_stream_keeps_what_the_model_saw(
    tiny_tokenizer, make_loop
):
    """Qwen3's template drops the `<think>` block of assistant turns before the last user query.
    With user observations that are not tool responses (the tags format's `<information>`), a
    re-rendering of the final conversation therefore differs from the stream; the stream keeps
    the reasoning, as the model saw it when it wrote the next turn (docs/verl.md says so). With
    tool observations the two are equal."""
    import copy

    from .conftest import ScriptedServer

    chat_template_utils = pytest.importorskip("trl.chat_template_utils", reason="Qwen3's template, as TRL ships it")
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = chat_template_utils.qwen3_chat_template
    tags = {"parser": "tags", "parser_kwargs": {"tags": {"calc": ["calculator", "expression"]}}}
    answer = "<think>\nDone.\n</think>\n\nThe answer is <answer>42</answer>"
    for env_kwargs, call, equal in (({}, CALL, True), (tags, "<calc>6 * 7</calc>", False)):
        server = ScriptedServer(tokenizer, ["<think>\nI will compute it.\n</think>\n\n" + call, answer])
        loop = make_loop(server, tokenizer=tokenizer, hf_model_type="qwen3")
        out = await loop.run({}, **await _row(env_kwargs))
        assert out.reward_score == 1.0
        assert out.response_ids[: len(server.emitted[0])] == server.emitted[0]
        assert "I will compute it." in tokenizer.decode(server.calls[1]["prompt_ids"])
        assert [m["role"] for m in loop.messages][3] == ("user" if env_kwargs else "tool")
        text = tokenizer.apply_chat_template(loop.messages, tokenize=False, add_generation_prompt=False)
        stream = out.prompt_ids + out.response_ids
        rendered = tokenizer.encode(text, add_special_tokens=False)
        assert (stream == rendered[: len(stream)]) is equal
        assert ("I will compute it." in text) is equal


def _notes_env(notes: str, **kwargs: Any) -> Any:
    """The calculator env whose factory reads a file of notes at once (a custom env that loads
    data when it is made): a path that is not there raises FileNotFoundError."""
    from toolenv.env import ToolEnv
    from toolenv.integrations.verl.demo import Calculator

    with open(notes, encoding="utf-8") as f:
        f.read()
    return ToolEnv(tools=[Calculator()], tasks=DEMO_TASKS, **kwargs)


async def test_a_row_env_that_cannot_be_made_in_the_worker_falls_back_to_the_rows_prompt(
    tmp_path, scripted_server, make_loop
):
    """The row names a data file of the machine that built the parquet; the loop's env_kwargs
    point at the worker's copy. The row's env cannot be made here (FileNotFoundError, not a
    ValueError), so the loop compares the row's prompt with the env's, as docs/verl.md says,
    rather than failing verl's whole batch."""
    import json

    import gymnasium as gym

    env_id = "toolenv-test/VerlNotes-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=_notes_env)
    there, here = tmp_path / "built-here.txt", tmp_path / "worker.txt"
    there.write_text("notes")
    here.write_text("notes")
    row = (await abuild_rows(env_id, env_kwargs={"notes": str(there)}))[0]
    there.unlink()  # the worker has no such file
    loop = make_loop(scripted_server([CALL, "<answer>42</answer>"]), env_kwargs={"notes": str(here)})
    out = await loop.run({}, raw_prompt=row["prompt"], extra_info=row["extra_info"])
    assert out.reward_score == 1.0 and out.extra_fields["toolenv_stop_reason"] == "terminated"
    assert json.loads(row["extra_info"]["env_kwargs"]) == {"notes": str(there)}
    assert [m["content"] for m in loop.messages[:2]] == [m["content"] for m in row["prompt"]]
