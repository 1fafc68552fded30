"""The wire protocol of `toolenv serve`: every request and response body as a Pydantic model.

The server and `RemoteToolEnv` read and write these same models, so one JSON schema
(`GET /schema`) describes both sides. Steps carry the env's own typed objects
(`ParsedAction`, `ToolResult` with base64 images, `Message`, `ToolCallRecord`), so what
crosses the wire is what a local `info` holds, with the same JSON limits as a trajectory.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from toolenv.caller import ToolCallRecord
from toolenv.trajectory import dump_json as json_line
from toolenv.types import Message, ParsedAction, Task, ToolResult

__all__ = [
    "ENV_CHANGED",
    "ENV_HEADER",
    "FEATURES",
    "FEATURES_HEADER",
    "IDEMPOTENCY_KEY",
    "PARSED",
    "PROMPT",
    "PROTOCOL_VERSION",
    "REPLAY",
    "EnvMetadata",
    "ErrorResponse",
    "Health",
    "ResetOptions",
    "ResetRequest",
    "ResetResponse",
    "SessionCreated",
    "StepInfo",
    "StepRequest",
    "StepResponse",
    "TaskList",
    "TruncateRequest",
    "TruncateResponse",
    "dump_json",
    "feature_set",
    "schemas",
]

log = logging.getLogger("toolenv.remote")

#: Bumped when a change breaks clients of the previous version (2: `POST /sessions/{id}/truncate`).
PROTOCOL_VERSION = 2
#: The header of `POST /sessions` naming one logical create: sent again with the same value
#: (its answer was lost), the create gets the session the first one made. Optional.
IDEMPOTENCY_KEY = "Idempotency-Key"
#: The header listing, comma separated, what one side does beyond its protocol version: on the
#: answer of `GET /metadata`, what the server does; on a client's requests, what the client
#: reads. A header, not a metadata field: clients of the same version refuse unknown fields.
FEATURES_HEADER = "Toolenv-Features"
#: Feature: steps and truncates may carry their episode id (and turn); one sent again gets the
#: answer of the run it repeats instead of a second run, so the client retries lost answers.
REPLAY = "replay"
#: Feature: `EnvMetadata` carries the env's `system_prompt` and `answer_tool_rewrites`. The server
#: sends them only to a client whose requests list it: an older client refuses fields it does not know.
PROMPT = "prompt"
#: Feature: a step may carry the turn already parsed (`StepRequest.parsed`: native tool calls),
#: run as given. A client sends it only to a server that lists it: an older one refuses the field.
PARSED = "parsed"
#: What this version does, as a server and as a client (the value of `FEATURES_HEADER`).
FEATURES = (REPLAY, PROMPT, PARSED)
#: The header naming the env a server serves, as a fingerprint of its metadata and tasks: on every
#: answer of the server; on a client's requests, the env it was built for. A server refuses (409,
#: error type `ENV_CHANGED`) a request built for another env: it restarted with other tools, parser,
#: prompt, limits or tasks, and the client's mirror of them is wrong. Optional on both sides.
ENV_HEADER = "Toolenv-Env"
#: The `ErrorResponse.type` of that refusal.
ENV_CHANGED = "EnvChanged"
#: The serialization context key naming the features of the side that reads the JSON.
_READER_FEATURES = "reader_features"
_PROMPT_FIELDS = ("system_prompt", "answer_tool_rewrites")


def feature_set(header: str | None) -> frozenset[str]:
    """The features a `Toolenv-Features` header lists (none when it is absent)."""
    return frozenset(f.strip() for f in (header or "").split(",") if f.strip())


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvMetadata(_Wire):
    """What a client needs to stand in for the env: its parser, tools, limits and rewards."""

    protocol: int = Field(default=PROTOCOL_VERSION, description="The wire protocol version.")
    toolenv_version: str = Field(description="The server's toolenv version.")
    env_id: str = Field(default="", description="The Gymnasium id the server was started with, if any.")
    parser: str = Field(description="The registered name of the env's parser (`get_parser(name, **kwargs)`).")
    parser_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Parser arguments that differ from defaults."
    )
    tool_schemas: list[dict[str, Any]] = Field(default_factory=list, description="OpenAI function schemas.")
    max_turns: int = Field(ge=1)
    reward_weights: dict[str, float] = Field(default_factory=dict, description="Weight of each reward component.")
    num_tasks: int = Field(default=0, ge=0, description="Tasks the env has (`GET /tasks` lists them).")
    system_prompt: str | None = Field(
        default=None,
        description="The env's system prompt (feature `prompt`: sent to clients that list it only).",
    )
    answer_tool_rewrites: dict[str, str] = Field(
        default_factory=dict,
        description="The env's `answer_tool_rewrites` (feature `prompt`: sent to clients that list it only).",
    )

    @model_serializer(mode="wrap")
    def _prompt_for_readers_of_it(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        # Written for a reader whose features are known (the server's answers), the prompt fields
        # go only to one that lists `prompt`: a client before it refuses fields it does not know.
        data = handler(self)
        readers = info.context.get(_READER_FEATURES) if isinstance(info.context, Mapping) else None
        if isinstance(data, dict) and readers is not None and PROMPT not in readers:
            for name in _PROMPT_FIELDS:
                data.pop(name, None)
        return data


class SessionCreated(_Wire):
    """`POST /sessions`: a new env instance, reserved for the caller until deleted or idle too long."""

    session_id: str
    metadata: EnvMetadata


class ResetOptions(BaseModel):
    """`reset` options: one of `task`, `task_id`, `task_index` (or none: the env's own order).

    Other keys pass through to the env unchanged, as they would locally.
    """

    model_config = ConfigDict(extra="allow")

    task: Task | None = None
    task_id: str | int | None = None
    task_index: int | None = None

    def to_env(self) -> dict[str, Any]:
        """The options as the env's `reset` takes them (the typed keys only when given)."""
        given = {k: v for k, v in (("task", self.task), ("task_id", self.task_id), ("task_index", self.task_index))}
        return {**{k: v for k, v in given.items() if v is not None}, **(self.model_extra or {})}


class ResetRequest(_Wire):
    """`POST /sessions/{id}/reset`."""

    seed: int | None = Field(default=None, ge=0)
    options: ResetOptions = Field(default_factory=ResetOptions)


class ResetResponse(_Wire):
    """The first observation of a new episode."""

    observation: str
    episode_id: str
    task_id: str
    task: Task | None = Field(default=None, description="The chosen task; left out when the request carried it.")
    messages: list[Message] = Field(default_factory=list)


class StepRequest(_Wire):
    """`POST /sessions/{id}/step`: one model turn, optionally naming which turn of which episode it is.

    With `episode_id` and `turn`, a step the server has just run, sent again because its
    answer was lost, gets that run's answer again rather than running a second time; a step
    older than the last, or of another episode, is refused (409). Without them (older
    clients) the step runs as it comes.
    """

    action: str
    episode_id: str | None = Field(
        default=None, min_length=1, max_length=255, description="The `episode_id` the reset answered."
    )
    turn: int | None = Field(
        default=None, ge=1, description="Which turn this step is: 1 for the first, as `info.turn` of its answer."
    )
    parsed: ParsedAction | None = Field(
        default=None,
        description="The turn already parsed (native tool calls), run as given with `action` as its text; "
        "only to a server listing the `parsed` feature.",
    )

    @model_validator(mode="after")
    def _identity_whole(self) -> StepRequest:
        if (self.episode_id is None) != (self.turn is None):
            raise ValueError("episode_id and turn go together: give both or neither")
        return self

    @model_serializer(mode="wrap")
    def _identity_only_when_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out rather than null: a server before the identity refuses fields it does not know.
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if k == "action" or v is not None}


