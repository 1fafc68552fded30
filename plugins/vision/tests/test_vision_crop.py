"""The crop tool on real images: boxes, units, resizing, path safety, bad input."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from PIL import Image

from toolenv import Task, ToolCall, ToolCaller, ToolContext
from toolenv_vision import CropTool, ImageRefError, resolve_image, zoom_size
from toolenv_vision.images import DATA_DIR


def call(tool: CropTool, task: Task, **arguments: object) -> object:
    caller = ToolCaller([tool])
    results, _ = asyncio.run(
        caller.invoke([ToolCall(name="crop", arguments=arguments, id="c")], ToolContext(task=task))
    )
    return results[0]


PHOTO = Task(id="p", context={"image": "astronaut.png"})  # 512x512


def test_pixel_crop_is_enlarged_to_min_pixels() -> None:
    tool = CropTool(min_pixels=200 * 200, max_pixels=400 * 400)
    r = call(tool, PHOTO, bbox=[100, 100, 150, 150])
    assert not r.is_error, r.text
    (img,) = r.images
    assert (img.width, img.height) == (200, 200)
    assert r.metadata["bbox"] == [100, 100, 150, 150] and r.metadata["zoom"] == 4.0
    assert "zoom ×4" in r.text and img.data_url().startswith("data:image/png;base64,")
    # the returned pixels really are the enlarged region
    expected = Image.open(DATA_DIR / "astronaut.png").convert("RGB").crop((100, 100, 150, 150)).resize((200, 200))
    got = img.to_pil().convert("RGB")
    diff = sum(abs(a - b) for a, b in zip(got.tobytes(), expected.tobytes()))
    assert diff / (200 * 200 * 3) < 8  # same picture up to resampling differences


def test_normalized_and_auto_units_agree_with_pixels() -> None:
    tool = CropTool()
    a = call(tool, PHOTO, bbox=[0.25, 0.25, 0.5, 0.5])
    b = call(tool, PHOTO, bbox=[0.25, 0.25, 0.5, 0.5], units="normalized")
    c = call(tool, PHOTO, bbox=[128, 128, 256, 256], units="pixels")
    assert a.metadata["bbox"] == b.metadata["bbox"] == c.metadata["bbox"] == [128, 128, 256, 256]
    assert a.images[0].data == c.images[0].data


def test_large_crop_is_shrunk_to_max_pixels() -> None:
    r = call(CropTool(min_pixels=16, max_pixels=100 * 100), PHOTO, bbox=[0, 0, 512, 256])
    w, h = r.metadata["size"]
    assert w * h <= 100 * 100 and abs(w / h - 2.0) < 0.05


@pytest.mark.parametrize("w,h", [(10, 10), (3000, 20), (1, 1), (512, 512), (7, 1300)])
def test_zoom_size_keeps_aspect_and_bounds(w: int, h: int) -> None:
    lo, hi = 224 * 224, 1024 * 1024
    ow, oh = zoom_size(w, h, lo, hi)
    assert ow * oh <= hi
    assert math.isclose(ow / oh, w / h, rel_tol=0.25) or min(ow, oh) == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"bbox": [0, 0, 600, 100]}, "reaches outside the 512x512 image"),
        ({"bbox": [100, 100, 50, 150]}, "x1 < x2"),
        ({"bbox": [10, 10, 12, 12]}, "at least 8 px"),
        ({"bbox": [0, 0, 1.5, 0.5], "units": "normalized"}, "values above 1"),
        ({"bbox": [0, 0, 10]}, "at least 4 items"),
        ({"bbox": ["a", 0, 10, 10]}, "valid number"),
        ({"bbox": [float("nan"), 0, 10, 10]}, "finite number"),
        ({"bbox": [-5, 0, 10, 10]}, "greater than or equal to 0"),
        ({"bbox": [0, 0, 1e300, 1e300]}, "outside"),
        ({"bbox": [0, 0, 10, 10], "zoom": 3}, "unknown argument"),
    ],
)
def test_bad_boxes_are_error_observations(arguments: dict[str, object], message: str) -> None:
    r = call(CropTool(), PHOTO, **arguments)
    assert r.is_error and message in r.text, r.text


@pytest.mark.parametrize("ref", ["../pyproject.toml", "/etc/passwd", "..\\x.png", "", "nope.png", 3, "a\x00b"])
def test_image_paths_never_escape_the_root(ref: object) -> None:
    with pytest.raises(ImageRefError):
        resolve_image(ref)
    r = call(CropTool(), Task(context={"image": ref}), bbox=[0, 0, 10, 10])
    assert r.is_error and "Cannot open the task image" in r.text


def test_symlink_out_of_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "secret.png"
    Image.new("RGB", (20, 20)).save(outside)
    (root / "link.png").symlink_to(outside)
    Image.new("RGB", (20, 20), (255, 0, 0)).save(root / "ok.png")
    with pytest.raises(ImageRefError, match="outside the image root"):
        resolve_image("link.png", root)
    r = call(CropTool(root), Task(context={"image": "ok.png"}), bbox=[0, 0, 10, 10])
    assert not r.is_error and r.images[0].to_pil().convert("RGB").getpixel((0, 0)) == (255, 0, 0)


def test_a_non_image_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "fake.png").write_text("not an image")
    r = call(CropTool(tmp_path), Task(context={"image": "fake.png"}), bbox=[0, 0, 10, 10])
    assert r.is_error and "not a readable image" in r.text


def test_schema_is_flat_and_complete() -> None:
    flat = CropTool().flat_schema()["function"]["parameters"]
    assert flat["properties"]["bbox"]["items"]["type"] == "number"
    assert flat["properties"]["units"]["enum"] == ["auto", "pixels", "normalized"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"bbox": [-5, 0, 100, 100]}, "bbox.0: Input should be greater than or equal to 0"),
        ({"bbox": [100, 100, 50, 200]}, "bbox [100, 100, 50, 200] must have x1 < x2 and y1 < y2"),
        ({"bbox": [0, 0, 1.5, 0.5], "units": "normalized"}, "normalized bbox [0, 0, 1.5, 0.5] has values above 1"),
        ({"bbox": [0, 0, 10]}, "at least 4 items"),
        ({"bbox": ["a", 0, 10, 10]}, "valid number"),
        ({"bbox": [float("inf"), 0, 10, 10]}, "finite number"),
        ({"bbox": "0 0 10 10"}, "valid list"),
        ({"bbox": [0, 0, 10, 10], "units": "cm"}, "units: Input should be"),
    ],
)
def test_argument_errors_say_how_big_the_image_is(arguments: dict[str, object], message: str) -> None:
    r = call(CropTool(), PHOTO, **arguments)
    assert r.is_error and message in r.text and r.text.endswith("The image is 512x512 px."), r.text


@pytest.mark.parametrize("value", [1e308, 1e30, 10**40])
def test_huge_coordinates_are_clipped_in_the_message(value: float) -> None:
    r = call(CropTool(), PHOTO, bbox=[0, 0, value, value])
    assert r.is_error and "The image is 512x512 px" in r.text, r.text
    assert len(r.text) < 250 and not any(len(w) > 20 for w in r.text.split()), r.text


def test_the_model_sees_the_strict_argument_schema() -> None:
    # The caller only checks argument names; the values are checked in run (which knows the image),
    # but the schema a model is shown still says what a valid box is.
    from toolenv_vision import CropArgs, CropCall

    assert CropCall.model_json_schema() == CropArgs.model_json_schema()
    params = CropTool().schema()["function"]["parameters"]
    assert params["properties"]["bbox"]["items"] == {"minimum": 0, "type": "number"}
    assert params["properties"]["bbox"]["minItems"] == params["properties"]["bbox"]["maxItems"] == 4
    assert params["required"] == ["bbox"]


@pytest.mark.parametrize(
    ("options", "bbox"),
    [
        ({}, [0, 0, 512, 8]),  # 64:1 at the default min_pixels: shown 1792x28 before
        ({"max_aspect_ratio": 200}, [0, 0, 8, 512]),
        ({"min_size": 1, "min_pixels": 1}, [5, 5, 6, 6]),  # a 1x1 crop, shown 1x1 before
        ({"min_pixels": 16 * 16, "max_pixels": 64 * 64}, [0, 0, 400, 40]),  # shrunk to 202x20 before
    ],
)
def test_every_side_of_a_crop_is_at_least_32_px(options: dict[str, int], bbox: list[int]) -> None:
    """Qwen-VL processors cut images into 28 px (Qwen2.5-VL) or 32 px (Qwen3-VL) squares, and many
    raise on a side under that (transformers up to 4.50, its Qwen3-VL video processor, GLM-4V,
    mistral.rs, Ollama), stopping the rollout batch: a thin or tiny crop is shown larger."""
    r = call(CropTool(**options), PHOTO, bbox=bbox)
    assert not r.is_error, r.text
    (img,) = r.images
    assert min(img.width, img.height) >= 32 and [img.width, img.height] == r.metadata["size"]
    w, h = bbox[2] - bbox[0], bbox[3] - bbox[1]
    assert math.isclose(img.width / img.height, w / h, rel_tol=0.05)  # aspect kept
    assert img.to_pil().size == (img.width, img.height)


def test_zoom_size_min_side() -> None:
    assert zoom_size(1, 1, 1, 100, min_side=32) == (32, 32)
    assert zoom_size(1000, 10, 224 * 224, 1024 * 1024, min_side=32) == (3200, 32)
    assert zoom_size(1000, 10, 224 * 224, 1024 * 1024) == (2240, 23)  # no floor unless asked


@pytest.mark.parametrize(("size", "bbox"), [((5, 5), [0, 0, 5, 5]), ((6, 40), [0, 10, 6, 30]), ((3, 2), [0, 0, 1, 1])])
def test_an_image_smaller_than_min_size_can_still_be_cropped(
    tmp_path: Path, size: tuple[int, int], bbox: list[float]
) -> None:
    # Each side of a box had to cover `min_size` (8) pixels, which an icon or a thumbnail does
    # not have: every crop, even of the whole image, was refused with a rule it could not meet.
    Image.new("RGB", size, "blue").save(tmp_path / "tiny.png")
    r = call(CropTool(tmp_path), Task(id="t", context={"image": "tiny.png"}), bbox=bbox)
    assert not r.is_error, r.text
    (img,) = r.images
    assert min(img.width, img.height) >= 32
    still = call(CropTool(tmp_path), Task(id="t", context={"image": "tiny.png"}), bbox=[0, 0, 1, 2], units="pixels")
    assert still.is_error and "at least" in still.text  # a sliver of it is still too small
