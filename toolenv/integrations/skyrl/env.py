"""`ToolEnvTextEnv`: any toolenv env as a skyrl-gym `BaseTextEnv`, for SkyRL-train's generator.

SkyRL-train's `SkyRLGymGenerator` makes one env per sample with
`skyrl_gym.make(env_class, env_config=..., extras=row)`, calls `init(prompt)` with the
row's prompt, then `step(model_text)` until `done` (or until its input length limit),
tokenizing the `observations` it gets back as the next chat turn and placing each step's
`reward` at the end of its turn; then it reads `get_metrics()` and calls `close()`. All are
sync calls. `init`, `step` and `close` run in a thread pool
(`environment.skyrl_gym.max_env_workers`) or, with no pool, on the generator's event loop,
like `make` and `get_metrics` always; both work here.

Building a toolenv env per sample would reload its tasks and tool backends, so the
envs are pooled per (env_id, env_kwargs) in the process: `__init__` borrows one and
`close()` gives it back, its tools released. The generator calls `close()` only after a
finished episode, so an env whose `init` raised is closed right then, and one the
generator drops without `close()` (it raised between two calls) is closed when it is
collected. The generator gathers a whole batch without `return_exceptions`, so one exception
would stop the training step: when the env fails (its reset, a step or the final reward
raises), the sample ends with `done` and the error in the metadata instead. A failed reset
ends it at the first step (`init` returns the row's prompt, which the model answers once);
only a row that names no task, or one with no prompt to fall back on, makes `init` raise.
The generator starts a whole batch at once, so the pool grows to a batch's size; the envs'
coroutines all run on one event loop of this module's (`_LOOP`, a
`toolenv._aio.BackgroundLoop`), not on a loop per env.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from toolenv._aio import BackgroundLoop, close_each
from toolenv.env import ToolEnv
from toolenv.episode import Episode
from toolenv.integrations._metrics import (
    answered,
    component_sums,
    failed_calls,
    failed_reset,
    infra_errors,
    parse_errors,
)
from toolenv.integrations.skyrl.rows import DEFAULT_ENV_CLASS, env_spec_from_extras, json_object, task_options
from toolenv.integrations.verl.envs import EnvPool, make_env, plain
from toolenv.types import Message, ToolResult, reply_messages

__all__ = ["ENTRY_POINT", "ToolEnvTextEnv", "close_pooled_envs", "register"]

_log = logging.getLogger(__name__)

#: The skyrl-gym entry point of every id `register` adds.
ENTRY_POINT = "toolenv.integrations.skyrl.env:ToolEnvTextEnv"

_OBSERVATION_ROLES = (None, "tool", "user")

#: Parsers whose chat templates render a tool message only after the assistant's call: gpt-oss's
#: refuses one without it, Gemma 4's writes nothing for it. SkyRL tokenizes an observation after
#: a fixed `[system, user]` base, without the call, so their results go back as a user message.
_PAIRED_TOOL_MESSAGES = frozenset({"harmony", "gemma4"})

#: Parsers whose chat templates refuse a user message right after a user message (Mistral's:
#: user and assistant must alternate; tool messages are not counted), which is where SkyRL
#: puts an observation. Errors that answer no call go back in a tool message with this id
#: (9 letters and digits, as Mistral's templates require) instead of a user message.
_NO_USER_OBSERVATIONS = {"mistral": "error0000"}

#: Every env's coroutines run on this one loop, whichever of SkyRL's threads (or its event
#: loop's, with `max_env_workers=0`) calls: SkyRL's generator makes a whole batch's envs (thousands)
#: before any closes, and a sync `ToolEnv` call would give each an event loop (three open files)
#: and a per-loop client or batcher (the judge's, the search backend's) of its own.
_LOOP = BackgroundLoop("toolenv-skyrl-envs")


# ---------------------------------------------------------------------- the env pool
@dataclasses.dataclass
class _Lease:
    key: str
    env: ToolEnv
    max_turns: int  # the env's own limit, for a borrower that sets none


class _Pool:
    """Idle ToolEnvs per (env_id, env_kwargs), shared by the generator's threads."""

    def __init__(self) -> None:
        self._idle: dict[str, list[_Lease]] = {}
        self._lock = threading.Lock()
        self.created = 0

    def acquire(self, env_id: str, env_kwargs: Mapping[str, Any]) -> _Lease:
        key = EnvPool.key(env_id, env_kwargs)
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                return idle.pop()
        env = make_env(env_id, env_kwargs)  # outside the lock: factories may load data
        with self._lock:
            self.created += 1
        return _Lease(key, env, env.max_turns)

    def release(self, lease: _Lease) -> None:
        with self._lock:
            self._idle.setdefault(lease.key, []).append(lease)

    def drain(self) -> list[_Lease]:
        with self._lock:
            leases = [lease for idle in self._idle.values() for lease in idle]
            self._idle.clear()
        return leases


