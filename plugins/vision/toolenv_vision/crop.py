"""The `crop` tool: zoom into a region of the task's image and return it as an image.

Box rules (also in the tool description the model sees):

* `bbox` is `[x1, y1, x2, y2]`, left/top inclusive, right/bottom exclusive (Pillow's crop).
* `units="pixels"`: pixels of the task image; fractions are rounded outwards.
* `units="normalized"`: fractions of width and height in [0, 1].
* `units="auto"` (default): normalised when all four values are ≤ 1, pixels otherwise.
* The box must lie inside the image, with x1 < x2, y1 < y2, each side at least
  `min_size` pixels of the task image, and its long side at most `max_aspect_ratio`
  times its short side (Qwen-VL processors raise on images past 200:1, which would
  stop a whole rollout batch).

The crop is resized, aspect ratio kept, so that its pixel count lies within
[`min_pixels`, `max_pixels`]: a small region is enlarged (the zoom), a huge one shrunk.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WithJsonSchema, model_validator

from toolenv import Task, Tool, ToolContext, ToolImage, ToolResult
from toolenv_vision.images import ImageRefError
from toolenv_vision.render import task_image

__all__ = ["DEFAULT_MAX_PIXELS", "DEFAULT_MIN_PIXELS", "CropArgs", "CropCall", "CropTool", "PixelBox", "zoom_size"]

DEFAULT_MIN_PIXELS = 224 * 224
DEFAULT_MAX_PIXELS = 1024 * 1024
DEFAULT_MIN_SIZE = 8
DEFAULT_MAX_ASPECT_RATIO = 100

Coordinate = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)]


class CropArgs(BaseModel):
    """Arguments of the crop tool."""

    model_config = ConfigDict(extra="forbid")

    bbox: list[Coordinate] = Field(
        min_length=4,
        max_length=4,
        description="Region [x1, y1, x2, y2]: pixels of the image, or fractions in [0, 1] of its width and height.",
    )
    units: Literal["auto", "pixels", "normalized"] = Field(
        default="auto",
        description="How to read bbox; 'auto' means normalized when all four values are <= 1, pixels otherwise.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> CropArgs:
        x1, y1, x2, y2 = self.bbox
        if not (x1 < x2 and y1 < y2):
            raise ValueError(f"bbox {_fmt(self.bbox)} must have x1 < x2 and y1 < y2")
        if self.units == "normalized" and max(self.bbox) > 1:
            raise ValueError(f"normalized bbox {_fmt(self.bbox)} has values above 1")
        return self

    @property
    def normalized(self) -> bool:
        """Whether the bbox is in fractions of the image size (the auto rule applied)."""
        return self.units == "normalized" or (self.units == "auto" and max(self.bbox) <= 1)


_ARG_SCHEMAS = CropArgs.model_json_schema()["properties"]


class CropCall(BaseModel):
    """Arguments of the crop tool."""

    # What the caller validates before `run`: only the argument names, so that `run`, which
    # knows the image, checks the values with `CropArgs` and can say how big the image is.
    # The schema the model sees is `CropArgs`'s.
    model_config = ConfigDict(extra="forbid", title="CropArgs")

    bbox: Annotated[Any, WithJsonSchema(_ARG_SCHEMAS["bbox"])]
    units: Annotated[Any, WithJsonSchema(_ARG_SCHEMAS["units"])] = "auto"


class PixelBox(BaseModel):
    """A crop box in whole pixels, validated against the image.

    Pass `context={"width", "height", "min_size", "max_aspect_ratio"}`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    x1: int
    y1: int
    x2: int
    y2: int

    @model_validator(mode="after")
    def _inside(self, info: ValidationInfo) -> PixelBox:
        ctx = info.context or {}
        width, height, min_size = ctx.get("width"), ctx.get("height"), ctx.get("min_size", 1)
        max_ratio = ctx.get("max_aspect_ratio")
        if width is not None and height is not None and (self.x2 > width or self.y2 > height):
            raise ValueError(f"box {_fmt(self.as_list())} reaches outside the {width}x{height} image")
        if self.x2 - self.x1 < min_size or self.y2 - self.y1 < min_size:
            raise ValueError(
                f"box {_fmt(self.as_list())} is {_num(self.x2 - self.x1)}x{_num(self.y2 - self.y1)} px; each side "
                f"must be at least {min_size} px"
            )
        long, short = max(self.x2 - self.x1, self.y2 - self.y1), min(self.x2 - self.x1, self.y2 - self.y1)
        if max_ratio is not None and long > max_ratio * short:
            raise ValueError(
                f"box {_fmt(self.as_list())} is {_num(self.x2 - self.x1)}x{_num(self.y2 - self.y1)} px, aspect ratio "
                f"{long / short:.3g}:1; it must be at most {_num(max_ratio)}:1"
            )
        return self

    def as_list(self) -> list[int]:
        """`[x1, y1, x2, y2]`."""
        return [self.x1, self.y1, self.x2, self.y2]

    @classmethod
    def from_args(
        cls, args: CropArgs, width: int, height: int, min_size: int, max_aspect_ratio: float | None = None
    ) -> PixelBox:
        """Whole-pixel box of `args` on a `width`×`height` image, rounded outwards.

        Raises:
            ValidationError: the box leaves the image, has a side under `min_size`, or its
                long side is more than `max_aspect_ratio` times its short side.
        """
        sx, sy = (width, height) if args.normalized else (1, 1)
        x1, y1, x2, y2 = args.bbox
        box = {"x1": math.floor(x1 * sx), "y1": math.floor(y1 * sy), "x2": math.ceil(x2 * sx), "y2": math.ceil(y2 * sy)}
        context = {"width": width, "height": height, "min_size": min_size, "max_aspect_ratio": max_aspect_ratio}
        return cls.model_validate(box, context=context)


