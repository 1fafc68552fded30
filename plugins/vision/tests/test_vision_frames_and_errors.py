"""The crop frame outside the env (verl's tool_agent), crop-of-crop wording, bad-image errors, the oracle's needs."""

from __future__ import annotations

import asyncio
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolResult
from toolenv_vision import CropTool, ImageRefError, box_in, make_visualsearch_env, task_image, visualsearch_oracle


def call(tool: CropTool, task: Task, **arguments: Any) -> ToolResult:
    results, _ = asyncio.run(
        ToolCaller([tool]).invoke([ToolCall(name="crop", arguments=arguments, id="c")], ToolContext(task=task))
    )
    return results[0]


def _padded(box: list[float], pad: int, width: int, height: int) -> list[float]:
    x1, y1, x2, y2 = box
    return [max(x1 - pad, 0), max(y1 - pad, 0), min(x2 + pad, width), min(y2 + pad, height)]


def _covers(outer: list[int], inner: list[int]) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and outer[2] >= inner[2] and outer[3] >= inner[3]


def test_verl_tool_agent_crop_reads_boxes_in_the_overview_the_row_shows() -> None:
    """`toolenv verl-data --agent-name tool_agent` rows show the overview and the question asks for its
    pixels; `ToolEnvBaseTool` with `tool: crop` (CropTool() with defaults) read pixels of the full
    image, so a box the model drew around the code cropped a region a third of the way to the corner."""
    pytest.importorskip("verl", reason="verl is not installed")
    from toolenv.integrations.verl.base_tool import ToolEnvBaseTool
    from toolenv.integrations.verl.data import abuild_rows

    rows = asyncio.run(abuild_rows("toolenv/VisualSearch-v0", limit=3, agent_name="tool_agent"))
    assert len(rows) == 3

    async def crop(tool: Any, task_json: str, bbox: list[float]) -> tuple[Any, dict[str, Any]]:
        iid, _ = await tool.create(create_kwargs={"task": task_json})
        response, _, metrics = await tool.execute(iid, {"bbox": bbox})
        await tool.release(iid)
        return response, metrics

    default = ToolEnvBaseTool({"type": "native", "tool": "crop"})
    explicit = ToolEnvBaseTool(
        {"type": "native", "tool": "crop", "tool_kwargs": {"view_size": 448, "view_multiple": 28}}
    )
    for row in rows:
        task_json = row["extra_info"]["tools_kwargs"]["crop"]["create_kwargs"]["task"]
        task = json.loads(task_json)
        shown = Image.open(io.BytesIO(row["images"][0]["bytes"])).size
        assert f"{shown[0]}x{shown[1]} image you see" in row["prompt"][-1]["content"]
        code = task["context"]["box"]
        seen = box_in(code, task["context"]["size"], "pixels", shown)  # the code, in the pixels the model sees
        bbox = _padded(seen, 8, *shown)
        for tool in (default, explicit):
            response, metrics = asyncio.run(crop(tool, task_json, bbox))
            assert not metrics["is_error"], response.text
            assert f"pixels of the {shown[0]}x{shown[1]} image" in response.text
            (image,) = response.image
            # no more pixels than a square overview: a whole-picture crop must not show the code
            assert image.width * image.height <= max(shown) ** 2
        # the crop the default tool returns holds the code: its box in full-image pixels covers it
        result = call(CropTool(), Task.model_validate_json(task_json), bbox=bbox)
        assert not result.is_error, result.text
        assert _covers(result.metadata["bbox"], code), (result.metadata["bbox"], code)


def test_a_tool_told_to_ignore_the_task_frame_reads_full_image_pixels() -> None:
    """`view_from_task=False`: pixels of the full task image, whatever the task records."""
    (task, *_) = make_visualsearch_env(num_tasks=1).tasks
    code = task.context["box"]
    result = call(CropTool(view_from_task=False), task, bbox=code, units="pixels")
    assert not result.is_error, result.text
    assert result.metadata["bbox"] == code and "view_size" not in result.metadata


def test_a_default_tool_shows_a_whole_picture_crop_no_larger_than_the_overview() -> None:
    """At the tool's own 1024² a crop of the whole picture showed the code legibly: one fixed action,
    no search. In the task's overview frame the default cap is the env's (a square overview, 448²)."""
    (task, *_) = make_visualsearch_env(num_tasks=1).tasks
    vw, vh = task.context["overview"]
    whole = call(CropTool(), task, bbox=[0, 0, 1, 1])
    assert not whole.is_error, whole.text
    (image,) = whole.images
    assert image.width * image.height <= max(vw, vh) ** 2
    given = call(CropTool(max_pixels=1024 * 1024), task, bbox=[0, 0, 1, 1])  # an explicit cap is used as given
    assert given.images[0].width * given.images[0].height > 900 * 900


def test_a_task_overview_that_is_not_a_size_is_an_error() -> None:
    (task, *_) = make_visualsearch_env(num_tasks=1).tasks
    bad = task.model_copy(update={"context": {**task.context, "overview": [448]}})
    result = call(CropTool(), bad, bbox=[10, 10, 50, 50])
    assert result.is_error and "context['overview']" in result.text


