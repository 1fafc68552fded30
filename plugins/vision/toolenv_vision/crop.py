"""The `crop` tool: zoom into a region of the task's image and return it as an image.

Coordinate conventions (`CropTool(coordinates=...)`; the tool description and schema tell
the model which one):

* `"pixels"` (default): pixels of the image the model was shown first (the whole picture,
  never one of the crops it was shown since). By default that is the size the task records in
  `context["overview"]` (`[width, height]`, as VisualSearch tasks do), else the task image
  itself, so a tool built with its defaults (verl's `ToolEnvBaseTool` with `tool: crop`) reads
  boxes where the env's does; with `view_size` (and `view_multiple`, `view_min_pixels`, `view_max_pixels`) it
  is the task image shrunk so its longer side is at most `view_size`, each side rounded to a
  multiple of `view_multiple`, and its pixel count brought within the two bounds, as an env that
  shows a downscaled overview (VisualSearch-v0) and Qwen2.5-VL's processor (`smart_resize`:
  multiples of 28, its `min_pixels` and `max_pixels`) present it. Qwen2.5-VL grounds in absolute
  pixels of the image it was given.
  The `units` argument may switch a call to fractions in [0, 1] (`"normalized"`); with `"auto"`
  (default) a box whose four values are all <= 1 is read as fractions.
* `"relative1000"`: integers or floats from 0 to 1000 across the width and height (Qwen3-VL).
* `"relative"`: fractions from 0 to 1 across the width and height.

Box rules (also in the tool description the model sees):

* `bbox` is `[x1, y1, x2, y2]`, left/top inclusive, right/bottom exclusive (Pillow's crop);
  mapped to pixels of the task image, fractions are rounded outwards.
* The box must lie inside the image, with x1 < x2, y1 < y2, each side at least
  `min_size` pixels of the task image (its shorter side, if the image is smaller), and
  its long side at most `max_aspect_ratio` times its short side (Qwen-VL processors
  raise on images past 200:1, which would stop a whole rollout batch).

The crop is resized, aspect ratio kept, so that its pixel count lies within
[`min_pixels`, `max_pixels`]: a small region is enlarged (the zoom), a huge one shrunk; and
each side is at least `min_shown_side` (32) pixels, even past `max_pixels`: Qwen-VL processors
cut images into 28 px (Qwen2.5-VL) or 32 px (Qwen3-VL) squares and many raise on a shorter side.

Crops are encoded as `crop_format` says: with `"auto"` (default) a JPEG photo gives JPEG crops
(quality `CROP_JPEG_QUALITY`, about 8x smaller than PNG, and every later request of an episode
resends every image) and anything else (PNG charts and screenshots, VisualSearch's rendered
images, whose drawn code must stay sharp) lossless PNG.

`ImageZoomInTool` is the same tool under DeepEyes' (and verl's example's) name and arguments:
`image_zoom_in_tool` with `bbox_2d` and an optional `label`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WithJsonSchema, model_validator

from toolenv import Task, Tool, ToolContext, ToolImage, ToolResult
from toolenv_vision.images import ImageRefError, resolve_image, source_format
from toolenv_vision.render import task_image

__all__ = [
    "COORDINATES",
    "CROP_FORMATS",
    "CROP_JPEG_QUALITY",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MIN_PIXELS",
    "DEFAULT_MIN_SHOWN_SIDE",
    "TASK_VIEW_KEY",
    "Coordinates",
    "CropArgs",
    "CropCall",
    "CropFormat",
    "CropTool",
    "ImageZoomInTool",
    "PixelBox",
    "Relative1000Args",
    "RelativeArgs",
    "box_in",
    "view_dims",
    "zoom_size",
]

DEFAULT_MIN_PIXELS = 224 * 224
DEFAULT_MAX_PIXELS = 1024 * 1024
DEFAULT_MIN_SIZE = 8
DEFAULT_MAX_ASPECT_RATIO = 100
DEFAULT_MIN_SHOWN_SIDE = 32
"""Each side of a returned crop is at least this long: Qwen2.5-VL's processor works in 28 px
squares and Qwen3-VL's in 32 px ones, and many of them (transformers up to 4.50, its Qwen3-VL
video processor, GLM-4V, mistral.rs, Ollama) raise on an image with a shorter side."""
TASK_VIEW_KEY = "overview"
"""`context["overview"]`: `[width, height]` of the image the task showed the model (VisualSearch's
downscaled overview); a tool built without a `view_*` argument reads pixel boxes there."""

Coordinates = Literal["pixels", "relative1000", "relative"]
"""How a crop box is read: pixels of the image the model was shown, 0-1000 across its width and
height (Qwen3-VL), or fractions 0-1."""
COORDINATES: tuple[str, ...] = get_args(Coordinates)

CropFormat = Literal["auto", "png", "jpeg"]
"""How a crop is encoded: `"auto"` keeps the kind of the task's image file (JPEG photos give JPEG
crops; everything else, and rendered task images, PNG), or always PNG, or always JPEG."""
CROP_FORMATS: tuple[str, ...] = get_args(CropFormat)
CROP_JPEG_QUALITY = 90
"""JPEG quality of a crop: a 12 MP photo's crop shown at 517x387 is 38 KB, against 310 KB as PNG."""
_JPEG_SOURCES = frozenset({"JPEG", "MPO"})  # MPO: a camera's multi-picture JPEG

