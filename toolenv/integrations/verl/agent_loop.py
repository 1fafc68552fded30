"""`ToolEnvAgentLoop`: one toolenv episode per verl sample, token-in/token-out.

Per turn: generate with verl's server manager from the running token ids, decode
only the new tokens, `env.astep(text)` (the env parses and invokes its tools and
scores the turn), then append the observation as chat messages with verl's
continuous-token helpers, so observation tokens get mask 0 and logprob 0.0 while
model tokens keep mask 1 and their logprobs. Model tokens are never re-encoded.
With `observation_role="inline"` the observation is raw text in the same assistant
turn instead (Search-R1's `<information>`), tokenized on its own.

Register it with verl through `actor_rollout_ref.rollout.agent.agent_loop_config_path`
(see examples/verl/toolenv_agent.yaml); every YAML key besides `name`/`_target_`
is a keyword argument of `__init__`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import uuid4

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from toolenv.env import ToolEnv
from toolenv.gc_tuning import tuned_gc
from toolenv.integrations._metrics import answered, failed_calls, infra_errors, parse_errors
from toolenv.integrations.verl._turns import (
    changes_prompt,
    ended_itself,
    merge_server_fields,
    note_reward_keys,
    note_tool_failures,
    stopped_on_string,
    template_turn_end_id,
    text_stops,
    truncate,
)
from toolenv.integrations.verl.envs import EnvPool, env_spec_from_row, shared_pool, task_from_row
from toolenv.parsers import ActionParser, detect_parser, template_mismatch
from toolenv.parsers.decoding import reply_text
from toolenv.parsers.stops import chat_stops
from toolenv.types import Message, Task, ToolResult, reply_messages

__all__ = ["OBSERVATION_ROLES", "STOP_REASONS", "ToolEnvAgentLoop", "chat_message"]

logger = logging.getLogger(__name__)

#: (parser class, parser name, tokenizer id) pairs already checked against the chat template.
_CHECKED: set[tuple[type[ActionParser], str, int]] = set()
#: Turn-end token id per (tokenizer id, chat template), read from the template once (verl makes a loop per sample).
_TURN_END: dict[tuple[int, str], int | None] = {}


def _check_template(parser: ActionParser, tokenizer: Any) -> None:
    """Warn once per parser and tokenizer when the env cannot read the calls the model's template writes.

    Only for a model family's own formats (those whose templates have tool messages): a
    prompted format such as Search-R1's tags is taught by the env's instructions instead.
    """
    key = (type(parser), parser.name, id(tokenizer))
    if not parser.tool_messages or key in _CHECKED:
        return
    _CHECKED.add(key)
    problem = template_mismatch(parser, tokenizer)
    if problem is not None:
        logger.warning("toolenv: %s", problem)


#: Why an episode stopped (`extra_fields["toolenv_stop_reason"]`): the env ended it (an answer, its
#: max_turns), the loop's max_turns, the response budget (a reply cut there is not stepped), the
#: model's context (`rollout.max_model_len`, likewise), a reply with no token, a generation the
#: server aborted, or the env failed (its reset, a step or the final reward raised, e.g. a remote
#: env's server lost the session; `extra_fields["toolenv_error"]` says how).
STOP_REASONS = (
    "terminated",
    "truncated",
    "max_turns",
    "response_length",
    "max_model_len",
    "empty_reply",
    "aborted",
    "env_error",
)
#: How observations enter the token stream (`observation_role`): chat messages of either role, or
#: raw text continuing the model's own turn.
OBSERVATION_ROLES = ("tool", "user", "inline")

#: Token ids, mask, log-probs, images and messages of an episode at one point, to go back to.
_Snapshot = tuple[list[int], list[int], list[float], list[Any] | None, list[dict[str, Any]]]


def chat_message(message: Message) -> tuple[dict[str, Any], list[Any]]:
    """A toolenv Message as a verl chat dict, and its images as PIL images.

    Images become `{"type": "image", "image": <PIL>}` content blocks, the form verl's
    processors and its own tool loop use.
    """
    out: dict[str, Any] = {"role": message.role}
    images = [im.to_pil() for im in message.images]
    if images:
        blocks: list[dict[str, Any]] = [{"type": "image", "image": im} for im in images]
        if message.content:
            blocks.append({"type": "text", "text": message.content})
        out["content"] = blocks
    else:
        out["content"] = message.content
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:  # the tool's name: Gemma 4's and other templates write tool results under it
        out["name"] = message.name
    return out, images


def _env_error(env_id: str, task: Task, exc: Exception) -> str:
    """`exc` as the episode's `toolenv_error`, logged as a warning."""
    error = f"{type(exc).__name__}: {exc}"
    logger.warning("toolenv: env %s failed on task %s; the episode ends here: %s", env_id, task.id, error)
    return error


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