_POOL = _Pool()


def _close_dropped(env: ToolEnv) -> None:
    """Close the env of a text env dropped without `close()` (SkyRL's generator raised between
    two calls), on a thread of its own: the collector runs this on any thread, the env loop's
    included, maybe holding a lock, and must not wait for the loop."""
    threading.Thread(target=_close_now, args=(env,), name="toolenv-skyrl-dropped", daemon=True).start()


def _close_now(env: ToolEnv) -> None:
    try:
        _LOOP.run(env.aclose())
    except Exception:  # noqa: BLE001 - nobody to raise to
        _log.warning("closing a dropped SkyRL env's toolenv env failed", exc_info=True)


def close_pooled_envs() -> int:
    """Close every idle pooled env (its tools); returns how many. For the end of a run or a test.

    Raises:
        Exception: the first env that failed to close, once every other one is closed.
    """
    leases = _POOL.drain()
    _LOOP.run(close_each(leases, lambda lease: lease.env.aclose(), lambda lease: f"env {lease.key!r}", _log))
    return len(leases)


# ---------------------------------------------------------------------- the env
def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(plain(value), default=str))


def _chat(message: Message) -> dict[str, Any]:
    """A toolenv Message as SkyRL's chat dict: role and text content (images dropped), plus the
    tool message's name and call id."""
    return (dataclasses.replace(message, images=[]) if message.images else message).to_openai()


def _first(*values: Any) -> Any:
    """The first value that is not None (a setting's source in order of precedence)."""
    return next((v for v in values if v is not None), None)


#: Where a turn limit comes from, in order of precedence (`_turn_limit`), and how to use the row's instead.
_LIMIT_SOURCES = (
    ("environment.skyrl_gym.<env_class>.max_turns={}", "drop max_turns from that config"),
    ("register(max_turns={})", "drop register's max_turns"),
    ("SkyRL's generator.max_turns={}", "set generator.max_turns={}"),
)

#: The (env id, stored limit, limit used) pairs already warned of in this process.
_warned_limits: set[tuple[str, int, int]] = set()
_warned_lock = threading.Lock()


def _turn_limit(*values: Any) -> tuple[Any, int]:
    """The first limit set (the config's, the registration's, SkyRL's `extras["max_turns"]`) and
    its index in `_LIMIT_SOURCES`; `(None, -1)` when none is set."""
    for i, value in enumerate(values):
        if value is not None:
            return value, i
    return None, -1


def _warn_overridden_limit(env_id: str, stored: Any, limit: int, stored_in: str, source: int) -> None:
    """Warn, once per process and pair of values, that the turn limit used is not the `max_turns`
    the env kwargs store: SkyRL always passes its `generator.max_turns` (default 1), which wins
    over a row's, and its default cannot be told from a setting, so the override stays but is said."""
    if not isinstance(stored, int) or stored == limit:
        return
    with _warned_lock:
        if (env_id, stored, limit) in _warned_limits:
            return
        _warned_limits.add((env_id, stored, limit))
    what, fix = _LIMIT_SOURCES[source]
    _log.warning(
        "toolenv: %s overrides max_turns=%s in %s for %s, so episodes are cut at %s turn(s); to use %s, %s "
        "(the first set wins: environment.skyrl_gym.<env_class>.max_turns, register(max_turns=...), "
        "generator.max_turns)",
        what.format(limit),
        stored,
        stored_in,
        env_id,
        limit,
        stored,
        fix.format(stored),
    )


def _default_role(env: ToolEnv) -> str:
    """`"tool"` for parsers whose chat templates have tool messages that render on their own, else `"user"`."""
    parser = env.parser
    return "tool" if parser.tool_messages and parser.name not in _PAIRED_TOOL_MESSAGES else "user"


