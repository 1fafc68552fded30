"""The typed agent interface: what a policy must do to be rolled out against a ToolEnv.

An `Agent` turns the env's latest observation (and the chat messages so far) into
the next action text. Agents are async because most wait on a server or a model.
One agent object can serve many concurrent episodes: the rollout runner calls
`spawn()` once per episode, so per-episode state lives on the spawned copy while
heavy resources (an HTTP pool, a loaded model) stay shared.

Agents are plugins of the `toolenv.agents` entry-point group (`load_agent`).
"""

from __future__ import annotations

import abc
import copy
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from toolenv.types import Message, ParsedAction, Task

if TYPE_CHECKING:
    from toolenv.parsers.base import ActionParser

__all__ = ["Agent", "AgentAction", "AgentError", "EnvInfo", "load_agent"]


class AgentError(Exception):
    """An agent could not produce an action (server down, no scripted action...).

    The rollout runner records the message in the trajectory and ends that episode.
    """


class AgentAction(BaseModel):
    """One action: the text the env parses (or records, with `parsed`), plus what the generator knows about it."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="The action text, in the env parser's format.")
    token_ids: list[int] | None = Field(default=None, description="Generated token ids, when known.")
    prompt_token_ids: list[int] | None = Field(
        default=None,
        description="The prompt's token ids as the model read them this turn, when the agent records them "
        "(a chat template may render earlier turns differently later: rendering the messages again is not the same).",
    )
    logprobs: list[float] | None = Field(default=None, description="Log-probability of each generated token.")
    prompt_tokens: int | None = Field(default=None, description="Prompt length in tokens, when known.")
    completion_tokens: int | None = Field(default=None, description="Generated tokens, when known.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free data (finish reason, raw tool calls).")
    parsed: ParsedAction | None = Field(
        default=None,
        description="The turn already parsed, e.g. from the API's native tool calls: the env runs it as given "
        "instead of parsing `text` (which stays the turn's recorded text), so a call the parser's format cannot "
        "write still reaches the tool.",
    )


@dataclass(frozen=True)
class EnvInfo:
    """What an agent may know about the env it acts in.

    Attributes:
        env_id: the Gymnasium id (`toolenv/Spider-v0`), or `""` for an env built directly.
        task: the current episode's task.
        turn: how many actions the env has taken this episode (0 before the first).
        max_turns: actions before the env truncates the episode.
        tool_schemas: OpenAI function schemas of the env's tools, for native tool calling.
        parser: the env's action parser; its `stop` strings end a generation, and native
            tool calls are rendered in its format.
        episode: the episode's number in its rollout (1 for the first; task position x samples
            + sample + 1), the same when the run resumes or retries it, so an agent can seed it
            as the whole run would; None outside the rollout runner.
        sample: which of its task's samples the episode is (0 for the first; `--samples`), so an
            agent can tell a GRPO group's episodes apart (the replay agent plays each sample's own
            recording); 0 outside the rollout runner.
    """

    env_id: str
    task: Task
    turn: int = 0
    max_turns: int = 1
    tool_schemas: list[dict[str, Any]] = field(default_factory=list)
    parser: ActionParser | None = None
    episode: int | None = None
    sample: int = 0

    @property
    def env_name(self) -> str:
        """The id without its namespace (`Spider-v0`), the key of oracle plugins."""
        return self.env_id.rsplit("/", 1)[-1]

    @property
    def stop(self) -> tuple[str, ...]:
        """Strings after which generation should stop."""
        return self.parser.stop if self.parser is not None else ()


class Agent(abc.ABC):
    """Base class of agents.

    Subclasses implement `act`; they may override `reset` (per-episode state),
    `spawn` (what is shared between concurrent episodes), `uses_native_tools` and `aclose`.
    """

    #: A short label recorded in trajectories (defaults to the class name).
    name: str = ""
    #: The model the agent runs, when it has one (recorded in trajectories).
    model: str | None = None
    #: True when the agent gives the model the env's tools itself (`EnvInfo.tool_schemas` as the
    #: API's `tools` or through the chat template): what `uses_native_tools` answers by default.
    native_tools: bool = False

    def uses_native_tools(self, parser: ActionParser | None) -> bool:
        """Whether the agent gives the model the tools itself in an env whose calls `parser` reads.

        The runner asks before each reset and, when True, resets with `native_tools`, so the
        prompt says only how to answer instead of describing the tools a second time. The
        default is `native_tools`; override to decide per env (the `transformers` agent does
        so when its chat template writes calls in the parser's format).
        """
        return self.native_tools

    def reset(self, task: Task) -> None:  # noqa: B027 - optional hook
        """Start an episode of `task`; called on the spawned copy before its first `act`."""

    @abc.abstractmethod
    async def act(self, observation: str, messages: list[Message], env_info: EnvInfo) -> AgentAction:
        """The next action.

        Args:
            observation: the env's latest observation (the prompt on the first turn).
            messages: the episode so far as chat messages (system, user, then assistant/tool turns).
            env_info: the env's tools, parser, task and turn.

        Raises:
            AgentError: no action can be produced; the runner records it and ends the episode.
        """

    def spawn(self) -> Agent:
        """An agent for one episode; the default shallow copy shares every resource."""
        return copy.copy(self)

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release shared resources (connection pools, models)."""

    @property
    def label(self) -> str:
        """The name recorded in trajectories."""
        return self.name or type(self).__name__


def load_agent(spec: str | Agent, **kwargs: Any) -> Agent:
    """An agent from a plugin name (`openai`, `oracle`...) or `"module:attr"`, built with `kwargs`.

    Raises:
        toolenv.PluginError: unknown or broken plugin, or the object does not build an Agent.
    """
    from toolenv.registry import PluginError, load

    if isinstance(spec, Agent):
        if kwargs:
            raise PluginError("keyword arguments are only accepted with an agent name, not an Agent object")
        return spec
    if ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            obj: Any = getattr(importlib.import_module(module), attr)
        except Exception as exc:  # a module failing at import is a broken plugin too, as with entry points
            raise PluginError(f"agent {spec!r} could not be imported: {type(exc).__name__}: {exc}") from exc
    else:
        obj = load("agents", spec)
    if isinstance(obj, Agent):
        if kwargs:
            raise PluginError(f"agent {spec!r} is an instance and takes no arguments")
        return obj
    try:
        agent = obj(**kwargs)
    except TypeError as exc:
        raise PluginError(f"agent {spec!r} rejected its arguments: {exc}") from exc
    if not isinstance(agent, Agent):
        raise PluginError(f"agent {spec!r} built {type(agent).__name__}, not a toolenv.Agent")
    return agent
