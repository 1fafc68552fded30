"""Where a task's image comes from: a path under an image root, decoded once per process.

A task names its image as `context["image"]`, a path relative to an image root (the
bundled photos by default). The path may not leave the root: absolute paths, `..`
parts and symlinks that resolve outside are refused with `ImageRefError`. A file is
decoded as a viewer shows it: EXIF orientation applied, transparent pixels on white,
16-bit greyscale scaled to 8 bits, an embedded colour profile converted to sRGB, then
RGB. Decoded images live in a process-wide LRU cache bounded by count and by bytes
(`TOOLENV_VISION_DECODE_CACHE_MB`, `set_decode_cache`), so a vector env of many envs decodes
each file once; cached images are shared and must be treated as read-only.
"""

from __future__ import annotations

import functools
import io
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from PIL import ExifTags, Image

try:
    from PIL import ImageCms
except ImportError:  # Pillow built without Little CMS: colour profiles are not applied
    ImageCms = None  # type: ignore[assignment]

__all__ = [
    "DATA_DIR",
    "PHOTOS",
    "ImageCache",
    "ImageRefError",
    "as_shown",
    "cache_clear",
    "load_image",
    "resolve_image",
    "set_decode_cache",
    "source_format",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The bundled photos (scikit-image sample data; see `data/SOURCE.md`)."""

PHOTOS: tuple[str, ...] = tuple(sorted(p.name for p in DATA_DIR.iterdir() if p.suffix in (".png", ".jpg")))
"""File names of the bundled photos, sorted."""

DECODE_CACHE_ENV = "TOOLENV_VISION_DECODE_CACHE_MB"
"""Environment variable: the decoded-image cache's budget in MB, read when this module is imported
(a rollout worker's environment); `set_decode_cache` changes it afterwards."""


def _env_mb(name: str, default: int) -> int:
    """`name` from the environment as a whole number of MB, in bytes; `default` bytes when unset.

    Raises:
        ValueError: the variable is set to something other than a whole number >= 1.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{name} must be a whole number of MB (at least 1), got {value!r}")
    return int(value) * 2**20


DECODE_CACHE_SIZE = 64
DECODE_CACHE_BYTES = _env_mb(DECODE_CACHE_ENV, 512 * 1024 * 1024)
"""At most this many bytes of decoded images are cached (default 512 MB, `DECODE_CACHE_ENV` or
`set_decode_cache` to change it): a 12 MP photo is 48 MB decoded, an 8K one 130 MB, so more
than ten 12 MP photos in flight re-decode their photo on every crop. The newest is kept
whatever its size."""


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


def image_bytes(image: Image.Image) -> int:
    """Roughly what `image` holds in memory (Pillow keeps a pixel of several bands in 4 bytes)."""
    return image.width * image.height * (1 if image.mode in ("1", "L", "P") else 4)


class ImageCache:
    """A thread-safe LRU of images, bounded by count and by bytes; the newest entry always stays.

    `functools.lru_cache` counts entries only, and 64 decoded photos may be 64 MB or 8 GB. An
    image asked for while another thread is making it is waited for, not made again: the samples
    of a GRPO group reset on the same task at once, and would each decode the same photo.
    """

    def __init__(self, max_items: int, max_bytes: Callable[[], int]) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self._items: OrderedDict[Hashable, tuple[Image.Image, int]] = OrderedDict()
        self._making: dict[Hashable, threading.Event] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Image.Image]) -> Image.Image:
        """The image cached under `key`, else `make()` (run outside the lock, once at a time per
        key) cached. If `make` raises, the error goes to its caller; waiting callers try again."""
        while True:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    return self._items[key][0]
                making = self._making.get(key)
                if making is None:
                    making = self._making[key] = threading.Event()
                    break
            making.wait()  # another thread is making it: then take it from the cache
        try:
            image = make()
            size = image_bytes(image)
            with self._lock:
                self._items[key] = (image, size)
                self._bytes += size
                limit = self.max_bytes()
                while len(self._items) > 1 and (len(self._items) > self.max_items or self._bytes > limit):
                    _, (_, old) = self._items.popitem(last=False)
                    self._bytes -= old
        finally:
            with self._lock:
                del self._making[key]
            making.set()
        return image

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._items.clear()
            self._bytes = 0


_DECODED = ImageCache(DECODE_CACHE_SIZE, lambda: DECODE_CACHE_BYTES)


def set_decode_cache(max_bytes: int | None = None, *, max_items: int | None = None) -> None:
    """Bound the process-wide decoded-image cache by `max_bytes` and/or `max_items` (None: as it is).

    The cache holds every decoded photo that crops and overviews need; size it for the photos
    in flight at once (concurrent episodes times distinct images, about 4 bytes a pixel).
    A smaller budget takes effect at the next insertion.

    Raises:
        ValueError: a bound under 1.
    """
    global DECODE_CACHE_BYTES
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
    if max_items is not None and max_items < 1:
        raise ValueError(f"max_items must be at least 1, got {max_items}")
    if max_bytes is not None:
        DECODE_CACHE_BYTES = max_bytes
    if max_items is not None:
        _DECODED.max_items = max_items


def as_shown(image: Image.Image) -> Image.Image:
    """`image` in RGB as a viewer shows it: EXIF orientation applied, transparency over white,
    16-bit greyscale scaled to 8 bits (Pillow's own conversion clips it: all white from 256 up),
    and an embedded colour profile (Adobe RGB, a CMYK print profile) converted to sRGB, the
    space models and image processors take pixel values to be in.

    The result carries no colour profile and no EXIF or XMP block: its pixels are upright and
    sRGB, what an untagged image means (a kept orientation would be applied a second time by
    whoever calls `ImageOps.exif_transpose` on it), and the sRGB profile lcms makes is stamped
    with the time, which PNG crops then embedded (the same crop had other bytes, hence another
    hash, in every process)."""
    shown = _as_shown(image)
    for key in _SPENT_METADATA:
        shown.info.pop(key, None)
    return shown


_SPENT_METADATA = ("icc_profile", "exif", "xmp", "XML:com.adobe.xmp")
"""Metadata the decoded pixels no longer follow: the profile is applied, and the EXIF or XMP
orientation too (kept, `ImageOps.exif_transpose` of the result would turn it a second time)."""


_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""EXIF orientation -> the transposition that shows the image upright (as `ImageOps.exif_transpose`)."""


def _upright(image: Image.Image) -> Image.Image:
    """`image` turned as its EXIF orientation says (a new image), or `image` itself.

    Not `ImageOps.exif_transpose`: after turning the pixels it re-encodes the whole EXIF block,
    which raises (struct.error, TypeError, AttributeError, ...) on a tag whose type is not the
    standard's, as cameras and editors write, and the photo could not be read at all."""
    try:
        orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # noqa: BLE001 - any fault in the metadata (SyntaxError, struct.error, ...): pixels as stored
        return image
    method = _TRANSPOSE.get(orientation) if isinstance(orientation, int) else None
    return image.transpose(method) if method is not None else image


def _as_shown(image: Image.Image) -> Image.Image:
    image = _upright(image)
    icc = image.info.get("icc_profile")
    if image.mode.startswith("I;16") or (image.mode == "I" and _brightest(image) > 255):
        image = image.convert("I").point(lambda v: v / 256).convert("L")
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        rgb = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    elif image.mode in ("L", "CMYK") and (managed := _in_srgb(image, icc)) is not None:
        return managed
    else:
        rgb = image.convert("RGB")
    return _in_srgb(rgb, icc) or rgb


_PROFILE_SPACES = {"RGB": "RGB", "L": "GRAY", "CMYK": "CMYK"}


def _in_srgb(image: Image.Image, icc: Any) -> Image.Image | None:
    """`image` (RGB, L or CMYK) converted from the colour profile `icc` to sRGB (RGB), or None
    when `icc` is missing, unreadable or not of the image's colour space."""
    if ImageCms is None or not icc or not isinstance(icc, bytes) or image.mode not in _PROFILE_SPACES:
        return None
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        if profile.profile.xcolor_space.strip() != _PROFILE_SPACES[image.mode]:
            return None
        # A fresh sRGB profile per call (cheap): lcms profiles are not shared across decoding threads.
        return ImageCms.profileToProfile(image, profile, ImageCms.createProfile("sRGB"), outputMode="RGB")
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):  # a broken profile: the values as stored
        return None


def _brightest(image: Image.Image) -> float:
    extrema = image.getextrema()
    top = extrema[1]
    return float(top) if isinstance(top, (int, float)) else 0.0


def _decode(path: str) -> Image.Image:
    with Image.open(path) as im:
        im.load()
        return as_shown(im)


def load_image(path: Path) -> Image.Image:
    """The RGB image at `path`, decoded once per process (LRU); do not modify it.

    Raises:
        ImageRefError: the file is not a readable image.
    """
    st = path.stat()
    try:
        # mtime and size are part of the key so that a replaced file is decoded afresh.
        return _DECODED.get((str(path), st.st_mtime_ns, st.st_size), lambda: _decode(str(path)))
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageRefError(f"{path.name} is not a readable image ({_reason(exc)})") from None


@functools.lru_cache(maxsize=4096)
def _format_of(path: str, mtime_ns: int, size: int) -> str | None:
    try:
        with Image.open(path) as im:  # reads the header only
            kind: str | None = im.format
            return kind
    except (OSError, ValueError, Image.DecompressionBombError):
        return None  # decoding says what is wrong


def source_format(path: Path) -> str | None:
    """Pillow's name for the file's format (`"JPEG"`, `"PNG"`, ...), None if it is not an image;
    read from the header once per file version."""
    st = path.stat()
    return _format_of(str(path), st.st_mtime_ns, st.st_size)


REASON_CHARS = 200
"""Pillow's reason is kept in the message, cut to this many characters: enough for "image file is
truncated (43 bytes not processed)" or the decompression-bomb limit, one line in a log."""


def _reason(exc: BaseException) -> str:
    """`Type: message`, on one line and clipped: what Pillow says is wrong with the file."""
    from toolenv.cli import clip_line  # the CLI's error-line helper; imported when an image fails

    text = clip_line(str(exc), REASON_CHARS)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cache_clear() -> None:
    """Drop every cached decoded image (tests and benchmarks use this)."""
    _DECODED.clear()
    _format_of.cache_clear()