class ToolEnvTextEnv(BaseTextEnv):  # type: ignore[misc]
    """One SkyRL sample's episode of a toolenv env, driven by the model's raw text.

    SkyRL calls it as `ToolEnvTextEnv(env_config=..., extras=row)`; the keyword-only
    arguments are the defaults `register` stored for the skyrl-gym id. A setting in
    `env_config` wins over the registration's, except `env_id`, which a per-id registration pins.

    Args:
        env_config: SkyRL's per-env-class config (what the generator finds at
            `environment.skyrl_gym.<env_class>`, else `{}`): `env_id`, `env_kwargs`, `max_turns`,
            `observation_role`, `use_env_prompt`, `reward_at_end`, all optional.
        extras: the dataset row without `prompt` and `env_class`: its `extra_info` names the
            task (`task`, `task_id`, `task_index` or a `question`; see `task_options`) and may
            name the env (`env_id`, `env_kwargs` JSON). SkyRL adds `max_turns` (its
            `generator.max_turns`).
        env_id: the toolenv env id: pinned by a per-id registration; for the generic class, the
            row's `extra_info.env_id`, else the config's.
        env_kwargs: `gym.make` keyword arguments; the config's and then the row's are merged over them.
        max_turns: model turns before the episode is cut (done, truncated). The config's wins,
            then this, then SkyRL's `extras["max_turns"]` (always set: `generator.max_turns`,
            default 1); with none, the env's own `max_turns`. One that differs from a `max_turns`
            in the env kwargs (the row's `extra_info.env_kwargs`) still wins, with a warning once
            per process and pair of values.
        observation_role: `"tool"` (a tool message per result; the chat template wraps it, e.g.
            Qwen's `<tool_response>`), `"user"` (one user message with the env's formatted
            observation, e.g. `<information>...</information>`), or None: `"tool"` for parsers
            whose chat templates have tool messages (hermes, ...), `"user"` otherwise and for
            harmony and gemma4, whose templates render a tool message only after the call,
            which SkyRL's observation tokenization leaves out. With `"tool"`, errors that
            answer no call go as a user message, but for mistral, whose templates refuse a user
            message after the user message SkyRL renders an observation after: a tool message
            with the id `error0000` (so `"user"` does not work with Mistral's templates).
        use_env_prompt: `init` returns the env's own first messages for the task instead of
            the row's prompt (for rows made elsewhere that carry only a task id).
        reward_at_end: every step's reward is 0 but the one that ends the episode, which carries
            the episode's return. For SkyRL with a custom chat template (`generator.chat_template`),
            whose generator keeps only the last step's reward, or with
            `generator.step_wise_trajectories`, whose trainer takes every step's advantage from
            the last step's reward; by default each step carries its own (SkyRL's token-level
            rewards, placed at the end of each turn).

    Attributes:
        env: the pooled `ToolEnv` this sample runs on (until `close`).
        last_info: the info dict of the env's last `reset` or `step`.

    Raises:
        ValueError: no env id is given, a per-id class gets a row of another env, or a setting is invalid.
    """

    def __init__(
        self,
        env_config: Any = None,
        extras: Mapping[str, Any] | None = None,
        *,
        env_id: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        observation_role: str | None = None,
        use_env_prompt: bool = False,
        reward_at_end: bool = False,
    ) -> None:
        super().__init__()
        config = json_object(env_config, "env_config")
        self.extras: dict[str, Any] = plain(dict(extras or {}))
        row_env_id, row_kwargs = env_spec_from_extras(self.extras)
        if env_id and row_env_id and row_env_id != env_id:
            raise ValueError(
                f"this skyrl-gym class runs {env_id!r} but the row names {row_env_id!r}; "
                f"use the row's env id (or {DEFAULT_ENV_CLASS!r}) as its env_class"
            )
        chosen = env_id or row_env_id or config.get("env_id")
        if not chosen:
            raise ValueError(
                "no toolenv env id: register the env id as the env_class (toolenv.integrations.skyrl.register), "
                "or give the row extra_info.env_id, or set env_id in environment.skyrl_gym.<env_class>"
            )
        self.env_id: str = str(chosen)
        kwargs = {
            **json_object(env_kwargs, "env_kwargs"),
            **json_object(config.get("env_kwargs"), "env_config.env_kwargs"),
            **row_kwargs,
        }
        role = _first(config.get("observation_role"), observation_role)
        if role not in _OBSERVATION_ROLES:
            raise ValueError(f"observation_role must be 'tool', 'user' or None, got {role!r}")
        self.use_env_prompt = bool(_first(config.get("use_env_prompt"), use_env_prompt))
        self.reward_at_end = bool(_first(config.get("reward_at_end"), reward_at_end))
        limit, source = _turn_limit(config.get("max_turns"), max_turns, self.extras.get("max_turns"))
        if limit is not None and int(limit) < 1:
            raise ValueError(f"max_turns must be at least 1, got {limit}")
        if limit is not None:
            stored_in = "the row's extra_info.env_kwargs" if "max_turns" in row_kwargs else "env_kwargs"
            _warn_overridden_limit(self.env_id, kwargs.get("max_turns"), int(limit), stored_in, source)
        self._lease = _POOL.acquire(self.env_id, kwargs)
        self.env: ToolEnv = self._lease.env
        # SkyRL calls close() only after a finished episode: if the generator raises between two
        # calls it drops this object, and the env (with its episode's tools) is closed then.
        self._on_drop = weakref.finalize(self, _close_dropped, self.env)
        self._on_drop.atexit = False
        self.observation_role: str = role or _default_role(self.env)
        self.max_turns = self.env.max_turns = int(limit) if limit is not None else self._lease.max_turns
        self.last_info: dict[str, Any] = {}
        # This sample's episode: the pooled env's own `episode` is the last sample's until `init`,
        # and the next sample's once `close()` has given the env back.
        self._episode: Episode | None = None
        self._closed = False
        self._broken = False
        #: The env's failure that ended the episode ("Type: message"), None while it has not failed.
        self.error: str | None = None
        #: `init`'s reset failed and no step has reported it yet.
        self._reset_error_pending = False

    # ------------------------------------------------------------------ SkyRL's calls
    def init(self, prompt: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the row's episode. Returns the row's prompt as given, or the env's own first
        messages for the task with `use_env_prompt` or an empty prompt; and `{env_id, task_id}`.

        When the env's reset raises (a task it does not have, a tool that cannot open, a remote
        env's server refusing the session), the sample fails as a failed step does, not SkyRL's
        batch: the env is closed, a warning logged, and the row's prompt returned with
        `{env_id, task_id: None, error}`; the first `step` then ends the episode (`done`,
        reward 0, `metadata["error"]`). SkyRL lets an env mask no tokens, so that one reply is
        trained with reward 0, as the turns of an episode whose step failed are.

        Raises:
            ValueError: the row names no task (see `task_options`), or the env's prompt has images.
            Exception: the env's reset raised and the row has no prompt to fall back on (e.g.
                KeyError: the row's `task_id` is not one of the env's tasks).
        """
        self._check_open()
        with self._closed_on_error():
            return self._init(prompt)

    def _init(self, prompt: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        options = task_options(self.extras)  # a row naming no task is the dataset's bug: raised
        try:
            _, info = _LOOP.run(self.env.areset(options=options))
        except Exception as exc:
            if not prompt:  # nothing to give the model
                raise
            return self._reset_failed(prompt, exc)
        self._episode = self.env.episode
        self.turns = 0
        self.last_info = info
        meta = {"env_id": self.env_id, "task_id": info["task_id"]}
        if prompt and not self.use_env_prompt:
            return [dict(m) for m in prompt], meta
        messages: list[Message] = info["messages"]
        if any(m.images for m in messages):
            raise ValueError(f"task {info['task_id']!r} has images in its prompt; SkyRL's text envs carry text only")
        return [_chat(m) for m in messages if m.content], meta

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One model turn: the env parses the text, runs its calls and scores the turn. The
        observations are the next chat messages (none once `done`); the metadata is JSON-safe.
        When the env itself fails (its step or final reward raises), the episode ends here:
        `done`, reward 0 (with `reward_at_end`, what the turns scored before), `metadata["error"]`
        and `self.error` say how, a warning is logged and the env is closed.

        Raises:
            RuntimeError: `init` was not called, or the env is closed (`close()` was called, `init`
                raised or a step failed).
        """
        if self._reset_error_pending:  # init's reset failed: this step ends the sample
            self._reset_error_pending = False
            self.turns += 1
            return self._error_output(None, 0.0)
        self._check_open()
        ep = self._episode
        if ep is None:
            raise RuntimeError("init() was not called: SkyRL's generator calls it before step()")
        if ep.terminated or ep.truncated:  # SkyRL stops at `done`; a caller that goes on gets nothing run
            return BaseTextEnvStepOutput(
                observations=[], reward=0.0, done=True, metadata={"note": "the episode has ended"}
            )
        try:
            return self._step(ep, action)
        except Exception as exc:  # noqa: BLE001 - one env's failure ends its sample, not SkyRL's batch
            return self._failed(ep, exc)
        except BaseException:  # interrupted: as in `_closed_on_error`
            self._broken = True
            raise

    def _step(self, ep: Episode, action: str) -> BaseTextEnvStepOutput:
        obs, reward, terminated, truncated, info = _LOOP.run(self.env.astep(action))
        self.turns += 1
        self.last_info = info
        done = bool(terminated or truncated)
        if self.reward_at_end:
            reward = sum(t.reward for t in ep.turns) if done else 0.0
        return BaseTextEnvStepOutput(
            observations=[] if done else self._observations(obs, info["tool_results"]),
            reward=float(reward),
            done=done,
            metadata=self._metadata(info, bool(terminated), bool(truncated)),
            postprocessed_action=None,
        )

    def _failed(self, ep: Episode, exc: Exception) -> BaseTextEnvStepOutput:
        """End the episode on the env's own failure (its step or final reward raised: a remote
        env's server lost the session, a custom reward's bug). SkyRL's generator gathers a
        batch's samples without `return_exceptions`, so raising would stop the whole training
        step: the step says `done` instead, scores 0 (with `reward_at_end`, what the turns scored
        before), and the env is closed at once (SkyRL calls `close()` after `done`, which then
        does nothing)."""
        task_id = self.last_info.get("task_id")
        self._fail(task_id, exc)
        self.turns += 1
        return self._error_output(task_id, sum(t.reward for t in ep.turns) if self.reward_at_end else 0.0)

    def _reset_failed(
        self, prompt: list[dict[str, Any]], exc: Exception
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """`init` for a reset that raised: the env closed, the row's prompt returned, and the
        first `step` ends the sample (see `init`)."""
        self._fail(None, exc)
        self.turns = 0
        self._reset_error_pending = True
        return [dict(m) for m in prompt], {"env_id": self.env_id, "task_id": None, "error": self.error}

    def _fail(self, task_id: str | None, exc: Exception) -> None:
        """Record and log the env's failure, and close the env (it may hold broken state)."""
        self.error = f"{type(exc).__name__}: {exc}"
        _log.warning("toolenv: env %s failed on task %s; the episode ends here: %s", self.env_id, task_id, self.error)
        self._discard()

    def _error_output(self, task_id: str | None, reward: float) -> BaseTextEnvStepOutput:
        """The step that ends a sample on the env's failure."""
        return BaseTextEnvStepOutput(
            observations=[],
            reward=float(reward),
            done=True,
            metadata={
                "env_id": self.env_id,
                "task_id": task_id,
                "turn": self.turns,
                "terminated": False,
                "truncated": False,
                "error": self.error,
            },
            postprocessed_action=None,
        )

    def get_metrics(self) -> dict[str, Any]:
        """The episode's numbers, for SkyRL's env metrics (which its default aggregator averages
        over a batch): return, turns, tool_calls, tool_errors (the calls that failed, so at most
        tool_calls), infra_errors (those of them that were not the model's fault), parse_errors
        (the parser's error results: unreadable calls, turns with no action), answered (a
        non-empty answer), terminated, truncated, env_error (1 when the env failed and ended the
        episode; it then ended neither terminated nor truncated), and each reward component's sum
        as `reward/<name>`. `{}` before `init`; after `close()` still this sample's, though the
        pooled env may run another one by then; after a failed reset, the same counts at zero and
        env_error 1."""
        ep = self._episode
        if ep is None:
            if self.error is None:
                return {}
            return failed_reset()
        components = component_sums(ep.turns)
        results = [r for turn in ep.turns for r in turn.results]
        return {
            "return": float(sum(t.reward for t in ep.turns)),
            "turns": len(ep.turns),
            "tool_calls": ep.tool_calls,
            "tool_errors": failed_calls(results),
            "infra_errors": infra_errors(results),
            "parse_errors": parse_errors(results),
            "answered": answered(ep.answer),
            # An episode the env failed in ended neither way: its reward is not the env's.
            "terminated": float(ep.terminated and self.error is None),
            "truncated": float(ep.truncated and self.error is None),
            "env_error": float(self.error is not None),
            **{f"reward/{k}": v for k, v in components.items()},
        }

    def close(self) -> None:
        """Release the episode's tools and give the env back to the pool (idempotent). An env
        whose `init` raised or whose step failed was closed then already (SkyRL's generator
        does not call `close()` after a raise); this does nothing for it."""
        if self._closed:
            return
        self._closed = True
        self._on_drop.detach()
        try:
            _LOOP.run(self.env.aend_episode())
        except Exception:  # noqa: BLE001 - a tool that cannot release: close the env rather than reuse it
            self._broken = True
        if self._broken:
            _LOOP.run(self.env.aclose())
        else:
            _POOL.release(self._lease)

    # ------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                "this SkyRL env is closed (close() was called, init raised or a step failed); make a new one"
            )

    @contextlib.contextmanager
    def _closed_on_error(self) -> Iterator[None]:
        """Close the env now if `init` raises: SkyRL's generator lets the exception
        end the sample without calling `close()`, so waiting for it would leak the env and its
        episode's tools."""
        try:
            yield
        except Exception:
            self._discard()
            raise
        except BaseException:  # interrupted (KeyboardInterrupt, SystemExit): not waited for here;
            self._broken = True  # close() or dropping the env closes it, never pooled in an unknown state
            raise

    def _discard(self) -> None:
        """Close the env (its episode released first) instead of pooling it; `close()` then does nothing."""
        self._closed = self._broken = True
        try:
            _LOOP.run(self.env.aclose())
        except Exception:  # noqa: BLE001 - the call's own error is the one to raise; dropping it closes it
            _log.warning("closing the toolenv env %r after a failed call raised too", self.env_id, exc_info=True)
        else:
            self._on_drop.detach()

    def _observations(self, obs: str, results: list[ToolResult]) -> list[dict[str, Any]]:
        """The turn's reply: a tool message per answered call and a user message for the rest
        (`reply_messages`; a tool message for Mistral's templates, which refuse that user
        message), or the env's formatted observation as one user message."""
        if self.observation_role == "tool":
            messages = reply_messages(results)
            error_id = _NO_USER_OBSERVATIONS.get(self.env.parser.name)
            if error_id and messages and messages[-1].role == "user":
                messages[-1] = dataclasses.replace(messages[-1], role="tool", name="parser", tool_call_id=error_id)
            return [_chat(m) for m in messages]
        return [{"role": "user", "content": obs}] if obs else []

    def _metadata(self, info: Mapping[str, Any], terminated: bool, truncated: bool) -> dict[str, Any]:
        results: list[ToolResult] = info["tool_results"]
        meta: dict[str, Any] = {
            "env_id": self.env_id,
            "task_id": info["task_id"],
            "turn": info["turn"],
            "terminated": terminated,
            "truncated": truncated,
            "tool_calls": [
                {"name": r.name, "call_id": r.call_id, "error": r.error, "attempts": r.attempts}
                for r in info["tool_calls"]
            ],
            "tool_errors": failed_calls(results),
            "parse_errors": list(info["action"].errors),
            "reward_components": dict(info["reward_components"]),
        }
        if terminated or truncated:
            meta["answer"] = info.get("answer")
            meta["episode"] = _json_safe(info.get("episode_stats", {}))
            meta["reward_info"] = _json_safe(info.get("reward_info", {}))
        return meta


