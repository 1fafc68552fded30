"""Any toolenv env as a TRL `environment_factory`, for `GRPOTrainer`'s native tool-calling loop.

TRL (>= 1.6) makes one environment object per rollout, resets it with the dataset row,
offers the object's public methods to the model as tools, runs the calls the model's
chat template writes, and scores the rollout with the object's `get_reward()`. Here
each such object holds a `ToolEnv` episode:

- `reset(**row)` starts an episode on the row's task (`task` as JSON or a dict,
  `task_id`, or the row's own `question`/`answer`/... columns), and for a row without a
  prompt returns the text `dataset_rows` would have put in it;
- one method per toolenv tool (per `env.tool_schemas()`, so a remote env offers its
  server's tools), with the tool's argument schema as type hints and a Google-style
  docstring, so TRL's chat template shows the model the tool it knows;
  a call is one env step, so toolenv validates, limits, truncates and records it; a
  failed call raises `ToolCallError` with the error text, which TRL counts as a failed
  tool call and shows the model as `{'error': <text>}` (`raise_tool_errors=False`: the
  text comes back as the tool's result instead); a result with images comes back as
  content blocks (`[{"type": "image", "image": PIL}, ..., {"type": "text", ...}]`), which
  `GRPOTrainer` puts in the tool message for a vision model;
- an `answer` method (its name is configurable) that gives the final answer and ends
  the episode, since TRL tells the environment nothing of the model's last message;
- `get_reward()`: the episode's return, as verl's agent loop reports it (the sum of the
  step rewards); an episode still open (the model stopped calling tools without
  answering) is ended first and scored with no answer;
- a call whose env step raises (its reward fails, a remote env's server lost the session),
  `get_reward()` scoring an open episode that raises, or a reset that raises on a row with a
  prompt (the prompt then stands as it is), ends the episode, as in verl's agent loop: a
  warning is logged, the environment's `error` (and `last_info["error"]`) says what failed,
  the tools are released, the call fails with that text, and `get_reward()` gives the
  return of the turns before it.

The factory (`EnvironmentFactory`) pickles, for TRL's async trainer, and names each env's
class, which TRL logs the env's reward under: the same name for the same settings, another for
other settings. TRL never gives the env the model's text, so the factory warns of reward parts
that read it (`format`, a `TurnReward`, the parse-error part of `invalid_call_penalty`);
`episode_metrics` gives a TRL reward function the episodes' reward components to log.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import pickle
import re
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from toolenv._aio import BackgroundLoop
from toolenv._schema import flatten_schema
from toolenv.env import ToolEnv, written_turn
from toolenv.episode import Episode
from toolenv.integrations._metrics import (
    answered,
    component_sums,
    failed_calls,
    failed_reset,
    infra_errors,
    parse_errors,
)
from toolenv.integrations.trl.schema import schema_signature
from toolenv.rewards import ActionPenalties, FormatReward, InvalidCallPenalty, TurnReward, WeightedSum
from toolenv.runner import EnvSpec, _make_env
from toolenv.types import Message, ParsedAction, Task, ToolCall, ToolImage, ToolResult, new_message

__all__ = [
    "ANSWER_DOC",
    "EnvironmentFactory",
    "TRLEnvironment",
    "ToolCallError",
    "dataset_rows",
    "environment_factory",
    "episode_metrics",
]

_log = logging.getLogger(__name__)

#: Docstring of the answer method (transformers reads the tool's description and argument from it).
ANSWER_DOC = """Give your final answer. This ends the episode; call it once, after gathering what you need.

Args:
    answer: The final answer, as short as the question allows.

Returns:
    A confirmation.
"""

#: The text-format answer tag a TRL prompt must not tell the model to write.
_OPEN_ANSWER = "<answer>"

_TASK_FIELDS = ("id", "question", "prompt", "answer", "context", "metadata")

#: The loop every TRL environment's episode runs on. TRL keeps one environment per sample of a
#: generation batch for the whole run; a loop per env would hold three open files each.
_LOOP = BackgroundLoop("toolenv-trl-envs")


class ToolCallError(Exception):
    """A tool call that failed (or was not run: the episode had ended), raised from a tool method
    so that TRL counts it in `tools/failure_frequency`; the message is toolenv's error text, which
    TRL shows the model as `{'error': <text>}`. The env has run and recorded the call before."""

    def __init__(self, text: str, result: ToolResult | None = None) -> None:
        super().__init__(text)
        self.result = result  # None for a call that was not run


class _ContentBlocks(list[dict[str, Any]]):
    """A tool result with images: content blocks `[{"type": "image", "image": PIL}, ..., {"type": "text",
    "text": ...}]`, which `GRPOTrainer` puts in the tool message for a vision model's chat template (and
    its forward pass). Its `str()` is the text alone: TRL's async trainer, text-only, sends the model
    `str(result)`, which for a plain list would be the blocks' repr."""

    def __str__(self) -> str:
        return "\n".join(str(b["text"]) for b in self if b.get("type") == "text")