@pytest.mark.parametrize("options", [{}, {"view_size": 448, "view_multiple": 28}])
def test_the_description_says_boxes_are_in_the_first_image_never_a_crop(options: dict[str, Any]) -> None:
    """After one crop the model has seen several images; a model refining inside its last crop must be
    told that boxes are always in the first (whole) image's pixels."""
    description = CropTool(**options).description
    assert "never" in description and "first image" in description and "of a crop" in description


def test_crop_of_crop_boxes_are_read_in_the_first_image(tmp_path: Path) -> None:
    """The behaviour the description states: the second box is read in the overview, not the crop."""
    Image.new("RGB", (800, 600), (200, 200, 200)).save(tmp_path / "plain.png")
    task = Task(id="plain", question="q", answer="a", context={"image": "plain.png"})
    env = make_visualsearch_env(tasks=[task], image_root=str(tmp_path))
    env.reset(options={"task": task})
    step = lambda b: env.step(f"<tool_call>{json.dumps({'name': 'crop', 'arguments': {'bbox': b}})}</tool_call>")  # noqa: E731
    step([0, 0, 224, 168])
    (second,) = step([100, 100, 200, 200])[4]["tool_results"]
    assert second.metadata["bbox"] == [178, 178, 358, 358]  # 100..200 of the 448x336 overview, in 800x600 pixels


def _truncated_jpeg(path: Path) -> None:
    """Half of a noisy JPEG: Pillow reads the header, then runs out of data while decoding."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", (256, 256), random.Random(0).randbytes(256 * 256 * 3)).save(buffer, "JPEG")
    data = buffer.getvalue()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("name", "make", "reason"),
    [
        ("truncated.jpg", _truncated_jpeg, "image file is truncated"),
        ("corrupt.jpg", lambda p: p.write_bytes(b"\xff\xd8\xff\xe0garbage" * 10), "Truncated File Read"),
    ],
)
def test_a_bad_image_error_keeps_pillows_reason(tmp_path: Path, name: str, make: Any, reason: str) -> None:
    make(tmp_path / name)
    with pytest.raises(ImageRefError) as info:
        task_image({"image": name}, tmp_path)
    message = str(info.value)
    assert name in message and "not a readable image" in message and reason in message
    assert "\n" not in message and len(message) < 400


def test_a_decompression_bomb_error_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Image.new("L", (120, 120)).save(tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 14400 px > twice that (2000): DecompressionBombError
    with pytest.raises(ImageRefError, match=r"bomb\.png is not a readable image.*exceeds limit of 2000 pixels"):
        task_image({"image": "bomb.png"}, tmp_path)


def test_a_long_pillow_reason_is_clipped_to_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolenv_vision import images

    (tmp_path / "odd.png").write_bytes(b"x")

    def fail(path: str) -> Image.Image:
        raise OSError("first line " + "x" * 500 + "\nsecond line")

    monkeypatch.setattr(images, "_decode", fail)
    with pytest.raises(ImageRefError) as info:
        images.load_image(tmp_path / "odd.png")
    message = str(info.value)
    assert "first line" in message and "second line" not in message and "\n" not in message
    assert len(message) < 300


def test_a_task_without_an_image_says_so_and_names_the_task(tmp_path: Path) -> None:
    Image.new("RGB", (64, 64)).save(tmp_path / "ok.png")
    good = Task(id="good", question="q", answer="a", context={"image": "ok.png"})
    env = make_visualsearch_env(tasks=[good], image_root=str(tmp_path))
    with pytest.raises(ImageRefError) as info:
        env.reset(options={"task": Task(id="noimage", question="q", answer="a", context={})})
    assert "this task has no image" in str(info.value) and "'noimage'" in str(info.value)


def test_an_unreadable_image_at_reset_names_the_task_and_the_reason(tmp_path: Path) -> None:
    _truncated_jpeg(tmp_path / "cut.jpg")
    task = Task(id="cut-1", question="q", answer="a", context={"image": "cut.jpg"})
    env = make_visualsearch_env(tasks=[task], image_root=str(tmp_path))
    with pytest.raises(ImageRefError) as info:
        env.reset(options={"task": task})
    assert "'cut-1'" in str(info.value) and "image file is truncated" in str(info.value)


@pytest.mark.parametrize("missing", ["size", "box"])
def test_the_oracle_says_what_it_needs(missing: str) -> None:
    context: dict[str, Any] = {"image": "astronaut.png", "box": [10, 10, 40, 30], "size": [512, 512]}
    del context[missing]
    task = Task(id="mine", question="q", answer="a", context=context)
    with pytest.raises(ValueError, match=rf"oracle needs context\['{missing}'\].*'mine'"):
        visualsearch_oracle(task, 0, "")
    assert visualsearch_oracle(task, 1, "") == "<answer>a</answer>"  # the answer turn needs neither
