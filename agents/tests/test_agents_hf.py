"""The `transformers` agent with a tiny random Qwen2 model and a tokenizer built here (no download)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from _tools import Add
from pydantic import BaseModel

import toolenv
from toolenv.runner import arollout

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def _missing() -> str | None:
    for mod in ("torch", "transformers", "tokenizers"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (the transformers agent needs torch + toolenv-agents[transformers])"
    return None


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = _missing()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<answer>",
        "</answer>",
        "[TOOL_CALLS]",  # Mistral's control tokens, special as in its tokenizers
        "[ARGS]",
    ]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "What is 2 + 3? The answer is 5.",
        '{"name": "add", "arguments": {"a": 2, "b": 3}}',
        "system user assistant tool",
    ]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    out = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


async def test_generates_with_chat_template_tokens_and_logprobs(tiny_model: Path) -> None:
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=12)

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(
            tools=[Add()], tasks=[{"id": "t", "question": "What is 2 + 3?", "answer": "5"}], max_turns=2
        )

    res = await arollout(env, agent, n=1)
    traj = res.trajectories[0]
    assert traj.error is None and traj.model == str(tiny_model) and len(traj.turns) >= 1
    turn = traj.turns[0]
    assert turn.token_ids and len(turn.token_ids) <= 12 and turn.completion_tokens == len(turn.token_ids)
    assert turn.logprobs is not None and len(turn.logprobs) == len(turn.token_ids)
    assert all(lp <= 0.0 for lp in turn.logprobs)
    # The action is the decoded generation (special tokens dropped).
    text_ids = [i for i in turn.token_ids if i not in agent.tokenizer.all_special_ids]
    assert turn.action == agent.tokenizer.decode(text_ids, skip_special_tokens=True)
    # The prompt is the chat template with the env's messages. This template writes no tool calls,
    # so it gets no tools: the env's system message describes them, once.
    ids = agent.prompt_ids(traj.prompt_messages, toolenv.agent.EnvInfo("", traj.task, tool_schemas=[Add().schema()]))
    rendered = agent.tokenizer.decode(ids)
    assert rendered.startswith(f"<|im_start|>system\n{traj.prompt_messages[0].content}<|im_end|>")
    assert rendered.count('"name": "add"') == 1 and "Tools:" not in rendered
    assert rendered.endswith("<|im_start|>assistant") and "What is 2 + 3?" in rendered
    assert turn.prompt_tokens == len(ids)


async def test_greedy_is_deterministic(tiny_model: Path) -> None:
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=8)
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    msgs = [toolenv.Message(role="user", content="What is 2 + 3?")]
    a, b = await agent.act("", msgs, info), await agent.act("", msgs, info)
    assert a.token_ids == b.token_ids and a.text == b.text


def _steer(agent: Any, script: list[int]) -> None:
    """Make the real model's generate() emit `script` (then its last id) by rewriting its logits."""
    import torch

    step = [0]

    def hook(module: Any, args: Any, logits: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(logits, -1e4)
        forced[..., script[min(step[0], len(script) - 1)]] = 0.0
        step[0] += 1
        return forced

    agent.lm.lm_head.register_forward_hook(hook)


async def test_special_token_formats_keep_their_tokens(tiny_model: Path) -> None:
    """A parser written in special tokens (Mistral's `[TOOL_CALLS]`) gets them in the action text,
    as vLLM and verl decode for it; the closing EOS is still dropped."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=40)
    tok = agent.tokenizer
    call_ids = tok('[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}', add_special_tokens=False)["input_ids"]
    _steer(agent, [*call_ids, tok.eos_token_id])

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(
            tools=[Add()], tasks=[{"id": "t", "question": "2+3?", "answer": "5"}], parser="mistral", max_turns=1
        )

    traj = (await arollout(env, agent, n=1)).trajectories[0]
    turn = traj.turns[0]
    assert turn.action == '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}'
    assert turn.parsed.errors == [] and [(c.name, c.arguments) for c in turn.parsed.tool_calls] == [
        ("add", {"a": 2, "b": 3})
    ]
    assert turn.results[0].text == "5" and turn.token_ids == [*call_ids, tok.eos_token_id]


async def test_samples_of_a_task_are_sampled_independently(tiny_model: Path) -> None:
    """With temperature > 0, the samples of one task are different draws (GRPO needs them to be),
    and a fresh agent with the same seed draws them again."""
    from toolenv_agents.hf import TransformersAgent

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Add()], tasks=[{"id": "t", "question": "2+3?", "answer": "5"}], max_turns=1)

    async def draws() -> dict[int, list[int] | None]:
        agent = TransformersAgent(tiny_model, max_new_tokens=8, temperature=1.0, seed=7)
        res = await arollout(env, agent, n=1, samples=4, concurrency=2)
        return {t.sample: t.turns[0].token_ids for t in res.trajectories}

    first = await draws()
    assert len({tuple(ids or []) for ids in first.values()}) == 4
    assert await draws() == first


async def test_a_retried_sample_draws_as_in_the_whole_run(tiny_model: Path, tmp_path: Path) -> None:
    """A retried (or resumed) episode is seeded by its place in the run: counted by spawns, the
    retry of sample 2 took sample 0's seed and drew its reply again."""
    from toolenv_agents.hf import TransformersAgent

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(tools=[Add()], tasks=[{"id": "t", "question": "2+3?", "answer": "5"}], max_turns=1)

    agent = TransformersAgent(tiny_model, max_new_tokens=8, temperature=1.0, seed=7)
    whole = await arollout(env, agent, n=1, samples=3, concurrency=1, out=tmp_path / "run")
    drawn = {t.sample: t.turns[0].token_ids for t in whole.trajectories}
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    (tmp_path / "run" / "trajectories.jsonl").write_text("\n".join(lines[:2]) + "\n")  # sample 2 not done
    resumed = await arollout(env, agent, n=1, samples=3, concurrency=1, out=tmp_path / "run", resume=True)
    again = [t for t in resumed.trajectories if t.sample == 2]
    assert len(again) == 1 and again[0].turns[0].token_ids == drawn[2] != drawn[0]


async def test_queued_generations_leave_the_default_executor_to_tools(tiny_model: Path) -> None:
    """Episodes waiting for the model hold no thread of the loop's default executor, where sync
    tools run (`asyncio.to_thread`): a tool call goes ahead while generations are queued."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=2)
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
    release = threading.Event()
    real = agent.lm.generate

    def gated(*args: Any, **kwargs: Any) -> Any:  # the first generation waits for the "tool" below
        release.wait()
        return real(*args, **kwargs)

    agent.lm.generate = gated
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    msgs = [toolenv.Message(role="user", content="What is 2 + 3?")]
    acts = [asyncio.create_task(agent.act("", msgs, info)) for _ in range(4)]
    try:
        # A hang guard, not a timing check: on the old code the tool never gets a thread.
        await asyncio.wait_for(asyncio.to_thread(release.set), timeout=20)
    finally:
        release.set()
        done = await asyncio.gather(*acts)
    assert [len(a.token_ids or []) for a in done] == [2, 2, 2, 2]


# Mistral's templates check each tool message's call id (this check is theirs) and pair it with its call.
MISTRAL_LIKE_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}"
    "{%- if m['tool_call_id'] is not defined or m['tool_call_id'] | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}"
    "[TOOL_RESULTS]{{ m['tool_call_id'] }}[TOOL_CONTENT]{{ m['content'] }}[/TOOL_RESULTS]"
    "{%- elif m['role'] == 'assistant' %}{{ m['content'] }}<|im_end|>"
    "{%- else %}[INST]{{ m['content'] }}[/INST]"
    "{%- endif %}{%- endfor %}"
)


@pytest.mark.parametrize(
    ("reply", "tail"),
    [
        ('[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}', "[TOOL_RESULTS]call00000[TOOL_CONTENT]5[/TOOL_RESULTS]"),
        ("[TOOL_CALLS]add[ARGS]{oops", "[INST]Tool call 1"),  # a parse error answers no call: a user turn
    ],
)
async def test_tool_results_reach_the_template_with_their_call_ids(tiny_model: Path, reply: str, tail: str) -> None:
    """Tool messages keep `tool_call_id` and `name` (as verl's loop sends them); results that
    answer no call (parse errors) go as one user message, which such templates accept."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=40)
    tok = agent.tokenizer
    tok.chat_template = MISTRAL_LIKE_TEMPLATE
    _steer(agent, [*tok(reply, add_special_tokens=False)["input_ids"], tok.eos_token_id])
    prompts: list[str] = []
    render = agent.prompt_ids

    def spy(messages: list[toolenv.Message], env_info: toolenv.agent.EnvInfo) -> list[int]:
        ids = render(messages, env_info)
        prompts.append(tok.decode(ids))
        return ids

    agent.prompt_ids = spy  # type: ignore[method-assign]

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(
            tools=[Add()], tasks=[{"id": "t", "question": "2+3?", "answer": "5"}], parser="mistral", max_turns=2
        )

    traj = (await arollout(env, agent, n=1)).trajectories[0]
    assert traj.error is None and len(traj.turns) == 2
    after_turn_0 = prompts[1].rsplit("<|im_end|>", 1)[1]
    assert after_turn_0.startswith(tail) and after_turn_0.count("[INST]") == (tail == "[INST]Tool call 1")


async def test_generation_stops_at_the_tokenizers_eos(tiny_model: Path, tmp_path: Path) -> None:
    """A checkpoint whose generation config names another EOS than its tokenizer (a base model's
    `<|endoftext|>` after chat fine-tuning set `<|im_end|>`) still ends its turn at the
    tokenizer's EOS, as vLLM stops on both: the action is not followed by a made-up next turn."""
    import json
    import shutil

    from toolenv_agents.hf import TransformersAgent

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model, ckpt)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    tok_cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    agent = TransformersAgent(tiny_model, max_new_tokens=40)
    tok = agent.tokenizer
    gen["eos_token_id"] = tok.pad_token_id  # <|endoftext|>; the tokenizer's EOS stays <|im_end|>
    (ckpt / "generation_config.json").write_text(json.dumps(gen))
    assert tok_cfg.get("eos_token") == "<|im_end|>"
    agent = TransformersAgent(ckpt, max_new_tokens=40)
    answer = tok("The answer is 5.", add_special_tokens=False)["input_ids"]
    chatter = tok("<|im_start|>user\nWhat is 2 + 3?", add_special_tokens=False)["input_ids"]
    _steer(agent, [*answer, tok.eos_token_id, *chatter])
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="2+3?"))
    action = await agent.act("", [toolenv.Message(role="user", content="What is 2 + 3?")], info)
    assert action.token_ids == [*answer, tok.eos_token_id]
    assert action.text == "The answer is 5."