def _image_blocks(images: list[ToolImage]) -> list[dict[str, Any]]:
    """TRL's image content blocks. The PIL images have no file format, so that `datasets` stores a
    dataset image losslessly (PNG) rather than re-encoding a JPEG at its own quality."""
    return [{"type": "image", "image": im.to_pil().copy()} for im in images]


class TRLEnvironment:
    """One rollout's episode of a `ToolEnv`, seen by TRL as an environment with tool methods.

    Subclasses made by `environment_factory` add a method per tool; use the factory
    rather than this class. `env`, `last_info` and `error` are public for reward functions
    that read the episode (`kwargs["environments"]` in TRL); `error` is the env's failure
    that ended the episode ("Type: message"), else None. An env that failed is closed, and
    the next `reset` runs on a new one from `remake` (the factory's; without it, the same env
    reopened).
    """

    _answer_tool: str | None = None
    _raise_tool_errors: bool = True

    def __init__(self, env: ToolEnv, remake: Callable[[], ToolEnv] | None = None) -> None:
        self.env = env
        self.last_info: dict[str, Any] = {}
        self.error: str | None = None
        #: Makes the env that replaces one that failed (the factory's), None to reopen the same one.
        self._remake = remake
        self._broken = False
        self._return = 0.0
        self._calls = 0
        self._reset_failed = False  # this row's episode never started: `env.episode` is an older one, if any

    # TRL calls `reset(**row)` with every column of the dataset row, `prompt` included.
    def reset(self, **row: Any) -> str | list[dict[str, Any]] | None:
        """Start an episode on the row's task. A row without a prompt gets back the text `dataset_rows`
        would have put in its prompt (the system message's, then the question), which TRL adds to the
        prompt's empty user message; as content blocks `[image..., text]` when the task's prompt has images.

        The episode's prompt messages (and `last_info["messages"]`) are then what TRL shows the model: the
        row's prompt, or that one user message, not the env's own text prompt with its call format.

        When the env's reset raises (a task it does not have, a tool that cannot open, a remote env's
        server refusing the session), the episode fails as a failing call does, not TRL's run: logged,
        kept as `error`, every call refused and `get_reward()` 0.0; this returns None, the row's
        prompt shown as it is. A row with no prompt to show raises it instead, as does a row that
        names no task (ValueError)."""
        task = _row_task(row)
        options: dict[str, Any] = {"task": task} if task is not None else {"task_id": row["task_id"]}
        if self._broken and self._remake is not None:  # the env that failed is closed: a new one
            self.env = self._remake()
        self._broken = False
        self._return = 0.0
        self._calls = 0
        self.error = None
        self._reset_failed = False
        try:
            _, info = _LOOP.run(self.env.areset(options=options))
        except Exception as exc:
            if not row.get("prompt"):  # nothing TRL could show the model
                raise
            self._fail(task.id if task is not None else str(row["task_id"]), exc)
            self._reset_failed = True
            self._retire()
            return None
        rendered = [im for m in info["messages"] for im in m.images]
        prompt = row.get("prompt")
        out: str | list[dict[str, Any]] | None = None
        if prompt:
            shown = _shown_messages(prompt, _row_images(row, rendered))
        else:
            system, question = _prompt_texts(self.env, self._episode().task, self._answer_tool)
            text = f"{system}\n\n{question}" if system else question
            out = [*_image_blocks(rendered), {"type": "text", "text": text}] if rendered else text
            shown = [new_message("user", text, images=list(rendered))]
        self._episode().messages[:] = shown
        info["messages"] = list(shown)
        self.last_info = info
        return out

    def get_reward(self) -> float:
        """The episode's return; an open episode is ended with no answer and scored first (one the
        env's failure ended is not: its return is that of the turns before the failure). Scoring
        it failing is such a failure too: it ends the episode as a failing call does, rather than
        raising into TRL's reward step, which would stop the run."""
        if self.error is None:
            ep = self._episode()
            try:
                self._return += _LOOP.run(self.env.atruncate())  # nothing when the episode has ended
            except Exception as exc:  # noqa: BLE001 - as a failing step: this episode ends, not the run
                self._env_failed(ep, exc)
        return self._return

    # ------------------------------------------------------------------ calls
    def _episode(self) -> Episode:
        ep = self.env.episode
        if ep is None:
            raise RuntimeError("reset() was not called: TRL resets every environment before generating")
        return ep

    def _step(self, parsed: ParsedAction) -> tuple[str, dict[str, Any] | None]:
        """(observation, step info), or the reason and None when the episode has ended."""
        ep = None if self.error is not None else self._episode()  # a failed reset left no episode
        if ep is None or ep.terminated or ep.truncated:
            why = (
                "the environment failed"
                if ep is None or self.error is not None
                else "the answer was given"
                if ep.terminated
                else f"the limit of {self.env.max_turns} turns was reached"
            )
            return f"The episode has ended ({why}); nothing more is run.", None
        try:
            obs, reward, _, _, info = _LOOP.run(self.env.astep(written_turn(self.env.parser, parsed), parsed=parsed))
        except Exception as exc:  # noqa: BLE001 - TRL would show it to the model as its error and score 0 unsaid
            return self._env_failed(ep, exc), None
        self._return += float(reward)
        self.last_info = info
        return obs, info

    def _env_failed(self, ep: Episode, exc: Exception) -> str:
        """End the episode on the env's failure `exc`: logged, kept as `error`, tools released and
        closed; the text the failed call gives back."""
        self._fail(ep.task.id, exc, len(ep.turns))
        self._retire()
        return f"The environment failed ({self.error}); the episode ends here."

    def _retire(self) -> None:
        """Close the env that failed (its episode released first; the episode stays readable): it
        may hold broken state, such as a tool mid-call or a half-closed connection. The next
        reset runs on a new env from the factory."""
        self._broken = True
        try:
            _LOOP.run(self.env.aclose())
        except Exception:  # noqa: BLE001 - the env's failure is the one to report
            _log.warning("toolenv: closing the env of the failed episode failed too", exc_info=True)

    def _fail(self, task_id: str, exc: Exception, turn: int = 0) -> None:
        """Keep the env's failure `exc` as `error` (and in `last_info`) and log it."""
        self.error = f"{type(exc).__name__}: {exc}"
        _log.warning(
            "toolenv: %s failed on task %s; the episode ends here: %s", type(self).__name__, task_id, self.error
        )
        self.last_info = {"task_id": task_id, "turn": turn, "error": self.error}

    def _failed(self, text: str, result: ToolResult | None = None) -> str:
        """`text`, or `ToolCallError(text)` raised when the factory says so (its default)."""
        if self._raise_tool_errors:
            raise ToolCallError(text, result)
        return text

    def _call(self, name: str, arguments: dict[str, Any]) -> str | list[dict[str, Any]]:
        self._calls += 1
        call = ToolCall(name=name, arguments=arguments, id=f"call_{self._calls}")
        obs, info = self._step(ParsedAction(tool_calls=[call]))
        results: list[ToolResult] = info["tool_results"] if info else []
        if not results:
            return self._failed(obs)
        result = results[0]
        if result.is_error:
            return self._failed(result.text, result)
        if result.images:  # GRPOTrainer passes a list through as the tool message's content blocks
            return _ContentBlocks([*_image_blocks(result.images), {"type": "text", "text": result.text}])
        return result.text

    def _answer(self, answer: str) -> str:
        obs, info = self._step(ParsedAction(answer=str(answer)))
        return self._failed(obs) if info is None else "Your answer is recorded; the episode is over."


