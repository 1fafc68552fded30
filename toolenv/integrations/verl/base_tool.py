"""Any toolenv `Tool` as a verl `BaseTool`, for verl's own `tool_agent` loop.

In a verl tool config (`actor_rollout_ref.rollout.multi_turn.tool_config_path`):

    tools:
      - class_name: toolenv.integrations.verl.ToolEnvBaseTool
        config: {type: native, tool: "toolenv.integrations.verl.demo:Calculator"}

`config.tool` is a `"module:Name"` reference or a `toolenv.tools` plugin name;
`config.tool_kwargs` is passed to its constructor. Leave `tool_schema` out: the
adapter builds it from `Tool.flat_schema()`.

Schemas: verl validates schemas with `OpenAIFunctionToolSchema`, whose property
model keeps only `type`, `description` and `enum` (it drops `items`, `default`,
`minimum`, `maxLength`...). The adapter's `tool_schema` is a subclass of that model
that validates the same way but keeps every other key, so what verl renders into
the chat template (`tool_schema.model_dump()`) is the tool's full schema.

Calls run through toolenv's `ToolCaller` (argument validation, timeout, retries,
truncation); failures come back as text, never as exceptions. verl creates and
releases an instance per call, so per-trajectory tool state (`ToolContext.state`)
is kept on verl's per-trajectory `AgentData` object, and the tool's per-episode
`Tool.release(ctx)` (an MCP server per episode, a code session) runs when that
object is freed, i.e. when verl's loop returns the trajectory. verl has no
end-of-trajectory hook for tools; `AgentData` is freed by reference counting as
soon as `ToolAgentLoop.run` returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import weakref
from typing import Any
from uuid import uuid4

from pydantic import ConfigDict, ValidationError
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import (
    OpenAIFunctionParametersSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    ToolResponse,
)

from toolenv._tool import Tool, ToolContext
from toolenv.caller import ToolCaller
from toolenv.registry import resolve_tool
from toolenv.types import Task, ToolCall

__all__ = ["FullToolSchema", "ToolEnvBaseTool", "verl_tool_schema"]

_STATE_ATTR = "_toolenv_tool_state"

_log = logging.getLogger(__name__)


class _Property(OpenAIFunctionPropertySchema):
    model_config = ConfigDict(extra="allow")


class _Parameters(OpenAIFunctionParametersSchema):
    model_config = ConfigDict(extra="allow")
    properties: dict[str, _Property]  # type: ignore[assignment]


class _Function(OpenAIFunctionSchema):
    model_config = ConfigDict(extra="allow")
    parameters: _Parameters  # type: ignore[assignment,unused-ignore]


class FullToolSchema(OpenAIFunctionToolSchema):
    """verl's tool schema model, validated the same way, keeping every JSON-schema key it does not model."""

    function: _Function  # type: ignore[assignment,unused-ignore]


def verl_tool_schema(tool: Tool) -> FullToolSchema:
    """The tool's flattened schema as a `FullToolSchema`.

    Raises:
        ValueError: the schema has a shape verl cannot take (e.g. a property without a `type`).
    """
    schema = tool.flat_schema()
    try:
        OpenAIFunctionToolSchema.model_validate(schema)
        return FullToolSchema.model_validate(schema)
    except ValidationError as exc:
        raise ValueError(f"tool {tool.name!r}: verl rejects its schema: {exc}") from None


def _task(value: Any) -> Task:
    if value is None:
        return Task()
    if isinstance(value, Task):
        return value
    if isinstance(value, str):
        return Task.model_validate_json(value)
    return Task.model_validate(dict(value))


