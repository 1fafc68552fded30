"""Drawing a small code into a photo, deterministically, from a recipe stored in the task.

A VisualSearch task's image is never written to disk: `context["render"]` holds a
`CodeOverlay` recipe (canvas size, code, box, colours) and `task_image` rebuilds the
picture on demand from the bundled photo. Results are cached process-wide (LRU).
The text uses Pillow's built-in default font (Aileron, bundled inside Pillow, at
`FONT_SIZE` px; Pillow's bitmap font when built without FreeType), so the pixels are
the same wherever the same Pillow is installed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from PIL import Image, ImageDraw, ImageFont
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolenv_vision.images import ImageCache, ImageRefError, load_image, resolve_image

__all__ = [
    "PAD",
    "CodeOverlay",
    "code_patch",
    "fit_long_side",
    "patch_size",
    "render_overlay",
    "scaled_photo",
    "task_image",
]

PAD = 3
"""Pixels of background box around the text on each side."""

FONT_SIZE = 12
"""Font size in pixels: capitals are about 9 px tall, 3 px in the 448 px overview of a 1344 px image."""

RENDER_CACHE_SIZE = 64
RENDER_CACHE_BYTES = 512 * 1024 * 1024
"""Scaled photos and rendered task images are each cached up to this many bytes (and 64 entries)."""

Channel = Annotated[int, Field(ge=0, le=255)]
Colour = tuple[Channel, Channel, Channel]


class CodeOverlay(BaseModel):
    """How to turn a photo into a VisualSearch image: scale it, then draw `text` in `box`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    long_side: int = Field(ge=16, le=8192, description="The photo is resized so its longer side has this length.")
    text: str = Field(min_length=1, max_length=32, description="The code drawn into the image.")
    box: tuple[int, int, int, int] = Field(
        description="[x1, y1, x2, y2] of the background box, x2/y2 exclusive; the patch is pasted at (x1, y1)."
    )
    fg: Colour = Field(description="Text colour (RGB).")
    bg: Colour = Field(description="Background box colour (RGB).")

    @model_validator(mode="after")
    def _box_ordered(self) -> CodeOverlay:
        x1, y1, x2, y2 = self.box
        if not (0 <= x1 < x2 and 0 <= y1 < y2):
            raise ValueError(f"box {list(self.box)} must have 0 <= x1 < x2 and 0 <= y1 < y2")
        return self


@functools.cache
def _font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=FONT_SIZE)


def patch_size(text: str) -> tuple[int, int]:
    """Width and height of the background box drawn for `text`."""
    left, top, right, bottom = _font().getbbox(text)
    return int(right - left) + 2 * PAD, int(bottom - top) + 2 * PAD


def code_patch(text: str, fg: tuple[int, int, int], bg: tuple[int, int, int]) -> Image.Image:
    """`text` on its background box, exactly as it is pasted into a task image."""
    w, h = patch_size(text)
    patch = Image.new("RGB", (w, h), bg)
    left, top, _, _ = _font().getbbox(text)
    ImageDraw.Draw(patch).text((PAD - left, PAD - top), text, fill=fg, font=_font())  # all capitals: no descenders
    return patch


def fit_long_side(image: Image.Image, long_side: int) -> Image.Image:
    """`image` resized (aspect kept, Lanczos) so that its longer side is `long_side`."""
    scale = long_side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image if size == image.size else image.resize(size, Image.Resampling.LANCZOS)


_CANVASES = ImageCache(RENDER_CACHE_SIZE, lambda: RENDER_CACHE_BYTES)
_RENDERS = ImageCache(RENDER_CACHE_SIZE, lambda: RENDER_CACHE_BYTES)


def _canvas(path: Path, mtime_ns: int, long_side: int) -> Image.Image:
    return _CANVASES.get((path, mtime_ns, long_side), lambda: fit_long_side(load_image(path), long_side))


def scaled_photo(path: Path, long_side: int) -> Image.Image:
    """The photo at `path` fitted to `long_side` (cached; do not modify)."""
    return _canvas(path, path.stat().st_mtime_ns, long_side)


def render_overlay(path: Path, overlay: CodeOverlay) -> Image.Image:
    """The photo at `path` scaled and with the code drawn (cached; do not modify).

    Raises:
        ImageRefError: the box does not fit in the scaled photo, or the file is not an image.
    """
    # The file's mtime is part of the key so that a replaced photo is rendered afresh.
    mtime_ns = path.stat().st_mtime_ns
    return _RENDERS.get((path, mtime_ns, overlay), lambda: _render(path, mtime_ns, overlay))


def _render(path: Path, mtime_ns: int, overlay: CodeOverlay) -> Image.Image:
    canvas = _canvas(path, mtime_ns, overlay.long_side)
    x1, y1, x2, y2 = overlay.box
    patch = code_patch(overlay.text, overlay.fg, overlay.bg)
    if max(x2, x1 + patch.width) > canvas.width or max(y2, y1 + patch.height) > canvas.height:
        raise ImageRefError(f"overlay box {list(overlay.box)} does not fit the {canvas.width}x{canvas.height} canvas")
    out = canvas.copy()
    out.paste(patch, (x1, y1))
    return out


def task_image(context: Mapping[str, Any], root: str | Path | None = None) -> Image.Image:
    """The image a task shows: `context["image"]` under `root`, with `context["render"]` applied if present.

    This is what the crop tool crops. Do not show it to the model as the prompt image: at full
    size the code is legible without zooming; the first observation carries the downscaled
    overview (`toolenv_vision.overview_image`), which is what `toolenv verl-data` puts in a row's
    `images`. The result is cached and shared: do not modify it.

    Raises:
        ImageRefError: no image, a path that escapes the root, an unreadable file, or a bad recipe.
    """
    if "image" not in context:
        raise ImageRefError("this task has no image (context['image'] is missing)")
    path = resolve_image(context["image"], root)
    recipe = context.get("render")
    if recipe is None:
        return load_image(path)
    try:
        overlay = recipe if isinstance(recipe, CodeOverlay) else CodeOverlay.model_validate(recipe)
    except ValidationError as exc:
        raise ImageRefError(
            f"context['render'] is not a valid recipe: {exc.errors(include_url=False)[0]['msg']}"
        ) from None
    return render_overlay(path, overlay)


def cache_clear() -> None:
    """Drop cached canvases and rendered images."""
    _CANVASES.clear()
    _RENDERS.clear()
