"""The crop tool's coordinate conventions: pixels (of the image the model was shown), 0-1000, 0-1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolResult
from toolenv_vision import CropTool, box_in, make_visualsearch_env, task_image, view_dims, visualsearch_oracle
from toolenv_vision.envs import DEFAULT_OVERVIEW_SIZE, overview_image


def call(tool: CropTool, task: Task, **arguments: Any) -> ToolResult:
    results, _ = asyncio.run(
        ToolCaller([tool]).invoke([ToolCall(name="crop", arguments=arguments, id="c")], ToolContext(task=task))
    )
    return results[0]


@pytest.fixture
def wide(tmp_path: Path) -> Task:
    """A 600x400 picture whose every pixel differs, so a crop one pixel off shows."""
    image = Image.new("RGB", (600, 400))
    image.putdata([(x % 256, y % 256, (x * 7 + y * 13) % 256) for y in range(400) for x in range(600)])
    image.save(tmp_path / "wide.png")
    return Task(context={"image": "wide.png"})


@pytest.mark.parametrize(
    ("options", "arguments"),
    [
        ({}, {"bbox": [120, 80, 360, 240]}),
        ({}, {"bbox": [0.2, 0.2, 0.6, 0.6], "units": "normalized"}),
        ({"view_size": 300}, {"bbox": [60, 40, 180, 120]}),  # the model was shown 300x200
        ({"view_size": 300}, {"bbox": [0.2, 0.2, 0.6, 0.6]}),  # auto: fractions
        ({"coordinates": "relative1000"}, {"bbox": [200, 200, 600, 600]}),
        ({"coordinates": "relative1000"}, {"bbox": [200.0, 200.0, 600.0, 600.0]}),
        ({"coordinates": "relative"}, {"bbox": [0.2, 0.2, 0.6, 0.6]}),
    ],
)
def test_equivalent_boxes_in_each_convention_crop_the_same_image(
    wide: Task, tmp_path: Path, options: dict[str, Any], arguments: dict[str, Any]
) -> None:
    expected = call(CropTool(tmp_path), wide, bbox=[120, 80, 360, 240], units="pixels")
    got = call(CropTool(tmp_path, **options), wide, **arguments)
    assert not got.is_error, got.text
    assert got.metadata["bbox"] == [120, 80, 360, 240]
    assert got.images[0].data == expected.images[0].data  # the same PNG bytes: the same pixels


def test_fractions_that_are_not_exact_in_binary_land_on_their_pixel(tmp_path: Path) -> None:
    # 0.29 * 100 is 28.999999999999996: rounded outwards as it stood, the box grew a pixel.
    Image.new("RGB", (100, 100)).save(tmp_path / "sq.png")
    task = Task(context={"image": "sq.png"})
    box = [29, 29, 58, 58]
    cases: list[tuple[dict[str, Any], list[float], dict[str, Any]]] = [
        ({}, [0.29, 0.29, 0.58, 0.58], {"units": "normalized"}),
        ({"coordinates": "relative"}, [0.29, 0.29, 0.58, 0.58], {}),
        ({"coordinates": "relative1000"}, [290, 290, 580, 580], {}),
    ]
    for options, bbox, units in cases:
        r = call(CropTool(tmp_path, **options), task, bbox=bbox, **units)
        assert not r.is_error and r.metadata["bbox"] == box, (options, r.text)


@pytest.mark.parametrize(
    ("options", "arguments", "message", "ending"),
    [
        (
            {"coordinates": "relative1000"},
            {"bbox": [0, 0, 1200, 500]},
            "bbox.2: Input should be less than or equal to 1000",
            "bbox is relative1000: [x1, y1, x2, y2] from 0 to 1000 across the image's width and height.",
        ),
        (
            {"coordinates": "relative1000"},
            {"bbox": [500, 0, 400, 10]},
            "must have x1 < x2 and y1 < y2",
            "from 0 to 1000 across the image's width and height.",
        ),
        (
            {"coordinates": "relative1000"},
            {"bbox": [0, 0, 3, 3]},  # 1.8x1.2 px of the 600x400 image
            "Invalid bbox [0, 0, 3, 3] (relative1000: 0 to 1000 across the width and height): box [0, 0, 2, 2] "
            "is 2x2 px of the 600x400 image; each side must be at least 8 px",
            "bbox is relative1000: [x1, y1, x2, y2] from 0 to 1000 across the image's width and height.",
        ),
        (
            {"coordinates": "relative1000"},
            {"bbox": [0, 0, 1, 1]},  # not read as fractions: 0-1000 has no auto rule
            "each side must be at least 8 px",
            "bbox is relative1000: [x1, y1, x2, y2] from 0 to 1000 across the image's width and height.",
        ),
        (
            {"coordinates": "relative"},
            {"bbox": [0, 0, 1.5, 0.5]},
            "bbox.2: Input should be less than or equal to 1",
            "bbox is relative: [x1, y1, x2, y2] as fractions from 0 to 1 of the image's width and height.",
        ),
        (
            {"coordinates": "relative"},
            {"bbox": [0, 0, float("nan"), 0.5]},
            "bbox.2: Input should be a finite number",
            "bbox is relative: [x1, y1, x2, y2] as fractions from 0 to 1 of the image's width and height.",
        ),
        (
            {"coordinates": "relative"},
            {"bbox": [0, 0, 0.001, 0.5]},
            "box [0, 0, 1, 200] is 1x200 px of the 600x400 image; each side must be at least 8 px",
            "bbox is relative: [x1, y1, x2, y2] as fractions from 0 to 1 of the image's width and height.",
        ),
        (
            {"view_size": 300},
            {"bbox": [0, 0, 301, 100]},
            "Invalid bbox [0, 0, 301, 100] (pixels of the 300x200 image): it reaches outside the 300x200 image",
            "The image is 300x200 px.",
        ),
        (
            {"view_size": 300},
            {"bbox": [0, 0, 2, 100]},  # 4 px of the task image
            "is 4x200 px of the 600x400 image; each side must be at least 8 px",
            "The image is 300x200 px.",
        ),
        (
            {},
            {"bbox": [0, 0, 601, 100]},
            "reaches outside the 600x400 image",
            "The image is 600x400 px.",
        ),
    ],
)
def test_invalid_boxes_name_the_convention(
    wide: Task, tmp_path: Path, options: dict[str, Any], arguments: dict[str, Any], message: str, ending: str
) -> None:
    r = call(CropTool(tmp_path, **options), wide, **arguments)
    assert r.is_error and message in r.text and r.text.endswith(ending), r.text


@pytest.mark.parametrize("coordinates", ["relative1000", "relative"])
def test_relative_conventions_take_no_units(wide: Task, tmp_path: Path, coordinates: str) -> None:
    r = call(CropTool(tmp_path, coordinates=coordinates), wide, bbox=[0, 0, 0.5, 0.5], units="pixels")  # type: ignore[arg-type]
    assert r.is_error and "unknown argument(s) 'units'" in r.text and "Expected arguments: bbox." in r.text


def test_unknown_conventions_and_views_are_refused() -> None:
    with pytest.raises(ValueError, match="coordinates must be one of pixels, relative1000, relative"):
        CropTool(coordinates="absolute")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="view_size"):
        CropTool(view_size=0)
    with pytest.raises(ValueError, match="view_multiple"):
        CropTool(view_multiple=0)
    with pytest.raises(ValueError, match="coordinates must be one of"):
        make_visualsearch_env(num_tasks=1, coordinates="0-1000")


def test_schema_and_description_state_the_convention() -> None:
    def parts(tool: CropTool) -> tuple[str, dict[str, Any]]:
        fn = tool.flat_schema()["function"]
        return fn["description"], fn["parameters"]

    text, params = parts(CropTool(coordinates="relative1000"))
    assert "0-1000 scale" in text and "[0, 0, 1000, 1000] is the whole image" in text
    assert params["properties"]["bbox"]["items"] == {"type": "number", "minimum": 0, "maximum": 1000}
    assert "0 to 1000" in params["properties"]["bbox"]["description"]
    assert list(params["properties"]) == ["bbox"] and params["required"] == ["bbox"]

    text, params = parts(CropTool(coordinates="relative"))
    assert "fractions from 0 to 1" in text and "[0, 0, 1, 1] is the whole image" in text
    assert params["properties"]["bbox"]["items"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert list(params["properties"]) == ["bbox"]

    text, params = parts(CropTool())
    assert "pixels of the full image" in text
    assert params["properties"]["units"]["enum"] == ["auto", "pixels", "normalized"]

    text, _ = parts(CropTool(view_size=448, view_multiple=28))
    assert "pixels of the image as you were shown it" in text and "448 px" in text

    # each tool keeps its own schema: building one does not change another's
    assert "units" in CropTool().schema()["function"]["parameters"]["properties"]


@pytest.mark.parametrize(
    ("coordinates", "phrase"),
    [
        ("pixels", "in pixels of the {w}x{h} image you see"),
        ("relative1000", "on a 0-1000 scale across the image's width and height"),
        ("relative", "as fractions from 0 to 1 of the image's width and height"),
    ],
)
def test_the_env_prompt_tool_and_oracle_agree_on_the_convention(coordinates: str, phrase: str) -> None:
    env = make_visualsearch_env(num_tasks=4, coordinates=coordinates)
    (tool,) = env.tools
    assert isinstance(tool, CropTool) and tool.coordinates == coordinates
    for task in env.tasks:
        obs, info = env.reset(options={"task": task})
        shown = info["messages"][-1].images[0]
        assert task.context["overview"] == [shown.width, shown.height]
        assert phrase.format(w=shown.width, h=shown.height) in task.question and task.question in obs
        assert json.dumps(tool.description) in obs  # the tool list in the prompt says it too
        (result,) = env.step(visualsearch_oracle(task, 0, obs))[4]["tool_results"]
        assert not result.is_error, result.text
        x1, y1, x2, y2 = task.context["box"]
        c1, d1, c2, d2 = result.metadata["bbox"]
        assert c1 <= x1 and d1 <= y1 and c2 >= x2 and d2 >= y2  # the crop holds the code
        assert env.step(visualsearch_oracle(task, 1, ""))[1] == 1.0


def test_pixels_are_those_of_the_overview_the_model_sees() -> None:
    """Qwen2.5-VL answers in pixels of the image it was given: in VisualSearch, the overview. A box the
    model draws around the code in the overview must crop the code (read as pixels of the full image,
    it cropped a region a third of the way towards the top-left corner)."""
    env = make_visualsearch_env(num_tasks=6)
    for task in env.tasks:
        _, info = env.reset(options={"task": task})
        shown = info["messages"][-1].images[0]
        assert f"pixels of the {shown.width}x{shown.height} image you see" in task.question
        (w, h), (x1, y1, x2, y2) = task.context["size"], task.context["box"]
        sx, sy = shown.width / w, shown.height / h
        seen = [int(x1 * sx) - 3, int(y1 * sy) - 3, int(x2 * sx) + 4, int(y2 * sy) + 4]  # a loose box, as drawn
        seen = [max(seen[0], 0), max(seen[1], 0), min(seen[2], shown.width), min(seen[3], shown.height)]
        call = {"name": "crop", "arguments": {"bbox": seen}}
        (result,) = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")[4]["tool_results"]
        assert not result.is_error, result.text
        c1, d1, c2, d2 = result.metadata["bbox"]
        assert c1 <= x1 and d1 <= y1 and c2 >= x2 and d2 >= y2, (task.id, seen, result.metadata["bbox"])
        assert result.metadata["view_size"] == [shown.width, shown.height]
        assert f"pixels of the {shown.width}x{shown.height} image" in result.text


def test_the_overview_is_what_a_qwen25_vl_processor_feeds_the_model() -> None:
    """The processor resizes an image to sides that are multiples of 28 (`smart_resize`); the overview
    is made at that size, so the model's pixels are the overview's, which the question states."""
    qwen = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    # Qwen2.5-VL's own preprocessor settings, given explicitly: another test's processor may have
    # changed the class's defaults (transformers 5.10 writes min_pixels/max_pixels into them).
    processor = qwen.Qwen2VLImageProcessorPil(
        patch_size=14, merge_size=2, size={"shortest_edge": 3136, "longest_edge": 12845056}
    )
    env = make_visualsearch_env(num_tasks=12)
    sizes = set()
    for task in env.tasks:
        _, info = env.reset(options={"task": task})
        shown = info["messages"][-1].images[0].to_pil()
        sizes.add(shown.size)
        (grid,) = processor(images=[shown], return_tensors="np")["image_grid_thw"]
        assert (int(grid[2]) * 14, int(grid[1]) * 14) == shown.size  # (t, h, w) in 14 px patches
    assert any(w != h for w, h in sizes)  # not only square photos were checked


def test_view_dims_and_box_in() -> None:
    assert view_dims(1344, 896, DEFAULT_OVERVIEW_SIZE, 28) == (448, 308)  # 448x299 shown as the processor would
    assert view_dims(1344, 896, DEFAULT_OVERVIEW_SIZE) == (448, 299)
    assert view_dims(300, 200, DEFAULT_OVERVIEW_SIZE) == (300, 200)  # never enlarged
    assert view_dims(300, 200, None, 28) == (308, 196)
    assert view_dims(10, 5, None, 28) == (28, 28)
    assert box_in([120, 80, 360, 240], (600, 400), "relative1000") == [200, 200, 600, 600]
    assert box_in([120, 80, 360, 240], (600, 400), "relative") == [0.2, 0.2, 0.6, 0.6]
    assert box_in([120, 80, 360, 240], (600, 400), "pixels", (300, 200)) == [60, 40, 180, 120]
    assert box_in([121, 81, 359, 239], (600, 400), "pixels", (300, 200)) == [60, 40, 180, 120]  # outwards
    assert box_in([0, 0, 600, 400], (600, 400), "pixels") == [0, 0, 600, 400]


def test_the_overview_image_has_the_size_the_tool_assumes(tmp_path: Path) -> None:
    Image.new("RGB", (1000, 700), (10, 20, 30)).save(tmp_path / "p.png")
    shown = overview_image({"image": "p.png"}, tmp_path, 448, 28)
    assert (shown.width, shown.height) == view_dims(1000, 700, 448, 28) == (448, 308)
    unrounded = overview_image({"image": "p.png"}, tmp_path, 448)
    assert (unrounded.width, unrounded.height) == (448, 314)
    assert task_image({"image": "p.png"}, tmp_path).size == (1000, 700)  # the tool crops the original


def test_pixels_of_a_photo_the_processor_shrank_to_its_max_pixels() -> None:
    """A Qwen2.5-VL processor with `max_pixels` set (verl and DeepEyes configs cap it) shrinks a large
    photo by pixel count, and the model answers in that frame. Rounding sides to 28 alone kept the
    1411x1411 retina at 1400x1400: the model's box around the centre, in the 392x392 image it saw,
    cropped the top-left corner."""
    tool = CropTool(view_multiple=28, view_max_pixels=400 * 400)
    task = Task(context={"image": "retina.jpg"})  # 1411x1411
    r = call(tool, task, bbox=[98, 98, 294, 294])  # the middle half of the 392x392 image the model saw
    assert not r.is_error, r.text
    assert r.metadata["view_size"] == [392, 392] and r.metadata["bbox"] == [352, 352, 1059, 1059]
    assert "pixels of the 392x392 image" in r.text
    assert call(tool, task, bbox=[0, 0, 393, 100]).text.endswith("The image is 392x392 px.")
    # a small photo that the processor enlarges to its min_pixels: 384x303 is seen as 728x588
    small = CropTool(view_multiple=28, view_min_pixels=512 * 28 * 28)
    r = call(small, Task(context={"image": "coins.png"}), bbox=[0, 0, 364, 294])
    assert not r.is_error, r.text
    assert r.metadata["view_size"] == [728, 588] and r.metadata["bbox"] == [0, 0, 192, 152]
    with pytest.raises(ValueError, match="view_min_pixels"):
        CropTool(view_min_pixels=10, view_max_pixels=5)


@pytest.mark.parametrize(
    ("min_pixels", "max_pixels"), [(3136, 12845056), (3136, 400 * 400), (512 * 28 * 28, 1280 * 28 * 28)]
)
def test_view_dims_is_what_a_qwen25_vl_processor_feeds_the_model(min_pixels: int, max_pixels: int) -> None:
    qwen = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    processor = qwen.Qwen2VLImageProcessorPil(
        patch_size=14, merge_size=2, size={"shortest_edge": min_pixels, "longest_edge": max_pixels}
    )
    for size in [(1411, 1411), (1000, 872), (640, 427), (384, 303), (4032, 3024), (200, 3000), (1344, 894)]:
        (grid,) = processor(images=[Image.new("RGB", size)], return_tensors="np")["image_grid_thw"]
        seen = (int(grid[2]) * 14, int(grid[1]) * 14)
        assert view_dims(*size, None, 28, min_pixels, max_pixels) == seen, size


def test_the_overview_matches_a_processor_with_min_pixels() -> None:
    """The Qwen2.5-VL README's processor example sets min_pixels=256*28*28: a 448x308 overview is then
    enlarged to 560x392 before the model sees it, and the model's boxes are in that frame. Given the
    processor's bounds, the env shows the overview at that size, says so and reads pixels there."""
    qwen = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    bounds = {"shortest_edge": 256 * 28 * 28, "longest_edge": 1280 * 28 * 28}
    processor = qwen.Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, size=bounds)
    env = make_visualsearch_env(num_tasks=6, overview_min_pixels=256 * 28 * 28, overview_max_pixels=1280 * 28 * 28)
    for task in env.tasks:
        _, info = env.reset(options={"task": task})
        shown = info["messages"][-1].images[0]
        (grid,) = processor(images=[shown.to_pil()], return_tensors="np")["image_grid_thw"]
        assert (int(grid[2]) * 14, int(grid[1]) * 14) == (shown.width, shown.height)  # passed through as is
        assert shown.width * shown.height >= 256 * 28 * 28 and task.context["overview"] == [shown.width, shown.height]
        assert f"pixels of the {shown.width}x{shown.height} image you see" in task.question
        (w, h), (x1, y1, x2, y2) = task.context["size"], task.context["box"]
        sx, sy = shown.width / w, shown.height / h
        seen = [int(x1 * sx) - 2, int(y1 * sy) - 2, int(x2 * sx) + 3, int(y2 * sy) + 3]  # as the model sees it
        call = {"name": "crop", "arguments": {"bbox": seen}}
        (result,) = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")[4]["tool_results"]
        assert not result.is_error, result.text
        c1, d1, c2, d2 = result.metadata["bbox"]
        assert c1 <= x1 and d1 <= y1 and c2 >= x2 and d2 >= y2, (task.id, seen, result.metadata["bbox"])
        (result,) = env.step(visualsearch_oracle(task, 0, ""))[4]["tool_results"]
        assert not result.is_error, result.text
    (tool,) = env.tools
    assert "as you were shown it" in tool.description and "448 px" not in tool.description  # it is larger


def test_view_dims_matches_the_processor_for_a_side_under_half_a_patch() -> None:
    """`smart_resize` rounds a side under 14 px to 0 and lets `min_pixels` enlarge the image; `view_dims`
    floored that side at 28 px first and kept a 2000x10 strip at 1988x28 where the model saw 812x28."""
    qwen = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    processor = qwen.Qwen2VLImageProcessorPil(
        patch_size=14, merge_size=2, size={"shortest_edge": 3136, "longest_edge": 12845056}
    )
    for size in [(2000, 10), (1000, 13), (200, 5), (100, 12), (13, 13), (1, 1)]:
        (grid,) = processor(images=[Image.new("RGB", size)], return_tensors="np")["image_grid_thw"]
        assert view_dims(*size, None, 28, 3136, 12845056) == (int(grid[2]) * 14, int(grid[1]) * 14), size
    assert view_dims(2000, 10, None, 28) == (1988, 28)  # no min_pixels: still at least one multiple
