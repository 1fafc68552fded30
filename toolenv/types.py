"""The typed data that flows through one step: messages, tool calls, results, tasks.

Every type forbids unknown fields so a typo in a config or a dataset row is an
error rather than a silently ignored key. `Task` and `ToolImage` are Pydantic
models; the four types built on every step are slotted dataclasses with the same
`model_*` methods (see `_Data`).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from typing_extensions import Self

from toolenv.image_store import IMAGE_STORE

if TYPE_CHECKING:  # Pillow is optional: only the vision plugin needs it.
    from PIL.Image import Image as PILImage

__all__ = [
    "Message",
    "ParsedAction",
    "Task",
    "ToolCall",
    "ToolImage",
    "ToolResult",
    "load_tasks",
]

Role = Literal["system", "user", "assistant", "tool"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Data:
    """Pydantic's model methods for the plain dataclasses built on every step.

    `ToolCall`, `ToolResult`, `Message` and `ParsedAction` are made several times per
    step, so they are slotted dataclasses (about 3x cheaper to build than a
    validating model); validation and (de)serialisation go through a Pydantic
    `TypeAdapter` on demand, with the method names of a `BaseModel`.
    """

    __slots__ = ()
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    @classmethod
    def _adapter(cls) -> TypeAdapter[Any]:
        found = _ADAPTERS.get(cls)
        if found is None:
            found = _ADAPTERS[cls] = TypeAdapter(cls)
        return found

    @classmethod
    def model_validate(cls, obj: Any, *, context: Any | None = None) -> Self:
        """Validate a dict (or an instance) into this type."""
        return cls._adapter().validate_python(obj, context=context)  # type: ignore[no-any-return]

    @classmethod
    def model_validate_json(cls, data: str | bytes, *, context: Any | None = None) -> Self:
        """Validate JSON into this type (`context` as for a BaseModel, e.g. an image store)."""
        return cls._adapter().validate_json(data, context=context)  # type: ignore[no-any-return]

    @classmethod
    def model_json_schema(cls) -> dict[str, Any]:
        """The JSON schema of this type."""
        return cls._adapter().json_schema()

    def model_dump(self, *, mode: Literal["python", "json"] = "python", **kwargs: Any) -> dict[str, Any]:
        """The fields as a dict (`mode="json"` for JSON-safe values)."""
        return self._adapter().dump_python(self, mode=mode, **kwargs)  # type: ignore[no-any-return]

    def model_dump_json(self, **kwargs: Any) -> str:
        """The fields as JSON text."""
        return self._adapter().dump_json(self, **kwargs).decode()

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Self:
        """A shallow copy with `update` applied."""
        return dataclasses.replace(self, **(update or {}))  # type: ignore[type-var]


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _image_store(context: Any) -> Any:
    """The `ImageStore` a (de)serialization was given, or None (images inline)."""
    return context.get(IMAGE_STORE) if isinstance(context, dict) else None


class ToolImage(_Model):
    """An image a tool returns: PNG (or JPEG) bytes with their size.

    Stored as bytes so trajectories serialise to JSON; `to_pil` and `data_url`
    give the two forms models consume.
    """

    data: bytes = Field(description="Encoded image bytes.")
    mime: str = Field(default="image/png", description="MIME type of `data`.")
    width: int = Field(ge=1)
    height: int = Field(ge=1)

    model_config = ConfigDict(extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")

    @model_serializer(mode="wrap")
    def _to_file(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """With an `ImageStore` in the context, the bytes go to a file and the JSON names it."""
        store = _image_store(info.context)
        if store is None:
            return handler(self)
        return {"file": store.put(self.data, self.mime), "mime": self.mime, "width": self.width, "height": self.height}

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, value: Any, info: ValidationInfo) -> Any:
        """Read back an image that was written to an `ImageStore`."""
        if not (isinstance(value, dict) and "file" in value):
            return value
        store = _image_store(info.context)
        if store is None:
            raise ValueError(
                "this image is stored in a file; read it with toolenv.read_trajectories(path), "
                "which finds the images/ folder beside the trajectories"
            )
        rest = {k: v for k, v in value.items() if k != "file"}
        return {**rest, "data": store.get(value["file"])}

    @classmethod
    def from_pil(cls, image: PILImage, fmt: str = "PNG", **save_params: Any) -> ToolImage:
        """Encode a PIL image; `save_params` go to `Image.save` (e.g. `quality=90` for JPEG).

        PNG defaults to zlib level 1: on photos it encodes about 4x faster than Pillow's
        default level 6 for about 10% more bytes, and envs encode an image on every reset
        and every crop.
        """
        if fmt.upper() == "PNG":
            save_params.setdefault("compress_level", 1)
        buf = io.BytesIO()
        image.save(buf, format=fmt, **save_params)
        return cls(data=buf.getvalue(), mime=f"image/{fmt.lower()}", width=image.width, height=image.height)

    def to_pil(self) -> PILImage:
        """Decode into a PIL image (needs Pillow)."""
        from PIL import Image

        img = Image.open(io.BytesIO(self.data))
        img.load()
        return img

    def data_url(self) -> str:
        """The image as a `data:` URL, the form OpenAI-style chat messages take."""
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass(slots=True, kw_only=True)
class ToolCall(_Data):
    """One call of a tool, as parsed from model output.

    Attributes:
        name: tool name as the model wrote it.
        arguments: arguments, not yet validated.
        id: call id; parsers assign call_0, call_1, ... when the model gives none.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass(slots=True, kw_only=True)