Coordinate = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)]
_SNAP = 1e-6
"""A mapped coordinate this close to a whole pixel is that pixel: 0.29 * 100 is 28.999999999999996,
which rounded outwards would grow the box by a pixel."""


class _Ordered(BaseModel):
    """`bbox` has x1 < x2 and y1 < y2."""

    model_config = ConfigDict(extra="forbid")

    bbox: list[Coordinate]

    @model_validator(mode="after")
    def _ordered(self) -> _Ordered:
        x1, y1, x2, y2 = self.bbox
        if not (x1 < x2 and y1 < y2):
            raise ValueError(f"bbox {_fmt(self.bbox)} must have x1 < x2 and y1 < y2")
        return self


class CropArgs(_Ordered):
    """Arguments of the crop tool."""

    # With coordinates="pixels" (the default).

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
    def _in_range(self) -> CropArgs:
        if self.units == "normalized" and max(self.bbox) > 1:
            raise ValueError(f"normalized bbox {_fmt(self.bbox)} has values above 1")
        return self

    @property
    def normalized(self) -> bool:
        """Whether the bbox is in fractions of the image size (the auto rule applied)."""
        return self.units == "normalized" or (self.units == "auto" and max(self.bbox) <= 1)


class Relative1000Args(_Ordered):
    """Arguments of the crop tool."""

    # With coordinates="relative1000", Qwen3-VL's grounding scale.

    bbox: list[Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1000)]] = Field(
        min_length=4,
        max_length=4,
        description="Region [x1, y1, x2, y2] from 0 to 1000 across the image's width and height "
        "(x rightwards, y downwards): [0, 0, 1000, 1000] is the whole image.",
    )


class RelativeArgs(_Ordered):
    """Arguments of the crop tool."""

    # With coordinates="relative".

    bbox: list[Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1)]] = Field(
        min_length=4,
        max_length=4,
        description="Region [x1, y1, x2, y2] as fractions from 0 to 1 of the image's width and height "
        "(x rightwards, y downwards): [0, 0, 1, 1] is the whole image.",
    )


_ARG_SCHEMAS = CropArgs.model_json_schema()["properties"]


class CropCall(BaseModel):
    """Arguments of the crop tool."""

    # What the caller validates before `run`: only the argument names, so that `run`, which
    # knows the image, checks the values with `CropArgs` and can say how big the image is.
    # The schema the model sees is `CropArgs`'s.
    model_config = ConfigDict(extra="forbid", title="CropArgs")

    bbox: Annotated[Any, WithJsonSchema(_ARG_SCHEMAS["bbox"])]
    units: Annotated[Any, WithJsonSchema(_ARG_SCHEMAS["units"])] = "auto"


class _Relative1000Call(BaseModel):
    """Arguments of the crop tool."""

    # Names only, as `CropCall`; `Relative1000Args` checks the values in `run`.

    model_config = ConfigDict(extra="forbid", title="Relative1000Args")

    bbox: Annotated[Any, WithJsonSchema(Relative1000Args.model_json_schema()["properties"]["bbox"])]


class _RelativeCall(BaseModel):
    """Arguments of the crop tool."""

    # Names only, as `CropCall`; `RelativeArgs` checks the values in `run`.

    model_config = ConfigDict(extra="forbid", title="RelativeArgs")

    bbox: Annotated[Any, WithJsonSchema(RelativeArgs.model_json_schema()["properties"]["bbox"])]