async def test_a_reply_cut_by_max_new_tokens_is_marked(tiny_model: Path) -> None:
    """As the `openai` agent records the server's `finish_reason`, a generation that ran out of
    `max_new_tokens` says `length` (a half-written call is told apart from a finished turn);
    one that ended at EOS or at a parser stop string says `stop`."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=6)
    tok = agent.tokenizer
    words = tok("What is 2 + 3? The answer is 5.", add_special_tokens=False)["input_ids"]
    assert len(words) > 6
    script = [0]  # which script the hook follows
    scripts = [words, [*words[:2], tok.eos_token_id], tok("is 5.", add_special_tokens=False)["input_ids"]]
    step = [0]

    def hook(module: Any, args: Any, logits: Any) -> Any:
        import torch

        ids = scripts[script[0]]
        forced = torch.full_like(logits, -1e4)
        forced[..., ids[min(step[0], len(ids) - 1)]] = 0.0
        step[0] += 1
        return forced

    agent.lm.lm_head.register_forward_hook(hook)
    msgs = [toolenv.Message(role="user", content="What is 2 + 3?")]
    plain = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    cut = await agent.act("", msgs, plain)
    assert len(cut.token_ids or []) == 6 and cut.metadata["finish_reason"] == "length"
    script[0], step[0] = 1, 0
    done = await agent.act("", msgs, plain)
    assert done.token_ids == [*words[:2], tok.eos_token_id] and done.metadata["finish_reason"] == "stop"
    script[0], step[0] = 2, 0
    parser = toolenv.parsers.get_parser("tags")
    parser.stop = ("5.",)  # a stop string the scripted reply reaches before its budget
    stops = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"), parser=parser)
    at_stop = await agent.act("", msgs, stops)
    assert at_stop.text.endswith("5.") and at_stop.metadata["finish_reason"] == "stop"


async def test_logprobs_are_computed_as_generation_goes_and_no_vocab_sized_scores_are_kept(tiny_model: Path) -> None:
    """The recorded log-probs are those of `generate`'s own scores (the distribution sampled
    from, after temperature and top-p), but the vocab-sized score of each step is not kept
    until the turn ends (1,000 tokens of a 150k vocab would be 600 MB)."""
    import torch

    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=24, temperature=0.8, top_p=0.9, seed=3)
    vocab = agent.lm.config.vocab_size
    real = agent.lm.generate
    seen: dict[str, Any] = {}

    def replayed(*args: Any, **kwargs: Any) -> Any:
        state = torch.get_rng_state()
        out = real(*args, **kwargs)
        seen["kept"] = [s for s in (out.scores or ()) if s.numel() >= vocab]
        # The reference: the same call again, same RNG state, without the agent's own criteria.
        torch.set_rng_state(state)
        kwargs.pop("stopping_criteria", None)
        seen["ref"] = real(*args, **kwargs)
        return out

    agent.lm.generate = replayed
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    action = await agent.act("", [toolenv.Message(role="user", content="What is 2 + 3?")], info)
    ref = seen["ref"]
    ids = action.token_ids or []
    assert ids and ref.sequences[0, -len(ids) :].tolist() == ids
    expected = [float(torch.log_softmax(s[0].float(), dim=-1)[t]) for s, t in zip(ref.scores, ids, strict=True)]
    assert action.logprobs == pytest.approx(expected, abs=1e-5)
    assert seen["kept"] == []  # what generate returned holds no vocab-sized score
    # Nothing vocab-sized reaches the action either.
    assert all(not isinstance(v, torch.Tensor) for v in action.model_dump().values())


async def test_a_cancelled_turn_stops_generating(tiny_model: Path) -> None:
    """An `act` cancelled mid-generation (an episode timeout, a stopped run) stops the model at its
    next token, rather than keeping the model's one worker busy to `max_new_tokens` while the
    other episodes' turns wait behind it."""
    import threading

    import torch

    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=300)
    tok = agent.tokenizer
    word = tok("answer", add_special_tokens=False)["input_ids"][0]
    loop = asyncio.get_running_loop()
    steps = [0]
    cancelled_seen = threading.Event()
    task: asyncio.Task[Any] | None = None

    def hook(module: Any, args: Any, logits: torch.Tensor) -> torch.Tensor:
        steps[0] += 1
        if steps[0] == 5:  # mid-generation: cancel the turn, and go on once the loop has seen it
            assert task is not None
            loop.call_soon_threadsafe(task.cancel)
            assert cancelled_seen.wait(timeout=30)  # a hang guard only
        forced = torch.full_like(logits, -1e4)
        forced[..., word] = 0.0  # never EOS
        return forced

    agent.lm.lm_head.register_forward_hook(hook)
    lengths: list[int] = []
    real = agent.lm.generate

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        lengths.append(out.sequences.shape[1] - args[0].shape[1])
        return out

    agent.lm.generate = counted
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    msgs = [toolenv.Message(role="user", content="What is 2 + 3?")]
    task = asyncio.create_task(agent.act("", msgs, info))
    with pytest.raises(asyncio.CancelledError):
        await task
    cancelled_seen.set()
    agent.max_new_tokens = 3
    after = await agent.act("", msgs, info)  # the model's worker runs it once the cancelled one has ended
    assert len(after.token_ids or []) == 3
    assert lengths[0] < 10  # stopped right after the cancellation, not at 300 tokens


