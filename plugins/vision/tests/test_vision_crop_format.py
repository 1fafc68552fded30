"""Crop encoding: a JPEG photo gives JPEG crops (every later request resends every image), the rest PNG."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from toolenv import Task, ToolCall, ToolCaller, ToolContext, ToolResult
from toolenv.export import move_tool_images
from toolenv.image_store import ImageStore
from toolenv_vision import CropTool, make_visualsearch_env, task_image
from toolenv_vision.crop import CROP_JPEG_QUALITY
from toolenv_vision.images import DATA_DIR


def call(tool: CropTool, task: Task, **arguments: Any) -> ToolResult:
    results, _ = asyncio.run(
        ToolCaller([tool]).invoke([ToolCall(name="crop", arguments=arguments, id="c")], ToolContext(task=task))
    )
    assert not results[0].is_error, results[0].text
    return results[0]


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """The same noisy 800x600 picture as a JPEG photo and as a lossless PNG."""
    rng = np.random.default_rng(0)
    base = np.asarray(Image.open(DATA_DIR / "astronaut.png").convert("RGB"))
    big = np.asarray(Image.fromarray(base).resize((800, 600), Image.Resampling.BICUBIC)).astype(np.int16)
    noisy = (big + rng.integers(-6, 7, big.shape)).clip(0, 255).astype("uint8")  # sensor noise, as photos have
    Image.fromarray(noisy).save(tmp_path / "photo.jpg", quality=92)
    Image.fromarray(noisy).save(tmp_path / "chart.png")
    return tmp_path


def test_a_jpeg_photo_gives_jpeg_crops_much_smaller_than_png(photos: Path) -> None:
    photo = Task(context={"image": "photo.jpg"})
    auto = call(CropTool(photos), photo, bbox=[100, 100, 500, 400], units="pixels")
    png = call(CropTool(photos, crop_format="png"), photo, bbox=[100, 100, 500, 400], units="pixels")
    (jpeg,) = auto.images
    assert jpeg.mime == "image/jpeg" and jpeg.data[:2] == b"\xff\xd8"
    assert jpeg.to_pil().format == "JPEG" and jpeg.to_pil().size == (jpeg.width, jpeg.height)
    assert png.images[0].mime == "image/png" and png.images[0].data[:4] == b"\x89PNG"
    assert len(jpeg.data) * 4 < len(png.images[0].data)
    # the same picture, within JPEG's loss
    got = np.asarray(jpeg.to_pil().convert("RGB"), dtype=np.int16)
    exact = np.asarray(png.images[0].to_pil().convert("RGB"), dtype=np.int16)
    assert np.abs(got - exact).mean() < 6
    assert auto.metadata == png.metadata


def test_a_png_source_stays_lossless_and_jpeg_can_be_forced(photos: Path) -> None:
    chart = Task(context={"image": "chart.png"})
    auto = call(CropTool(photos), chart, bbox=[0, 0, 400, 300], units="pixels")
    assert auto.images[0].mime == "image/png"
    region = task_image(chart.context, photos).crop((0, 0, 400, 300))
    assert auto.images[0].to_pil().convert("RGB").tobytes() == region.tobytes()  # pixel for pixel
    forced = call(CropTool(photos, crop_format="jpeg"), chart, bbox=[0, 0, 400, 300], units="pixels")
    assert forced.images[0].mime == "image/jpeg" and forced.images[0].data[:2] == b"\xff\xd8"


def test_a_jpeg_crop_is_its_pixels_alone(photos: Path) -> None:
    # As for PNG crops: the same crop has the same bytes (image-store names and caches hash them).
    photo = Task(context={"image": "photo.jpg"})
    r = call(CropTool(photos, min_pixels=64 * 64), photo, bbox=[0, 0, 64, 64], units="pixels")
    region = task_image(photo.context, photos).crop((0, 0, 64, 64))
    buf = io.BytesIO()
    region.save(buf, "JPEG", quality=CROP_JPEG_QUALITY)
    assert r.images[0].data == buf.getvalue()


@pytest.mark.parametrize("name", ["rocket.jpg", "hubble_deep_field.jpg"])
def test_a_bundled_jpeg_photos_crops_are_jpeg_without_a_profile(name: str) -> None:
    # rocket.jpg embeds Adobe RGB: the pixels are converted to sRGB, and the JPEG must not carry
    # a profile (lcms stamps a fresh sRGB one with the time: other bytes in every process).
    photo = Task(context={"image": name})
    r = call(CropTool(min_pixels=64 * 64), photo, bbox=[0, 0, 64, 64], units="pixels")
    shown = r.images[0].to_pil()
    assert r.images[0].mime == "image/jpeg" and "icc_profile" not in shown.info and "exif" not in shown.info
    buf = io.BytesIO()
    task_image(photo.context).crop((0, 0, 64, 64)).save(buf, "JPEG", quality=CROP_JPEG_QUALITY)
    assert r.images[0].data == buf.getvalue()


def test_rendered_visualsearch_crops_stay_png() -> None:
    # The drawn code must stay sharp: "auto" keeps a rendered task image's crops lossless.
    env = make_visualsearch_env(num_tasks=40)
    jpeg_tasks = [t for t in env.tasks if t.context["image"].endswith(".jpg")]
    assert jpeg_tasks, "no task on a bundled JPEG photo among the first 40"
    env.reset(options={"task": jpeg_tasks[0]})
    _, _, _, _, info = env.step('<tool_call>{"name": "crop", "arguments": {"bbox": [0, 0, 200, 200]}}</tool_call>')
    assert info["tool_results"][0].images[0].mime == "image/png"


def test_the_env_passes_crop_format_and_agents_send_the_right_mime_type(photos: Path, tmp_path: Path) -> None:
    tasks = [{"id": "p", "question": "q", "answer": "a", "context": {"image": "photo.jpg"}}]
    for fmt, mime, ext in [("auto", "image/jpeg", ".jpg"), ("png", "image/png", ".png")]:
        env = make_visualsearch_env(tasks=tasks, image_root=photos, crop_format=fmt)
        env.reset(options={"task_index": 0})
        call_text = '<tool_call>{"name": "crop", "arguments": {"bbox": [10, 10, 200, 150]}}</tool_call>'
        _, _, _, _, info = env.step(call_text)
        (image,) = info["tool_results"][0].images
        assert image.mime == mime
        # what the openai agent sends (tool images moved into a user message, as data URLs)
        sent = [m.to_openai() for m in move_tool_images(info["messages"])]
        parts = [p for m in sent if isinstance(m["content"], list) for p in m["content"]]
        urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        assert urls and all(u.startswith(f"data:{mime};base64,") for u in urls)
        # and the file an export writes has the matching extension
        assert ImageStore(tmp_path / f"store-{fmt}").put(image.data, image.mime).endswith(ext)


def test_an_unknown_crop_format_is_refused() -> None:
    with pytest.raises(ValueError, match="crop_format must be one of auto, png, jpeg, got 'webp'"):
        CropTool(crop_format="webp")  # type: ignore[arg-type]