_MODELS: dict[str, tuple[type[_Ordered], type[BaseModel]]] = {
    "pixels": (CropArgs, CropCall),
    "relative1000": (Relative1000Args, _Relative1000Call),
    "relative": (RelativeArgs, _RelativeCall),
}


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
        of = f" of the {width}x{height} image" if width is not None and height is not None else ""
        if width is not None and height is not None and (self.x2 > width or self.y2 > height):
            raise ValueError(f"box {_fmt(self.as_list())} reaches outside the {width}x{height} image")
        w, h = self.x2 - self.x1, self.y2 - self.y1
        if w < min_size or h < min_size:
            raise ValueError(
                f"box {_fmt(self.as_list())} is {_num(w)}x{_num(h)} px{of}; each side must be at least {min_size} px"
            )
        long, short = max(w, h), min(w, h)
        if max_ratio is not None and long > max_ratio * short:
            raise ValueError(
                f"box {_fmt(self.as_list())} is {_num(w)}x{_num(h)} px{of}, aspect ratio "
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
        return cls.scaled(args.bbox, sx, sy, width, height, min_size, max_aspect_ratio)

    @classmethod
    def scaled(
        cls,
        bbox: list[float],
        sx: float,
        sy: float,
        width: int,
        height: int,
        min_size: int,
        max_aspect_ratio: float | None = None,
    ) -> PixelBox:
        """Whole-pixel box of `bbox` times (`sx`, `sy`) on a `width`×`height` image, rounded outwards.

        Raises:
            ValidationError: as `from_args`.
        """
        x1, y1, x2, y2 = (_snap(v * s) for v, s in zip(bbox, (sx, sy, sx, sy), strict=True))
        box = {"x1": math.floor(x1), "y1": math.floor(y1), "x2": math.ceil(x2), "y2": math.ceil(y2)}
        context = {"width": width, "height": height, "min_size": min_size, "max_aspect_ratio": max_aspect_ratio}
        return cls.model_validate(box, context=context)


def _snap(value: float) -> float:
    nearest = round(value)
    return float(nearest) if abs(value - nearest) < _SNAP else value


def view_dims(
    width: int,
    height: int,
    size: int | None,
    multiple: int = 1,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> tuple[int, int]:
    """The size at which a `width`×`height` image is shown: shrunk (never enlarged) so its longer
    side is at most `size` (None: not shrunk), then each side rounded to the nearest multiple of
    `multiple`, then, if that is more than `max_pixels` or fewer than `min_pixels` pixels, scaled
    (aspect kept) into that range, sides floored or ceiled to multiples; each side at least one multiple.

    The last two steps are Qwen2.5-VL's `smart_resize` (with `multiple` 28 and the processor's
    `min_pixels`/`max_pixels`): the size of the image the model sees and gives coordinates in.
    """
    w, h = width, height
    if size is not None and max(w, h) > size:
        scale = size / max(w, h)
        w, h = max(1, round(w * scale)), max(1, round(h * scale))
    m = multiple
    vw, vh = round(w / m) * m, round(h / m) * m  # a side under m/2 rounds to 0, as in smart_resize
    if max_pixels is not None and vw * vh > max_pixels:
        beta = math.sqrt(w * h / max_pixels)
        vw, vh = max(m, math.floor(w / beta / m) * m), max(m, math.floor(h / beta / m) * m)
    elif min_pixels is not None and vw * vh < min_pixels:
        beta = math.sqrt(min_pixels / (w * h))
        vw, vh = math.ceil(w * beta / m) * m, math.ceil(h * beta / m) * m
    return max(m, vw), max(m, vh)  # without min_pixels, a side rounded to 0 is one multiple


def box_in(
    box: list[int] | tuple[int, int, int, int],
    size: tuple[int, int] | list[int],
    coordinates: Coordinates,
    view: tuple[int, int] | list[int] | None = None,
) -> list[float]:
    """`box` (pixels of the `size` image, right/bottom exclusive) in a crop convention, rounded
    outwards where the convention is whole numbers: pixels of `view` (the shown image, default
    `size`), 0-1000 (whole numbers), or fractions. Scripted policies and tests use this."""
    width, height = size
    if coordinates == "relative":
        return [box[0] / width, box[1] / height, box[2] / width, box[3] / height]
    if coordinates == "relative1000":
        ex, ey = 1000, 1000
    elif coordinates == "pixels":
        ex, ey = view if view is not None else (width, height)
    else:
        raise ValueError(f"coordinates must be one of {', '.join(COORDINATES)}, got {coordinates!r}")
    x1, y1, x2, y2 = (
        _snap(v * e / s) for v, e, s in zip(box, (ex, ey, ex, ey), (width, height, width, height), strict=True)
    )
    return [math.floor(x1), math.floor(y1), min(math.ceil(x2), ex), min(math.ceil(y2), ey)]


def zoom_size(width: int, height: int, min_pixels: int, max_pixels: int, min_side: int = 1) -> tuple[int, int]:
    """Output size for a `width`×`height` crop: same aspect ratio, pixel count in [min_pixels, max_pixels],
    then each side at least `min_side` (which wins over `max_pixels`)."""
    area = width * height
    w, h = width, height
    if not min_pixels <= area <= max_pixels:
        scale = math.sqrt((min_pixels if area < min_pixels else max_pixels) / area)
        w, h = max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))
        if w * h > max_pixels:  # rounding up overshot the cap (or the range is narrow): round down instead
            w, h = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    if min(w, h) < min_side:
        scale = min_side / min(width, height)
        w, h = max(min_side, math.ceil(width * scale - _SNAP)), max(min_side, math.ceil(height * scale - _SNAP))
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