def episode_metrics(environments: Sequence[Any]) -> list[dict[str, float]]:
    """Each environment's episode in numbers, for a TRL reward function to log (`log_metric`).

    The keys are those of SkyRL's env metrics: `return`, `turns`, `tool_calls`, `tool_errors` (calls
    that failed), `infra_errors` (those not the model's fault), `parse_errors`, `answered` (a
    non-empty answer), `terminated`, `truncated`, `env_error` (1 when the env
    failed and ended the episode) and each reward component's sum as `reward/<name>`; `{}` for an
    object that is no toolenv environment (or was never reset).

    TRL runs the env's `get_reward` after the user's reward functions, so an episode the model left
    unanswered is still open when they read it: this calls `get_reward()` first, which ends and scores
    it (once: TRL's later call gives the same return). A module-level function, not a method: TRL
    offers every public method of an environment to the model as a tool."""
    return [_metrics(e) if isinstance(e, TRLEnvironment) else {} for e in environments]


def _metrics(environment: TRLEnvironment) -> dict[str, float]:
    if environment._reset_failed:  # this row's episode never started
        return failed_reset()
    ep = environment.env.episode
    if ep is None:
        return {}
    returned = environment.get_reward()
    # An episode with no turn (the model called nothing) keeps its final score in `final_components` alone.
    components = component_sums(ep.turns, None if ep.turns else ep.final_components)
    results = [r for turn in ep.turns for r in turn.results]
    failed = environment.error is not None
    return {
        "return": float(returned),
        "turns": float(len(ep.turns)),
        "tool_calls": float(ep.tool_calls),
        "tool_errors": float(failed_calls(results)),
        "infra_errors": float(infra_errors(results)),
        "parse_errors": float(parse_errors(results)),
        "answered": answered(ep.answer),
        # An episode the env failed in ended neither way: its reward is not the env's.
        "terminated": float(ep.terminated and not failed),
        "truncated": float(ep.truncated and not failed),
        "env_error": float(failed),
        **{f"reward/{k}": v for k, v in components.items()},
    }