class ToolEnvBaseTool(BaseTool):  # type: ignore[misc,unused-ignore]
    """A verl `BaseTool` that runs a toolenv `Tool` (built from `config` or passed as `tool=`)."""

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        tool_schema: OpenAIFunctionToolSchema | None = None,
        *,
        tool: Tool | None = None,
    ) -> None:
        cfg = dict(config or {})
        if tool is None:
            if "tool" not in cfg:
                raise ValueError("ToolEnvBaseTool needs config.tool: a 'module:Name' reference or a tool plugin name")
            tool = resolve_tool(cfg["tool"], **dict(cfg.get("tool_kwargs") or {}))
        self.tool = tool
        self.caller = ToolCaller([tool])
        self._contexts: dict[str, ToolContext] = {}
        #: Instances whose `create` failed: verl drops what `create` returns, so `execute` says it.
        self._create_errors: dict[str, str] = {}
        #: Instances run without an `AgentData`: each is its own episode, released with the instance.
        self._standalone: set[str] = set()
        #: Trajectories (AgentData) whose release is registered, and the releases in flight.
        self._tracked: weakref.WeakSet[Any] = weakref.WeakSet()
        self._pending: set[asyncio.Future[None] | concurrent.futures.Future[None]] = set()
        super().__init__(cfg, tool_schema or verl_tool_schema(tool))

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start an instance; `create_kwargs.task` (a Task, dict or JSON) sets the tool's `ctx.task`.

        An invalid task is reported by every `execute` of the instance (verl's `tool_agent`
        ignores what `create` returns), rather than the tool running on an empty task.
        """
        instance_id = instance_id or uuid4().hex
        create_kwargs = kwargs.get("create_kwargs") or {}
        try:
            task = _task(create_kwargs.get("task"))
        except ValueError as exc:
            text = f"Invalid task for tool '{self.tool.name}': {exc}"
            self._create_errors[instance_id] = text
            return instance_id, ToolResponse(text=text)
        self._contexts[instance_id] = ToolContext(task=task, episode_id=instance_id)
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run the tool; returns (response with text and images, reward 0.0, call metrics)."""
        if instance_id in self._create_errors:
            return ToolResponse(text=self._create_errors[instance_id]), 0.0, {"is_error": True}
        ctx = self._contexts.get(instance_id) or ToolContext(task=Task(), episode_id=instance_id)
        agent_data = kwargs.get("agent_data")
        if agent_data is not None:  # share state across the calls of one trajectory
            ctx = self._trajectory_context(agent_data, ctx, instance_id)
        else:
            self._standalone.add(instance_id)
        if isinstance(parameters, str):
            try:
                parameters = json.loads(parameters)
            except json.JSONDecodeError:
                parameters = None  # type: ignore[assignment,unused-ignore]
        if not isinstance(parameters, dict):
            text = f"Arguments for tool '{self.tool.name}' must be a JSON object."
            return ToolResponse(text=text), 0.0, {"is_error": True}
        call = ToolCall(name=self.tool.name, arguments=parameters, id=instance_id)
        results, records = await self.caller.invoke([call], ctx)
        result, record = results[0], records[0]
        metrics = {"is_error": result.is_error, "latency_s": record.latency_s, "attempts": record.attempts}
        if result.images:
            return ToolResponse(text=result.text, image=[im.to_pil() for im in result.images]), 0.0, metrics
        return ToolResponse(text=result.text), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """toolenv scores episodes with the env's reward, not per tool: always 0.0."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance (verl calls this after every call). An instance that ran without
        verl's `AgentData` is its own episode: the tool's `release(ctx)` runs now."""
        ctx = self._contexts.pop(instance_id, None)
        self._create_errors.pop(instance_id, None)
        if instance_id in self._standalone:
            self._standalone.discard(instance_id)
            if ctx is not None and self.caller.releases:
                await self.caller.release(ctx)

    def _trajectory_context(self, agent_data: Any, ctx: ToolContext, instance_id: str) -> ToolContext:
        """The trajectory's context (state kept on `agent_data`); on its first call, arrange
        for the tool's `release` to run when `agent_data` is freed."""
        state = getattr(agent_data, _STATE_ATTR, None)
        if state is None:
            state = {}
            setattr(agent_data, _STATE_ATTR, state)
        out = ToolContext(task=ctx.task, episode_id=str(getattr(agent_data, "request_id", instance_id)), state=state)
        if self.caller.releases and agent_data not in self._tracked:
            self._tracked.add(agent_data)
            # The finalizer holds the context (its state dict) but never agent_data itself.
            weakref.finalize(agent_data, self._schedule_release, out, asyncio.get_running_loop())
        return out

    def _schedule_release(self, ctx: ToolContext, loop: asyncio.AbstractEventLoop) -> None:
        """Run `release(ctx)` on the trajectory's event loop (called from a finalizer, any thread)."""
        if loop.is_closed():
            _log.warning(
                "tool %r: episode %s ended after its event loop closed; not released", self.tool.name, ctx.episode_id
            )
            return
        if asyncio._get_running_loop() is loop:  # the usual case: freed on the loop's own thread
            task = loop.create_task(self.caller.release(ctx))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        try:
            future = asyncio.run_coroutine_threadsafe(self.caller.release(ctx), loop)
        except RuntimeError:  # the loop closed in between
            return
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        """Wait for the releases in flight, then close the tool."""
        pending = [asyncio.wrap_future(f) if isinstance(f, concurrent.futures.Future) else f for f in self._pending]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        await self.caller.aclose()