@dataclass(frozen=True)
class _Frame:
    """Where a box's numbers live: their extent, and task-image pixels per unit."""

    label: str  # for messages: "pixels", "pixels of the 448x448 image", "relative1000", ...
    extent: tuple[float, float]
    scale: tuple[float, float]
    whole_pixels: bool  # the frame is the task image's own pixels


_WH = "width and height"
_FIRST_IMAGE = (
    "Boxes always refer to the first image you were shown, the whole picture: never give coordinates of a crop."
)
"""After a crop the model has seen several images: boxes are never read in a crop's pixels."""

_DESCRIPTIONS = {
    "relative1000": (
        "Zoom in: crop a region of the image and return it enlarged. bbox is [x1, y1, x2, y2] "
        "(left, top, right, bottom) on a 0-1000 scale across the image's width and height, whatever "
        "its size in pixels: [0, 0, 1000, 1000] is the whole image, [500, 0, 1000, 500] its top-right quarter."
    ),
    "relative": (
        "Zoom in: crop a region of the image and return it enlarged. bbox is [x1, y1, x2, y2] "
        "(left, top, right, bottom) as fractions from 0 to 1 of the image's width and height: "
        "[0, 0, 1, 1] is the whole image, [0.5, 0, 1, 0.5] its top-right quarter."
    ),
}


