"""Where a task's image comes from: a path under an image root, decoded once per process.

A task names its image as `context["image"]`, a path relative to an image root (the
bundled photos by default). The path may not leave the root: absolute paths, `..`
parts and symlinks that resolve outside are refused with `ImageRefError`. Decoded
images live in a process-wide LRU cache, so a vector env of many envs decodes each
file once; cached images are shared and must be treated as read-only.
"""

from __future__ import annotations

import functools
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from PIL import Image

__all__ = [
    "DATA_DIR",
    "PHOTOS",
    "ImageRefError",
    "cache_clear",
    "load_image",
    "resolve_image",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The bundled photos (scikit-image sample data; see `data/SOURCE.md`)."""

PHOTOS: tuple[str, ...] = tuple(sorted(p.name for p in DATA_DIR.iterdir() if p.suffix in (".png", ".jpg")))
"""File names of the bundled photos, sorted."""

DECODE_CACHE_SIZE = 64


class ImageRefError(ValueError):
    """An image reference that is missing, malformed, outside the root, or not an image."""


def resolve_image(ref: Any, root: str | Path | None = None) -> Path:
    """The file that `ref` names under `root` (default: the bundled photos).

    Raises:
        ImageRefError: `ref` is not a non-empty relative path, leaves the root
            (`..`, absolute, a symlink pointing outside), or is not a file.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ImageRefError(f"image reference must be a non-empty relative path, got {ref!r}")
    if "\x00" in ref:
        raise ImageRefError("image reference contains a NUL byte")
    posix, windows = PurePosixPath(ref), PureWindowsPath(ref)
    if posix.is_absolute() or windows.is_absolute() or windows.drive:
        raise ImageRefError(f"image reference {ref!r} is absolute; give a path relative to the image root")
    if ".." in posix.parts or ".." in windows.parts:
        raise ImageRefError(f"image reference {ref!r} contains '..'; it must stay inside the image root")
    base = Path(root).resolve() if root is not None else DATA_DIR
    try:
        path = (base / posix).resolve(strict=True)
    except (OSError, RuntimeError):  # missing file, or a symlink loop
        raise ImageRefError(f"image {ref!r} not found under the image root") from None
    if not path.is_relative_to(base):
        raise ImageRefError(f"image reference {ref!r} resolves outside the image root")
    if not path.is_file():
        raise ImageRefError(f"image reference {ref!r} is not a file")
    return path


@functools.lru_cache(maxsize=DECODE_CACHE_SIZE)
def _decode(path: str, mtime_ns: int, size: int) -> Image.Image:
    # mtime and size are part of the key so that a replaced file is decoded afresh.
    with Image.open(path) as im:
        im.load()
        rgb: Image.Image = im.convert("RGB")
        return rgb


def load_image(path: Path) -> Image.Image:
    """The RGB image at `path`, decoded once per process (LRU); do not modify it.

    Raises:
        ImageRefError: the file is not a readable image.
    """
    st = path.stat()
    try:
        return _decode(str(path), st.st_mtime_ns, st.st_size)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageRefError(f"{path.name} is not a readable image ({type(exc).__name__})") from None


def cache_clear() -> None:
    """Drop every cached decoded image (tests and benchmarks use this)."""
    _decode.cache_clear()
