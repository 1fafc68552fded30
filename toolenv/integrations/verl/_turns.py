"""Helpers of `ToolEnvAgentLoop`: the server's per-call fields, the token that closes a turn
cut by a stop string, the parser's stop strings a server can match, whether a reply ended itself
or was cut, whether the dataset prompt still fits the env, the final reward of an episode the
loop cuts short, and the process's count of episodes whose tool calls failed. They import
neither verl nor torch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from toolenv._decades import Decades
from toolenv.env import ToolEnv
from toolenv.integrations.verl.envs import EnvPool, make_env
from toolenv.types import Message, Task, ToolResult

__all__ = [
    "REWARD_KEYS",
    "TOOL_FAILURES",
    "RewardKeys",
    "ToolFailures",
    "changes_prompt",
    "ended_itself",
    "merge_server_fields",
    "note_reward_keys",
    "note_tool_failures",
    "prompt_key",
    "stopped_on_string",
    "template_turn_end_id",
    "text_stops",
    "truncate",
]

logger = logging.getLogger("toolenv.integrations.verl.agent_loop")

#: Whether the loop's env_kwargs change an env's prompt, per (row env, loop env) pool keys; the
#: keys whose row env cannot be built here; one lock per key.
_PROMPT_CHANGED: dict[str, bool] = {}
_NO_ROW_ENV: set[str] = set()
_PROMPT_LOCKS: dict[str, asyncio.Lock] = {}

#: verl's speculative-decoding counters (`tool_agent_loop.SPEC_DECODE_EXTRA_KEYS`): summed over turns.
_SUMMED = ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")


def merge_server_fields(merged: dict[str, Any], new: Mapping[str, Any]) -> None:
    """Fold one generation's `TokenOutput.extra_fields` into the episode's, in place.

    verl's `LLMServerClient.generate` tags each call with the weight version that served it
    (`min_global_steps`/`max_global_steps`); verl 0.9.1's default trainer stores them per
    trajectory and reads them as ints, so an episode keeps the earliest and the latest over its
    turns, as verl's own `ToolAgentLoop` does. Speculative-decoding counters are summed; any
    other key keeps its first value.
    """
    for key, value in new.items():
        old = merged.get(key)
        if key not in merged or old is None:
            merged[key] = value
        elif value is None:
            continue
        elif key == "min_global_steps":
            merged[key] = min(old, value)
        elif key == "max_global_steps":
            merged[key] = max(old, value)
        elif key in _SUMMED:
            merged[key] = int(old) + int(value)


def stopped_on_string(tokenizer: Any, token_ids: Sequence[int], stops: Iterable[str]) -> bool:
    """Whether generation ended on one of `stops`: a stop string completed by the last token.

    Servers return the tokens of the stop string (vLLM and SGLang trim only the text), so the
    string is in the decoded reply and was not there before its last token.
    """
    stops = [s for s in stops if s]
    if not stops or not token_ids:
        return False
    # Only the tail can hold a stop the last token completed: a token decodes to at least one
    # character, or a byte of one (4 at most per character), so this many tokens cover the
    # longest stop whatever the reply's length.
    tail = list(token_ids[-(4 * max(len(s) for s in stops) + 2) :])
    text = tokenizer.decode(tail, skip_special_tokens=False)
    before = tokenizer.decode(tail[:-1], skip_special_tokens=False)
    return any(s in text and s not in before for s in stops)


def ended_itself(tokenizer: Any, token_ids: Sequence[int], stops: Iterable[str], stop_token_ids: Iterable[int]) -> bool:
    """Whether a reply ended on its own: on a special token (EOS, the turn's end, GLM's next role
    token, Harmony's `<|call|>`), on one of `stop_token_ids` or on a stop string. A reply that
    used all its `max_tokens` without any of these was cut there (vLLM's finish reason "length",
    which verl's server reports as "completed" like any other)."""
    if not token_ids:
        return False
    last = int(token_ids[-1])
    if last in {int(t) for t in stop_token_ids} or _special(tokenizer, last):
        return True
    return stopped_on_string(tokenizer, token_ids, stops)


_PROBE = "TOOLENV-TURN-END-PROBE"


def template_turn_end_id(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message's content
    (`<|im_end|>` for ChatML, `<|eot_id|>` for Llama 3, `<turn|>` for Gemma 4), or None when
    it writes none there (GLM: the next role token closes the turn) or the template cannot say.
    """
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - any template error means "unknown"
        return None
    if not isinstance(text, str) or _PROBE not in text:
        return None
    tail = text[text.rindex(_PROBE) + len(_PROBE) :]
    ids = tokenizer.encode(tail, add_special_tokens=False) if tail else []
    if not ids:
        return None
    first = int(ids[0])
    return first if _special(tokenizer, first) else None


def _special(tokenizer: Any, token_id: int) -> bool:
    """Whether `token_id` is one of the tokenizer's special tokens (its EOS, role or format tokens)."""
    if token_id in set(getattr(tokenizer, "all_special_ids", []) or []):
        return True
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return bool(getattr(added.get(token_id), "special", False))


#: Whether a stop string is one special token, per tokenizer and string: asked for every episode.
#: Weakly keyed: a tokenizer freed and another made at its address must not reuse its answers.
_SPECIAL_STOPS: weakref.WeakKeyDictionary[Any, dict[str, bool]] = weakref.WeakKeyDictionary()


def text_stops(tokenizer: Any, stops: Iterable[str]) -> list[str]:
    """`stops` less those that are one special token of the tokenizer (GLM's `<|observation|>`,
    Harmony's `<|call|>`, DeepSeek's `<｜tool▁calls▁end｜>`): servers match stop strings against
    their text, which skips special tokens, so these never match there, and a reply ending on one
    is the model's own turn boundary, which verl's token builder closes, not the loop."""
    try:
        known = _SPECIAL_STOPS.setdefault(tokenizer, {})
    except TypeError:  # an object that takes no weak reference: asked each time
        known = {}
    kept = []
    for stop in stops:
        if stop not in known:
            ids = tokenizer.encode(stop, add_special_tokens=False)
            known[stop] = len(ids) == 1 and _special(tokenizer, int(ids[0]))
        if not known[stop]:
            kept.append(stop)
    return kept


def prompt_key(messages: Iterable[Any]) -> list[tuple[str, str]]:
    """(role, text) per message, images as `<image>`: the form in which a parquet prompt (chat
    dicts, possibly with content blocks) and an env's reset messages compare."""
    out: list[tuple[str, str]] = []
    for m in messages:
        if isinstance(m, Message):
            out.append((m.role, "<image>" * len(m.images) + m.content))
            continue
        content = m.get("content")
        if isinstance(content, str):
            out.append((str(m.get("role")), content))
            continue
        parts = []
        for block in content or []:
            kind = block.get("type") if isinstance(block, Mapping) else None
            parts.append("<image>" if kind == "image" else str(block.get("text", "")) if kind == "text" else "")
        out.append((str(m.get("role")), "".join(parts)))
    return out


async def truncate(env: ToolEnv) -> tuple[float, dict[str, float]]:
    """`env.atruncate()` on an unfinished episode: its final reward and that reward's components
    (what `atruncate` added to the last turn's; kept too when there is no turn, its first
    reply cut or empty)."""
    ep = env.episode
    if ep is None or ep.terminated or ep.truncated:
        return 0.0, {}
    last = ep.turns[-1] if ep.turns else None
    before = dict(last.reward_components) if last is not None else {}
    reward = float(await env.atruncate())
    if ep.final_components is not None:  # what the env scored (a remote env mirrors the turn's only)
        return reward, {k: float(v) for k, v in ep.final_components.items() if v}
    after = last.reward_components if last is not None else {}
    return reward, {k: float(v) - float(before.get(k, 0.0)) for k, v in after.items() if v != before.get(k, 0.0)}


async def changes_prompt(
    env_id: str,
    row_kwargs: dict[str, Any],
    overrides: Mapping[str, Any],
    task: Task,
    reset: list[Message],
    raw_prompt: Sequence[Any],
) -> bool:
    """Whether the env built with the loop's `env_kwargs` prompts differently from the env the row
    was built for (another parser's instructions, system prompt or template): decided once per
    pair of kwargs by resetting the row's env on the task. When the row's env cannot be built
    here, the row's `raw_prompt` stands for its prompt."""
    key = EnvPool.key(env_id, row_kwargs) + "\n" + EnvPool.key(env_id, {**row_kwargs, **overrides})
    changed = _PROMPT_CHANGED.get(key)
    if changed is None and key not in _NO_ROW_ENV:
        async with _PROMPT_LOCKS.setdefault(key, asyncio.Lock()):  # one build, however many episodes wait
            changed = _PROMPT_CHANGED.get(key)
            if changed is None and key not in _NO_ROW_ENV:
                changed = await _row_prompt_differs(env_id, row_kwargs, task, reset)
                if changed is None:
                    _NO_ROW_ENV.add(key)
                else:
                    _PROMPT_CHANGED[key] = changed
                    if changed:
                        logger.warning(
                            "toolenv: the agent loop's env_kwargs %r change the prompt of %s; episodes start "
                            "from the env's prompt instead of the dataset's",
                            dict(overrides),
                            env_id,
                        )
    if changed is None:
        return prompt_key(raw_prompt) != prompt_key(reset)
    return changed


async def _row_prompt_differs(env_id: str, row_kwargs: dict[str, Any], task: Task, reset: list[Message]) -> bool | None:
    """Whether the row's env prompts `task` differently from `reset`; None when it cannot be built
    here, whatever its factory raised (a file or service only the machine that built the rows has:
    the loop's env_kwargs are often there to replace it)."""
    try:
        row_env = await asyncio.to_thread(make_env, env_id, row_kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure to build it means "cannot be built here"
        logger.info("toolenv: the row's env %s cannot be built here (%s: %s)", env_id, type(exc).__name__, exc)
        return None
    try:
        _, info = await row_env.areset(options={"task": task})
    finally:
        await row_env.aclose()
    return prompt_key(info["messages"]) != prompt_key(reset)


class ToolFailures:
    """The process's episodes with tool calls, and those most of whose calls failed.

    A failed call is an error observation the episode goes on from: a retriever down fails every
    search of every episode, verl trains on them, and only `tool_errors` shows it. So the loop
    warns, at the 1st, 10th, 100th ... failing episode (as a judge that is down does), while
    failing episodes are most of them: every one, or half or more once there are `FEW`.
    """

    #: Fewer episodes than this are too few for a share to mean much; all failing still warns.
    FEW = 4

    def __init__(self) -> None:
        self.episodes = self.failing = 0
        self.warnings = Decades()
        self._lock = threading.Lock()  # verl's worker may run loops on more than one thread

    def add(self, results: Sequence[ToolResult]) -> str | None:
        """Count one episode's tool results (parse errors are not calls); the warning to log, if any."""
        calls = [r for r in results if r.name != "parser"]
        if not calls:
            return None
        failed = [r for r in calls if r.is_error]
        with self._lock:
            self.episodes += 1
            if 2 * len(failed) < len(calls):
                return None
            self.failing += 1
            mostly = self.failing == self.episodes or (self.episodes >= self.FEW and 2 * self.failing >= self.episodes)
            if not mostly or not self.warnings.due(self.failing):
                return None
            failing, episodes = self.failing, self.episodes
        from toolenv.cli import clip_line  # an error may quote a page of a server's reply

        last = failed[-1]
        plural = "" if episodes == 1 else "s"
        return (
            f"toolenv: most tool calls failed in {failing} of {episodes} episode{plural} with tool calls so far "
            f"(the episodes go on and are trained on; see tool_errors in reward_extra_info); "
            f"tool {last.name!r} last failed: {clip_line(last.text)}"
        )


#: The process's count (verl runs one loop per sample; the count spans them all).
TOOL_FAILURES = ToolFailures()


def note_tool_failures(results: Sequence[ToolResult]) -> None:
    """Count an episode's tool results and log the warning `ToolFailures` calls for."""
    warning = TOOL_FAILURES.add(results)
    if warning is not None:
        logger.warning("%s", warning)


class RewardKeys:
    """The sets of reward component names the process's episodes reported, with the first env of
    each: verl needs the same `reward_extra_info` keys on every sample of a batch, and a batch mixing
    envs with different rewards otherwise fails in verl's postprocessing with a bare `KeyError`."""

    def __init__(self) -> None:
        self.by_keys: dict[tuple[str, ...], str] = {}
        self._lock = threading.Lock()

    def add(self, env_id: str, keys: Sequence[str]) -> str | None:
        """Note an episode's keys; the error to log when they are a second set (once per set)."""
        key_set = tuple(sorted(keys))
        with self._lock:
            if key_set in self.by_keys:
                return None
            self.by_keys[key_set] = env_id
            if len(self.by_keys) < 2:
                return None
            union = sorted({k for ks in self.by_keys for k in ks})
            seen = "; ".join(f"{e}: {', '.join(ks) or '(none)'}" for ks, e in self.by_keys.items())
        return (
            f"toolenv: episodes with different reward components in one run ({seen}); verl needs the "
            "same reward_extra_info keys on every sample of a batch and fails in its postprocessing with a "
            f"KeyError otherwise: set reward_keys: [{', '.join(union)}] on the agent loop (agent_loop_config_path)"
        )


#: The process's reward key sets (verl runs one loop per sample; a batch spans them all).
REWARD_KEYS = RewardKeys()


def note_reward_keys(env_id: str, keys: Sequence[str]) -> None:
    """Note an episode's reward keys (when the loop has no `reward_keys`) and log what `RewardKeys` finds."""
    error = REWARD_KEYS.add(env_id, keys)
    if error is not None:
        logger.error("%s", error)