def zoom_size(width: int, height: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Output size for a `width`×`height` crop: same aspect ratio, pixel count in [min_pixels, max_pixels]."""
    area = width * height
    if min_pixels <= area <= max_pixels:
        return width, height
    scale = math.sqrt((min_pixels if area < min_pixels else max_pixels) / area)
    w, h = max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))
    if w * h > max_pixels:  # rounding up overshot the cap (or the range is narrow): round down instead
        w, h = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    return w, h


def _num(value: float) -> str:
    """A number for a message: whole numbers in full up to 12 digits, else 6 significant digits."""
    if isinstance(value, int) and abs(value) < 10**12:
        return str(value)
    try:
        return f"{float(value):.6g}"
    except OverflowError:  # an int past float range
        return "-huge" if value < 0 else "huge"


def _fmt(values: list[float] | list[int]) -> str:
    return "[" + ", ".join(_num(v) for v in values) + "]"


def _error_text(exc: ValidationError) -> str:
    return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors(include_url=False))


def _argument_errors(exc: ValidationError) -> str:
    """`loc: message` per problem, as the caller writes them, each cut short."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        msg = msg if len(msg) <= 200 else msg[:199] + "…"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


class CropTool(Tool):
    """Zoom in: crop a region of the task's image and return it enlarged.

    bbox is [x1, y1, x2, y2] (right/bottom exclusive) in pixels of the full image, or normalized to [0, 1];
    with units="auto" values all <= 1 are read as normalized. The box must lie inside the image.
    """

    name = "crop"
    Args = CropCall

    def __init__(
        self,
        image_root: str | Path | None = None,
        *,
        min_pixels: int = DEFAULT_MIN_PIXELS,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        min_size: int = DEFAULT_MIN_SIZE,
        max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO,
        **limits: Any,
    ) -> None:
        super().__init__(**limits)
        if not 1 <= min_pixels <= max_pixels:
            raise ValueError(f"need 1 <= min_pixels <= max_pixels, got {min_pixels} and {max_pixels}")
        if min_size < 1:
            raise ValueError(f"min_size must be at least 1, got {min_size}")
        if not max_aspect_ratio >= 1:
            raise ValueError(f"max_aspect_ratio must be at least 1, got {max_aspect_ratio}")
        self.image_root = Path(image_root) if image_root is not None else None
        self.min_pixels, self.max_pixels, self.min_size = min_pixels, max_pixels, min_size
        self.max_aspect_ratio = max_aspect_ratio

    async def run(self, args: CropCall | CropArgs, ctx: ToolContext) -> ToolResult:
        # Decoding, resizing and PNG encoding are CPU work: keep them off the event loop.
        return await asyncio.to_thread(self.crop, args, ctx.task)

    def crop(self, args: CropCall | CropArgs, task: Task) -> ToolResult:
        """The synchronous crop of `task`'s image; errors (with the image's size) come back as error results."""
        try:
            image = task_image(task.context, self.image_root)
        except ImageRefError as exc:
            return ToolResult.error(f"Cannot open the task image: {exc}.")
        size = f"The image is {image.width}x{image.height} px."
        if not isinstance(args, CropArgs):
            try:
                args = CropArgs.model_validate({"bbox": args.bbox, "units": args.units})
            except ValidationError as exc:
                return ToolResult.error(f"Invalid arguments for tool 'crop': {_argument_errors(exc)}. {size}")
        try:
            box = PixelBox.from_args(args, image.width, image.height, self.min_size, self.max_aspect_ratio)
        except ValidationError as exc:
            units = "normalized" if args.normalized else "pixels"
            return ToolResult.error(f"Invalid bbox {_fmt(args.bbox)} ({units}): {_error_text(exc)}. {size}")
        region = image.crop((box.x1, box.y1, box.x2, box.y2))
        zoomed = zoom_size(region.width, region.height, self.min_pixels, self.max_pixels)
        if zoomed != region.size:
            region = region.resize(zoomed, Image.Resampling.LANCZOS)
        zoom = zoomed[0] / (box.x2 - box.x1)
        text = (
            f"Cropped region {box.as_list()} ({box.x2 - box.x1}x{box.y2 - box.y1} px of the "
            f"{image.width}x{image.height} image), shown at {zoomed[0]}x{zoomed[1]}, zoom ×{zoom:.3g}"
        )
        meta = {"bbox": box.as_list(), "size": list(zoomed), "zoom": zoom, "image_size": [image.width, image.height]}
        return ToolResult(text=text, images=[ToolImage.from_pil(region)], metadata=meta)