async def test_a_stop_string_ending_inside_a_token_ends_the_action(tiny_model: Path) -> None:
    """`generate` stops on a token that runs past a stop string (`stop_strings` matches such
    overhangs): the action ends at the stop string, as a server's does, and the turn counts as
    stopped, not cut, even when that token was the last of the budget."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=4)
    tok = agent.tokenizer
    words = tok("The answer is 5.", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in words[:4]] == ["Th", "e", " ", "an"]
    _steer(agent, words)
    parser = toolenv.parsers.get_parser("tags")
    parser.stop = ("The a",)  # ends inside the token "an"
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"), parser=parser)
    action = await agent.act("", [toolenv.Message(role="user", content="What is 2 + 3?")], info)
    assert action.token_ids == words[:4]
    assert action.text == "The a" and action.metadata["finish_reason"] == "stop"


async def test_prompt_token_ids_are_recorded_when_asked(tiny_model: Path) -> None:
    """`record_prompt_ids=True`: each turn keeps the prompt's ids as the model read them (the
    rendering of that turn's messages); by default only their count."""
    from toolenv_agents.hf import TransformersAgent

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(
            tools=[Add()], tasks=[{"id": "t", "question": "What is 2 + 3?", "answer": "5"}], max_turns=2
        )

    agent = TransformersAgent(tiny_model, max_new_tokens=4, record_prompt_ids=True)
    traj = (await arollout(env, agent, n=1)).trajectories[0]
    assert traj.error is None and len(traj.turns) == 2
    first, second = traj.turns
    info = toolenv.agent.EnvInfo("", traj.task, tool_schemas=[Add().schema()])
    assert first.prompt_token_ids == agent.prompt_ids(traj.prompt_messages, info)
    assert first.prompt_tokens == len(first.prompt_token_ids)
    assert second.prompt_token_ids is not None and second.prompt_tokens == len(second.prompt_token_ids)
    assert second.prompt_tokens > first.prompt_tokens  # the first turn and its observation came in between
    plain = (await arollout(env, TransformersAgent(tiny_model, max_new_tokens=4), n=1)).trajectories[0]
    assert all(t.prompt_token_ids is None and t.prompt_tokens for t in plain.turns)


