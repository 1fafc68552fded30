"""`toolenv/VisualSearch-v0`: find a small code in a photo by zooming in with `crop`.

The first observation carries the whole image, downscaled to `overview_size` so the
code cannot be read from it: `info["messages"][-1].images[0]` after `reset`. The
full-resolution image of a task is `toolenv_vision.task_image(task.context)`.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolenv import Message, Task, ToolEnv, ToolImage, load_tasks
from toolenv_vision.crop import DEFAULT_MIN_PIXELS, CropTool
from toolenv_vision.images import ImageRefError, resolve_image
from toolenv_vision.render import task_image
from toolenv_vision.tasks import DEFAULT_LONG_SIDE, generate_tasks

__all__ = ["DEFAULT_OVERVIEW_SIZE", "VisualSearchEnv", "make_visualsearch_env", "overview_image", "visualsearch_oracle"]

DEFAULT_OVERVIEW_SIZE = 448
"""Longer side of the first-observation image (16 × 28 px): a third of the task image, too coarse to read the code."""
OVERVIEW_JPEG_QUALITY = 90
"""The overview is a downscaled photo, so JPEG: about 7x smaller than PNG (it rides in every
episode's trajectory) and 19x faster to encode. Crops, which must stay legible, remain PNG."""


class VisualSearchEnv(ToolEnv):
    """A ToolEnv whose first user message carries the task's image (downscaled).

    Args:
        image_root: where `context["image"]` paths live (default: the bundled photos).
        overview_size: longer side of the image shown in the first observation.
        *args: as for `ToolEnv`.
        **kwargs: as for `ToolEnv`.
    """

    def __init__(
        self,
        *args: Any,
        image_root: str | Path | None = None,
        overview_size: int = DEFAULT_OVERVIEW_SIZE,
        **kwargs: Any,
    ) -> None:
        if overview_size < 16:
            raise ValueError(f"overview_size must be at least 16, got {overview_size}")
        self.image_root = Path(image_root) if image_root is not None else None
        self.overview_size = overview_size
        super().__init__(*args, **kwargs)

    async def arender_prompt(self, task: Task) -> tuple[str, list[Message]]:
        """Decoding, resizing and encoding release the GIL: render in a worker thread, so
        concurrent episodes keep stepping while one resets."""
        return await asyncio.to_thread(self.render_prompt, task)

    def render_prompt(self, task: Task) -> tuple[str, list[Message]]:
        """The text prompt, and chat messages whose user message holds the overview image."""
        text, messages = super().render_prompt(task)
        image = overview_image(task.context, self.image_root, self.overview_size)
        messages[-1] = messages[-1].model_copy(update={"images": [image]})
        return text, messages


def overview_image(context: Mapping[str, Any], root: str | Path | None, size: int) -> ToolImage:
    """The task image shrunk (never enlarged) so its longer side is at most `size`, as JPEG (cached)."""
    try:  # the file's mtime is in the key, as in the decode cache, so a replaced photo is shown afresh
        mtime_ns: int | None = resolve_image(context["image"], root).stat().st_mtime_ns
    except (KeyError, ImageRefError, OSError):
        mtime_ns = None  # task_image says what is wrong
    key = json.dumps({"image": context.get("image"), "render": context.get("render")}, sort_keys=True)
    return _overview(key, str(root) if root is not None else None, size, mtime_ns)


@functools.lru_cache(maxsize=256)
def _overview(key: str, root: str | None, size: int, mtime_ns: int | None) -> ToolImage:
    image = task_image(json.loads(key), root)
    if max(image.size) > size:
        image = image.copy()
        image.thumbnail((size, size))  # in place, aspect kept, never enlarges
    return ToolImage.from_pil(image.convert("RGB"), "JPEG", quality=OVERVIEW_JPEG_QUALITY)


def make_visualsearch_env(**overrides: Any) -> VisualSearchEnv:
    """`toolenv/VisualSearch-v0`: tasks from `generate_tasks`, the `crop` tool, exact-match reward.

    Overrides: `num_tasks` (200), `seed` (0), `code_length` (4), `long_side` (1344),
    `limit` (first N tasks), `tasks` (replace the generated ones), `image_root`,
    `overview_size` (448), `min_pixels` (224²)/`max_pixels` (`overview_size`², so that cropping the
    whole picture shows no more than the overview)/`min_size`/`max_aspect_ratio` (crop tool), and
    any `ToolEnv` argument (`max_turns`, `parser`, `reward`, ...).
    """
    num_tasks = overrides.pop("num_tasks", 200)
    seed = overrides.pop("seed", 0)
    code_length = overrides.pop("code_length", 4)
    long_side = overrides.pop("long_side", DEFAULT_LONG_SIDE)
    limit = overrides.pop("limit", None)
    image_root = overrides.pop("image_root", None)
    crop_keys = ("min_pixels", "max_pixels", "min_size", "max_aspect_ratio")
    crop_options = {k: overrides.pop(k) for k in crop_keys if k in overrides}
    overview_size = overrides.get("overview_size", DEFAULT_OVERVIEW_SIZE)
    crop_options.setdefault("min_pixels", DEFAULT_MIN_PIXELS)
    # A crop is shown at no more pixels than the overview: at 1024x1024, cropping the whole
    # picture showed the code legibly, one fixed action that needs no search.
    crop_options.setdefault("max_pixels", max(overview_size * overview_size, crop_options["min_pixels"]))
    if "tasks" in overrides:
        tasks = load_tasks(overrides.pop("tasks"))
    else:
        tasks = generate_tasks(num_tasks, seed, code_length=code_length, long_side=long_side)
    if limit is not None:
        tasks = tasks[: int(limit)]
    overrides.setdefault("tools", [CropTool(image_root, **crop_options)])
    overrides.setdefault("max_turns", 4)
    return VisualSearchEnv(tasks=tasks, image_root=image_root, **overrides)


def visualsearch_oracle(task: Task, turn: int, observation: str) -> str:
    """Scripted policy: crop the known box (hermes format), then answer with the known code.

    There is no OCR here, so the second turn answers from the ground truth; the tests
    check separately that the crop returned by the tool really shows that code.
    """
    if turn == 0:
        call = {"name": "crop", "arguments": {"bbox": task.context["box"], "units": "pixels"}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return f"<answer>{task.answers[0] if task.answers else ''}</answer>"
