"""`ToolEnv`: a Gymnasium env whose step is one model turn (parse → invoke → observe → score)."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import json
import operator
import re
import string
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, SupportsFloat, SupportsIndex

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding

from toolenv import _aio
from toolenv._text import clean_parse, encodable_parse, fix_text, unencodable_parse
from toolenv._tool import Tool, with_limits
from toolenv.caller import ToolCaller, end_detached
from toolenv.episode import Episode, Turn, new_episode_id
from toolenv.parsers._scan import positional_id
from toolenv.parsers.base import ANSWER_INSTRUCTION, ActionParser, get_parser
from toolenv.registry import resolve_tools
from toolenv.rewards.base import RewardSpec, WeightedSum, get_reward
from toolenv.spaces import UnicodeText
from toolenv.types import Message, ParsedAction, Task, ToolCall, ToolResult, load_tasks, new_message, reply_messages

__all__ = ["DEFAULT_TEMPLATE", "ToolEnv", "written_turn"]

DEFAULT_TEMPLATE = "{instructions}\n\nQuestion: {question}\n"

#: Parse errors reported per step; more are summarised so a pathological reply cannot flood the context.
MAX_PARSE_ERRORS = 5

_NOTHING_FOUND = "No tool call and no final answer found in your reply. Call a tool in the format described above"
#: The reply to a turn with neither a call nor an answer, for a parser whose answer is
#: `<answer>...</answer>`; `no_action_text` words it for the env's parser.
NO_ACTION = f"{_NOTHING_FOUND}, or give the final answer as <answer>...</answer>."
#: The same, for an env whose reply without a call is the answer (`no_call_is_answer`): the turn
#: held nothing, or only thinking.
NO_ACTION_NO_CALL = (
    "No tool call and no final answer found in your reply. Call a tool in the format described above, "
    "or write your final answer."
)


def no_action_text(parser: ActionParser) -> str:
    """The reply to a turn with neither a call nor an answer, naming `parser`'s own answer form
    (its `answer_instructions`): told `<answer>` by an env whose parser reads `<final>`, a model
    would obey and get the same reply again until `max_turns`. A format that reads no answer
    is told only to call a tool."""
    how = parser.answer_instructions()
    markup = parser.answer_markup()
    if markup is not None and how == ANSWER_INSTRUCTION.replace("<answer>...</answer>", markup):
        return f"{_NOTHING_FOUND}, or give the final answer as {markup}."  # NO_ACTION, with the parser's tags
    return f"{_NOTHING_FOUND}. {how}".rstrip()


def _field_root(name: str) -> str:
    """The key a `str.format` field looks up: `a` of `a.b` and of `a[0]`."""
    return re.split(r"[.\[]", name, maxsplit=1)[0]


@functools.lru_cache(maxsize=64)
def _parsed(template: str) -> tuple[tuple[str, str | None, str | None, str | None], ...]:
    """`string.Formatter().parse(template)`, kept: a template is rendered at every reset."""
    return tuple(string.Formatter().parse(template))


@functools.lru_cache(maxsize=64)
def _roots(template: str) -> frozenset[str]:
    """The keys `template`'s fields look up (positional ones, `{}` and `{0}`, and those nested in a spec, too)."""
    out: set[str] = set()
    for _, name, spec, _ in _parsed(template):
        if name is not None:
            out.add(_field_root(name))
        if spec:
            out |= _roots(spec)
    return frozenset(out)


@functools.lru_cache(maxsize=64)
def _top_fields(template: str) -> frozenset[str]:
    """The keys `template`'s own (not nested) named fields look up, kept: every env checks its
    template when built, and the runner builds one env per concurrent episode."""
    return frozenset(_field_root(name) for _, name, _, _ in _parsed(template) if name)


