"""The `transformers` agent: a local Hugging Face causal LM with its chat template.

The env's messages are rendered with the tokenizer's chat template. The env's tool schemas
go to the template as `tools` (native tool calling: the env's prompt then only says how to
answer) when the template writes tool calls in the format the env's parser reads (Qwen's and
`hermes`); otherwise (Search-R1's `tags`, a template without tool calls) the template gets no
tools and the env's prompt teaches its own format, so the model sees one description of the
tools and one call format. The model generates until EOS (the tokenizer's or the generation
config's) or one of the parser's stop strings (less one that closes one of several calls a turn,
Hermes's `</tool_call>`: the template's end of turn ends the call list, so a turn may hold
parallel calls), and the action carries the generated token ids and their log-probabilities —
what an RL trainer needs, computed token by token so that no vocab-sized scores are kept —
and a `finish_reason` (`length` when `max_new_tokens` or the model's context ran out; a
prompt that fills the context is an `AgentError`). A cancelled `act` (an episode timeout)
stops its generation at the next token. The model is fed text only: a message with images
is an `AgentError`, never silently dropped.
Formats written in special tokens (`parser.special_tokens`: Harmony, Mistral...) are
decoded with those tokens kept, as vLLM and verl do for them.
Generation runs in the model's own worker thread, one at a time per model, so the event
loop keeps stepping other episodes' tools meanwhile (and queued episodes hold no thread
of the loop's default executor, where sync tools run). Works on the CPU.

Needs the `transformers` extra and torch (install the build you want first).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from toolenv.agent import Agent, AgentAction, AgentError, EnvInfo
from toolenv.parsers import detect_parser, template_mismatch
from toolenv.parsers.base import ActionParser
from toolenv.parsers.decoding import reply_text
from toolenv.types import Message
from toolenv_agents._seeds import episode_seed
from toolenv_agents._stops import chat_stops

__all__ = ["TransformersAgent"]


@functools.cache
def _step_watch_class() -> type[Any]:
    """`_StepWatch`, built on first use: transformers is imported only by the agent."""
    import torch
    from transformers import StoppingCriteria

    class _StepWatch(StoppingCriteria):
        """A stopping criterion that runs after each generated token: it keeps the chosen
        token's log-prob under that step's scores (the distribution sampled from) and frees the
        vocab-sized scores, which `generate` would otherwise hold for the whole reply (a 1,000-token
        reply of a 150k vocab: 600 MB); and it stops generating once the turn is cancelled."""

        def __init__(self, cancelled: threading.Event) -> None:
            self.cancelled = cancelled
            self.logprobs: list[torch.Tensor] = []  # 0-d, on the model's device: no sync per token

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            if scores:  # generate's tuple of the steps' scores so far; the last is this step's
                step = scores[-1]
                row = step[0].float()
                self.logprobs.append(row[input_ids[0, -1]] - torch.logsumexp(row, dim=-1))
                step.set_()  # empty it in place: the tuple generate returns holds no vocab-sized tensor
            return torch.full((input_ids.shape[0],), self.cancelled.is_set(), device=input_ids.device)

    return _StepWatch


def _context_length(config: Any) -> int | None:
    """The model's context in tokens, as vLLM derives it: `max_position_embeddings`, times a
    linear, dynamic or YaRN RoPE scaling factor (YaRN's from its original length); None if unknown."""
    text = config.get_text_config()
    length = getattr(text, "max_position_embeddings", None)
    if not isinstance(length, int):
        return None
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if kind in ("linear", "dynamic", "yarn") and isinstance(factor, int | float) and factor > 1:
        base = rope.get("original_max_position_embeddings") if kind == "yarn" else None
        return int((base if isinstance(base, int) else length) * factor)
    return length


def _harmony(m: Message, parser: ActionParser) -> list[tuple[str, dict[str, Any]]]:
    """An assistant turn as gpt-oss's chat template takes it, as (call id, message) pairs: each
    call in a message of its own (the template writes one call per message and names a result
    after the last call before it), the first with the turn's text outside its Harmony messages
    (its analysis) as `content`; a turn without calls as its answer (or that text). The template
    refuses Harmony markers in `content`, so the model's raw text cannot go as it is."""
    parsed = parser.parse(m.content)
    if not m.tool_calls:
        return [("", {"role": "assistant", "content": parsed.answer if parsed.answer is not None else parsed.text})]
    out = []
    for k, call in enumerate(m.tool_calls):
        wire = [{"type": "function", "function": {"name": call.name, "arguments": call.arguments}}]
        out.append((call.id, {"role": "assistant", "content": "" if k else parsed.text, "tool_calls": wire}))
    return out


class TransformersAgent(Agent):
    """Generates actions with a local model.

    Args:
        model: a local model directory (or a hub id when the hub is reachable).
        device: a torch device string (`"cpu"`, `"cuda"`).
        max_new_tokens: the generation budget per action.
        temperature: 0 for greedy decoding, otherwise sampling at this temperature.
        top_p: nucleus sampling when sampling.
        seed: seeds sampling. Each action reseeds with `seed + turn`, offset per episode (by
            its place in the rollout, `EnvInfo.episode`, so a resumed or retried episode draws as
            in the whole run; else per copy `spawn()`ed from this agent), so that the samples of
            one task are different draws and a fresh agent with the same seed draws them again.
        tool_role: the role given to tool results (`"tool"`, or `"user"` for templates without it).
        dtype: torch dtype name (`"float32"`, `"bfloat16"`).
        record_prompt_ids: record each turn's prompt token ids (`AgentAction.prompt_token_ids`)
            as the model read them: what a trainer needs to score the exact tokens (a template
            may render earlier turns differently later). Off by default: they repeat the whole
            conversation every turn.
        native_tools: give the env's tools to the chat template and leave the env's prompt only
            the answer instructions (True), or give the template no tools and let the env's prompt
            describe them and its call format (False). None (the default) decides per env: native
            when the template writes tool calls that the env's parser reads
            (`toolenv.parsers.template_mismatch`), checked once per parser.
        max_model_len: the model's context in tokens (default: its config's
            `max_position_embeddings`, times a linear, dynamic or YaRN RoPE scaling factor, as vLLM
            derives it). A prompt that fills it is an `AgentError`, and generation stops at it
            (`finish_reason` `length`), as vLLM does.
        chat_template_kwargs: more variables for the chat template on every turn, e.g.
            `{"enable_thinking": False}` for Qwen3 (as vLLM's and verl's `chat_template_kwargs`).
    """

    name = "transformers"

    def __init__(
        self,
        model: str | Path,
        *,
        device: str = "cpu",
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        tool_role: str = "tool",
        dtype: str = "float32",
        record_prompt_ids: bool = False,
        native_tools: bool | None = None,
        max_model_len: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise AgentError(
                f"the transformers agent needs torch and transformers ({exc}); "
                "install torch, then toolenv-agents[transformers]"
            ) from exc
        self.model = str(model)
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.tool_role = tool_role
        self.record_prompt_ids = record_prompt_ids
        self.force_native_tools = native_tools
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        own = {"conversation", "tools", "add_generation_prompt", "tokenize"}  # what prompt_ids passes
        taken = sorted(self.chat_template_kwargs.keys() & own)
        if taken:
            raise AgentError(f"chat_template_kwargs cannot set {', '.join(taken)}: the agent sets them")
        # The template check's verdicts by parser (type, name), shared by spawned copies; the key
        # None: whether the template writes tool calls at all.
        self._native: dict[tuple[type[ActionParser], str] | None, bool] = {}
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        loaded: Any = AutoModelForCausalLM.from_pretrained(self.model, dtype=getattr(torch, dtype))
        self.lm: Any = loaded.to(device)
        self.lm.eval()
        if self.tokenizer.chat_template is None:
            raise AgentError(f"the tokenizer of {self.model} has no chat template")
        self.max_model_len = _context_length(self.lm.config) if max_model_len is None else max_model_len
        self._lock = threading.Lock()  # one generate() at a time per model
        # The model's own thread: episodes queued for it hold none of the default executor's.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolenv-transformers")
        gen_eos = getattr(self.lm.generation_config, "eos_token_id", None)
        eos = [self.tokenizer.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])]
        self._eos_ids = {int(i) for i in eos if i is not None}
        self._episodes = itertools.count(1)  # shared by spawned copies
        self._episode = 0  # 0: not spawned (direct use)

    def spawn(self) -> TransformersAgent:
        """A copy for one episode, sharing the model, with its own sampling seeds."""
        twin = super().spawn()
        assert isinstance(twin, TransformersAgent)
        twin._episode = next(self._episodes)
        return twin

    def uses_native_tools(self, parser: ActionParser | None) -> bool:
        """True when the chat template writes tool calls in `parser`'s format (or in any format a
        parser reads, without a parser), or as `native_tools` forces: the runner then resets the
        env with `native_tools` and `prompt_ids` gives the template the tools, one decision for both.
        """
        if self.force_native_tools is not None:
            return self.force_native_tools
        if None not in self._native:  # a template without tool calls has no format of its own to teach
            self._native[None] = detect_parser(self.tokenizer) is not None
        if parser is None or not self._native[None]:
            return self._native[None]
        key = (type(parser), parser.name)
        if key not in self._native:
            self._native[key] = template_mismatch(parser, self.tokenizer) is None
        return self._native[key]

    def _chat(self, messages: list[Message], parser: ActionParser | None = None) -> list[dict[str, Any]]:
        """The messages as chat-template dicts. A turn's tool results keep their call id and tool
        name (Mistral's templates require the id, Gemma 4's write the name); results that answer
        no call (parse errors) follow as one user message, as `toolenv.types.reply_messages` sends
        them, since templates that pair results with calls reject a tool message without an id.
        With the Harmony `parser`, assistant turns go as gpt-oss's template takes them (`_harmony`).

        Raises:
            AgentError: a message carries images, which this agent cannot give the model (it
                feeds text only): refused rather than dropped, so no episode asks about a photo
                the model never saw.
        """
        out: list[dict[str, Any]] = []
        unanswered: list[str] = []
        harmony = parser is not None and parser.name == "harmony"
        later: dict[str, dict[str, Any]] = {}  # Harmony: call id -> its assistant message, sent before its result
        for i, m in enumerate(messages):
            if m.images:
                raise AgentError(
                    f"message {i} ({m.role}) carries {len(m.images)} image(s), and the transformers agent "
                    "gives the model text only; serve a vision-language model and use the openai agent"
                )
            if m.role == "tool" and not m.tool_call_id:
                unanswered.append(m.content)
                continue
            if unanswered and m.role != "tool":
                out.append({"role": "user", "content": "\n".join(unanswered)})
                unanswered = []
            if m.role == "assistant" and parser is not None and harmony:
                first, *rest = _harmony(m, parser)
                out.append(first[1])
                later = dict(rest)
                continue
            if m.role != "tool":
                out.append({"role": m.role, "content": m.content})
                continue
            if m.tool_call_id in later:  # the call it answers goes right before it
                out.append(later.pop(m.tool_call_id))
            if self.tool_role == "tool":
                result = {"role": "tool", "content": m.content, "tool_call_id": m.tool_call_id}
                out.append({**result, "name": m.name} if m.name else result)
            else:
                out.append({"role": self.tool_role, "content": m.content})
        if unanswered:
            out.append({"role": "user", "content": "\n".join(unanswered)})
        return out

    def prompt_ids(self, messages: list[Message], env_info: EnvInfo) -> list[int]:
        """The chat-templated prompt, as token ids; the env's tools go to the template when
        `uses_native_tools(env_info.parser)`."""
        native = self.uses_native_tools(env_info.parser)
        rendered = self.tokenizer.apply_chat_template(
            self._chat(messages, env_info.parser),
            tools=(list[Any](env_info.tool_schemas) or None) if native else None,
            add_generation_prompt=True,
            tokenize=False,
            **self.chat_template_kwargs,
        )
        return list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])

    def _budget(self, prompt: list[int]) -> int:
        """The tokens this turn may generate: `max_new_tokens`, up to the model's context.

        Raises:
            AgentError: the prompt fills the context (generating past the positions a model was
                trained on gives garbage; transformers only logs a warning).
        """
        if self.max_model_len is None:
            return self.max_new_tokens
        room = self.max_model_len - len(prompt)
        if room <= 0:
            raise AgentError(
                f"the prompt of {len(prompt)} tokens leaves no room in the model's context of "
                f"{self.max_model_len} tokens (max_model_len)"
            )
        return min(self.max_new_tokens, room)

    def _generate(
        self, prompt: list[int], stop: tuple[str, ...], seed: int, cancelled: threading.Event, budget: int
    ) -> tuple[list[int], list[float] | None]:
        from transformers import StoppingCriteriaList

        torch = self._torch
        watch = _step_watch_class()(cancelled)
        with self._lock, torch.inference_mode():
            torch.manual_seed(seed)
            input_ids = torch.tensor([prompt], device=self.device)
            kwargs: dict[str, Any] = {
                "max_new_tokens": budget,
                "do_sample": self.temperature > 0,
                # Only so do stopping criteria receive each step's scores: `watch` keeps the
                # chosen token's log-prob and frees the step's scores at once.
                "return_dict_in_generate": True,
                "output_scores": True,
                "stopping_criteria": StoppingCriteriaList([watch]),
                "pad_token_id": self.tokenizer.pad_token_id
                if self.tokenizer.pad_token_id is not None
                else self.tokenizer.eos_token_id,
                "attention_mask": torch.ones_like(input_ids),
            }
            # Stop at the tokenizer's EOS as well as the generation config's, as vLLM does: a chat
            # fine-tune of a base model often names only the base model's EOS in the latter.
            if self._eos_ids:
                kwargs["eos_token_id"] = sorted(self._eos_ids)
            if self.temperature > 0:
                kwargs.update(temperature=self.temperature, top_p=self.top_p)
            else:  # greedy: clear sampling defaults a model's generation config may carry
                kwargs.update(temperature=None, top_p=None, top_k=None)
            if stop:
                kwargs.update(stop_strings=list(stop), tokenizer=self.tokenizer)
            new: list[int] = self.lm.generate(input_ids, **kwargs).sequences[0, len(prompt) :].tolist()
            logprobs: list[float] = torch.stack(watch.logprobs).tolist() if watch.logprobs else []
        # One log-prob per generated token, or none rather than misaligned ones.
        return new, logprobs if len(logprobs) == len(new) else None

    async def act(self, observation: str, messages: list[Message], env_info: EnvInfo) -> AgentAction:
        prompt = self.prompt_ids(messages, env_info)
        stops = chat_stops(env_info.stop)
        budget = self._budget(prompt)
        seed = episode_seed(self.seed, self._episode, env_info)
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        try:
            ids, logprobs = await loop.run_in_executor(
                self._executor, self._generate, prompt, stops, seed, cancelled, budget
            )
        except asyncio.CancelledError:  # an episode timeout, a stopped run: free the model now
            cancelled.set()  # generation stops at its next token (a queued one never starts)
            raise
        # The closing EOS is not part of the action, unless it is a stop string the parser reads.
        ended = bool(ids) and ids[-1] in self._eos_ids
        text_ids = ids[:-1] if ended and self.tokenizer.decode(ids[-1:]) not in stops else ids
        text = (
            reply_text(env_info.parser, self.tokenizer, text_ids)  # the markers kept if the tokenizer made them special
            if env_info.parser is not None
            else str(self.tokenizer.decode(text_ids, skip_special_tokens=True))
        )
        # `stop_strings` also stops on a token that runs past a stop string ("an" for "The a"):
        # the action ends with the stop string, as a server's does. Generation stopped at the
        # first one, so the earliest end is it.
        ends = [text.find(s) + len(s) for s in stops if s in text]
        text = text[: min(ends)] if ends else text
        # `length`: the budget (or the context) ran out before EOS or a stop string (a half-written
        # call), as OpenAI-compatible servers report it.
        at_stop = ended or bool(ends) or any(s in str(self.tokenizer.decode(ids)) for s in stops)
        cut = not at_stop and len(ids) >= budget
        return AgentAction(
            text=text,
            token_ids=ids,
            logprobs=logprobs,
            prompt_token_ids=prompt if self.record_prompt_ids else None,
            prompt_tokens=len(prompt),
            completion_tokens=len(ids),
            # `replies`: the model reads the env's messages through the chat template (tool messages),
            # not the observation text; `toolenv export` answers the turn the same way.
            metadata={"finish_reason": "length" if cut else "stop", "replies": "messages"},
        )