class CropTool(Tool):
    """Zoom in: crop a region of the task's image and return it enlarged.

    The description the model reads states the coordinate convention (`description`, set per tool).

    Args:
        image_root: where `context["image"]` paths live (default: the bundled photos).
        coordinates: `"pixels"`, `"relative1000"` (Qwen3-VL) or `"relative"` (0-1); see the module.
        view_size: with `"pixels"`, the longer side of the image the model was shown (None: the
            task image at full size); its boxes are scaled up to the task image.
        view_multiple: with `"pixels"`, the shown image's sides are rounded to this multiple (28 for
            a Qwen2.5-VL processor), as `view_dims` computes.
        view_min_pixels: with `"pixels"`, the shown image was enlarged to at least this many
            pixels (a Qwen2.5-VL processor's `min_pixels`; None: not enlarged).
        view_max_pixels: and shrunk to at most this many (the processor's `max_pixels`; None:
            not shrunk): the processor resizes a large photo by pixel count, not by its side.
        view_from_task: with `"pixels"` and no `view_*` argument, read boxes in pixels of the
            size the task records in `context["overview"]` when it has one (False: always the
            task image's own pixels).
        min_pixels: a crop is enlarged to at least this many pixels.
        max_pixels: and shrunk to at most this many (default 1024²; for a task read in its
            `context["overview"]` frame, no more than a square overview, as the env sets it, so
            that a crop of the whole picture shows no more than the overview did).
        min_size: each side of a box covers at least this many task-image pixels (or the
            image's shorter side, for an image smaller than that).
        max_aspect_ratio: long side over short side of a box, at most.
        min_shown_side: each side of the returned image is at least this long, even past
            `max_pixels` (32: Qwen-VL processors raise on a side under their 28 or 32 px grid).
        crop_format: `"auto"` (a JPEG task image gives JPEG crops, anything else PNG), `"png"`
            or `"jpeg"` (quality `CROP_JPEG_QUALITY`): the bytes every later request resends.
        **limits: `ToolLimits` overrides.
    """

    name = "crop"
    description: ClassVar[str] = (
        "Zoom in: crop a region of the task's image and return it enlarged.\n\n"
        "bbox is [x1, y1, x2, y2] (right/bottom exclusive) in pixels of the full image as you were first shown it, "
        'or normalized to [0, 1]; with units="auto" values all <= 1 are read as normalized. The box must lie inside '
        "the image. " + _FIRST_IMAGE
    )
    Args: ClassVar[type[BaseModel]] = CropCall
    _bbox_name: ClassVar[str] = "bbox"  # the box argument's name, in messages

    def __init__(
        self,
        image_root: str | Path | None = None,
        *,
        coordinates: Coordinates = "pixels",
        view_size: int | None = None,
        view_multiple: int = 1,
        view_min_pixels: int | None = None,
        view_max_pixels: int | None = None,
        view_from_task: bool = True,
        min_pixels: int = DEFAULT_MIN_PIXELS,
        max_pixels: int | None = None,
        min_size: int = DEFAULT_MIN_SIZE,
        max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO,
        min_shown_side: int = DEFAULT_MIN_SHOWN_SIDE,
        crop_format: CropFormat = "auto",
        **limits: Any,
    ) -> None:
        super().__init__(**limits)
        self._max_pixels_given = max_pixels is not None
        max_pixels = DEFAULT_MAX_PIXELS if max_pixels is None else max_pixels
        if coordinates not in COORDINATES:
            raise ValueError(f"coordinates must be one of {', '.join(COORDINATES)}, got {coordinates!r}")
        if view_size is not None and view_size < 1:
            raise ValueError(f"view_size must be at least 1 or None, got {view_size}")
        if view_multiple < 1:
            raise ValueError(f"view_multiple must be at least 1, got {view_multiple}")
        if not 1 <= (view_min_pixels or 1) <= (view_max_pixels or math.inf):
            raise ValueError(
                f"need 1 <= view_min_pixels <= view_max_pixels, got {view_min_pixels} and {view_max_pixels}"
            )
        if not 1 <= min_pixels <= max_pixels:
            raise ValueError(f"need 1 <= min_pixels <= max_pixels, got {min_pixels} and {max_pixels}")
        if min_size < 1:
            raise ValueError(f"min_size must be at least 1, got {min_size}")
        if not max_aspect_ratio >= 1:
            raise ValueError(f"max_aspect_ratio must be at least 1, got {max_aspect_ratio}")
        if min_shown_side < 1:
            raise ValueError(f"min_shown_side must be at least 1, got {min_shown_side}")
        if crop_format not in CROP_FORMATS:
            raise ValueError(f"crop_format must be one of {', '.join(CROP_FORMATS)}, got {crop_format!r}")
        self.image_root = Path(image_root) if image_root is not None else None
        self.coordinates: Coordinates = coordinates
        self.view_size, self.view_multiple = view_size, view_multiple
        self.view_min_pixels, self.view_max_pixels = view_min_pixels, view_max_pixels
        self.view_from_task = view_from_task
        self.min_pixels, self.max_pixels, self.min_size = min_pixels, max_pixels, min_size
        self.max_aspect_ratio, self.min_shown_side = max_aspect_ratio, min_shown_side
        self.crop_format: CropFormat = crop_format
        self._strict, self.Args = _MODELS[coordinates]  # type: ignore[misc]  # per instance, like FunctionTool
        self.description = self._describe()  # type: ignore[misc]

    @property
    def _scaled_view(self) -> bool:
        return self.coordinates == "pixels" and (
            self.view_size is not None
            or self.view_multiple > 1
            or self.view_min_pixels is not None
            or self.view_max_pixels is not None
        )

    def _view(self, width: int, height: int) -> tuple[int, int]:
        """The size of the image the model was shown, for a `width`×`height` task image."""
        return view_dims(width, height, self.view_size, self.view_multiple, self.view_min_pixels, self.view_max_pixels)

    def _describe(self) -> str:
        """The description the model reads: how this tool reads `bbox`."""
        if self.coordinates in _DESCRIPTIONS:
            return _DESCRIPTIONS[self.coordinates]
        if not self._scaled_view:
            if self.view_from_task:
                return type(self).description
            return (
                "Zoom in: crop a region of the task's image and return it enlarged.\n\n"
                "bbox is [x1, y1, x2, y2] (right/bottom exclusive) in pixels of the full image at its original size, "
                'or normalized to [0, 1]; with units="auto" values all <= 1 are read as normalized. The box must lie '
                "inside the image. " + _FIRST_IMAGE
            )
        shown = "the image as you were shown it"
        if self.view_size is not None and self.view_min_pixels is None:  # min_pixels may enlarge it past that
            shown += f" (its longer side at most about {self.view_size} px)"
        return (
            "Zoom in: crop a region of the image and return it enlarged, at higher resolution than you "
            f"were shown. bbox is [x1, y1, x2, y2] (right/bottom exclusive) in pixels of {shown}, or "
            'normalized to [0, 1]; with units="auto" values all <= 1 are read as normalized. '
            "The box must lie inside the image. " + _FIRST_IMAGE
        )

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        # Decoding, resizing and encoding are CPU work: keep them off the event loop.
        return await asyncio.to_thread(self.crop, args, ctx.task)

    def _shown(self, context: Mapping[str, Any], width: int, height: int) -> tuple[int, int] | None:
        """The size of the image whose pixels a `"pixels"` box is in, when not the task image's own:
        this tool's `view_*` arguments, else the task's `context["overview"]` (`view_from_task`).

        Raises:
            ValueError: `context["overview"]` is not `[width, height]`.
        """
        if self.coordinates != "pixels":
            return None
        if self._scaled_view:
            return self._view(width, height)
        if not self.view_from_task or context.get(TASK_VIEW_KEY) is None:
            return None
        shown = context[TASK_VIEW_KEY]
        if not (
            isinstance(shown, (list, tuple))
            and len(shown) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shown)
        ):
            raise ValueError(
                f"the task's context[{TASK_VIEW_KEY!r}] must be [width, height] of the image the model was "
                f"shown, got {str(shown)[:80]}"
            )
        return shown[0], shown[1]

    def _max_pixels(self, shown: tuple[int, int] | None) -> int:
        """`max_pixels`; for a frame the task recorded and no `max_pixels` given, no more than a
        square overview of the same longer side (the env's cap: 448² for its 448 px overview)."""
        if self._max_pixels_given or self._scaled_view or shown is None:
            return self.max_pixels
        return min(self.max_pixels, max(max(shown) ** 2, self.min_pixels))

    def _frame(self, args: _Ordered, width: int, height: int, shown: tuple[int, int] | None) -> _Frame:
        if isinstance(args, CropArgs) and args.normalized:
            return _Frame("normalized", (1, 1), (width, height), False)
        if self.coordinates == "relative1000":
            return _Frame(
                "relative1000: 0 to 1000 across the width and height",
                (1000, 1000),
                (width / 1000, height / 1000),
                False,
            )
        if self.coordinates == "relative":
            return _Frame("relative: 0 to 1 across the width and height", (1, 1), (width, height), False)
        if shown is None:
            return _Frame("pixels", (width, height), (1, 1), True)
        vw, vh = shown
        return _Frame(f"pixels of the {vw}x{vh} image", (vw, vh), (width / vw, height / vh), False)

    def _trailer(self, width: int, height: int, shown: tuple[int, int] | None) -> str:
        """The last sentence of an error: the image's size in the model's pixels, or the convention."""
        if self.coordinates == "relative1000":
            return f"{self._bbox_name} is relative1000: [x1, y1, x2, y2] from 0 to 1000 across the image's {_WH}."
        if self.coordinates == "relative":
            return f"{self._bbox_name} is relative: [x1, y1, x2, y2] as fractions from 0 to 1 of the image's {_WH}."
        vw, vh = shown or (width, height)
        return f"The image is {vw}x{vh} px."

    def _min_size(self, image: Image.Image) -> int:
        """`min_size`, or the image's shorter side if that is shorter: an icon or a thumbnail
        under `min_size` px could not be cropped at all, not even whole."""
        return min(self.min_size, image.width, image.height)

    def crop(self, args: BaseModel, task: Task) -> ToolResult:
        """The synchronous crop of `task`'s image; errors (with the image's size) come back as error results."""
        try:
            image = task_image(task.context, self.image_root)
        except ImageRefError as exc:
            return ToolResult.error(f"Cannot open the task image: {exc}.", infra_error=True)
        try:
            shown = self._shown(task.context, image.width, image.height)
        except ValueError as exc:
            return ToolResult.error(f"Cannot crop this task: {exc}.", infra_error=True)
        trailer = self._trailer(image.width, image.height, shown)
        if not isinstance(args, self._strict):
            try:
                args = self._validated(args)
            except ValidationError as exc:
                return ToolResult.error(f"Invalid arguments for tool {self.name!r}: {self._arg_errors(exc)}. {trailer}")
        assert isinstance(args, _Ordered)
        frame = self._frame(args, image.width, image.height, shown)
        ex, ey = frame.extent
        invalid = f"Invalid {self._bbox_name} {_fmt(args.bbox)} ({frame.label})"
        if not frame.whole_pixels and (args.bbox[2] > ex or args.bbox[3] > ey):
            return ToolResult.error(f"{invalid}: it reaches outside the {_num(ex)}x{_num(ey)} image. {trailer}")
        try:
            box = PixelBox.scaled(
                args.bbox, *frame.scale, image.width, image.height, self._min_size(image), self.max_aspect_ratio
            )
        except ValidationError as exc:
            return ToolResult.error(f"{invalid}: {_error_text(exc)}. {trailer}")
        region = image.crop((box.x1, box.y1, box.x2, box.y2))
        zoomed = zoom_size(region.width, region.height, self.min_pixels, self._max_pixels(shown), self.min_shown_side)
        if zoomed != region.size:
            region = region.resize(zoomed, Image.Resampling.LANCZOS)
        zoom = zoomed[0] / (box.x2 - box.x1)
        size = f"{box.x2 - box.x1}x{box.y2 - box.y1} px of the {image.width}x{image.height} image"
        if frame.whole_pixels or (frame.label == "normalized" and shown is None):
            where = f"{box.as_list()} ({size})"
        else:
            where = f"{_fmt(args.bbox)} ({frame.label}; {size})"
        text = f"Cropped region {where}, shown at {zoomed[0]}x{zoomed[1]}, zoom ×{zoom:.3g}"
        meta = {
            "bbox": box.as_list(),
            "size": list(zoomed),
            "zoom": zoom,
            "image_size": [image.width, image.height],
            "coordinates": self.coordinates,
        }
        if shown is not None:
            meta["view_size"] = list(shown)
        return ToolResult(text=text, images=[self._encode(region, task.context)], metadata=meta)

    def _validated(self, args: BaseModel) -> _Ordered:
        """The call's arguments checked against the strict model of this tool's convention.

        Raises:
            ValidationError: a value is wrong (its `loc` names the argument as the model wrote it).
        """
        return self._strict.model_validate(args.model_dump())

    def _arg_errors(self, exc: ValidationError) -> str:
        """The argument problems of `exc`, one `loc: message` each."""
        return _argument_errors(exc)

    def _format(self, context: Mapping[str, Any]) -> str:
        """`"png"` or `"jpeg"`: `crop_format`, or with `"auto"` the task image file's kind. A
        rendered image (`context["render"]`: VisualSearch's drawn code) stays PNG, sharp."""
        if self.crop_format != "auto":
            return self.crop_format
        if context.get("render") is not None:
            return "png"
        try:
            kind = source_format(resolve_image(context.get("image"), self.image_root))
        except (ImageRefError, OSError):  # the image was just read: this is a race with its removal
            return "png"
        return "jpeg" if kind in _JPEG_SOURCES else "png"

    def _encode(self, region: Image.Image, context: Mapping[str, Any]) -> ToolImage:
        """`region` as the tool returns it: JPEG for a photo (`_format`), else lossless PNG."""
        if self._format(context) == "jpeg":
            return ToolImage.from_pil(region, "JPEG", quality=CROP_JPEG_QUALITY)
        return ToolImage.from_pil(region)