async def test_a_hermes_call_reaches_the_env_when_the_tokenizer_made_its_markers_special(tiny_model: Path) -> None:
    """This tokenizer marks `<tool_call>` special (some fine-tunes do; Qwen's do not): decoding the
    reply without special tokens left the env no call to run. The markers stay; the EOS goes."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=60)
    tok = agent.tokenizer
    assert "<tool_call>" in tok.all_special_tokens or any(
        t.special for t in tok.added_tokens_decoder.values() if t.content == "<tool_call>"
    )
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    _steer(agent, [*tok(call, add_special_tokens=False)["input_ids"], tok.eos_token_id])

    def env() -> toolenv.ToolEnv:
        return toolenv.ToolEnv(
            tools=[Add()], tasks=[{"id": "t", "question": "2+3?", "answer": "5"}], parser="hermes", max_turns=1
        )

    traj = (await arollout(env, agent, n=1)).trajectories[0]
    turn = traj.turns[0]
    assert traj.error is None and turn.action == call
    assert [c.name for c in turn.parsed.tool_calls] == ["add"] and turn.results[0].text == "5"


class Search(toolenv.Tool):
    """Look a phrase up in the encyclopedia."""

    name = "search"

    class Args(BaseModel):
        query: str

    async def run(self, args: Args, ctx: toolenv.ToolContext) -> toolenv.ToolResult:  # type: ignore[override]
        return toolenv.ToolResult(text="Paris is in France.")


def _real_template(name: str) -> str:
    """A model family's real chat template, as TRL ships it (no download)."""
    trl = pytest.importorskip("trl", reason="the real chat templates come with trl (pip install toolenv[trl])")
    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


