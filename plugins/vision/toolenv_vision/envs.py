"""`toolenv/VisualSearch-v0`: find a small code in a photo by zooming in with `crop`.

The first observation carries the whole image, downscaled to `overview_size` (sides rounded
to multiples of `overview_multiple`) so the code cannot be read from it:
`info["messages"][-1].images[0]` after `reset`. The full-resolution image of a task is
`toolenv_vision.task_image(task.context)`. The crop tool reads boxes in `coordinates`: by
default pixels of that overview, which the question states the size of.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import string
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from toolenv import Message, Task, ToolEnv, ToolImage, load_tasks
from toolenv.episode import Episode
from toolenv.rewards import ExactMatch
from toolenv_vision.crop import DEFAULT_MIN_PIXELS, CropTool, box_in, view_dims
from toolenv_vision.images import ImageRefError, resolve_image
from toolenv_vision.render import CodeOverlay, task_image
from toolenv_vision.tasks import (
    ANSWER_TOOL_REWRITES,
    DEFAULT_LONG_SIDE,
    DEFAULT_OVERVIEW_MULTIPLE,
    DEFAULT_OVERVIEW_SIZE,
    generate_tasks,
)

__all__ = [
    "DEFAULT_OVERVIEW_MULTIPLE",
    "DEFAULT_OVERVIEW_SIZE",
    "CodeMatch",
    "VisualSearchEnv",
    "make_visualsearch_env",
    "overview_image",
    "visualsearch_oracle",
]

OVERVIEW_JPEG_QUALITY = 90
"""The overview is a downscaled photo, so JPEG: about 7x smaller than PNG (it rides in every
episode's trajectory) and 19x faster to encode. Crops of the rendered tasks, whose drawn code must
stay sharp, remain PNG (the crop tool's `crop_format="auto"`)."""


_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _code(text: str) -> str:
    """`text` as a code: NFKC (full-width `Ｊ６` is `J6`), lower case, without punctuation,
    spaces or invisible characters, Unicode's (“ ” « » 。 –, zero-width spaces) as ASCII's:
    the codes are ASCII letters and digits, and models quote and end them in many scripts."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_PUNCTUATION)
    return "".join(c for c in text if unicodedata.category(c)[0] not in "PZC")


class CodeMatch(ExactMatch):
    """`exact_match` for codes: case, punctuation and whitespace ignored ("j6 ta" and "J6-TA" are
    "J6TA"), but no articles dropped as SQuAD's normalisation does, which turned the codes "A",
    "AN" and "THE" into "" and let an empty answer (or "the") match them."""

    name = "exact_match"

    async def final(self, episode: Episode) -> float:
        if episode.answer is None:
            return 0.0
        got = _code(episode.answer)
        return float(any(got == _code(gold) for gold in episode.task.answers))


class VisualSearchEnv(ToolEnv):
    """A ToolEnv whose first user message carries the task's image (downscaled).

    Args:
        image_root: where `context["image"]` paths live (default: the bundled photos).
        overview_size: longer side of the image shown in the first observation.
        overview_multiple: its sides are rounded to multiples of this (28: Qwen2.5-VL's
            processor then leaves it as it is; 1: no rounding).
        overview_min_pixels: it is then enlarged to at least this many pixels: your
            Qwen2.5-VL processor's `min_pixels` (None: not enlarged), which would otherwise
            enlarge it, so that the model's pixels would not be the overview's.
        overview_max_pixels: and shrunk to at most this many (the processor's `max_pixels`).
        *args: as for `ToolEnv`.
        **kwargs: as for `ToolEnv`.
    """

    def __init__(
        self,
        *args: Any,
        image_root: str | Path | None = None,
        overview_size: int = DEFAULT_OVERVIEW_SIZE,
        overview_multiple: int = DEFAULT_OVERVIEW_MULTIPLE,
        overview_min_pixels: int | None = None,
        overview_max_pixels: int | None = None,
        **kwargs: Any,
    ) -> None:
        if overview_size < 16:
            raise ValueError(f"overview_size must be at least 16, got {overview_size}")
        if overview_multiple < 1:
            raise ValueError(f"overview_multiple must be at least 1, got {overview_multiple}")
        self.image_root = Path(image_root) if image_root is not None else None
        if not 1 <= (overview_min_pixels or 1) <= (overview_max_pixels or math.inf):
            raise ValueError(
                "need 1 <= overview_min_pixels <= overview_max_pixels, "
                f"got {overview_min_pixels} and {overview_max_pixels}"
            )
        self.overview_size, self.overview_multiple = overview_size, overview_multiple
        self.overview_pixels = (overview_min_pixels, overview_max_pixels)
        super().__init__(*args, **kwargs)

    async def arender_prompt(self, task: Task) -> tuple[str, list[Message]]:
        """Decoding, resizing and encoding release the GIL: render in a worker thread, so
        concurrent episodes keep stepping while one resets."""
        return await asyncio.to_thread(self.render_prompt, task)

    def render_prompt(self, task: Task) -> tuple[str, list[Message]]:
        """The text prompt, and chat messages whose user message holds the overview image."""
        text, messages = super().render_prompt(task)
        try:
            image = overview_image(
                task.context, self.image_root, self.overview_size, self.overview_multiple, *self.overview_pixels
            )
        except ImageRefError as exc:  # one bad task among thousands: say which
            raise ImageRefError(f"task {task.id!r}: {exc}") from None
        messages[-1] = messages[-1].model_copy(update={"images": [image]})
        return text, messages


def overview_image(
    context: Mapping[str, Any],
    root: str | Path | None,
    size: int,
    multiple: int = 1,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> ToolImage:
    """The task image shrunk (never enlarged) so its longer side is at most `size`, each side
    then rounded to a multiple of `multiple`, then brought within [`min_pixels`, `max_pixels`]
    pixels (`view_dims`), as JPEG (cached)."""
    try:  # the file's mtime is in the key, as in the decode cache, so a replaced photo is shown afresh
        mtime_ns: int | None = resolve_image(context["image"], root).stat().st_mtime_ns
    except (KeyError, ImageRefError, OSError):
        mtime_ns = None  # task_image says what is wrong
    recipe = context.get("render")
    if isinstance(recipe, CodeOverlay):  # `task_image` takes the model as well as its JSON form
        recipe = recipe.model_dump(mode="json")
    # Only the keys the task has: a missing image must stay missing ("this task has no image"),
    # not come back from the JSON round trip as None ("must be a non-empty relative path").
    keyed = {"image": context.get("image"), "render": recipe}
    key = json.dumps({k: v for k, v in keyed.items() if k in context}, sort_keys=True)
    view = (size, multiple, min_pixels, max_pixels)
    return _overview(key, str(root) if root is not None else None, view, mtime_ns)


@functools.lru_cache(maxsize=256)
def _overview(
    key: str, root: str | None, view: tuple[int, int, int | None, int | None], mtime_ns: int | None
) -> ToolImage:
    image = task_image(json.loads(key), root)
    shown = view_dims(image.width, image.height, *view)
    if shown != image.size:  # as `Image.thumbnail` resizes, but to the size the crop tool assumes
        image = image.resize(shown, Image.Resampling.BICUBIC, reducing_gap=2.0)
    return ToolImage.from_pil(image.convert("RGB"), "JPEG", quality=OVERVIEW_JPEG_QUALITY)


def make_visualsearch_env(**overrides: Any) -> VisualSearchEnv:
    """`toolenv/VisualSearch-v0`: tasks from `generate_tasks`, the `crop` tool, exact-match reward.

    Overrides: `num_tasks` (200), `seed` (0), `code_length` (4), `long_side` (1344),
    `limit` (first N tasks), `tasks` (replace the generated ones, used as given: their question
    should state the crop convention), `image_root` (where the photos are: the generated tasks
    use every image under it; default the bundled photos), `overview_size` (448), `overview_multiple` (28),
    `overview_min_pixels`/`overview_max_pixels` (None: your processor's `min_pixels`/`max_pixels`
    when the overview's size is outside them, so that the processor shows it as it is),
    `coordinates` (`"pixels"` of the overview, `"relative1000"` for Qwen3-VL, `"relative"`: the
    crop tool's convention, which the generated questions state), `min_pixels` (224²)/`max_pixels`
    (`overview_size`², so that cropping the whole picture shows no more than the overview)/
    `min_size`/`max_aspect_ratio`/`min_shown_side`/`crop_format` (`"auto"`: JPEG crops for tasks whose
    image is a JPEG photo shown as it is, PNG for rendered tasks; `"png"`, `"jpeg"`) (crop tool), and
    any `ToolEnv` argument (`tools`, e.g. `[ImageZoomInTool(...)]` for DeepEyes' names, `max_turns`,
    `parser`, `reward` (`CodeMatch`: exact match of the code, case and punctuation ignored), ...).
    """
    num_tasks = overrides.pop("num_tasks", 200)
    seed = overrides.pop("seed", 0)
    code_length = overrides.pop("code_length", 4)
    long_side = overrides.pop("long_side", DEFAULT_LONG_SIDE)
    limit = overrides.pop("limit", None)
    image_root = overrides.pop("image_root", None)
    coordinates = overrides.pop("coordinates", "pixels")
    crop_keys = ("min_pixels", "max_pixels", "min_size", "max_aspect_ratio", "min_shown_side", "crop_format")
    crop_options = {k: overrides.pop(k) for k in crop_keys if k in overrides}
    overview_size = overrides.get("overview_size", DEFAULT_OVERVIEW_SIZE)
    overview_multiple = overrides.get("overview_multiple", DEFAULT_OVERVIEW_MULTIPLE)
    overview_pixels = overrides.get("overview_min_pixels"), overrides.get("overview_max_pixels")
    crop_options.setdefault("min_pixels", DEFAULT_MIN_PIXELS)
    # A crop is shown at no more pixels than the overview: at 1024x1024, cropping the whole
    # picture showed the code legibly, one fixed action that needs no search.
    crop_options.setdefault("max_pixels", max(overview_size * overview_size, crop_options["min_pixels"]))
    # The tool reads pixels in the overview the model is shown (and the questions say so).
    crop = CropTool(
        image_root,
        coordinates=coordinates,
        view_size=overview_size,
        view_multiple=overview_multiple,
        view_min_pixels=overview_pixels[0],
        view_max_pixels=overview_pixels[1],
        **crop_options,
    )
    if "tasks" in overrides:
        tasks = load_tasks(overrides.pop("tasks"))
    else:
        tasks = generate_tasks(
            num_tasks,
            seed,
            code_length=code_length,
            long_side=long_side,
            image_root=image_root,
            coordinates=coordinates,
            overview_size=overview_size,
            overview_multiple=overview_multiple,
            overview_min_pixels=overview_pixels[0],
            overview_max_pixels=overview_pixels[1],
        )
    if limit is not None:
        tasks = tasks[: int(limit)]
    overrides.setdefault("tools", [crop])
    overrides.setdefault("max_turns", 4)
    overrides.setdefault("reward", CodeMatch())
    overrides.setdefault("answer_tool_rewrites", ANSWER_TOOL_REWRITES)
    return VisualSearchEnv(tasks=tasks, image_root=image_root, **overrides)


_ORACLE_NEEDS = {
    "box": "[x1, y1, x2, y2] of the answer's region in pixels of the task image",
    "size": "[width, height] of the task image in pixels",
}
"""What the oracle reads from a task's context to send a box in the task's convention."""


def visualsearch_oracle(task: Task, turn: int, observation: str) -> str:
    """Scripted policy: crop the known box (hermes format), then answer with the known code.

    The box is sent in the task's convention (`context["coordinates"]`; with pixels, those of
    `context["overview"]`), rounded outwards, as a model told that convention would send it.
    There is no OCR here, so the second turn answers from the ground truth; the tests
    check separately that the crop returned by the tool really shows that code.

    Raises:
        ValueError: on the first turn, a task without `context["box"]` or `context["size"]`.
    """
    if turn == 0:
        context = task.context
        for key, what in _ORACLE_NEEDS.items():
            if key not in context:
                raise ValueError(
                    f"visualsearch_oracle needs context[{key!r}] ({what}); task {task.id!r} has none: "
                    "generate_tasks writes it, or add it to your own tasks"
                )
        box, size, coordinates = context["box"], context["size"], context.get("coordinates", "pixels")
        arguments: dict[str, Any]
        if coordinates != "pixels":
            arguments = {"bbox": box_in(box, size, coordinates)}
        elif "overview" in context:
            arguments = {"bbox": box_in(box, size, "pixels", context["overview"]), "units": "pixels"}
        else:  # a task that does not say what the model sees: fractions hold for any pixel frame
            arguments = {"bbox": box_in(box, size, "relative"), "units": "normalized"}
        call = {"name": "crop", "arguments": arguments}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return f"<answer>{task.answers[0] if task.answers else ''}</answer>"