_ZOOM_BBOX = (
    "The bounding box of the region to zoom in, as [x1, y1, x2, y2], where (x1, y1) is the top-left corner "
    "and (x2, y2) is the bottom-right corner"
)
_ZOOM_SCALES = {
    "pixels": ", in pixels of the image (right/bottom exclusive).",
    "relative1000": ", from 0 to 1000 across the image's width and height: [0, 0, 1000, 1000] is the whole image.",
    "relative": ", as fractions from 0 to 1 of the image's width and height: [0, 0, 1, 1] is the whole image.",
}
_ZOOM_HEAD = (
    "Zoom in on a specific region of an image by cropping it based on a bounding box (bbox_2d) and an "
    "optional object label; the region comes back enlarged."
)
_LABEL_SCHEMA = {
    "type": "string",
    "description": "The name or label of the object in the specified bounding box (optional).",
}


def _zoom_box(coordinates: str) -> dict[str, Any]:
    """The JSON schema of `bbox_2d` in a convention: the strict model's value rules, DeepEyes' wording."""
    schema = dict(_MODELS[coordinates][0].model_json_schema()["properties"]["bbox"])
    return {**schema, "description": _ZOOM_BBOX + _ZOOM_SCALES[coordinates]}


def _no_label_default(schema: dict[str, Any]) -> None:
    """DeepEyes' schema: `label` is an optional string, with no `"default": null` beside `"type": "string"`."""
    schema["properties"]["label"].pop("default", None)