async def _first_prompt(agent: Any, tool: toolenv.Tool, parser: str) -> tuple[str, str, str, toolenv.ToolEnv]:
    """The system message the env sent, the whole prompt the model read for one turn, and the
    env's system message with its full instructions (the tools and how to call them)."""

    def env() -> toolenv.ToolEnv:
        task = {"id": "t", "question": "Q?", "answer": "A"}
        return toolenv.ToolEnv(tools=[tool], tasks=[task], parser=parser, max_turns=1)

    traj = (await arollout(env, agent, n=1)).trajectories[0]
    assert traj.error is None and traj.turns[0].prompt_token_ids is not None
    fresh = env()
    full = fresh.render_prompt(fresh.tasks[0])[1][0].content
    return traj.prompt_messages[0].content, agent.tokenizer.decode(traj.turns[0].prompt_token_ids), full, fresh


async def test_a_template_writing_the_parsers_format_gets_the_tools_once(tiny_model: Path) -> None:
    """Qwen2.5's template writes `<tool_call>` JSON, which `hermes` reads: the tools go to the
    template and the env's prompt only says how to answer, so the model sees each tool once."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=2, record_prompt_ids=True)
    agent.tokenizer.chat_template = _real_template("qwen2_5")
    system, rendered, full, env = await _first_prompt(agent, Add(), "hermes")
    assert system == env.parser.answer_instructions() != full
    assert "# Tools" in rendered and rendered.count("Add two integers.") == 1  # the template's block only
    assert agent.uses_native_tools(env.parser)


async def test_a_template_writing_another_format_gets_no_tools(tiny_model: Path) -> None:
    """Search-R1's `tags` parser reads `<search>...</search>`, which Qwen's template does not write:
    the template gets no tools (it would teach `<tool_call>` JSON) and the env keeps its own
    instructions, so the model is taught one call format, the env's."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=2, record_prompt_ids=True)
    agent.tokenizer.chat_template = _real_template("qwen2_5")
    system, rendered, full, env = await _first_prompt(agent, Search(), "tags")
    assert system == full and "<search>" in system
    assert "# Tools" not in rendered and "<tool_call>" not in rendered
    assert rendered.count("Look a phrase up in the encyclopedia.") == 1
    assert not agent.uses_native_tools(env.parser)