def _text_readers(reward: Any, key: str = "") -> list[str]:
    """What each part of `reward` that reads the model's text sees under TRL, as `'name' (what)`.

    TRL gives the env the parsed tool calls, never the model's text, so each turn's text is the
    env's own rewrite of the call (`written_turn`): always well formed, with no reasoning, and a
    malformed call or a reply with no call never becomes a turn at all."""
    name = key or str(getattr(reward, "name", "")) or type(reward).__name__
    if isinstance(reward, WeightedSum):
        return [said for k, (part, _) in reward.parts.items() for said in _text_readers(part, k)]
    if isinstance(reward, ActionPenalties):
        return _text_readers(reward.invalid, name)
    if isinstance(reward, FormatReward):
        if reward._think is not None:
            return [f"{name!r} (always 0.0: no turn the env writes has a <{reward._think}> block)"]
        ended = "answered episode" if reward.require_answer else "episode with a call"
        return [f"{name!r} (1.0 for every {ended}: every turn the env writes is well formed)"]
    if isinstance(reward, TurnReward):
        return [f"{name!r} (its turn.action is the env's rewrite of the call, not what the model wrote)"]
    if isinstance(reward, InvalidCallPenalty) and reward.per_invalid and (reward.parse_errors or reward.no_action):
        return [f"{name!r} (counts failed tool calls only: a malformed call or a reply with no call is no turn)"]
    return []


def _warn_text_readers(env: ToolEnv, label: str) -> None:
    """Log one warning naming the parts of `env`'s reward that read the model's text, if any."""
    said = _text_readers(getattr(env, "reward_fn", None))
    if said:
        _log.warning(
            "toolenv: under TRL the env of %s never sees the model's text, only its parsed tool calls, so these "
            "reward parts score the env's own rewrite of each call: %s. Score the text with a TRL reward function "
            "(it gets the completions) instead; see 'What the env sees under TRL' in docs/trl.md",
            label,
            "; ".join(said),
        )


def _prompt_texts(env: ToolEnv, task: Task, answer_tool: str | None) -> tuple[str, str]:
    """(system message, question) of `task` for a model shown the tools by its chat template. With an
    answer tool, the env's `answer_tool_rewrites` turn what its prompt says about writing the answer
    (or a call) as text into giving it through that tool, and the system message ends by saying so:
    TRL shows the env no reply text, so a model told to write `<answer>...</answer>` would score 0."""
    system, question = env.system_prompt or "", task.prompt or task.question
    if not answer_tool:
        return system, question
    for phrase, wording in env.answer_tool_rewrites.items():
        wording = wording.replace("{answer_tool}", answer_tool)
        system, question = system.replace(phrase, wording), question.replace(phrase, wording)
    note = f"Give your final answer by calling the `{answer_tool}` tool."
    return (f"{system}\n\n{note}" if system else note), question


