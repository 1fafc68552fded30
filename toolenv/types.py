"""The typed data that flows through one step: messages, tool calls, results, tasks.

Every model forbids unknown fields so a typo in a config or a dataset row is an
error rather than a silently ignored key.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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

    @classmethod
    def from_pil(cls, image: PILImage, fmt: str = "PNG") -> ToolImage:
        """Encode a PIL image."""
        buf = io.BytesIO()
        image.save(buf, format=fmt)
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


class ToolCall(_Model):
    """One call of a tool, as parsed from model output."""

    name: str = Field(description="Tool name as the model wrote it.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments, not yet validated.")
    id: str = Field(default="", description="Call id; parsers assign call_0, call_1, ... when the model gives none.")


class ToolResult(_Model):
    """What a tool call returned. Failures are results too (`is_error`), never exceptions."""

    text: str = Field(default="", description="Text the model sees.")
    images: list[ToolImage] = Field(default_factory=list, description="Images the model sees.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Structured data for rewards and reports.")
    is_error: bool = Field(default=False, description="True when the call failed.")
    retryable: bool = Field(default=False, description="A failure worth retrying (the caller backs off and retries).")
    name: str = Field(default="", description="Tool name, filled in by the caller.")
    call_id: str = Field(default="", description="Call id, filled in by the caller.")

    @classmethod
    def error(cls, message: str, *, retryable: bool = False, **metadata: Any) -> ToolResult:
        """A failed call with a message the model can act on."""
        return cls(text=message, is_error=True, retryable=retryable, metadata=metadata)


class Message(_Model):
    """A chat message in the OpenAI shape, with images kept typed."""

    role: Role
    content: str = ""
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None
    images: list[ToolImage] = Field(default_factory=list)

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat-completions dict (images as data URLs)."""
        out: dict[str, Any] = {"role": self.role}
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


class ParsedAction(_Model):
    """What a parser found in one model turn."""

    tool_calls: list[ToolCall] = Field(default_factory=list)
    answer: str | None = Field(default=None, description="The final answer, when the turn gives one.")
    text: str = Field(default="", description="The turn's text outside tool calls and the answer.")
    errors: list[str] = Field(default_factory=list, description="Parse errors, worded for the model.")

    @property
    def is_final(self) -> bool:
        """True when the turn ends the episode with an answer."""
        return self.answer is not None


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

    @property
    def answers(self) -> list[str]:
        """Gold answers as a list (empty when there is none)."""
        if self.answer is None:
            return []
        return [self.answer] if isinstance(self.answer, str) else list(self.answer)


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