class ToolResult(_Data):
    """What a tool call returned. Failures are results too (`is_error`), never exceptions.

    Attributes:
        text: text the model sees.
        images: images the model sees.
        metadata: structured data for rewards and reports.
        is_error: true when the call failed.
        retryable: a failure worth retrying (the caller backs off and retries).
        name: tool name, filled in by the caller.
        call_id: call id, filled in by the caller.
    """

    text: str = ""
    images: list[ToolImage] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    is_error: bool = False
    retryable: bool = False
    name: str = ""
    call_id: str = ""

    @classmethod
    def error(cls, message: str, *, retryable: bool = False, **metadata: Any) -> ToolResult:
        """A failed call with a message the model can act on (`infra_error=True` in `metadata`:
        not the input's fault, see `is_infra_error`)."""
        return cls(text=message, is_error=True, retryable=retryable, metadata=metadata)

    @property
    def is_infra_error(self) -> bool:
        """Failed for the infrastructure, not for the call the model wrote: `retryable` (a 5xx, a
        dropped connection, the caller's timeout), refused by an open circuit breaker
        (`metadata["circuit_open"]`), or marked by the tool (`metadata["infra_error"]`: the
        task's database or image is missing, the tool itself is broken). Penalties and run
        summaries keep these apart from the model's faults."""
        if not self.is_error:
            return False
        meta = self.metadata
        return self.retryable or meta.get("circuit_open") is True or meta.get("infra_error") is True

    def addressed(self, name: str, call_id: str, text: str) -> ToolResult:
        """A copy with the call's tool name and id filled in and `text` as its text (the
        caller's copy of every result; a tool's own object may be cached and reused).

        Built slot by slot, not through `__init__`: a third of the cost on every step.
        """
        out: ToolResult = object.__new__(ToolResult)
        out.text, out.images, out.metadata = text, self.images, self.metadata
        out.is_error, out.retryable, out.name, out.call_id = self.is_error, self.retryable, name, call_id
        return out


