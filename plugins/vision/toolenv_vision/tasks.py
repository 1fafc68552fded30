"""VisualSearch tasks: a short code drawn small somewhere in a bundled photo, chosen by seed.

Each task is a pure function of `(seed, index)`, so the same arguments give the same
tasks on every machine. The image itself is not stored: `context["render"]` is the
recipe that `toolenv_vision.render.task_image` turns into pixels on demand.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from pathlib import Path

from PIL import ImageStat

from toolenv import Task
from toolenv_vision.crop import COORDINATES, Coordinates, view_dims
from toolenv_vision.images import PHOTOS, resolve_image
from toolenv_vision.render import CodeOverlay, patch_size, scaled_photo

__all__ = [
    "ALPHABET",
    "DEFAULT_LONG_SIDE",
    "DEFAULT_OVERVIEW_MULTIPLE",
    "DEFAULT_OVERVIEW_SIZE",
    "QUESTION",
    "generate_tasks",
    "photos_in",
]

ALPHABET = "ACDEFHJKLMNPRTUVWXY34679"
"""Letters and digits that cannot be mistaken for one another (no 0/O, 1/I/L-like pairs, 2/Z, 5/S, 8/B)."""

DEFAULT_LONG_SIDE = 1344
"""Task images are scaled to this longer side (48 × 28 px, a multiple of Qwen-VL's patch grid)."""

DEFAULT_OVERVIEW_SIZE = 448
"""Longer side of the first-observation image (16 × 28 px): a third of the task image, too coarse to read the code."""
DEFAULT_OVERVIEW_MULTIPLE = 28
"""The overview's sides are rounded to multiples of 28 px, as Qwen2.5-VL's processor (`smart_resize`)
rounds an image: the model then sees the overview pixel for pixel, and its pixel coordinates are
the overview's, not a resized copy's."""

MARGIN = 8

QUESTION = (
    "Somewhere in this photo there is a small box with a {length}-character code (capital letters and "
    "digits). It is too small to read at the size you see: use the crop tool to zoom in ({bbox}), then "
    "reply with the code as <answer>CODE</answer>."
)
"""The question; `{bbox}` says how the crop tool reads a box (`BBOX`)."""

ANSWER_TOOL_REWRITES = {" as <answer>CODE</answer>": " by calling the `{answer_tool}` tool"}
"""The question's answer format for a model that answers through a tool (TRL's rows)."""

BBOX: dict[str, str] = {
    "pixels": (
        "bbox [x1, y1, x2, y2] in pixels of the {view_width}x{view_height} image you see, or normalized "
        "to [0, 1]; the crop is cut from the {width}x{height} original"
    ),
    "relative1000": "bbox [x1, y1, x2, y2] on a 0-1000 scale across the image's width and height",
    "relative": "bbox [x1, y1, x2, y2] as fractions from 0 to 1 of the image's width and height",
}


def generate_tasks(
    num_tasks: int = 200,
    seed: int = 0,
    *,
    code_length: int = 4,
    long_side: int = DEFAULT_LONG_SIDE,
    photos: Sequence[str] | None = None,
    image_root: str | Path | None = None,
    coordinates: Coordinates = "pixels",
    overview_size: int = DEFAULT_OVERVIEW_SIZE,
    overview_multiple: int = DEFAULT_OVERVIEW_MULTIPLE,
    overview_min_pixels: int | None = None,
    overview_max_pixels: int | None = None,
) -> list[Task]:
    """`num_tasks` VisualSearch tasks drawn from `seed` over `photos` under `image_root`.

    `photos` are paths relative to `image_root`; by default, with no root, the bundled photos,
    and with a root, every image file under it (`photos_in`). Give the env the same root.

    Task `i` depends only on `(seed, i)`: asking for more tasks extends the list. The question
    states the crop tool's `coordinates` convention; with `"pixels"`, the pixels of the overview
    the model is shown (`overview_size`, `overview_multiple`, `overview_min_pixels`,
    `overview_max_pixels`: `toolenv_vision.view_dims`), whose size `context["overview"]` holds
    (`context["size"]` is the task image's, `context["box"]` the code's box in its pixels).

    Raises:
        ValueError: a non-positive count or code length, a canvas too small for the code, an
            unknown convention, or no photos.
        ImageRefError: a photo that is missing, outside the root or not an image.
    """
    if coordinates not in COORDINATES:
        raise ValueError(f"coordinates must be one of {', '.join(COORDINATES)}, got {coordinates!r}")
    root = str(Path(image_root).resolve()) if image_root is not None else None
    if photos is None:
        photos = PHOTOS if root is None else photos_in(root)
    view = (overview_size, overview_multiple, overview_min_pixels, overview_max_pixels)
    return list(_generate(num_tasks, seed, code_length, long_side, tuple(photos), root, coordinates, view))


IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"})


def photos_in(root: str | Path) -> tuple[str, ...]:
    """Paths (relative, `/`-separated, sorted) of the image files under `root`, by suffix
    (`IMAGE_SUFFIXES`), hidden files and folders skipped."""
    base = Path(root).resolve()
    found = []
    for path in base.rglob("*"):
        rel = path.relative_to(base)
        if path.suffix.lower() in IMAGE_SUFFIXES and not any(p.startswith(".") for p in rel.parts) and path.is_file():
            found.append(rel.as_posix())
    return tuple(sorted(found))


@functools.lru_cache(maxsize=16)
def _generate(
    num_tasks: int,
    seed: int,
    code_length: int,
    long_side: int,
    photos: tuple[str, ...],
    root: str | None,
    coordinates: str,
    view: tuple[int, int, int | None, int | None],
) -> tuple[Task, ...]:
    # Cached so that many env factory calls (a vector env) share one task list.
    if num_tasks < 1 or code_length < 1 or not photos:
        raise ValueError(
            f"need num_tasks >= 1, code_length >= 1 and photos, got {num_tasks}, {code_length}, {photos[:8]}"
        )
    return tuple(_task(seed, i, code_length, long_side, photos, root, coordinates, view) for i in range(num_tasks))


def _task(
    seed: int,
    index: int,
    code_length: int,
    long_side: int,
    photos: tuple[str, ...],
    root: str | None,
    coordinates: str,
    view: tuple[int, int, int | None, int | None],
) -> Task:
    rng = random.Random(f"toolenv-vision/VisualSearch:{seed}:{index}")  # str seeds hash deterministically
    photo = photos[rng.randrange(len(photos))]
    code = "".join(rng.choice(ALPHABET) for _ in range(code_length))
    canvas = scaled_photo(resolve_image(photo, root), long_side)
    w, h = patch_size(code)
    if canvas.width < w + 2 * MARGIN or canvas.height < h + 2 * MARGIN:
        raise ValueError(f"a {long_side} px canvas is too small for a {code_length}-character code")
    x, y = rng.randint(MARGIN, canvas.width - w - MARGIN), rng.randint(MARGIN, canvas.height - h - MARGIN)
    box = (x, y, x + w, y + h)
    # Contrast with what is underneath: a dark box on bright regions, a light one on dark regions.
    brightness = ImageStat.Stat(canvas.crop(box).convert("L")).mean[0]
    dark, light = (20, 20, 20), (250, 250, 250)
    bg, fg = (dark, light) if brightness >= 128 else (light, dark)
    overlay = CodeOverlay(long_side=long_side, text=code, box=box, fg=fg, bg=bg)
    vw, vh = view_dims(canvas.width, canvas.height, *view)
    bbox = BBOX[coordinates].format(width=canvas.width, height=canvas.height, view_width=vw, view_height=vh)
    return Task(
        id=f"visualsearch-{seed}-{index}",
        question=QUESTION.format(length=code_length, bbox=bbox),
        answer=code,
        context={
            "image": photo,
            "render": overlay.model_dump(mode="json"),
            "box": list(box),
            "size": [canvas.width, canvas.height],
            "overview": [vw, vh],
            "coordinates": coordinates,
        },
    )