async def test_a_template_without_tool_calls_gets_no_tools(tiny_model: Path) -> None:
    """A template that lists tools but cannot write a call (this tiny one) has no format of its own
    to teach: the env's instructions describe the tools, once."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=2, record_prompt_ids=True)
    system, rendered, full, env = await _first_prompt(agent, Add(), "hermes")
    assert system == full
    assert "Tools:" not in rendered and rendered.count("Add two integers.") == 1
    assert not agent.uses_native_tools(env.parser)


@pytest.mark.parametrize("forced", [True, False])
async def test_native_tools_can_be_forced_either_way(tiny_model: Path, forced: bool) -> None:
    """`native_tools=True` / `False` overrides the template check, for the prompt and the template alike."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=2, record_prompt_ids=True, native_tools=forced)
    agent.tokenizer.chat_template = _real_template("qwen2_5")
    # The check would say the opposite: tags is not Qwen's format, hermes is.
    system, rendered, full, env = await _first_prompt(agent, Search(), "tags" if forced else "hermes")
    assert agent.uses_native_tools(env.parser) is forced
    assert ("# Tools" in rendered) is forced
    assert system == (env.parser.answer_instructions() if forced else full) != ""
    assert rendered.count("Look a phrase up in the encyclopedia.") == 1


async def test_the_template_check_runs_once_per_parser(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision is cached per parser and shared by the spawned copies: not re-rendered per turn."""
    import toolenv_agents.hf as hf

    agent = hf.TransformersAgent(tiny_model, max_new_tokens=2)
    agent.tokenizer.chat_template = _real_template("qwen2_5")
    calls: list[str] = []
    check = hf.template_mismatch

    def counted(parser: Any, tokenizer: Any) -> str | None:
        calls.append(parser.name)
        return check(parser, tokenizer)

    monkeypatch.setattr(hf, "template_mismatch", counted)
    hermes, tags = toolenv.parsers.get_parser("hermes"), toolenv.parsers.get_parser("tags")
    for twin in (agent, agent.spawn(), agent.spawn()):
        assert twin.uses_native_tools(hermes) and not twin.uses_native_tools(tags)
        assert twin.uses_native_tools(toolenv.parsers.get_parser("hermes"))
    assert sorted(calls) == ["hermes", "tags"]


async def test_a_prompt_over_the_models_context_is_an_agent_error(tiny_model: Path) -> None:
    """A prompt longer than the model's context (`max_position_embeddings`) is refused with one
    clear line, as a server refuses it, rather than generated from past the positions the model
    was trained on (transformers only logs a warning and returns garbage tokens to train on)."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=8)
    context = agent.lm.config.max_position_embeddings
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    long = [toolenv.Message(role="user", content="What is 2 + 3? " * context)]
    assert len(agent.prompt_ids(long, info)) > context
    with pytest.raises(toolenv.agent.AgentError, match=rf"prompt of \d+ tokens.*context of {context} tokens"):
        await agent.act("", long, info)


async def test_the_budget_stops_at_the_models_context(tiny_model: Path) -> None:
    """A prompt that fits but leaves less room than `max_new_tokens` generates up to the context
    and no further, marked `length`, as vLLM caps `max_tokens`."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=50)
    context = agent.lm.config.max_position_embeddings
    tok = agent.tokenizer
    _steer(agent, tok("answer", add_special_tokens=False)["input_ids"][:1])  # never EOS
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    filler = "x" * (context - 20 - len(agent.prompt_ids([toolenv.Message(role="user", content="")], info)))
    msgs = [toolenv.Message(role="user", content=filler)]
    prompt = agent.prompt_ids(msgs, info)
    assert context - 50 < len(prompt) < context
    action = await agent.act("", msgs, info)
    assert len(prompt) + len(action.token_ids or []) == context
    assert action.metadata["finish_reason"] == "length"


def test_the_context_of_a_rope_scaled_model_is_its_scaled_length() -> None:
    """Qwen's documented YaRN setting (factor 4 over 32,768 positions) gives 131,072 tokens, as
    vLLM reads it: long prompts that the scaled model takes are not refused."""
    pytest.importorskip("transformers", reason="needs transformers")
    from transformers import Qwen2Config

    from toolenv_agents.hf import _context_length

    yarn = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
    assert _context_length(Qwen2Config(max_position_embeddings=32768, rope_scaling=yarn)) == 131072
    assert _context_length(Qwen2Config(max_position_embeddings=32768)) == 32768


async def test_an_image_in_the_conversation_is_an_agent_error_not_dropped(tiny_model: Path) -> None:
    """The agent feeds the model text only: a message with images (VisualSearch's photo, a crop
    tool's result) ends the episode with one clear line rather than asking the model about a
    photo it never receives."""
    from PIL import Image

    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=2)
    image = toolenv.ToolImage.from_pil(Image.new("RGB", (8, 8), "red"))
    msgs = [toolenv.Message(role="user", content="What colour is this photo?", images=[image])]
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="colour?"))
    with pytest.raises(toolenv.agent.AgentError, match=r"message 0 \(user\) carries 1 image.*text only"):
        await agent.act("", msgs, info)


THINKING_TEMPLATE = CHAT_TEMPLATE + (
    "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)


async def test_chat_template_kwargs_reach_the_template(tiny_model: Path) -> None:
    """`chat_template_kwargs` (Qwen3's `enable_thinking=False`) go to every rendering of the
    prompt, as verl and vLLM pass them; without them the template renders its default."""
    from toolenv_agents.hf import TransformersAgent

    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"))
    msgs = [toolenv.Message(role="user", content="What is 2 + 3?")]
    off = TransformersAgent(tiny_model, max_new_tokens=2, chat_template_kwargs={"enable_thinking": False})
    off.tokenizer.chat_template = THINKING_TEMPLATE
    assert off.tokenizer.decode(off.prompt_ids(msgs, info)).endswith("<|im_start|>assistant<think>\n\n</think>\n\n")
    action = await off.act("", msgs, info)
    assert action.prompt_tokens == len(off.prompt_ids(msgs, info))
    default = TransformersAgent(tiny_model, max_new_tokens=2)
    default.tokenizer.chat_template = THINKING_TEMPLATE
    assert "<think>" not in default.tokenizer.decode(default.prompt_ids(msgs, info))
    with pytest.raises(toolenv.agent.AgentError, match="cannot set add_generation_prompt, tools"):
        TransformersAgent(tiny_model, chat_template_kwargs={"tools": [], "add_generation_prompt": False})


async def test_a_turn_of_parallel_hermes_calls_is_not_cut_at_the_first(tiny_model: Path) -> None:
    """Qwen/Hermes templates write each call in its own `<tool_call>` block and end the turn with
    EOS after the last: stopping at the first `</tool_call>` allowed one call a turn."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=80)
    tok = agent.tokenizer
    one = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    two = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 2}}</tool_call>'
    ids = tok(one + two, add_special_tokens=False)["input_ids"]
    _steer(agent, [*ids, tok.eos_token_id])
    parser = toolenv.parsers.get_parser("hermes")
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="hi"), parser=parser)
    action = await agent.act("", [toolenv.Message(role="user", content="What is 2 + 3?")], info)
    assert action.text == one + two and action.token_ids == [*ids, tok.eos_token_id]
    assert len(parser.parse(action.text).tool_calls) == 2 and action.metadata["finish_reason"] == "stop"