class StepInfo(_Wire):
    """The `info` of a step; `answer`, `reward_info` and `episode` only when the episode ended."""

    task_id: str
    turn: int
    action: ParsedAction
    tool_results: list[ToolResult] = Field(default_factory=list)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    messages: list[Message] = Field(default_factory=list)
    reward_components: dict[str, float] = Field(default_factory=dict)
    answer: str | None = None
    reward_info: dict[str, dict[str, Any]] | None = None
    episode: dict[str, int | float] | None = None


class StepResponse(_Wire):
    """What `step` returns, with `info` typed."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: StepInfo


class TruncateRequest(_Wire):
    """`POST /sessions/{id}/truncate` (the body is optional): which episode to end.

    With `episode_id`, a truncate sent again because its answer was lost gets that answer
    again (the reward it scored) instead of 0.0, and one for another episode is refused (409).
    """

    episode_id: str | None = Field(
        default=None, min_length=1, max_length=255, description="The `episode_id` the reset answered."
    )


class TruncateResponse(_Wire):
    """`POST /sessions/{id}/truncate`: the open episode ended unanswered and scored (`ToolEnv.atruncate`)."""

    reward: float
    last_turn_components: dict[str, float] = Field(
        default_factory=dict, description="The last turn's reward components after the final ones were added."
    )


class TaskList(_Wire):
    """`GET /tasks`: the env's tasks."""

    tasks: list[Task]


class Health(_Wire):
    """`GET /health`."""

    status: Literal["ok"] = "ok"
    sessions: int
    max_sessions: int


class ErrorResponse(_Wire):
    """Every error: a message, and the env's exception type when the env raised it."""

    error: str
    type: str | None = None


def dump_json(model: BaseModel, reader_features: Collection[str] | None = None) -> str:
    """`model` as JSON, also when it holds what a local env returns but JSON has no word for.

    With `reader_features` (what the reader listed in its `Toolenv-Features`), fields of a
    feature the reader does not list are left out (`EnvMetadata`'s prompt fields).

    Tool output decoded with `surrogateescape`, a model's half emoji, numpy scores and
    metadata: a local step returns them as they are, so the wire takes them as a trajectory
    file does (`toolenv.trajectory.dump_json`); a value that still is not JSON is sent as
    null and logged.
    """
    context = None if reader_features is None else {_READER_FEATURES: frozenset(reader_features)}
    line = json_line(model, context, warnings=False)
    for problem in line.problems:
        log.warning("%s: %s", type(model).__name__, problem)
    return line.text


def schemas() -> dict[str, Any]:
    """The JSON schema of every body, by model name (`GET /schema`)."""
    models: list[type[BaseModel]] = [
        EnvMetadata,
        SessionCreated,
        ResetRequest,
        ResetResponse,
        StepRequest,
        StepResponse,
        TruncateRequest,
        TruncateResponse,
        TaskList,
        Health,
        ErrorResponse,
    ]
    return {m.__name__: m.model_json_schema() for m in models}
