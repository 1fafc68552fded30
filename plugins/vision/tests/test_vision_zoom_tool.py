"""DeepEyes' `image_zoom_in_tool(bbox_2d, label)`: the crop tool under the names a DeepEyes checkpoint calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolResult, get_parser
from toolenv.registry import load_tool
from toolenv_vision import CropTool, ImageZoomInTool, make_visualsearch_env


def invoke(tool: CropTool, task: Task, arguments: dict[str, Any]) -> ToolResult:
    call = ToolCall(name=tool.name, arguments=arguments, id="c")
    results, _ = asyncio.run(ToolCaller([tool]).invoke([call], ToolContext(task=task)))
    return results[0]


@pytest.fixture
def wide(tmp_path: Path) -> Task:
    image = Image.new("RGB", (600, 400), (250, 250, 250))
    image.paste((200, 0, 0), (120, 80, 360, 240))
    image.save(tmp_path / "wide.png")
    return Task(context={"image": "wide.png"})


# DeepEyes' own tool call (its system prompt's example), as a Qwen2.5-VL checkpoint trained on it writes it.
DEEPEYES_CALL = (
    '<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [120, 80, 360, 240], '
    '"label": "the red box"}}\n</tool_call>'
)


def test_a_deepeyes_call_crops_what_crop_crops(wide: Task, tmp_path: Path) -> None:
    (parsed,) = get_parser("hermes").parse(DEEPEYES_CALL).tool_calls
    zoom = ImageZoomInTool(tmp_path)
    assert parsed.name == zoom.name == "image_zoom_in_tool"
    got = invoke(zoom, wide, parsed.arguments)
    expected = invoke(CropTool(tmp_path), wide, {"bbox": [120, 80, 360, 240], "units": "pixels"})
    assert not got.is_error, got.text
    assert got.images[0].data == expected.images[0].data
    assert got.metadata == {**expected.metadata, "label": "the red box"}
    unlabelled = invoke(zoom, wide, {"bbox_2d": [120, 80, 360, 240]})  # label is optional
    assert not unlabelled.is_error and "label" not in unlabelled.metadata


@pytest.mark.parametrize(
    ("options", "bbox_2d"),
    [
        ({"coordinates": "relative1000"}, [200, 200, 600, 600]),
        ({"coordinates": "relative"}, [0.2, 0.2, 0.6, 0.6]),
        ({"view_size": 300}, [60, 40, 180, 120]),  # the model was shown 300x200
    ],
)
def test_bbox_2d_follows_the_tool_convention(
    wide: Task, tmp_path: Path, options: dict[str, Any], bbox_2d: list[float]
) -> None:
    got = invoke(ImageZoomInTool(tmp_path, **options), wide, {"bbox_2d": bbox_2d})
    assert not got.is_error, got.text
    assert got.metadata["bbox"] == [120, 80, 360, 240]


def test_the_schema_the_model_sees_names_bbox_2d_and_label() -> None:
    fn = ImageZoomInTool().schema()["function"]
    assert fn["name"] == "image_zoom_in_tool"
    params = fn["parameters"]
    assert set(params["properties"]) == {"bbox_2d", "label"} and params["required"] == ["bbox_2d"]
    box = params["properties"]["bbox_2d"]
    assert box["type"] == "array" and box["minItems"] == box["maxItems"] == 4
    assert box["items"] == {"minimum": 0, "type": "number"}
    assert params["properties"]["label"]["type"] == "string"
    assert "bbox_2d" in fn["description"] and "first shown" in fn["description"]
    rel = ImageZoomInTool(coordinates="relative1000").schema()["function"]
    assert rel["parameters"]["properties"]["bbox_2d"]["items"]["maximum"] == 1000
    assert (
        "0 to 1000" in rel["description"] and "0 to 1000" in rel["parameters"]["properties"]["bbox_2d"]["description"]
    )
    assert "units" not in json.dumps(params)  # a DeepEyes box is pixels, never re-read as fractions
    assert CropTool().schema()["function"]["name"] == "crop"  # the crop tool is as it was


def test_verl_takes_the_schema() -> None:
    pytest.importorskip("verl", reason="verl is not installed")
    from toolenv.integrations.verl.base_tool import verl_tool_schema

    schema = verl_tool_schema(ImageZoomInTool())
    assert schema.function.name == "image_zoom_in_tool"
    assert schema.function.parameters.required == ["bbox_2d"]


def test_errors_name_bbox_2d_and_the_tool(wide: Task, tmp_path: Path) -> None:
    zoom = ImageZoomInTool(tmp_path)
    r = invoke(zoom, wide, {"bbox_2d": [-1, 0, 10, 10]})
    assert r.is_error and r.text.startswith("Invalid arguments for tool 'image_zoom_in_tool': bbox_2d.0:"), r.text
    assert "The image is 600x400 px." in r.text
    r = invoke(zoom, wide, {"bbox_2d": [50, 50, 10, 10]})
    assert r.is_error and "bbox_2d [50, 50, 10, 10] must have x1 < x2 and y1 < y2" in r.text, r.text
    r = invoke(zoom, wide, {"bbox_2d": [0, 0, 700, 100]})
    assert r.is_error and "reaches outside the 600x400 image" in r.text, r.text
    r = invoke(zoom, wide, {"bbox_2d": [0, 0, 1, 1]})  # pixels, not the whole image as fractions
    assert r.is_error and "Invalid bbox_2d [0, 0, 1, 1]" in r.text and "at least" in r.text, r.text
    r = invoke(zoom, wide, {"bbox_2d": [0, 0, 100, 100], "label": 3})
    assert r.is_error and "label: Input should be a valid string" in r.text, r.text
    r = invoke(zoom, wide, {"bbox": [0, 0, 100, 100]})  # crop's name: refused, and the right one named
    assert r.is_error and "bbox_2d" in r.text, r.text
    r = invoke(ImageZoomInTool(tmp_path, coordinates="relative1000"), wide, {"bbox_2d": [0, 0, 1001, 10]})
    assert r.is_error and "bbox_2d is relative1000" in r.text, r.text


def test_it_is_a_tool_plugin_and_drives_visualsearch() -> None:
    tool = load_tool("image_zoom_in_tool", coordinates="relative1000")
    assert isinstance(tool, ImageZoomInTool) and tool.coordinates == "relative1000"
    env = make_visualsearch_env(num_tasks=1, tools=[ImageZoomInTool()])
    env.reset(options={"task_index": 0})
    task = env.tasks[0]
    x1, y1, x2, y2 = task.context["box"]
    vw, vh = task.context["overview"]
    w, h = task.context["size"]
    box = [x1 * vw // w - 2, y1 * vh // h - 2, -(-x2 * vw // w) + 2, -(-y2 * vh // h) + 2]
    action = f'<tool_call>{{"name": "image_zoom_in_tool", "arguments": {{"bbox_2d": {box}}}}}</tool_call>'
    _, _, _, _, info = env.step(action)
    (result,) = info["tool_results"]
    assert not result.is_error, result.text
    c1, d1, c2, d2 = result.metadata["bbox"]
    assert c1 <= x1 and d1 <= y1 and c2 >= x2 and d2 >= y2  # read in the overview's pixels, as crop