def _gptoss_template() -> str:
    trl = pytest.importorskip("trl", reason="gpt-oss's chat template comes with trl")
    return (Path(trl.__file__).parent / "chat_templates" / "gptoss.jinja").read_text(encoding="utf-8")


async def test_a_gpt_oss_episode_goes_on_after_its_tool_calls(tiny_model: Path) -> None:
    """gpt-oss's template takes a call only from an assistant message's `tool_calls` (one per
    message), refuses Harmony markers in `content`, and refuses a tool message that follows no
    call: the agent sent the model's raw text, so every turn after a call failed with "Message has
    tool role, but there was no previous assistant message with a tool call!". Each call now goes
    as its own assistant message right before its result, as the Harmony format writes them."""
    from toolenv_agents.hf import TransformersAgent

    agent = TransformersAgent(tiny_model, max_new_tokens=4)
    agent.tokenizer.chat_template = _gptoss_template()
    parser = toolenv.parsers.get_parser("harmony")
    action = (
        "<|channel|>analysis<|message|>Add both pairs.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>'
        '<|start|>assistant<|channel|>commentary to=functions.sub <|constrain|>json<|message|>{"a": 9, "b": 4}<|call|>'
    )
    calls = parser.parse(action).tool_calls
    assert [c.name for c in calls] == ["add", "sub"]
    messages = [
        toolenv.Message(role="system", content="Use the tools."),
        toolenv.Message(role="user", content="2+3 and 9-4?"),
        toolenv.Message(role="assistant", content=action, tool_calls=calls),
        toolenv.Message(role="tool", content="5", name="add", tool_call_id=calls[0].id),
        toolenv.Message(role="tool", content="5", name="sub", tool_call_id=calls[1].id),
    ]
    info = toolenv.agent.EnvInfo("", toolenv.Task(id="x", question="2+3?"), parser=parser)
    rendered = agent.tokenizer.decode(agent.prompt_ids(messages, info))
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Add both pairs.<|end|>"
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 2, "b": 3}<|call|>'
        '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"5"<|end|>'
        '<|start|>assistant to=functions.sub<|channel|>commentary json<|message|>{"a": 9, "b": 4}<|call|>'
        '<|start|>functions.sub to=assistant<|channel|>commentary<|message|>"5"<|end|>'
        "<|start|>assistant"
    ) in rendered
    assert rendered.endswith("<|start|>assistant")