class _ZoomCall(BaseModel):
    """Arguments of the image_zoom_in_tool tool."""

    # Names only, as `CropCall`; `run` checks the values with the strict model of the convention.
    model_config = ConfigDict(extra="forbid", title="ImageZoomInArgs", json_schema_extra=_no_label_default)

    bbox_2d: Annotated[Any, WithJsonSchema(_zoom_box("pixels"))]
    label: Annotated[Any, WithJsonSchema(_LABEL_SCHEMA)] = None


class _ZoomRelative1000Call(BaseModel):
    """Arguments of the image_zoom_in_tool tool."""

    model_config = ConfigDict(extra="forbid", title="ImageZoomInArgs", json_schema_extra=_no_label_default)

    bbox_2d: Annotated[Any, WithJsonSchema(_zoom_box("relative1000"))]
    label: Annotated[Any, WithJsonSchema(_LABEL_SCHEMA)] = None


class _ZoomRelativeCall(BaseModel):
    """Arguments of the image_zoom_in_tool tool."""

    model_config = ConfigDict(extra="forbid", title="ImageZoomInArgs", json_schema_extra=_no_label_default)

    bbox_2d: Annotated[Any, WithJsonSchema(_zoom_box("relative"))]
    label: Annotated[Any, WithJsonSchema(_LABEL_SCHEMA)] = None