def _checked_template(template: str) -> str:
    """`template`, refused if `str.format` cannot read it and warned of if it has no
    `{question}` (unknown fields stay as written, so a misspelt one would drop the question)."""
    try:
        fields = _top_fields(template)
    except ValueError as exc:
        raise ValueError(f"prompt_template is not a str.format template ({exc}): {template!r}") from None
    if "question" not in fields:
        warnings.warn(
            f"prompt_template has no {{question}} field, so prompts will not hold the task's question: {template!r}",
            UserWarning,
            stacklevel=3,
        )
    return template


def _render(template: str, fields: Mapping[str, Any]) -> str:
    """`template.format_map(fields)`, except that a field whose key `fields` lacks stays as
    written, with its conversion and format spec: a JSON example such as `{"answer": 1}` (to
    `str.format`, a field `"answer"` with the spec ` 1`), `{0}` or `{}` is text, not an error."""
    if _roots(template) <= fields.keys():  # every field known (the usual case): str.format itself
        return template.format_map(fields)
    formatter = string.Formatter()
    out: list[str] = []
    for literal, name, spec, conversion in _parsed(template):
        out.append(literal)
        if name is None:
            continue
        if _field_root(name) not in fields or (spec and not _roots(spec) <= fields.keys()):
            out.append("{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}")
            continue
        value = formatter.convert_field(formatter.get_field(name, (), fields)[0], conversion)
        out.append(format(value, _render(spec, fields) if spec else ""))
    return "".join(out)


