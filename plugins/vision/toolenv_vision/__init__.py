"""toolenv-vision: a `crop` (zoom-in) tool, the same as DeepEyes' `image_zoom_in_tool`, and the
`toolenv/VisualSearch-v0` environment.

Needs Pillow. Images are named by tasks as paths relative to an image root (the
bundled scikit-image photos by default) and decoded once per process.
"""

from __future__ import annotations

from toolenv_vision.crop import (
    COORDINATES,
    Coordinates,
    CropArgs,
    CropCall,
    CropFormat,
    CropTool,
    ImageZoomInTool,
    PixelBox,
    Relative1000Args,
    RelativeArgs,
    box_in,
    view_dims,
    zoom_size,
)
from toolenv_vision.envs import CodeMatch, VisualSearchEnv, make_visualsearch_env, overview_image, visualsearch_oracle
from toolenv_vision.images import DATA_DIR, PHOTOS, ImageRefError, resolve_image, set_decode_cache
from toolenv_vision.render import CodeOverlay, code_patch, task_image
from toolenv_vision.tasks import ALPHABET, generate_tasks, photos_in

__all__ = [
    "ALPHABET",
    "COORDINATES",
    "DATA_DIR",
    "PHOTOS",
    "CodeMatch",
    "CodeOverlay",
    "Coordinates",
    "CropArgs",
    "CropCall",
    "CropFormat",
    "CropTool",
    "ImageRefError",
    "ImageZoomInTool",
    "PixelBox",
    "Relative1000Args",
    "RelativeArgs",
    "VisualSearchEnv",
    "box_in",
    "code_patch",
    "generate_tasks",
    "make_visualsearch_env",
    "overview_image",
    "photos_in",
    "resolve_image",
    "set_decode_cache",
    "task_image",
    "view_dims",
    "visualsearch_oracle",
    "zoom_size",
]
