"""ToolEnvBaseTool: create/execute/release over real toolenv tools, and schemas verl accepts."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")

import toolenv
from toolenv.integrations.verl.demo import Calculator

CALC_REF = "toolenv.integrations.verl.demo:Calculator"


class Stats(toolenv.Tool):
    """Summarise a list of numbers; remembers how often it ran in this trajectory."""

    name = "stats"

    class Args(BaseModel):
        values: list[float] = Field(description="Numbers to summarise.", min_length=1)
        mode: str = Field(default="mean", description="Statistic.", json_schema_extra={"enum": ["mean", "max"]})
        digits: int | None = Field(default=None, description="Round to this many digits.", ge=0)

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        ctx.state["runs"] = ctx.state.get("runs", 0) + 1
        value = sum(args.values) / len(args.values) if args.mode == "mean" else max(args.values)
        if args.digits is not None:
            value = round(value, args.digits)
        return toolenv.ToolResult(text=f"{value} (run {ctx.state['runs']}, task {ctx.task.id})")


class Picture(toolenv.Tool):
    """Return a small image."""

    name = "picture"

    class Args(BaseModel):
        size: int = Field(ge=1, le=64)

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        from PIL import Image

        img = Image.new("RGB", (args.size, args.size), (255, 0, 0))
        return toolenv.ToolResult(text="a red square", images=[toolenv.ToolImage.from_pil(img)])


def test_schema_validates_and_keeps_what_verl_drops():
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool

    adapter = ToolEnvBaseTool(tool=Stats())
    assert adapter.name == "stats"
    assert isinstance(adapter.tool_schema, OpenAIFunctionToolSchema)
    assert adapter.tool_schema.model_dump(exclude_unset=True) == Stats().flat_schema()  # nothing lost
    # What verl renders into the chat template (its tool loop dumps with exclude_none, dropping `default: null`).
    dumped = adapter.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    props = dumped["function"]["parameters"]["properties"]
    assert props["values"]["items"] == {"type": "number"}
    assert props["digits"]["type"] == ["integer", "null"]
    assert props["digits"]["minimum"] == 0
    # verl's own model accepts the same dict but keeps less (documented in docs/verl.md).
    plain = OpenAIFunctionToolSchema.model_validate(Stats().flat_schema()).model_dump(exclude_none=True)
    assert "items" not in plain["function"]["parameters"]["properties"]["values"]
    assert plain["function"]["parameters"]["properties"]["mode"]["enum"] == ["mean", "max"]


def test_builds_from_config_reference():
    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool

    adapter = ToolEnvBaseTool({"type": "native", "tool": "toolenv.integrations.verl.demo:Calculator"}, None)
    assert adapter.name == "calculator"
    assert isinstance(adapter.tool, Calculator)
    with pytest.raises(ValueError, match=r"config\.tool"):
        ToolEnvBaseTool({"type": "native"}, None)
    with pytest.raises(ValueError, match="cannot import tool"):
        ToolEnvBaseTool({"type": "native", "tool": "no_such_module:Tool"}, None)


async def test_create_execute_release_with_task_and_trajectory_state():
    from verl.tools.schemas import ToolResponse

    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool

    adapter = ToolEnvBaseTool(tool=Stats())
    task = toolenv.Task(id="t7", question="q").model_dump_json()
    iid, created = await adapter.create(create_kwargs={"task": task})
    assert isinstance(created, ToolResponse)

    class AgentData:  # verl's per-trajectory object: only request_id is read
        request_id = "traj-1"

    traj = AgentData()
    resp, reward, metrics = await adapter.execute(iid, {"values": [1, 2, 6]}, agent_data=traj)
    assert resp.text == "3.0 (run 1, task t7)"
    assert reward == 0.0 and metrics["is_error"] is False
    resp, _, _ = await adapter.execute(iid, {"values": [1, 5], "mode": "max"}, agent_data=traj)
    assert resp.text == "5.0 (run 2, task t7)"  # state shared across calls of one trajectory
    await adapter.release(iid)
    assert iid not in adapter._contexts

    # Bad arguments come back as text the model can act on, never as exceptions.
    iid, _ = await adapter.create()
    resp, _, metrics = await adapter.execute(iid, {"values": []})
    assert metrics["is_error"] is True and "Invalid arguments for tool 'stats'" in resp.text
    resp, _, metrics = await adapter.execute(iid, {"value": [1]})
    assert "unknown argument" in resp.text.lower() and metrics["is_error"] is True
    resp, _, metrics = await adapter.execute(iid, "not json")  # type: ignore[arg-type]
    assert "must be a JSON object" in resp.text
    await adapter.release(iid)


async def test_images_travel_as_pil():
    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool

    adapter = ToolEnvBaseTool(tool=Picture())
    iid, _ = await adapter.create()
    resp, _, _ = await adapter.execute(iid, {"size": 4})
    assert resp.text == "a red square"
    assert len(resp.image) == 1 and resp.image[0].size == (4, 4)
    assert resp.image[0].getpixel((0, 0)) == (255, 0, 0)


def test_agent_loop_chat_message_carries_images():
    pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")
    from PIL import Image

    from toolenv.integrations.verl.agent_loop import chat_message

    img = toolenv.ToolImage.from_pil(Image.new("RGB", (3, 2), (0, 0, 255)))
    msg, images = chat_message(toolenv.Message(role="tool", content="blue", images=[img], tool_call_id="c1"))
    assert msg["role"] == "tool" and msg["tool_call_id"] == "c1"
    assert [b["type"] for b in msg["content"]] == ["image", "text"]
    assert images[0].size == (3, 2) and msg["content"][0]["image"] is images[0]
    plain, none = chat_message(toolenv.Message(role="user", content="hi"))
    assert plain == {"role": "user", "content": "hi"} and none == []


def test_agent_loop_tool_messages_name_their_tool(tmp_path):
    """Gemma 4's template writes a tool result under the tool's name (`response:NAME{...}`); the
    name must survive the trip from toolenv's reply to verl's chat dict."""
    pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")
    trl = pytest.importorskip("trl", reason="Gemma 4's real chat template comes with trl (CI has it)")
    from pathlib import Path

    from transformers import AutoTokenizer

    from toolenv.integrations.verl.agent_loop import chat_message
    from toolenv.integrations.verl.tiny import build_tiny_qwen2
    from toolenv.types import reply_messages

    (result,) = reply_messages([toolenv.ToolResult(text="5", name="add", call_id="call_0")])
    msg, _ = chat_message(result)
    assert msg == {"role": "tool", "content": "5", "tool_call_id": "call_0", "name": "add"}
    tok = AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path, with_model=False))
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "gemma4.jinja").read_text(encoding="utf-8")
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}, "id": "call_0"}
    messages = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "", "tool_calls": [call]}, msg]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert 'response:add{value:<|"|>5<|"|>}' in text


async def test_image_observations_need_a_vision_processor(scripted_server, make_loop):
    """Tool images become image content blocks; with a text-only model verl's own check stops the episode."""
    pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")
    from toolenv.integrations.verl.data import abuild_rows

    rows = await abuild_rows(
        "toolenv/ToolEnv-v0",
        env_kwargs={
            "tools": ["toolenv.integrations.verl.demo:Calculator"],
            "tasks": [{"question": "q", "answer": "a"}],
        },
    )
    call = '<tool_call>\n{"name": "picture", "arguments": {"size": 2}}\n</tool_call>'
    loop = make_loop(scripted_server([call]), env_kwargs={"tools": [Picture()]})
    env = toolenv.ToolEnv(tools=[Picture()], tasks=[{"question": "q"}])
    await env.areset()
    _, _, _, _, step = await env.astep(call)
    messages, images = loop._observation(env, step)
    assert messages[0]["role"] == "tool" and messages[0]["content"][0] == {"type": "image", "image": images[0]}
    assert images[0].size == (2, 2)
    with pytest.raises(ValueError, match="Multimodal inputs require"):
        await loop.run({}, raw_prompt=rows[0]["prompt"], extra_info=rows[0]["extra_info"])