@dataclass(slots=True, kw_only=True)
class Message(_Data):
    """A chat message in the OpenAI shape, with images kept typed."""

    role: Role
    content: str = ""
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None
    images: list[ToolImage] = field(default_factory=list)

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat-completions dict (images as data URLs).

        Raises:
            ValueError: a tool message with images. OpenAI's tool messages hold text only (the API
                refuses image parts there) and one dict cannot also hold the user message they
                would go to: `toolenv.export.move_tool_images` moves them there first, as the
                `openai` agent sends them.
        """
        out: dict[str, Any] = {"role": self.role}
        if self.images and self.role == "tool":
            raise ValueError(
                f"a tool message holds text only in OpenAI chat, and this one carries {len(self.images)} image(s): "
                "move them to a user message after it first (toolenv.export.move_tool_images)"
            )
        if self.images:
            parts: list[dict[str, Any]] = [
                {"type": "image_url", "image_url": {"url": im.data_url()}} for im in self.images
            ]
            if self.content:
                parts.append({"type": "text", "text": self.content})
            out["content"] = parts
        else:
            out["content"] = self.content
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for c in self.tool_calls
            ]
        return out


@dataclass(slots=True, kw_only=True)
class ParsedAction(_Data):
    """What a parser found in one model turn.

    Attributes:
        tool_calls: the calls, in order.
        answer: the final answer, when the turn gives one.
        text: the turn's text outside tool calls and the answer.
        errors: parse errors, worded for the model.
    """

    tool_calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    text: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def is_final(self) -> bool:
        """True when the turn ends the episode with an answer."""
        return self.answer is not None


# Builders for the step's hot path. The four step types are keyword-only, like the Pydantic
# models beside them, and a keyword call costs CPython 3.11 twice a positional one; they are
# built several times per step, so the parsers and the env fill their slots directly. The
# objects are the same (tests/test_types.py checks every field is set).
_new = object.__new__


def new_call(name: str, arguments: dict[str, Any], id: str) -> ToolCall:
    """`ToolCall(name=..., arguments=..., id=...)`, faster."""
    out: ToolCall = _new(ToolCall)
    out.name, out.arguments, out.id = name, arguments, id
    return out


def new_parsed(tool_calls: list[ToolCall], answer: str | None, text: str, errors: list[str]) -> ParsedAction:
    """`ParsedAction(tool_calls=..., answer=..., text=..., errors=...)`, faster."""
    out: ParsedAction = _new(ParsedAction)
    out.tool_calls, out.answer, out.text, out.errors = tool_calls, answer, text, errors
    return out


def reply_messages(results: Sequence[ToolResult]) -> list[Message]:
    """The env's reply to a turn as chat messages: a `tool` message per result that answers a
    call (it has a call id), then one user message for those that answer none (parse errors,
    "no tool call"). OpenAI's API and templates that pair each result with its call (Mistral's,
    gpt-oss's) reject a tool message without a call; the env's `info["messages"]`, verl's agent
    loop and the SFT export all send replies this way. Built with `new_message`: it runs every step."""
    out: list[Message] = []
    unanswered: list[ToolResult] = []
    for r in results:
        if r.call_id:  # the message shares the result's image list (one object fewer per step)
            out.append(new_message("tool", r.text, r.name or None, r.call_id, None, r.images))
        else:
            unanswered.append(r)
    if unanswered:
        text = "\n".join(r.text for r in unanswered)
        out.append(new_message("user", text, None, None, None, [im for r in unanswered for im in r.images]))
    return out


def new_message(
    role: Role,
    content: str,
    name: str | None = None,
    tool_call_id: str | None = None,
    tool_calls: list[ToolCall] | None = None,
    images: list[ToolImage] | None = None,
) -> Message:
    """`Message(role=..., content=..., ...)`, faster."""
    out: Message = _new(Message)
    out.role, out.content, out.name, out.tool_call_id = role, content, name, tool_call_id
    out.tool_calls, out.images = tool_calls, [] if images is None else images
    return out


class Task(_Model):
    """One episode's problem: the question, its ground truth, and per-task tool context."""

    id: str = Field(default="", description="Stable id; resumable rollouts skip finished ids.")
    question: str = Field(default="", description="The user's question.")
    prompt: str | None = Field(default=None, description="A fully rendered prompt that replaces the env's template.")
    answer: str | list[str] | None = Field(default=None, description="Ground truth: one or several gold answers.")
    context: dict[str, Any] = Field(
        default_factory=dict,
        description="Per-task data for tools and rewards (database path, image, tests, gold SQL...).",
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free data carried into trajectories.")

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, value: Any) -> Any:
        """An int id (a dataset's row number) as its text, a whole float one (pandas') too."""
        if type(value) is float and value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return str(value) if type(value) is int else value

    @field_validator("answer", mode="before")
    @classmethod
    def _answer_as_text(cls, value: Any) -> Any:
        """Numbers as their text (GSM8K-style datasets store `"answer": 72`), in a list too;
        a bool stays refused (`True` is no gold answer anyone wrote)."""
        if isinstance(value, list):
            return [_number_text(v) for v in value]
        return _number_text(value)

    @property
    def answers(self) -> list[str]:
        """Gold answers as a list (empty when there is none)."""
        if self.answer is None:
            return []
        return [self.answer] if isinstance(self.answer, str) else list(self.answer)


def _number_text(value: Any) -> Any:
    """An int or a finite float as text (`72`, `3.5`); anything else as it is, for the model to check.

    A whole float is written as the integer it is (`72.0` is `"72"`, as JSON writers such as
    JavaScript's write that number): pandas stores an integer column with gaps as floats, and
    `"72.0"` would score 0 against an answer of 72 (and normalise to `"720"`)."""
    if type(value) is float and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return str(value)
    return value


def load_tasks(source: str | Path | Iterable[Task | dict[str, Any]]) -> list[Task]:
    """Tasks from a JSONL file or an iterable of Tasks/dicts; ids default to the index.

    Raises:
        ValueError: a row is not a valid Task (the message names the row).
    """
    rows: Sequence[Task | dict[str, Any]]
    if isinstance(source, (str, Path)):
        path = Path(source)
        rows = []
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    else:
        rows = list(source)
    tasks: list[Task] = []
    for i, row in enumerate(rows):
        try:
            task = row if isinstance(row, Task) else Task.model_validate(row)
        except ValidationError as exc:
            raise ValueError(f"task {i} is not valid: {exc}") from None
        if not task.id:
            task = task.model_copy(update={"id": str(i)})
        tasks.append(task)
    return tasks
