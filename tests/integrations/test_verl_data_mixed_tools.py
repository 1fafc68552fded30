"""Rows of two envs under verl's own `tool_agent`: a call to the other env's tool is an error observation.

verl's dataset joins its files (and parquet one file's rows) by uniting the struct fields of
`extra_info.tools_kwargs`, so a row of env A held `{calculator: {...}, echo: None}`; `tool_agent`
offered every configured tool on every row, and a call to `echo` on an A row failed inside verl,
before any tool ran (`'NoneType' object has no attribute 'get'`). Real parquet files written by
`write_parquet`, read back with verl's `RLHFDataset`, run by verl's `ToolAgentLoop` with
`ToolEnvBaseTool`s, a scripted server and the tiny tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("verl", reason="verl is not installed (pip install 'toolenv[verl]'); CI installs it")
pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop needs cachetools/uvicorn/fastapi")

import toolenv
from toolenv.integrations.verl.data import abuild_rows, write_parquet
from toolenv.integrations.verl.demo import DEMO_TASKS

CALC_REF = "toolenv.integrations.verl.demo:Calculator"
ECHO_TASKS = [{"id": "echo-0", "question": "Say hi.", "answer": "hi"}]


class Echo(toolenv.Tool):
    """Repeat a text back (the second env's only tool)."""

    name = "echo"

    class Args(BaseModel):
        text: str = Field(description="What to repeat.")

    async def run(self, args: Any, ctx: toolenv.ToolContext) -> toolenv.ToolResult:
        return toolenv.ToolResult(text=f"echo: {args.text} (task {ctx.task.id})")


ECHO_REF = f"{__name__}:Echo"


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


async def _files(tmp_path: Path, layout: str) -> list[str]:
    """The two envs' tool_agent rows as verl-data writes them: a file per env, or both in one file."""
    calc = await abuild_rows(
        "toolenv/ToolEnv-v0", env_kwargs={"tools": [CALC_REF], "tasks": DEMO_TASKS}, limit=1, agent_name="tool_agent"
    )
    echo = await abuild_rows(
        "toolenv/ToolEnv-v0", env_kwargs={"tools": [ECHO_REF], "tasks": ECHO_TASKS}, agent_name="tool_agent"
    )
    if layout == "one file":
        return [str(write_parquet(calc + echo, tmp_path / "mixed.parquet"))]
    return [str(write_parquet(calc, tmp_path / "calc.parquet")), str(write_parquet(echo, tmp_path / "echo.parquet"))]


def _dataset(files: list[str], tokenizer: Any) -> Any:
    """verl's RLHFDataset over the files, as its trainer builds it."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create({"max_prompt_length": 4096, "return_raw_chat": True, "filter_overlong_prompts": False})
    return RLHFDataset(data_files=files, tokenizer=tokenizer, config=config)


@pytest.mark.parametrize("layout", ["two files", "one file"])
async def test_a_call_to_another_envs_tool_is_an_error_observation(
    tmp_path, layout, scripted_server, make_loop, tiny_tokenizer
):
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool

    dataset = _dataset(await _files(tmp_path, layout), tiny_tokenizer)
    items = {dataset[i]["extra_info"]["task_id"]: dataset[i] for i in range(len(dataset))}
    calc_row = items["calc-0"]
    assert calc_row["tools_kwargs"]["echo"] is None  # what parquet and verl's dataset make of the other env's tool

    tools = [ToolEnvBaseTool({"tool": CALC_REF}), ToolEnvBaseTool({"tool": ECHO_REF})]
    replies = [_call("echo", '{"text": "hi"}'), _call("calculator", '{"expression": "6 * 7"}'), "<answer>42</answer>"]
    loop = make_loop(scripted_server(replies), cls=ToolAgentLoop, tools=tools)
    out = await loop.run(
        {}, raw_prompt=calc_row["raw_prompt"], extra_info=calc_row["extra_info"], tools_kwargs=calc_row["tools_kwargs"]
    )
    response = tiny_tokenizer.decode(out.response_ids)
    assert "NoneType" not in response
    assert "Unknown function 'echo'. Available tools: ['calculator']" in response  # the row's env's tools
    assert "<tool_response>\n42\n</tool_response>" in response  # the episode went on: its own tool ran
    prompt = tiny_tokenizer.decode(out.prompt_ids)
    assert '"name": "calculator"' in prompt and '"name": "echo"' not in prompt  # offered its own tools only

    echo_row = items["echo-0"]  # the other env's row: its tool runs on its task
    loop = make_loop(
        scripted_server([_call("echo", '{"text": "hi"}'), "<answer>hi</answer>"]), cls=ToolAgentLoop, tools=tools
    )
    out = await loop.run(
        {}, raw_prompt=echo_row["raw_prompt"], extra_info=echo_row["extra_info"], tools_kwargs=echo_row["tools_kwargs"]
    )
    assert "echo: hi (task echo-0)" in tiny_tokenizer.decode(out.response_ids)
    for tool in tools:
        await tool.aclose()


async def test_tool_selection_names_the_envs_tools_only_in_tool_agent_rows():
    """`ToolEnvAgentLoop` rows (and SkyRL's, made from them) carry no `tool_selection`: their loop
    runs the env's own tools, and `native_tools` rows are the ones verl's `tool_agent` reads."""
    kwargs = {"tools": [CALC_REF, ECHO_REF], "tasks": DEMO_TASKS}
    [agent] = await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs, limit=1, agent_name="tool_agent")
    assert agent["extra_info"]["tool_selection"] == ["calculator", "echo"]
    assert set(agent["extra_info"]["tools_kwargs"]) == {"calculator", "echo"}
    [own] = await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs, limit=1)
    assert "tool_selection" not in own["extra_info"] and set(own["extra_info"]["tools_kwargs"]) == {
        "calculator",
        "echo",
    }
    [forced] = await abuild_rows("toolenv/ToolEnv-v0", env_kwargs=kwargs, limit=1, agent_name="x", native_tools=True)
    assert forced["extra_info"]["tool_selection"] == ["calculator", "echo"]