class Session(toolenv.Tool):
    """Open a session on a trajectory's first call; count the releases."""

    name = "calculator"
    opened: ClassVar[list[str]] = []
    released: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    class Args(BaseModel):
        expression: str

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        if "session" not in ctx.state:
            ctx.state["session"] = ctx.episode_id
            self.opened.append(ctx.episode_id)
        return toolenv.ToolResult(text="42")

    async def release(self, ctx: toolenv.ToolContext) -> None:
        self.released.append((ctx.episode_id, dict(ctx.state)))


async def test_tool_agent_trajectories_release_the_tools_episode(scripted_server, make_loop):
    """verl's ToolAgentLoop releases a BaseTool instance after every call, and has no end of
    trajectory hook: the tool's own `release(ctx)` runs once per trajectory when it is over,
    with that trajectory's state, so per-episode sessions (MCP servers, code sessions) end."""
    import asyncio

    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool
    from toolenv.integrations.verl.data import abuild_rows
    from toolenv.integrations.verl.demo import DEMO_TASKS

    Session.opened, Session.released = [], []
    adapter = ToolEnvBaseTool(tool=Session())
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC_REF], "tasks": DEMO_TASKS}))[0]
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
    for _ in range(3):
        server = scripted_server([call, call, "<answer>42</answer>"])
        loop = make_loop(server, cls=ToolAgentLoop, tools=[adapter])
        await loop.run({}, raw_prompt=row["prompt"], extra_info=row["extra_info"])
        await asyncio.sleep(0)  # the release runs as a task on the trajectory's event loop
        assert len(Session.released) == len(Session.opened)
    assert len(Session.opened) == 3 and len(set(Session.opened)) == 3
    assert [episode for episode, _ in Session.released] == Session.opened
    assert all(state == {"session": episode} for episode, state in Session.released)
    await adapter.aclose()

    # Without verl's AgentData, each instance is its own episode: released with the instance.
    iid, _ = await adapter.create()
    await adapter.execute(iid, {"expression": "1"})
    await adapter.release(iid)
    assert Session.released[-1][0] == iid and len(Session.released) == 4