class ToolEnvAgentLoop(AgentLoopBase):  # type: ignore[misc,unused-ignore]
    """verl agent loop that runs the toolenv env named by each row's `extra_info`.

    Args:
        max_turns: model turns per episode; default `multi_turn.max_assistant_turns`, or
            `multi_turn.max_user_turns + 1` when that is fewer, as verl's `tool_agent` stops (the
            env's own `max_turns` truncates too).
        env_kwargs: overrides merged over each row's `extra_info.env_kwargs` key by key (a key
            replaces the row's whole value, nested mappings included).
        observation_role: `"tool"` (one tool message per tool result; the chat template
            wraps them, e.g. `<tool_response>`), `"user"` (one user message holding the env's
            formatted observation, e.g. `<information>`), `"inline"` (the formatted observation
            as raw text inside the model's own turn, `parser.continue_with(obs)`, which the
            model continues: the whole episode is one assistant response, as Search-R1 and
            its followers train; text only), or None: `"tool"` for parsers whose
            chat templates have tool messages (hermes, harmony, qwen3_xml, llama3_json,
            pythonic, mistral, glm45, deepseek_v3/v31, gemma4, kimi_k2, muse_glimmer), `"user"`
            otherwise; results that answer no call go as a user message.
        reward_keys: reward component names reported for every sample (default: the env's);
            set it when one batch mixes envs with different rewards, since verl needs the same
            `reward_extra_info` keys on every sample.
        stop: stop strings for generation, added to any the sampling params hold (e.g.
            `["</search>"]`); None (default): the row's env's parser's (`parser.stop`, e.g.
            `</search>` for Search-R1's tags), less, for the `tool` and `user` roles, those that
            close one of several calls a turn (Hermes' `</tool_call>`: the model's end of turn
            ends its calls), as the reference agents pick them, and less those that are one
            special token (the server's text skips them; the model's turn ends there itself);
            `[]`: none. A turn that ends on one gets the chat template's turn-end token appended
            with mask 0 (see `turn_end_token`), except inline, where the observation follows
            the stop string directly.
        use_dataset_prompt: start from the row's `raw_prompt` (default) or re-render the env's prompt.
            When `env_kwargs` changes the env's prompt (another parser, system prompt or
            template), the env's prompt is used anyway: the row's was written for the old env.
        turn_end_token: the token that closes a turn cut by a stop string; default: the special
            token the chat template writes after an assistant message (`<|im_end|>` for
            ChatML), none when it writes none there (GLM). Other turns are left as generated.
        tune_gc: run each episode inside `toolenv.tuned_gc()`; while any episode of the worker
            runs, the collector is tuned, and it is restored when the last one ends (a batch of
            thousands of episodes spends much of its CPU in the collector otherwise; see
            docs/vector.md). Off by default: the worker process is verl's.
        tools: verl's tool list; unused (the env owns its tools), accepted because verl passes it.
    """

    def __init__(
        self,
        *args: Any,
        max_turns: int | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        observation_role: str | None = None,
        reward_keys: Sequence[str] | None = None,
        stop: Sequence[str] | None = None,
        use_dataset_prompt: bool = True,
        turn_end_token: str | None = None,
        tune_gc: bool = False,
        tools: Any = None,
        name: str | None = None,
        pool: EnvPool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if observation_role not in (None, *OBSERVATION_ROLES):
            raise ValueError(f"observation_role must be 'tool', 'user', 'inline' or None, got {observation_role!r}")
        multi_turn = self.rollout_config.get("multi_turn", {}) or {}
        # verl's own tool_agent stops after a reply once `max_user_turns` observations were sent:
        # that is `max_user_turns + 1` model turns, whichever cap comes first.
        caps = [multi_turn.get("max_assistant_turns"), (multi_turn.get("max_user_turns") or -1) + 1]
        self.max_turns: int | None = max_turns or min((c for c in caps if c), default=None)
        # hydra hands nested YAML values over as OmegaConf containers; envs get plain Python.
        self.env_kwargs: dict[str, Any] = _plain(env_kwargs or {})
        self.observation_role = observation_role
        self.reward_keys: list[str] | None = list(_plain(reward_keys)) if reward_keys is not None else None
        self.stop: list[str] | None = None if stop is None else list(_plain(stop))
        self.use_dataset_prompt = use_dataset_prompt
        self.tune_gc = bool(tune_gc)
        self.response_length: int = int(self.rollout_config.response_length)
        # The server's context, when set: verl's vLLM server clamps `max_tokens` to what is left of it
        # (and calls a reply cut there "completed") and refuses a prompt that leaves no room.
        max_model_len = self.rollout_config.get("max_model_len")
        self.max_model_len: int | None = int(max_model_len) if max_model_len else None
        self.pool = pool or shared_pool()
        self.turn_end_id = self._turn_end_id(turn_end_token)
        # The continuous-token helper for appended non-assistant messages was renamed after 0.9.
        merge = getattr(self, "ct_merge_context_msg", None) or getattr(self, "ct_merge_non_assistant_msg", None)
        if merge is None:
            raise RuntimeError("this verl has neither ct_merge_context_msg nor ct_merge_non_assistant_msg")
        self._merge_context = merge
        #: The final conversation of the last `run` (chat dicts), for inspection and tests.
        self.messages: list[dict[str, Any]] = []
        self._auto_parser: str | None = None

    def _turn_end_id(self, token: str | None) -> int | None:
        """Id of the token that closes a turn cut by a stop string: `token`, else the one the
        chat template writes after an assistant message (None when it writes none)."""
        if token is None:
            key = (id(self.tokenizer), str(getattr(self.tokenizer, "chat_template", None)))
            if key not in _TURN_END:
                _TURN_END[key] = template_turn_end_id(self.tokenizer)
            return _TURN_END[key]
        # convert_tokens_to_ids, not get_vocab(): the latter copies a 150k-entry dict per sample.
        tokenizer: Any = self.tokenizer  # verl annotates it as AutoTokenizer, which has no instance methods
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == tokenizer.unk_token_id:
            raise ValueError(f"turn_end_token {token!r} is not in the tokenizer's vocabulary")
        return int(tid)

    def _request_id(self, row: Mapping[str, Any]) -> str:
        """The episode's request id. Under `rollout.full_determinism` verl routes a request to a
        replica by a hash of its id (each replica samples with its own seed) and hands the id to
        vLLM, so it is `det-<priority>` as in verl's own loops (`priority` is the sample's index
        in the batch); otherwise, or without a priority, a random one."""
        priority = row.get("priority")
        if self.rollout_config.get("full_determinism", False) and priority is not None:
            return f"det-{int(priority)}"
        return uuid4().hex

    def _detected_parser(self) -> str:
        """`parser: auto`: the parser for the tool calls this model's chat template writes."""
        if self._auto_parser is None:
            found = detect_parser(self.tokenizer)
            if found is None:
                raise ValueError(
                    "parser='auto': the model's chat template writes no tool call that a registered "
                    "parser reads; name the parser in env_kwargs (see docs/parsers.md)"
                )
            logger.info("toolenv: parser='auto' picked %r for this model's chat template", found)
            self._auto_parser = found
        return self._auto_parser

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run one episode of the row's env and task."""
        extra_info = kwargs.get("extra_info") or {}
        env_id, row_kwargs = env_spec_from_row(extra_info)
        task = task_from_row(extra_info)
        env_kwargs = {**row_kwargs, **self.env_kwargs}
        if env_kwargs.get("parser") == "auto":
            env_kwargs["parser"] = self._detected_parser()
        row_spec = (env_id, row_kwargs) if env_kwargs != row_kwargs else None
        with tuned_gc() if self.tune_gc else contextlib.nullcontext():
            async with self.pool.lease(env_id, env_kwargs) as env:
                out = await self._episode(env, env_id, task, sampling_params, kwargs, row_spec)
                if out.extra_fields["toolenv_error"]:  # it may hold broken state: closed, not reused
                    self.pool.discard(env)
                return out

    async def _prompt(
        self, task: Task, row: dict[str, Any], reset: list[Message], row_spec: tuple[str, dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        """The chat the episode starts from: the row's `raw_prompt`, unless it is off or the
        loop's `env_kwargs` change the env's prompt (parser, system prompt, template), in which
        case the env's own prompt: the row's teaches the env it was built for."""
        raw_prompt = row.get("raw_prompt")
        if not self.use_dataset_prompt or raw_prompt is None:
            return [chat_message(m)[0] for m in reset]
        if row_spec is not None and await changes_prompt(*row_spec, self.env_kwargs, task, reset, raw_prompt):
            return [chat_message(m)[0] for m in reset]
        return [dict(m) for m in raw_prompt]

    async def _episode(
        self,
        env: ToolEnv,
        env_id: str,
        task: Task,
        sampling_params: dict[str, Any],
        row: dict[str, Any],
        row_spec: tuple[str, dict[str, Any]] | None = None,
    ) -> AgentLoopOutput:
        _check_template(env.parser, self.tokenizer)
        #: The env's failure, as "Type: message": verl gathers a batch's episodes, so one env's
        #: exception would fail the whole training step; it ends this episode instead.
        error: str | None = None
        try:
            _, info = await env.areset(options={"task": task})
        except Exception as exc:  # as a failing step (a remote env's server refused the session)
            if row.get("raw_prompt") is None:  # no prompt to give the sample
                raise
            error = _env_error(env_id, task, exc)
        if error is None:
            messages = await self._prompt(task, row, info["messages"], row_spec)
        else:  # the sample is the row's prompt, nothing generated for a task the env could not start
            messages = [dict(m) for m in row["raw_prompt"]]
        mm = await self.process_multi_modal_info(messages)
        if mm.get("videos") or mm.get("audios"):
            raise ValueError("ToolEnvAgentLoop carries images only; this row's prompt has video or audio")
        images: list[Any] | None = mm.get("images")
        self._assert_mm_supported(bool(images))
        mm_kwargs = self._get_mm_processor_kwargs()
        # verl annotates `images` as a list though None is its default.
        runtime: list[int] = await self.ct_build_initial_tokens(messages, images=images)  # type: ignore[arg-type,unused-ignore]
        mask: list[int] = []
        logprobs: list[float] = []
        request_id = self._request_id(row)
        tokenizer: Any = self.tokenizer  # verl annotates it as AutoTokenizer, which has no instance methods
        inline = self._role(env) == "inline"
        params = dict(sampling_params)
        extra_stops = self._stops(env, inline)
        if extra_stops:
            params["stop"] = [*(params.get("stop") or []), *extra_stops]
        stops: list[str] = list(params.get("stop") or [])
        stop_ids: list[int] = [int(t) for t in params.get("stop_token_ids") or []]

        reward_keys = self.reward_keys if self.reward_keys is not None else list(env.reward_fn.weights)
        if self.reward_keys is None:
            note_reward_keys(env_id, reward_keys)  # another env's differ: say which reward_keys to set
        components = dict.fromkeys(reward_keys, 0.0)
        turn_scores: list[float] = []
        results: list[ToolResult] = []
        server_fields: dict[str, Any] = {}
        # Router replay (R3): the experts of every token the last generation saw, as the server returns them.
        routed_experts: Any = None
        tool_latency = 0.0
        gen_s = env_s = 0.0
        preempted = -1  # AgentLoopMetrics' "not available", until the server reports a count
        assistant_turns = observation_turns = 0
        terminated = truncated = False
        answer: str | None = None
        stop_reason = "response_length" if error is None else "env_error"
        #: The stream and the conversation as the model's last turn left them, before the
        #: observation that followed it (inline, that observation is in the last message's text).
        before_observation: _Snapshot | None = None

        while error is None:
            budget = self.response_length - len(mask)
            room = self._room(runtime)
            if room <= 0 < budget:  # the prompt fills the model's context
                stop_reason = "max_model_len"
            if budget <= 0 or room <= 0:
                break
            limit = min(budget, room)
            t0 = time.perf_counter()
            out = await self.server_manager.generate(
                request_id=request_id,
                prompt_ids=runtime,
                sampling_params={**params, "max_tokens": limit},
                image_data=images,
                mm_processor_kwargs=mm_kwargs,
            )
            gen_s += time.perf_counter() - t0
            if out.num_preempted is not None:
                preempted = max(preempted, 0) + out.num_preempted
            merge_server_fields(server_fields, out.extra_fields or {})
            if out.routed_experts is not None:
                routed_experts = out.routed_experts
            new_ids = list(out.token_ids)[:limit]
            # verl's vLLM server says "aborted" and "completed" (a stop or the length limit alike);
            # its SGLang server passes SGLang's finish reason on: "abort", "stop", "length".
            aborted = out.stop_reason in ("aborted", "abort")
            if not new_ids:
                # No token (an aborted request, a server that stopped at once): there is no turn to
                # step, and asking again may well get nothing again. The episode ends here, without
                # the observation nothing answered, so the response ends on the model's last token,
                # where verl puts the reward (PPO's GAE drops one on a mask-0 token).
                if before_observation is not None:
                    runtime, mask, logprobs, images, kept = before_observation
                    messages[:] = kept
                    observation_turns -= 1
                stop_reason = "aborted" if aborted else "empty_reply"
                break
            new_lp = list(out.log_probs)[: len(new_ids)] if out.log_probs else None
            merged, mask, lps = await self.ct_merge_assistant_token(
                runtime, new_ids, mask, logprobs if (logprobs or new_lp) else None, assistant_logprobs=new_lp
            )
            runtime = merged.token_ids
            if lps is not None:
                logprobs = list(lps)
            assistant_turns += 1

            # Formats written in special tokens (Harmony) keep them, and so do formats whose markers
            # this tokenizer made special; the others read plain text.
            text = reply_text(env.parser, tokenizer, new_ids)
            if inline and assistant_turns > 1:  # one assistant message: this reply continues it
                messages[-1] = {"role": "assistant", "content": messages[-1]["content"] + text}
            else:
                messages.append({"role": "assistant", "content": text})
            at_limit = len(new_ids) >= limit or out.stop_reason == "length"
            if aborted or (at_limit and not ended_itself(tokenizer, new_ids, stops, stop_ids)):
                # Cut by the length limit (the response budget, the model's context) or an abort: a
                # half-written call is not run, as in verl's tool_agent (it parses no turn that
                # reached response_length). The turn stays in the response; the episode ends truncated.
                stop_reason = "aborted" if aborted else "max_model_len" if room < budget else "response_length"
                turn_scores.append(0.0)  # the truncation's final reward goes here, below
                break
            t0 = time.perf_counter()
            try:
                _, reward, terminated, truncated, step = await env.astep(text)
            except Exception as exc:  # noqa: BLE001 - one env's failure ends its episode, not verl's batch
                env_s += time.perf_counter() - t0
                error, stop_reason = _env_error(env_id, task, exc), "env_error"
                turn_scores.append(0.0)  # the env scored nothing for this turn
                break
            env_s += time.perf_counter() - t0
            turn_scores.append(float(reward))
            for k, v in step["reward_components"].items():
                if k in components:
                    components[k] += float(v)
            results.extend(step["tool_results"])
            tool_latency += sum(r.latency_s for r in step["tool_calls"])
            if terminated or truncated:
                answer = step.get("answer")
                stop_reason = "terminated" if terminated else "truncated"
                break
            if len(mask) >= self.response_length:
                break
            if self.max_turns and assistant_turns >= self.max_turns:
                stop_reason = "max_turns"
                break

            # As the model left it: restored when the observation does not fit (below), or when
            # the next reply is empty (above). Messages are replaced, never edited: a shallow copy keeps them.
            before_observation = (runtime, mask, logprobs, images, list(messages))
            if inline:
                # Raw text in the model's own turn: no turn-end token, no role tokens; its tokens
                # alone (as Search-R1 tokenizes its `<information>` block), the model's never re-encoded.
                obs = env.parser.continue_with(self._inline_observation(env, step))
                obs_ids = [int(t) for t in tokenizer.encode(obs, add_special_tokens=False)]
                if len(mask) + len(obs_ids) >= self.response_length or self._room(runtime) <= len(obs_ids):
                    # The response ends on the model's last token, where verl puts the reward.
                    stop_reason = (
                        "response_length" if len(mask) + len(obs_ids) >= self.response_length else "max_model_len"
                    )
                    break
                runtime = [*runtime, *obs_ids]
                mask = [*mask, *[0] * len(obs_ids)]
                if logprobs:
                    logprobs = [*logprobs, *[0.0] * len(obs_ids)]
                messages[-1] = {"role": "assistant", "content": messages[-1]["content"] + obs}
                observation_turns += 1
                continue
            if (
                self.turn_end_id is not None
                and new_ids[-1:] != [self.turn_end_id]
                and stopped_on_string(self.tokenizer, new_ids, stops)
            ):
                # Generation stopped on a stop string, before the turn's end: close the turn as the
                # chat template does (not a model token, so mask 0). Any other ending is the model's
                # own and verl's token builder handles its boundary.
                runtime = [*runtime, self.turn_end_id]
                mask = [*mask, 0]
                if logprobs:
                    logprobs = [*logprobs, 0.0]
            new_messages, new_images = self._observation(env, step)
            self._assert_mm_supported(bool(new_images))
            previous = list(messages)
            messages.extend(new_messages)
            merged, new_mask, lps = await self._merge_context(
                previous, messages, runtime, mask, logprobs if logprobs else None
            )
            if len(new_mask) >= self.response_length or self._room(merged.token_ids) <= 0:
                # The closing token goes only with its observation: the response must end on a
                # model token, where verl puts the reward (PPO's GAE drops one on a mask-0 token).
                # An observation that leaves the model no room in its context ends it too.
                if len(new_mask) < self.response_length:
                    stop_reason = "max_model_len"
                del messages[len(previous) :]
                runtime, mask, logprobs = before_observation[:3]
                break
            runtime, mask = merged.token_ids, new_mask
            if logprobs:
                logprobs = list(lps or [])
            if new_images:
                images = [*(images or []), *new_images]
            observation_turns += 1

        if error is None and not (terminated or truncated):
            # The loop cut the episode (its max_turns, the response budget): the env scores it as a
            # truncation, so final-only rewards (no-answer penalties, format) count here too.
            try:
                final, parts = await truncate(env)
            except Exception as exc:  # noqa: BLE001 - as a failing step
                error, stop_reason = _env_error(env_id, task, exc), "env_error"
            else:
                truncated = True
                if turn_scores:
                    turn_scores[-1] += final
                else:  # the first reply was empty: no turn to add it to, but the episode still scores it
                    turn_scores.append(final)
                for k, v in parts.items():
                    if k in components:
                        components[k] += v
        if error is not None:
            # The env gave no reward for what the model wrote: its tokens are not trained on (verl
            # leaves fully masked responses out of the loss), rather than trained toward a 0.0
            # that says nothing about them.
            mask = [0] * len(mask)

        if not mask:
            # No response (the first reply empty, the prompt filling the context, a reset that
            # failed): verl's default trainer (v1) puts the score on the response's last token and
            # fails the sample's whole group on an empty one. One token that is not the model's
            # (mask 0, log-prob 0.0) carries it; asked for, log-probs are a list (verl concatenates
            # the batch's when its first sample has them).
            runtime = [*runtime, self._filler_id()]
            mask = [0]
            logprobs = [0.0] if params.get("logprobs") else []

        self.messages = messages
        note_tool_failures(results)
        split = len(runtime) - len(mask)
        total = split + min(len(mask), self.response_length)
        score = float(sum(turn_scores))
        # Two faults, counted apart: calls that failed (so tool_errors / tool_calls is a failure
        # rate, at most 1) and turns the parser could not read (its results: parse errors, no action).
        tool_metrics = {
            "tool_calls": float(sum(1 for r in results if r.name != "parser")),
            "tool_errors": float(failed_calls(results)),
            "infra_errors": float(infra_errors(results)),
            "parse_errors": float(parse_errors(results)),
            "tool_latency_s": tool_latency,
        }
        reward_extra_info: dict[str, float] = {
            "score": score,
            "answered": answered(answer),
            "terminated": float(terminated),
            "truncated": float(truncated),
            "turns": float(assistant_turns),
            **tool_metrics,
            **{f"reward/{k}": v for k, v in components.items()},
        }
        return AgentLoopOutput(
            prompt_ids=runtime[:split],
            response_ids=runtime[split:][: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            # By absolute position; verl pads them to the batch's length. Rows past the episode's
            # tokens (an observation taken back) would not fit there.
            routed_experts=routed_experts[:total] if routed_experts is not None else None,
            multi_modal_data={"images": images} if images else {},
            mm_processor_kwargs=mm_kwargs,
            reward_score=score,
            num_turns=1 + assistant_turns + observation_turns,
            metrics=AgentLoopMetrics(generate_sequences=gen_s, tool_calls=env_s, num_preempted=preempted),
            extra_fields={
                **server_fields,
                "turn_scores": turn_scores,
                "tool_rewards": [],
                "reward_extra_info": reward_extra_info,
                "reward_components": dict(components),
                "tool_metrics": tool_metrics,
                "toolenv_env_id": env_id,
                "toolenv_task_id": task.id,
                "toolenv_answer": answer or "",
                "toolenv_stop_reason": stop_reason,
                "toolenv_error": error or "",
            },
        )

    def _filler_id(self) -> int:
        """The token of an otherwise empty response: the one that ends a turn (as if the model
        stopped at once), else EOS, else padding."""
        tokenizer: Any = self.tokenizer
        for tid in (self.turn_end_id, tokenizer.eos_token_id, tokenizer.pad_token_id):
            if tid is not None:
                return int(tid)
        return 0

    def _room(self, runtime: Sequence[int]) -> int:
        """Tokens the model can still write after `runtime` within `rollout.max_model_len` (the
        response budget bounds them too; without a `max_model_len`, only it does)."""
        return self.response_length if self.max_model_len is None else self.max_model_len - len(runtime)

    def _stops(self, env: ToolEnv, inline: bool) -> list[str]:
        """The stop strings the loop adds: `stop`, else the env's parser's (see `stop`). Without
        one, a tags-format model writes its query, an observation of its own and an answer in one
        turn: the env scores the answer and the made-up observation is trained on."""
        if self.stop is not None:
            return self.stop
        parser_stops = env.parser.stop if inline else chat_stops(env.parser.stop)
        return text_stops(self.tokenizer, parser_stops)

    def _role(self, env: ToolEnv) -> str:
        """The observation role for `env`: the configured one, else by the parser's format."""
        return self.observation_role or ("tool" if env.parser.tool_messages else "user")

    @staticmethod
    def _inline_observation(env: ToolEnv, step: dict[str, Any]) -> str:
        """The turn's observation text for `observation_role="inline"`: the env's formatted
        results, as the user role has them. Raw text cannot carry images, so a result with
        images is refused (as verl refuses images it cannot render) rather than dropped."""
        results: list[ToolResult] = step["tool_results"]
        with_images = sorted({r.name for r in results if r.images})
        if with_images:
            raise ValueError(
                f"observation_role='inline' appends observations as raw text, but tool result(s) of "
                f"{', '.join(repr(n) for n in with_images)} hold images; use observation_role 'user' or "
                "'tool' (with a vision-language model and its processor) for tools that return images"
            )
        return env.parser.format_results(results) if results else ""

    def _observation(self, env: ToolEnv, step: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
        """The turn's observation as chat messages (tool or user role) plus any images in it."""
        role = self._role(env)
        if role == "tool":
            pairs = [chat_message(m) for m in reply_messages(step["tool_results"])]
            return [p[0] for p in pairs], [im for p in pairs for im in p[1]]
        results: list[ToolResult] = step["tool_results"]
        obs = env.parser.format_results(results) if results else ""
        msg, images = chat_message(Message(role="user", content=obs, images=[im for r in results for im in r.images]))
        return [msg], images