class ToolEnv(gym.Env[str, str]):
    """A multi-turn tool-use environment.

    The observation is the text the policy sees next: the prompt after `reset`, the
    formatted tool results (or an error message) after `step`. `info["messages"]`
    carries the same turn as typed chat messages for chat-template users.

    Args:
        tools: the tools the model may call: Tools, or references a config or command line
            can hold (`"module:Name"`, a tool plugin's name, or `{"tool": reference,
            "tool_kwargs": {...}}` to pass its arguments), each built for this env.
        tasks: Tasks, dicts, or a JSONL path.
        parser: an `ActionParser` or its name (`hermes`, `tags`, `codeblock`, `harmony`,
            `qwen3_xml`, `llama3_json`, `pythonic`, `mistral`, `glm45`, `deepseek_v3`,
            `deepseek_v31`, `gemma4`, `kimi_k2`, `muse_glimmer`; `toolenv list` shows them all).
        reward: a reward spec (name, Reward, `{name: weight}` or `[(reward, weight)]`).
        max_turns: steps before the episode is truncated.
        system_prompt: text put before the tool instructions. `""` leaves out the system message
            of the chat form, the instructions with it (nothing is prepended to the text form
            either): for a task prompt or template that says how to call the tools itself.
        prompt_template: `str.format` template with `{instructions}`, `{question}` and task context
            keys; any other field (a JSON example's `{"answer": ...}`) stays as written.
        task_order: `"random"` (seeded by `reset(seed=...)`) or `"sequential"` (a seeded reset
            starts the sequence again at task `seed % len(tasks)`, so it is deterministic too).
        parser_kwargs: passed to the parser factory when `parser` is a name.
        tool_limits: `ToolLimits` fields to change, by tool name (`"*"`: every tool), e.g.
            `{"search": {"timeout": 10, "retries": 2}}`; the env steps copies of those tools.
        answer_tool_rewrites: phrases of the system prompt or the questions that say to write the
            final answer (or a tool call) as text, each mapped to its wording for a model that gets
            the tools from its chat template and gives the answer by calling a tool, named where the
            wording says `{answer_tool}`. TRL's rows use them (`toolenv.integrations.trl`): TRL does
            not show the env the model's last message, so an answer written as text is lost there.
        no_call_is_answer: a turn with neither a tool call, an answer nor a parse error is the
            final answer, its text after any `</think>` (ReTool, ToRL and other math recipes with a
            code tool: the model answers by not calling it, e.g. with `\\boxed{}`, which the `math`
            reward reads). False: such a turn gets the "no tool call" observation and the episode
            goes on.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012 - Gymnasium's convention
    #: The keys `reset(options=...)` accepts; any other is refused (a misspelt `taskid` would
    #: otherwise run a random task). A subclass that reads options of its own adds them here.
    reset_options: ClassVar[frozenset[str]] = frozenset({"task", "task_id", "task_index", "native_tools"})
    #: The reset options that describe the agent, not the task: a vector env's autoreset gives
    #: each sub-env those of its latest explicit reset again (the task-choosing ones must not repeat).
    autoreset_options: ClassVar[frozenset[str]] = frozenset({"native_tools"})

    def __init__(
        self,
        tools: Iterable[Tool | str | Mapping[str, Any]] = (),
        tasks: str | Path | Iterable[Task | Mapping[str, Any]] = (),
        *,
        parser: str | ActionParser = "hermes",
        reward: RewardSpec = "exact_match",
        max_turns: int = 4,
        system_prompt: str | None = None,
        prompt_template: str = DEFAULT_TEMPLATE,
        task_order: str = "random",
        parser_kwargs: Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        tool_limits: Mapping[str, Mapping[str, Any]] | None = None,
        answer_tool_rewrites: Mapping[str, str] | None = None,
        no_call_is_answer: bool = False,
    ) -> None:
        max_turns = _turns(max_turns)
        if task_order not in ("random", "sequential"):
            raise ValueError(f"task_order must be 'random' or 'sequential', got {task_order!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if isinstance(tools, str):  # iterated, it would name a tool per letter
            raise TypeError(f"tools must be a list of tools, got the string {tools!r}: write [{tools!r}]")
        # A reference may name a factory of several tools (`mcp_tools`): each goes in its place
        built = [t for ref in tools for t in (resolve_tools(ref) if isinstance(ref, str | Mapping) else [ref])]
        self.tools: list[Tool] = with_limits(built, tool_limits)
        self.caller = ToolCaller(self.tools)
        self.tasks: list[Task] = load_tasks(tasks)  # type: ignore[arg-type]
        self.parser = get_parser(parser, **dict(parser_kwargs or {})).bind(self.tools)
        self.reward_fn: WeightedSum = get_reward(reward)
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        self.prompt_template = _checked_template(prompt_template)
        self.task_order = task_order
        self.render_mode = render_mode
        self.answer_tool_rewrites: dict[str, str] = dict(answer_tool_rewrites or {})
        self.no_call_is_answer = bool(no_call_is_answer)
        self.observation_space = UnicodeText()
        self.action_space = UnicodeText()
        self._instructions = self.parser.instructions(self.tools)
        self._prompt_instructions = self._instructions  # what the latest reset asked for (`native_tools`)
        self._native_tools = False
        self._next_index = 0
        self._episode: Episode | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seed: int | None = None  # a reset's seed whose generator is not made yet
        self._rng: np.random.Generator | None = None
        self._closed = False  # tools closed, and the env not used since
        self._in_step = False  # an `astep` is running: another step or a reset is refused, a close waits
        self._step_ended: asyncio.Future[None] | None = None  # what `aclose` waits on, made by it

    # ------------------------------------------------------------------ seeding
    # Gymnasium's `reset(seed=...)` builds the generator at once (a SeedSequence and a PCG64,
    # ~12 µs, more than the rest of a reset), though a reset given its task never draws from
    # it. Here the generator is made from the seed on first use: same numbers, same API.
    # It has to be Gymnasium's own `_np_random` slot that is lazy, since `np_random`,
    # `np_random_seed` and Gymnasium's env checker all read that attribute.
    def _seed_lazily(self, seed: int | None) -> None:
        if seed is None:
            return
        if not (isinstance(seed, int) and seed >= 0):
            seeding.np_random(seed)  # raises Gymnasium's own error for a bad seed
        self._rng, self._seed, self._np_random_seed = None, seed, seed

    @property
    def _np_random(self) -> np.random.Generator | None:
        if self._rng is None and self._seed is not None:
            self._rng, self._np_random_seed = seeding.np_random(self._seed)
            self._seed = None
        return self._rng

    @_np_random.setter
    def _np_random(self, value: np.random.Generator | None) -> None:
        self._rng, self._seed = value, None

    # ------------------------------------------------------------------ tasks and prompts
    def _pick_task(self, options: Mapping[str, Any]) -> Task:
        if "task" in options:
            t = options["task"]
            return t if isinstance(t, Task) else load_tasks([t])[0]
        if not self.tasks:
            raise ValueError("this env has no tasks: pass tasks=... or reset(options={'task': ...})")
        if "task_id" in options:
            wanted = str(options["task_id"])
            for t in self.tasks:
                if t.id == wanted:
                    return t
            raise KeyError(f"no task with id {wanted!r}")
        if "task_index" in options:
            index = int(options["task_index"])
            if not -len(self.tasks) <= index < len(self.tasks):
                raise IndexError(f"task_index {index} is out of range: this env has {len(self.tasks)} tasks")
            return self.tasks[index]
        if self.task_order == "sequential":
            task = self.tasks[self._next_index % len(self.tasks)]
            self._next_index += 1
            return task
        if len(self.tasks) == 1:  # `integers(1)` draws nothing: skip making the generator for it
            return self.tasks[0]
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    @property
    def native_tools(self) -> bool:
        """Whether the latest reset had `native_tools`: the agent shows the model the tools itself,
        so a prompt of an env's own should not teach a call format too (`render_prompt` reads it)."""
        return self._native_tools

    def render_prompt(self, task: Task) -> tuple[str, list[Message]]:
        """The first observation of `task` as text and as chat messages (with only the parser's
        answer instructions when the latest reset had `native_tools`)."""
        # `system_prompt=""`: no system message and no instructions, for a prompt that carries its own
        # (Search-R1's checkpoints were trained on one user message); None keeps the default.
        alone = self.system_prompt == ""
        system = "" if alone else "\n\n".join(p for p in (self.system_prompt, self._prompt_instructions) if p)
        head = [] if alone else [Message(role="system", content=system)]
        if task.prompt is not None:
            return task.prompt, [*head, Message(role="user", content=task.prompt)]
        fields = {**task.context, "question": task.question}
        text = _render(self.prompt_template, {**fields, "instructions": system})
        if alone and "instructions" in _roots(self.prompt_template):
            text = text.lstrip()  # nothing before the prompt: not the blank lines that followed the instructions
        # The chat form: the instructions go in the system message; the user message is the
        # question, or for a template of one's own what it makes of the task (a schema from
        # `context`, a line of its own), which would otherwise reach only text-mode agents.
        if self.prompt_template == DEFAULT_TEMPLATE:
            user = task.question
        elif "instructions" not in _roots(self.prompt_template):  # nothing to take out: the text itself
            user = text
        else:  # without the instructions, and the white space that set them apart
            user = _render(self.prompt_template, {**fields, "instructions": ""}).strip()
        return text, [*head, Message(role="user", content=user)]

    async def arender_prompt(self, task: Task) -> tuple[str, list[Message]]:
        """`render_prompt` as `areset` calls it: override to move heavy rendering (images)
        off the event loop, e.g. `return await asyncio.to_thread(self.render_prompt, task)`."""
        return self.render_prompt(task)

    # ------------------------------------------------------------------ async API
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode. Options: `task` (Task or dict), `task_id` (KeyError when no task has
        it), or `task_index` (IndexError out of range); and `native_tools: True` when the agent
        gives the model the tools itself (`tool_schemas()` through the chat template or the API's
        `tools`): the prompt then says only how to answer, not the tools and call format again.
        Any other key is a ValueError (a subclass reading its own lists them in `reset_options`)."""
        if self._in_step:
            raise _in_flight("reset")
        if options:
            self._check_options(options)
        self._seed_lazily(seed)  # what `super().reset(seed=seed)` does, deferred
        if seed is not None and self.task_order == "sequential" and self.tasks:
            self._next_index = seed % len(self.tasks)  # Gymnasium: a seeded reset is deterministic
        await self.aend_episode()
        self._episode, self._closed = None, False  # a reset failing below leaves no released episode to step
        self.caller.hold()  # after a close: its tools are this env's again (another holder's close leaves them open)
        task = self._pick_task(options or {})
        native = self._native_tools = bool((options or {}).get("native_tools"))
        self._prompt_instructions = self.parser.answer_instructions() if native else self._instructions
        obs, messages = await self.arender_prompt(task)
        self._episode = Episode(task=task, episode_id=new_episode_id(), caller=self.caller, messages=list(messages))
        return obs, {"task_id": task.id, "turn": 0, "messages": messages}

    def _check_options(self, options: Mapping[str, Any]) -> None:
        """Refuse a reset option key this env does not read (`reset_options`), naming the close
        match, and a list where one task is expected (a vector env's options go to every sub-env)."""
        unknown = [k for k in options if k not in self.reset_options]
        if unknown:
            known = sorted(self.reset_options)
            close = difflib.get_close_matches(str(unknown[0]), known, n=2)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise ValueError(f"unknown reset option {unknown[0]!r}{hint}: the options are {', '.join(known)}")
        for key in ("task_id", "task_index"):
            if isinstance(options.get(key), list | tuple):
                raise TypeError(
                    f"reset option {key!r} takes one value, got a {type(options[key]).__name__}: for a vector env, "
                    "reset each sub-env with its own, e.g. reset(options={'reset_mask': mask, 'task_id': ...})"
                )

    async def astep(
        self, action: str, *, parsed: ParsedAction | None = None
    ) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take one model turn; see the class docstring for what comes back.

        `parsed` is the turn already parsed, e.g. the calls a trainer's own chat-template
        parser read (native tool calling); the env runs it as given and records `action`
        as the turn's text (`written_turn` writes calls in the env's format).

        Raises:
            TypeError: `action` is not a str (bytes, token ids, None): outside the action space.
        """
        if not isinstance(action, str):
            raise _not_text(action)
        ep = self._episode_to_step()
        if self._in_step:  # `_begin_step`, inlined: this is the hot path
            raise _in_flight("step")
        self._in_step = True
        try:
            if parsed is None:  # lone surrogates (half an emoji) as U+FFFD: no tool or agent can encode them
                action, parsed = clean_parse(self.parser, action)
            else:
                if not action.isascii():
                    action = fix_text(action)
                if not all(c.id and type(c.arguments) is dict for c in parsed.tool_calls):
                    parsed = _completed_calls(parsed)
                if unencodable_parse(parsed):  # the caller's own, or its JSON arguments decoded above
                    parsed = encodable_parse(parsed)
            if parsed.tool_calls:
                results, records = await self.caller.invoke_for(
                    parsed.tool_calls, ep.task, ep.episode_id, len(ep.turns), ep.state
                )
            else:  # an answer or a malformed turn: no context to build, no call to make
                results, records = [], []
            if parsed.errors:
                errors = parsed.errors[:MAX_PARSE_ERRORS]
                if len(parsed.errors) > MAX_PARSE_ERRORS:
                    errors.append(f"... and {len(parsed.errors) - MAX_PARSE_ERRORS} more problems of the same kinds.")
                results = [*results, *(ToolResult(text=e, is_error=True, name="parser") for e in errors)]
            if not results and parsed.answer is None and self.no_call_is_answer:
                thinking, end, reply = action.rpartition("</think>")  # a reasoning model's hedges are no answer
                if reply.strip():
                    parsed = parsed.model_copy(update={"answer": reply.strip(), "text": (thinking + end).strip()})
            turn = Turn(action, parsed, results, records)
            ep.turns.append(turn)
            if parsed.answer is not None:
                ep.answer = parsed.answer
                ep.terminated = True
                obs = self.parser.format_results(results) if results else ""
            else:
                if not results:
                    text = NO_ACTION_NO_CALL if self.no_call_is_answer else no_action_text(self.parser)
                    results = turn.results = [ToolResult(text=text, is_error=True, name="parser")]
                obs = self.parser.format_results(results)
                ep.truncated = len(ep.turns) >= self.max_turns
            turn.observation = obs
            rf = self.reward_fn
            components = await rf.turn_components(ep, turn) if rf.scores_turns else rf.zero_components()
            if ep.terminated or ep.truncated:
                ep.final_components = await rf.final_components(ep)
                for k, v in ep.final_components.items():
                    components[k] = components.get(k, 0.0) + v
            turn.reward = rf.weighted(components)
            turn.reward_components = components
            new_messages = _turn_messages(action, parsed, results)
            ep.messages.extend(new_messages)
            info: dict[str, Any] = {
                "task_id": ep.task.id,
                "turn": len(ep.turns),
                "action": parsed,
                "tool_results": results,
                "tool_calls": records,
                "messages": new_messages,
                "reward_components": dict(components),
            }
            if ep.terminated or ep.truncated:
                await self.aend_episode()
                info.update(end_info(ep))
            return obs, turn.reward, ep.terminated, ep.truncated, info
        finally:
            self._in_step = False  # `_end_step`, inlined
            if self._step_ended is not None:
                self._end_step()

    def _begin_step(self) -> None:
        """Mark a step in flight, or refuse it while another is (two turns at once would
        interleave in one episode)."""
        if self._in_step:
            raise _in_flight("step")
        self._in_step = True

    def _end_step(self) -> None:
        """The step in flight has ended: an `aclose` waiting for it goes on."""
        self._in_step = False
        ended, self._step_ended = self._step_ended, None
        if ended is not None:  # the close may wait on another thread's loop: handed over safely
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
                ended.get_loop().call_soon_threadsafe(_resolve, ended)

    def _episode_to_step(self) -> Episode:
        """The current episode, or the error that says why there is none to step."""
        ep = self._episode
        if ep is None:
            raise RuntimeError("call reset() before step()")
        if ep.terminated or ep.truncated:
            raise RuntimeError("this episode has ended; call reset() to start another")
        if ep.released:  # its tools freed what it held (and may be closed): they must not run for it again
            raise RuntimeError("this episode was ended by end_episode() or close(); call reset() to start another")
        return ep

    async def aend_episode(self) -> None:
        """Let the tools free what they hold for the current episode (`Tool.release`).

        The env calls this itself when an episode ends, when `reset` abandons one and on
        close; call it when you stop stepping an unfinished episode for good. Idempotent.
        """
        ep = self._episode
        if ep is not None and not ep.released:
            ep.released = True
            if self.caller.releases:
                await self.caller.release(ep.context())

    async def atruncate(self) -> float:
        """End the open episode here, unanswered, as a truncation (a trainer stopped generating):
        score its final reward, release its tools, and return that reward (0.0 when none is open).

        The reward is added to the last turn's, so the episode's return stays the sum of its turns.
        """
        ep = self._episode
        if ep is None or ep.terminated or ep.truncated:
            return 0.0
        ep.truncated = True
        components = ep.final_components = await self.reward_fn.final_components(ep)
        reward = self.reward_fn.weighted(components)
        if ep.turns:
            last = ep.turns[-1]
            last.reward += reward
            for k, v in components.items():
                last.reward_components[k] = last.reward_components.get(k, 0.0) + v
        await self.aend_episode()
        return reward

    async def aclose(self) -> None:
        """Release the current episode from every tool, then close the tools no other open env
        holds (a tool object several envs share is closed by the last of them to close); again
        only once the env is reset, which holds its tools again."""
        if self._closed:
            return
        if self._in_step:  # closed under it, its calls would go on with closed tools (or reopen them)
            await self._step_end()
        await self.aend_episode()
        await self.caller.aclose()
        self._closed = True

    async def _step_end(self) -> None:
        """Until the step in flight ends (on this loop or another thread's); not awaiting the step: a
        cancelled wait leaves it be."""
        if self._step_ended is None:
            self._step_ended = asyncio.get_running_loop().create_future()
        await asyncio.wait({self._step_ended})

    # ------------------------------------------------------------------ sync API
    def _run(self, coro: Any) -> Any:
        """Run a sync twin's coroutine on the env's private loop; on a thread already running an
        event loop (a Jupyter or Colab cell), on a helper thread, as `close` does: the private loop
        is the same either way, so loop-bound tool state (httpx pools, sandboxes) stays on it."""
        if asyncio._get_running_loop() is not None:  # in asyncio.__all__; no exception raised per step
            return _aio.call_off_loop(self._run_here, coro)
        return self._run_here(coro)

    def _run_here(self, coro: Any) -> Any:
        """`_run` on a thread running no event loop."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        if self._in_step and asyncio.all_tasks(self._loop):  # a sync call interrupted twice (Ctrl-C) left its step here
            try:
                self._loop.run_until_complete(self._step_end())
            except BaseException:
                coro.close()
                raise
        return _aio.complete(self._loop, coro)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; returns the prompt and info (`task_id`, `turn`, `messages`)."""
        return self._run(self.areset(seed=seed, options=options))  # type: ignore[no-any-return]

    def step(
        self, action: str, *, parsed: ParsedAction | None = None
    ) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take one model turn: `(observation, reward, terminated, truncated, info)`; `parsed` as for `astep`."""
        return self._run(self.astep(action, parsed=parsed))  # type: ignore[no-any-return]

    def truncate(self) -> float:
        """Sync twin of `atruncate`."""
        return self._run(self.atruncate())  # type: ignore[no-any-return]

    def end_episode(self) -> None:
        """Sync twin of `aend_episode`."""
        self._run(self.aend_episode())

    def close(self) -> None:
        """`aclose` (tools another open env holds stay open), then close the private event loop:
        also after the async twins alone were used, and inside a running event loop (a notebook),
        where `aclose` runs on a worker thread; after `await env.aclose()` there is nothing left to do.
        Tool calls left running on that loop past their timeout are cancelled and run to their
        end first (for a second at most), not left to be closed outside any loop."""
        loop, self._loop = self._loop, None
        # On a thread running an event loop (a notebook), a step in flight there cannot end while
        # this waits: the tools are closed under it, as the caller asked, and it is said once.
        if self._in_step and asyncio._get_running_loop() is not None:  # in asyncio.__all__; raises nothing
            warnings.warn(
                "ToolEnv.close() inside a running event loop while a step is in flight: its tool calls may "
                "go on with closed tools; await the step, or `await env.aclose()`, which waits for it",
                RuntimeWarning,
                stacklevel=2,
            )
            self._in_step = False  # not waited for by `aclose`; the step's own end sets it again
        try:
            if not self._closed:
                _aio.close_from_sync(loop, self.aclose())
        finally:
            if loop is not None:
                try:
                    end_detached(loop)
                finally:
                    loop.close()

    def __getstate__(self) -> dict[str, Any]:
        """The env without its private event loop, which cannot be pickled or deep-copied
        (the copy makes its own on its first sync call)."""
        state = self.__dict__.copy()
        state["_loop"] = state["_step_ended"] = None
        state["_in_step"] = False
        return state

    def render(self) -> str | None:
        """The episode so far as text (render_mode="ansi")."""
        if self.render_mode != "ansi" or self._episode is None:
            return None
        return "\n".join(f"[{m.role}] {m.content}" for m in self._episode.messages)

    # ------------------------------------------------------------------ introspection
    @property
    def episode(self) -> Episode | None:
        """The current episode: None before the first reset (and after a reset that failed); after
        `close`, the last one, released (it cannot be stepped)."""
        return self._episode

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of the env's tools (for native tool calling)."""
        return [t.schema() for t in self.tools]


def end_info(ep: Episode) -> dict[str, Any]:
    """The keys a step's info adds when `ep` has ended: `answer`, `reward_info`, `episode_stats`."""
    return {
        "answer": ep.answer,
        "reward_info": {k: dict(v) for k, v in ep.reward_info.items()},
        # Not "episode": Gymnasium's RecordEpisodeStatistics writes that key and refuses it taken.
        "episode_stats": {
            "return": sum(t.reward for t in ep.turns),
            "turns": len(ep.turns),
            "tool_calls": ep.tool_calls,
            "tool_errors": ep.tool_errors,
        },
    }


def _turn_messages(action: str, parsed: ParsedAction, results: Sequence[ToolResult]) -> list[Message]:
    """The turn as chat messages: the assistant's, then the env's reply (`reply_messages`: a
    `tool` message per answered call, one user message for parse errors). Agents send these as
    they are, and OpenAI's API and several templates refuse a `tool` message that answers no call."""
    calls: list[ToolCall] | None = parsed.tool_calls or None
    return [new_message("assistant", action, None, None, calls), *reply_messages(results)]


def _turns(value: object) -> int:
    """`max_turns` as an int of at least 1 (a numpy integer too), else one line saying so: a
    string from `--env-arg max_turns=abc` would otherwise fail at a comparison naming nothing."""
    turns = None
    if type(value) is int:  # the common case first: a Protocol's isinstance costs ~5 µs per env
        turns = value
    elif isinstance(value, SupportsIndex) and not isinstance(value, bool):
        turns = operator.index(value)
    if turns is None or turns < 1:
        raise ValueError(f"max_turns must be at least 1 (a whole number), got {value!r}")
    return turns


def _not_text(action: object) -> TypeError:
    """The refusal of an action that is not text, saying what came and what to do with it."""
    shown = repr(action)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return TypeError(
        f"ToolEnv.step takes the model's reply as a str, got {type(action).__name__} {shown}: "
        "decode bytes (.decode()) or token ids (tokenizer.decode(ids)) to text first"
    )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _in_flight(what: str) -> gym.error.AlreadyPendingCallError:
    """The refusal of a `what` while a step of the env is running (a second task stepping it)."""
    return gym.error.AlreadyPendingCallError(
        f"ToolEnv.{what} called while a step of this env is in flight; await that step first", what
    )


def _completed_calls(parsed: ParsedAction) -> ParsedAction:
    """A copy of `parsed` whose calls without an id are named by position (`call_0`, ...), as a
    parser names them: each tool result and message must answer its call by id, so an id
    another call of the turn has already is passed over for the next free one. Arguments given
    as JSON text (OpenAI's and verl's calls carry them so) are read as the object they hold."""
    taken = {c.id for c in parsed.tool_calls if c.id}
    calls = []
    for i, c in enumerate(parsed.tool_calls):
        update: dict[str, Any] = {}
        if not c.id:
            k = i
            while positional_id(k) in taken:
                k += len(parsed.tool_calls)
            taken.add(positional_id(k))
            update["id"] = positional_id(k)
        if isinstance(c.arguments, str):
            with contextlib.suppress(ValueError):  # not JSON: the caller's error result says so
                decoded = json.loads(c.arguments)
                if isinstance(decoded, dict):
                    update["arguments"] = decoded
        calls.append(c.model_copy(update=update) if update else c)
    return parsed.model_copy(update={"tool_calls": calls})


def written_turn(parser: ActionParser, parsed: ParsedAction) -> str:
    """The text of a turn given as parsed calls and answer, for `astep(text, parsed=...)`: the calls
    in the parser's own format where it can write them (else each as a JSON line), then the answer
    (before the calls in a format whose calls must end the turn), so the text parses back the same."""
    parts = [parsed.text] if parsed.text else []
    answer = [f"<answer>{parsed.answer}</answer>"] if parsed.answer is not None else []
    if parser.calls_end_turn:
        parts += answer
    for call in parsed.tool_calls:
        text = parser.format_call(call.name, call.arguments, call.id)
        parts.append(text if text is not None else json.dumps({"name": call.name, "arguments": call.arguments}))
    if not parser.calls_end_turn:
        parts += answer
    return "\n".join(parts)