_ZOOM_CALLS: dict[str, type[BaseModel]] = {
    "pixels": _ZoomCall,
    "relative1000": _ZoomRelative1000Call,
    "relative": _ZoomRelativeCall,
}


class _Label(BaseModel):
    """`label`: a string when given (what DeepEyes' schema says)."""

    model_config = ConfigDict(extra="ignore")

    label: str | None = None


class ImageZoomInTool(CropTool):
    """The crop tool under DeepEyes' name and arguments: `image_zoom_in_tool(bbox_2d, label)`.

    DeepEyes (and verl's `image_zoom_in_tool` example) train Qwen2.5-VL to call
    `{"bbox_2d": [x1, y1, x2, y2], "label": "..."}`; with `crop`'s `bbox` such a checkpoint
    makes only invalid calls. Same arguments and behaviour as `CropTool`, except that `bbox_2d`
    is always read in the `coordinates` convention (no `units`: with `"pixels"`, values <= 1
    are pixels too) and `label` is kept in the result's metadata.
    """

    name = "image_zoom_in_tool"
    description: ClassVar[str] = (
        f"{_ZOOM_HEAD} bbox_2d is [x1, y1, x2, y2] (right/bottom exclusive) in pixels of the image as you were "
        f"first shown it. {_FIRST_IMAGE}"
    )
    Args: ClassVar[type[BaseModel]] = _ZoomCall
    _bbox_name: ClassVar[str] = "bbox_2d"

    def __init__(self, image_root: str | Path | None = None, **options: Any) -> None:
        super().__init__(image_root, **options)
        self.Args = _ZOOM_CALLS[self.coordinates]  # type: ignore[misc]  # per instance, as CropTool

    def _describe(self) -> str:
        if self.coordinates != "pixels":
            return f"{_ZOOM_HEAD} {_ZOOM_BBOX}{_ZOOM_SCALES[self.coordinates]} {_FIRST_IMAGE}"
        shown = "the image as you were first shown it"
        if not self._scaled_view and not self.view_from_task:
            shown = "the full image at its original size"
        if self.view_size is not None and self.view_min_pixels is None:  # min_pixels may enlarge it past that
            shown += f" (its longer side at most about {self.view_size} px)"
        return f"{_ZOOM_HEAD} bbox_2d is [x1, y1, x2, y2] (right/bottom exclusive) in pixels of {shown}. {_FIRST_IMAGE}"

    def _validated(self, args: BaseModel) -> _Ordered:
        given = args.model_dump()
        _Label.model_validate(given)
        bbox: dict[str, Any] = {"bbox": given.get("bbox_2d")}
        if self.coordinates == "pixels":
            bbox["units"] = "pixels"  # the schema says pixels: [0, 0, 1, 1] is not the whole image
        return self._strict.model_validate(bbox)

    def _arg_errors(self, exc: ValidationError) -> str:
        text = _argument_errors(exc)
        # The strict model names the box `bbox`: say `bbox_2d`, as the model wrote it.
        return text.replace("bbox.", "bbox_2d.").replace("bbox:", "bbox_2d:").replace("bbox [", "bbox_2d [")

    def crop(self, args: BaseModel, task: Task) -> ToolResult:
        """As `CropTool.crop`; the call's `label`, if any, is in the result's metadata."""
        result = super().crop(args, task)
        label = getattr(args, "label", None)
        if not result.is_error and isinstance(label, str) and label:
            result.metadata["label"] = label
        return result