def _tool_image(image: Any) -> ToolImage | None:
    """A prompt image as toolenv keeps it (a PIL image or a ToolImage; None for a path or URL)."""
    if isinstance(image, ToolImage):
        return image
    return ToolImage.from_pil(image) if hasattr(image, "save") and hasattr(image, "size") else None


def _row_images(row: Mapping[str, Any], rendered: list[ToolImage]) -> list[ToolImage]:
    """The images TRL puts in a row's prompt: its `images` column (or `image`). As many as the env
    rendered are those `dataset_rows` wrote there (the same pixels), kept without encoding them again."""
    images = row.get("images")
    if images is None and row.get("image") is not None:
        images = [row["image"]]
    if not images:
        return []
    if len(images) == len(rendered):
        return list(rendered)
    return [im for im in map(_tool_image, images) if im is not None]


def _prompt_calls(calls: Any) -> list[ToolCall] | None:
    """An assistant prompt message's `tool_calls` (TRL's and OpenAI's shape) as toolenv's calls."""
    out = []
    for i, call in enumerate(calls or []):
        fn = call.get("function", call)
        arguments = fn.get("arguments") or {}
        if isinstance(arguments, str):  # OpenAI's shape: JSON text (kept whole when it is not an object)
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            arguments = {"arguments": arguments}
        out.append(ToolCall(name=str(fn.get("name", "")), arguments=arguments, id=str(call.get("id") or f"p{i}")))
    return out or None


def _shown_messages(prompt: Any, images: list[ToolImage]) -> list[Message]:
    """A row's prompt as toolenv's messages: what TRL shows the model. As TRL's `prepare_multimodal_messages`
    does, the row's images go to the first user message written as text, or fill a content list's
    image placeholders; a content list's text parts are joined."""
    if isinstance(prompt, str):  # a standard (not conversational) prompt
        return [new_message("user", prompt, images=list(images))]
    pending, placed, out = list(images), False, []
    for m in prompt:
        role, content = m["role"], m.get("content")
        pictures: list[ToolImage] = []
        if isinstance(content, list):
            texts = []
            for block in content:
                if block.get("type") == "text":
                    texts.append(str(block.get("text") or ""))
                elif block.get("type") == "image":
                    image = _tool_image(block["image"]) if block.get("image") is not None else None
                    if image is None and block.get("image") is None and pending:
                        image = pending.pop(0)
                    if image is not None:
                        pictures.append(image)
            text = "".join(texts)
        else:
            text = "" if content is None else str(content)
            if role == "user" and not placed:
                pictures, pending, placed = pending, [], True
        calls = _prompt_calls(m.get("tool_calls"))
        out.append(new_message(role, text, m.get("name"), m.get("tool_call_id"), calls, pictures))
    return out


def _row_task(row: Mapping[str, Any]) -> Task | None:
    """The task a dataset row names: its `task` column (JSON or dict), else its Task-shaped columns;
    None when it names a `task_id`. A None value counts as absent: `datasets` gives every row every
    column, and a dict column every key, None where the row had none."""
    value = row.get("task")
    if isinstance(value, Task):
        return value
    if isinstance(value, str) and value:
        return Task.model_validate_json(value)
    if isinstance(value, Mapping):
        return Task.model_validate({k: v for k, v in value.items() if v is not None})
    if row.get("task_id") is not None:
        return None
    fields = {k: row[k] for k in _TASK_FIELDS if k in row and k != "prompt" and row[k] is not None}
    if "question" not in fields:
        raise ValueError(
            "this dataset row names no task: give it a 'task' column (JSON, as toolenv.integrations.trl.dataset_rows "
            "writes), a 'task_id' column, or a 'question' column"
        )
    return Task.model_validate(fields)