# ---------------------------------------------------------------------- registration
def register(
    env_ids: str | Iterable[str] | None = None,
    *,
    entry_point: str | Callable[..., ToolEnv] | None = None,
    generic: bool = True,
    env_kwargs: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
    observation_role: str | None = None,
    use_env_prompt: bool = False,
    reward_at_end: bool = False,
) -> list[str]:
    """Register toolenv envs with skyrl-gym; returns the skyrl-gym ids. Idempotent.

    Each env id becomes a skyrl-gym id of the same name (`env_class: toolenv/Spider-v0`),
    and with `generic` the id `"toolenv"` runs whatever env a row's `extra_info.env_id`
    names. Call it in the process that runs SkyRL's generator (SkyRL's entrypoint), as
    for any custom skyrl-gym env. The keyword arguments become every id's defaults (see
    `ToolEnvTextEnv`). skyrl-gym deep-copies them for every env, and the env pool is keyed
    by their JSON, so `env_kwargs` must be JSON: tools as references (`"module:Name"` or
    plugin names), not objects.

    Args:
        env_ids: toolenv env ids; default every installed one.
        entry_point: a custom env's factory (`gym.make`'s: keyword arguments in, a `ToolEnv` out,
            as TRL's `environment_factory` makes one), or its `"module:name"`, for one env id that
            Gymnasium does not have yet: registered with Gymnasium under that id first, as
            `gymnasium.register(env_id, entry_point=...)` would. The factory is called once per
            pooled env with the env kwargs, not once per sample.

    Raises:
        ValueError: an id is not a registered Gymnasium env (the message says how to register a
            custom one), `entry_point` is given for other than one id or Gymnasium has the id for
            another entry point, a setting is invalid (`env_kwargs` not JSON, `max_turns` below 1),
            or skyrl-gym has one of the ids for another entry point (then nothing is registered).
    """
    import gymnasium as gym
    from skyrl_gym.envs.registration import deregister, registry
    from skyrl_gym.envs.registration import register as skyrl_register

    import toolenv._gym

    ids = _env_ids(env_ids, entry_point, toolenv._gym.register_envs())
    if observation_role not in _OBSERVATION_ROLES:
        raise ValueError(f"observation_role must be 'tool', 'user' or None, got {observation_role!r}")
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    common: dict[str, Any] = {"use_env_prompt": use_env_prompt, "reward_at_end": reward_at_end}
    if env_kwargs:
        try:
            common["env_kwargs"] = json.loads(json.dumps(dict(env_kwargs)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"env_kwargs must be JSON (tools as 'module:Name' or plugin names): {exc}") from None
    if max_turns is not None:
        common["max_turns"] = max_turns
    if observation_role is not None:
        common["observation_role"] = observation_role
    specs = [(DEFAULT_ENV_CLASS, common)] if generic else []
    specs += [(i, {**common, "env_id": i}) for i in ids]
    taken = {s: registry[s].entry_point for s, _ in specs if s in registry and registry[s].entry_point != ENTRY_POINT}
    if taken:
        raise ValueError(f"skyrl-gym already has these ids for other envs: {taken}")
    if entry_point is not None and ids[0] not in gym.registry:  # checked by `_env_ids`: now nothing can fail
        gym.register(ids[0], entry_point=entry_point)
    for skyrl_id, kwargs in specs:
        if skyrl_id in registry:
            deregister(skyrl_id)  # ours: replaced, so new defaults take effect
        skyrl_register(id=skyrl_id, entry_point=ENTRY_POINT, kwargs=kwargs)
    return [s for s, _ in specs]


def _unknown_ids_message(unknown: list[str]) -> str:
    """One line naming the ways a custom env gets an id `register` can take."""
    first = unknown[0]
    return (
        f"not registered with Gymnasium: {unknown}; for your own env pass its factory, "
        f"register({first!r}, entry_point=make_env) (keyword arguments in, a toolenv.ToolEnv out), "
        f"or call gymnasium.register({first!r}, entry_point='your_module:make_env') first, or install "
        "a package with a 'toolenv.envs' entry point (its id is toolenv/<name>), or use 'toolenv/ToolEnv-v0' "
        "with env_kwargs of JSON references (tools as 'module:Name' or plugin names); see docs/skyrl.md"
    )


def _env_ids(
    env_ids: str | Iterable[str] | None, entry_point: str | Callable[..., ToolEnv] | None, known: list[str]
) -> list[str]:
    """The Gymnasium ids `register` is asked for (`known`, the installed ones, for None), checked;
    with `entry_point`, the one id it will register with Gymnasium (`make_env` makes envs there).

    Raises:
        ValueError: an id is not registered (and has no entry point), or `entry_point` comes with
            other than one id, a malformed id or one Gymnasium has for another entry point.
    """
    import gymnasium as gym

    if entry_point is not None:
        if not isinstance(env_ids, str):
            raise ValueError(f"entry_point= registers one env id (a string), got {env_ids!r}")
        try:
            gym.envs.registration.parse_env_id(env_ids)
        except gym.error.Error as exc:
            raise ValueError(f"cannot register {env_ids!r} with Gymnasium: {exc}") from None
        spec = gym.registry.get(env_ids)
        if spec is not None and spec.entry_point != entry_point:
            raise ValueError(
                f"Gymnasium already has {env_ids!r} for {spec.entry_point!r}; "
                "give your env another id, or register(env_id) without entry_point to use that one"
            )
        return [env_ids]
    if env_ids is None:
        return known
    ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
    unknown = [i for i in ids if i not in gym.registry]
    if unknown:
        raise ValueError(_unknown_ids_message(unknown))
    return ids