CALCULATOR = Calculator()  # a "module:NAME" reference may name a ready-made instance


def test_arguments_for_a_tool_instance_reference_are_refused() -> None:
    """`tool_kwargs` for a reference to a Tool instance were dropped without a word."""
    from toolenv.integrations.verl.envs import resolve_tool

    ref = f"{__name__}:CALCULATOR"
    assert resolve_tool(ref) is CALCULATOR
    with pytest.raises(ValueError, match=r"tool instance: it takes no arguments \(got timeout\)"):
        resolve_tool(ref, timeout=3)


async def test_an_invalid_task_is_reported_by_execute_not_run_on_an_empty_task():
    """verl's tool_agent drops what `create` returns (`instance_id, _ = await tool.create(...)`):
    a row whose task did not validate ran the tool on an empty Task without a word."""
    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool

    adapter = ToolEnvBaseTool(tool=Stats())
    iid, created = await adapter.create(create_kwargs={"task": '{"id": "t1", "answer": {"not": "a string"}}'})
    assert "Invalid task for tool 'stats'" in (created.text or "")
    resp, reward, metrics = await adapter.execute(iid, {"values": [1, 2]})
    assert "Invalid task for tool 'stats'" in (resp.text or "") and metrics["is_error"] is True and reward == 0.0
    await adapter.release(iid)
    assert not adapter._create_errors and not adapter._contexts


async def test_tool_agent_rows_leave_the_tools_to_the_chat_template(scripted_server, make_loop, tiny_tokenizer):
    """verl's tool_agent renders its tools with the chat template (`tools=`); rows built for it
    (`agent_name="tool_agent"`) held the env's hermes instructions too, so the model saw every
    tool described twice, in two wordings. They now hold only how to answer; the hermes calls
    verl's parser reads still run, and `toolenv_agent` rows (no `tools=`) keep the tool list."""
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool
    from toolenv.integrations.verl.data import abuild_rows
    from toolenv.integrations.verl.demo import DEMO_TASKS

    kwargs = {"tools": [CALC_REF], "tasks": DEMO_TASKS}
    description = Calculator().flat_schema()["function"]["description"]
    row = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs, agent_name="tool_agent"))[0]
    adapter = ToolEnvBaseTool({"tool": CALC_REF})
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
    loop = make_loop(scripted_server([call, "<answer>42</answer>"]), cls=ToolAgentLoop, tools=[adapter])
    out = await loop.run({}, raw_prompt=row["prompt"], extra_info=row["extra_info"], tools_kwargs={})
    prompt = tiny_tokenizer.decode(out.prompt_ids)
    assert prompt.count(description) == 1  # the template's `# Tools` block only
    assert "<answer>...</answer>" in prompt  # how to answer, which the template does not say
    assert "<tool_response>\n42\n</tool_response>" in tiny_tokenizer.decode(out.response_ids)  # the call ran
    await adapter.aclose()

    own = (await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs))[0]  # for ToolEnvAgentLoop: no tools=
    assert own["agent_name"] == "toolenv_agent" and description in own["prompt"][0]["content"]
    forced = await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs, agent_name="my_loop", native_tools=True)
    assert description not in forced[0]["prompt"][0]["content"]