def _tool_method(name: str, schema: Mapping[str, Any]) -> Callable[..., Any]:
    """The method standing for the tool whose (flattened) function schema is `schema`: a call is one env step."""
    signature, annotations, doc = schema_signature(schema)

    def method(self: TRLEnvironment, **arguments: Any) -> str | list[dict[str, Any]]:
        return self._call(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    method.__doc__ = doc
    return method


def _answer_method(name: str) -> Callable[..., Any]:
    def method(self: TRLEnvironment, answer: str) -> str:
        return self._answer(answer)

    method.__name__ = method.__qualname__ = name
    method.__annotations__ = {"answer": str, "return": str}  # not `self`: transformers reads every hint
    method.__doc__ = ANSWER_DOC
    return method


class EnvironmentFactory:
    """A zero-argument factory of TRL environments for one toolenv env; `environment_factory` makes it.

    It pickles (TRL's `AsyncGRPOTrainer` sends it to a spawned rollout process, as do
    `torch.multiprocessing` and Ray): its state is the env spec, `answer_tool`, `env_kwargs`,
    `raise_tool_errors` and its name, and a copy rebuilds its environment class the first time
    it is used. An env given as a lambda or a local function cannot be pickled; give an env id
    or a module-level function.
    """

    def __init__(
        self,
        env: EnvSpec,
        *,
        answer_tool: str | None = "answer",
        env_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        raise_tool_errors: bool = True,
    ) -> None:
        if name is not None and not name:
            raise ValueError("name must be a non-empty string")
        self.env = env
        self.answer_tool = answer_tool
        self.env_kwargs = dict(env_kwargs or {})
        self.raise_tool_errors = raise_tool_errors
        self._name = name
        self._lock = threading.Lock()
        self._cls: type[TRLEnvironment] | None = None
        self._spare: list[ToolEnv] = []
        self._build()  # a bad tool name or env is reported here, not at TRL's first rollout
        _warn_text_readers(self._spare[0], repr(self.name))  # once, here: not again in a process a copy is sent to

    @property
    def environment_class(self) -> type[TRLEnvironment]:
        """The class of the environments made (shared by factories of the same settings; TRL names the
        reward column after it)."""
        return self._build()

    @property
    def name(self) -> str:
        """The environment class's name, which TRL uses as this env's reward name (`rewards/<name>/mean`)."""
        return self._build().__name__

    def __call__(self) -> TRLEnvironment:
        cls = self._build()
        with self._lock:  # the env made to read the tools serves the first instance rather than being thrown away
            made = self._spare.pop() if self._spare else None
        return cls(made if made is not None else self._new_env(), remake=self._new_env)

    def _new_env(self) -> ToolEnv:
        return _make_env(self.env, self.env_kwargs)[0]

    def __repr__(self) -> str:
        return f"EnvironmentFactory({self.env!r}, name={self._name!r})"

    def _build(self) -> type[TRLEnvironment]:
        with self._lock:
            if self._cls is None:
                probe, env_id = _make_env(self.env, self.env_kwargs)
                try:
                    name, unique = (self._name, False) if self._name else (_default_name(self.env, env_id), True)
                    self._cls = _environment_class(
                        probe,
                        self.answer_tool,
                        name,
                        unique=unique,
                        raise_tool_errors=self.raise_tool_errors,
                        settings=_settings_key(self.env, self.env_kwargs),
                    )
                except BaseException:
                    probe.close()
                    raise
                self._name = self._cls.__name__
                self._spare.append(probe)
            return self._cls

    def __getstate__(self) -> dict[str, Any]:
        qualname = getattr(self.env, "__qualname__", "")
        if not isinstance(self.env, str) and ("<lambda>" in qualname or "<locals>" in qualname):
            raise pickle.PicklingError(
                f"this TRL environment factory cannot be pickled: its env {qualname!r} is a lambda or a local "
                "function, which pickle cannot send to another process (TRL's AsyncGRPOTrainer, multiprocessing "
                "spawn, Ray); give an env id or a module-level function (functools.partial for arguments)"
            )
        # The name goes along (fixed when the class was built), so every process logs the same reward name.
        name = self._name or self.name
        return {
            "env": self.env,
            "answer_tool": self.answer_tool,
            "env_kwargs": self.env_kwargs,
            "name": name,
            "raise_tool_errors": self.raise_tool_errors,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.env = state["env"]
        self.answer_tool = state["answer_tool"]
        self.env_kwargs = state["env_kwargs"]
        self.raise_tool_errors = state.get("raise_tool_errors", True)
        self._name = state["name"]
        self._lock = threading.Lock()
        self._cls = None  # rebuilt on first use, in the process that uses it
        self._spare = []

    def __copy__(self) -> EnvironmentFactory:
        """The same factory (its envs and reward name); copying, unlike pickling, takes a lambda env too."""
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> EnvironmentFactory:
        return self


# Every environment class made in this process, by name and settings, and the settings each default
# name has had, in the order they came. Held for the process's life (a class is a few methods): a
# name must not depend on whether the garbage collector has freed an earlier factory's class.
_CLASSES: dict[tuple[str, str], type[TRLEnvironment]] = {}
_SETTINGS: dict[str, list[str]] = {}
_CLASSES_LOCK = threading.Lock()
_ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+")


def _default_name(env: EnvSpec, env_id: str) -> str:
    """`TRL<Label>Environment`, the label from the env id, else from the factory function's name."""
    func_name = getattr(env, "__name__", "")
    label = env_id or (func_name if func_name.isidentifier() else "") or "ToolEnv"
    words = label.replace("/", "-").replace("_", "-").split("-")
    return "TRL" + "".join(w[:1].upper() + w[1:] for w in words) + "Environment"


def _stable_repr(value: Any) -> str:
    """`repr(value)` without memory addresses, which differ from one run (or notebook cell) to the next."""
    if isinstance(value, functools.partial):
        return f"partial({_stable_repr(value.func)}, {_stable_repr(value.args)}, {_stable_repr(value.keywords)})"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return _ADDRESS.sub("", repr(value))


def _settings_key(*settings: Any) -> str:
    """One text for `settings` (JSON where it can be, else stable reprs): equal settings, equal text."""
    try:
        return json.dumps(settings, sort_keys=True, default=_stable_repr)
    except (TypeError, ValueError):  # keys JSON cannot sort or hold
        return _stable_repr(settings)


def _environment_class(
    probe: ToolEnv,
    answer_tool: str | None,
    name: str,
    *,
    unique: bool,
    raise_tool_errors: bool = True,
    settings: str = "",
) -> type[TRLEnvironment]:
    """A `TRLEnvironment` subclass named `name`, with a method per tool of `probe` and the answer method.

    TRL logs an env's reward under its class's name (`rewards/<name>/mean`), so the name must be
    the same each time the same env is set up (a notebook cell run again, a resumed run, a sweep):
    the same `settings` (the factory's env and `env_kwargs`), tools, answer tool and error mode get
    the same class back. With `unique` (a default name), other settings of the same name get a
    `_2`, `_3`... suffix in the order they first came in this process, so two envs of one run never
    share a column; the suffix never depends on which earlier classes are still alive.

    The methods come from `probe.tool_schemas()`, not `probe.tools`: a remote env's tools run on its
    server, so it has no local tools, only their schemas (for a local env the two say the same)."""
    # Its public attributes too: an instance's `error` (set in `__init__`) would hide a tool
    # method of that name, and TRL would collect None as the tool.
    reserved = {n for n in dir(TRLEnvironment) if not n.startswith("_")} | {"env", "last_info", "error"}
    methods: dict[str, Any] = {}
    schemas = [flatten_schema(s) for s in probe.tool_schemas()]
    for schema in schemas:
        tool_name = str(schema.get("function", schema).get("name", ""))
        if not tool_name.isidentifier() or tool_name.startswith("_") or tool_name in reserved | {answer_tool}:
            raise ValueError(
                f"tool {tool_name!r} cannot be offered to TRL: its name must be a public Python name "
                f"other than {sorted(n for n in reserved | {answer_tool} if n)}"
            )
        methods[tool_name] = _tool_method(tool_name, schema)
    if answer_tool is not None:
        if not answer_tool.isidentifier() or answer_tool.startswith("_") or answer_tool in reserved:
            raise ValueError(f"answer_tool {answer_tool!r} must be a public Python name other than {sorted(reserved)}")
        methods[answer_tool] = _answer_method(answer_tool)
    key = _settings_key(settings, answer_tool, raise_tool_errors, schemas)
    with _CLASSES_LOCK:
        chosen = name
        if unique:
            seen = _SETTINGS.setdefault(name, [])
            if key not in seen:
                seen.append(key)
            n = seen.index(key) + 1
            chosen = name if n == 1 else f"{name}_{n}"
        cls = _CLASSES.get((chosen, key))
        if cls is None:
            attrs = {"_answer_tool": answer_tool, "_raise_tool_errors": raise_tool_errors, **methods}
            cls = _CLASSES[chosen, key] = type(chosen, (TRLEnvironment,), attrs)
    return cls


def environment_factory(
    env: EnvSpec,
    *,
    answer_tool: str | None = "answer",
    env_kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    raise_tool_errors: bool = True,
) -> EnvironmentFactory:
    """A zero-argument, picklable factory for `GRPOTrainer(environment_factory=...)`.

    Args:
        env: an env id (`"toolenv/Spider-v0"`) or a callable returning a ToolEnv (a
            module-level one if the factory is to be pickled).
        answer_tool: name of the method that gives the final answer; None leaves it out
            (episodes then end at `max_turns` or when TRL stops, scored with no answer).
        env_kwargs: passed to `gym.make` with an env id.
        name: the environment class's name, which TRL logs this env's reward under
            (`rewards/<name>/mean`). By default `TRL<Label>Environment`, the label from the
            env id or the callable's name: the same for the same env, `env_kwargs`,
            `answer_tool` and `raise_tool_errors` every time, with a `_2`, `_3`... suffix for
            other settings of the same env (in the order first made in the process), so
            differently set-up envs in one run get their own reward columns.
        raise_tool_errors: a failed tool call (or one made after the episode ended) raises
            `ToolCallError` with toolenv's error text, so TRL counts it in
            `tools/failure_frequency` and shows the model `{'error': <text>}`; False returns
            the text as the tool's result (TRL then counts no failure).

    Logs one warning when the env's reward has parts that read the model's text (`format`, a
    `TurnReward`, `invalid_call_penalty`'s parse errors and empty turns): TRL gives the env only
    the parsed calls, so they score the env's own rewrite of each call (docs/trl.md).

    Raises:
        ValueError: a tool's name or argument cannot be a Python method or parameter, or
            clashes with `reset`, `get_reward`, the answer method or another tool.
    """
    return EnvironmentFactory(
        env, answer_tool=answer_tool, env_kwargs=env_kwargs, name=name, raise_tool_errors=raise_tool_errors
    )


def dataset_rows(
    env: EnvSpec,
    *,
    n: int | None = None,
    answer_tool: str | None = "answer",
    environment: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per task of `env`, for `datasets.Dataset.from_list`.

    A row has a conversational `prompt` (the env's system prompt, then the task's
    question) and the `task` as JSON, which `reset` reads back. The env's text-format
    instructions are left out: TRL's chat template shows the tools. With `answer_tool`,
    the env's `answer_tool_rewrites` reword what its system prompt and questions say about
    writing the answer (or a call) as text, the system message ends by saying to answer
    through that tool, and a prompt that still says `<answer>` is warned of (TRL shows the
    env no reply text: such an answer scores nothing). With `environment`,
    rows carry TRL's `environment` column, which picks a factory when
    `environment_factory` is a dict (several envs in one run).

    A task whose prompt has images (`toolenv/VisualSearch-v0`'s overview) also gets TRL's
    `images` column: the images as PIL images, in order, which `GRPOTrainer` shows a
    vision model before the question (its `prepare_multimodal_messages`).

    Warns:
        UserWarning: a task's prompt still says to write `<answer>...</answer>`.

    Raises:
        ValueError: `n` is below 1 or the env has no tasks.
    """
    if n is not None and n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    made, env_id = _make_env(env, dict(env_kwargs or {}))
    try:
        if not made.tasks:
            raise ValueError(f"the env {env_id or env!r} has no tasks to make rows of")
        rows, unread = [], []
        for task in made.tasks[:n]:
            _, messages = made.render_prompt(task)
            system, question = _prompt_texts(made, task, answer_tool)
            if answer_tool and _OPEN_ANSWER in system + question:
                unread.append(task.id)
            prompt = [{"role": "system", "content": system}] if system else []
            prompt.append({"role": "user", "content": question})
            row: dict[str, Any] = {
                "prompt": prompt,
                "task": json.dumps(task.model_dump(mode="json"), ensure_ascii=False),
            }
            images = [im for m in messages for im in m.images]
            if images:
                row["images"] = [block["image"] for block in _image_blocks(images)]
            if environment is not None:
                row["environment"] = environment
            rows.append(row)
        if unread:
            warnings.warn(
                f"the prompt of {len(unread)} task(s) of {env_id or env!r} (first {unread[0]!r}) still says to write "
                f"the answer as {_OPEN_ANSWER}...</answer>, which TRL does not show the env: the answer must come "
                f"through the `{answer_tool}` tool. Give the env answer_tool_rewrites for that phrase.",
                UserWarning,
                stacklevel=2,
            )
        return rows
    finally:
        made.close()
