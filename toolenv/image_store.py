"""`ImageStore`: images of trajectories kept as files, once each, beside `trajectories.jsonl`.

Inline, every image is base64 in its JSON line: a VisualSearch episode is ~90 KB, and the
same prompt image is written again for every sample of a task. With a store, a line
holds `{"file": "<sha256>.png", ...}` and the bytes live in `images/` under their hash,
so an image shared by many turns or samples is written once.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

__all__ = ["IMAGES_DIR", "IMAGE_STORE", "ImageStore"]

#: The serialization/validation context key under which `ToolImage` looks for a store.
IMAGE_STORE = "toolenv_image_store"
#: The store's folder, beside the `trajectories.jsonl` whose lines refer to it.
IMAGES_DIR = "images"

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)  # no newline translation on Windows
_NAME = re.compile(r"[0-9a-f]{64}\.(png|jpg|webp|gif|bin)")


class ImageStore:
    """A directory of images named by the SHA-256 of their bytes."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self._written: set[str] = set()

    def put(self, data: bytes, mime: str) -> str:
        """Store `data` (once) and return its file name, relative to the store."""
        name = f"{hashlib.sha256(data).hexdigest()}.{_EXTENSIONS.get(mime, 'bin')}"
        if name in self._written:
            return name
        path = self.dir / name
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            # Written whole then renamed, so a run killed mid-write leaves no torn image. Made as
            # `open` makes a file (0666 less the umask), as readable as the trajectories beside it;
            # `tempfile.mkstemp` made every image 0600, unreadable to anyone else.
            tmp = self.dir / f".tmp-{uuid.uuid4().hex}"
            try:
                with open(os.open(tmp, _FLAGS, 0o666), "wb") as fh:
                    fh.write(data)
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        self._written.add(name)
        return name

    def clear(self) -> int:
        """Delete the store's own files (hash-named images, torn temporary files), nothing else
        a user may have put in the folder; returns how many. For a run started afresh."""
        if not self.dir.is_dir():
            return 0
        gone = 0
        for path in self.dir.iterdir():
            if _NAME.fullmatch(path.name) or path.name.startswith(".tmp-"):
                path.unlink(missing_ok=True)
                gone += 1
        self._written.clear()
        return gone

    def get(self, name: str) -> bytes:
        """The bytes of a stored image.

        Raises:
            ValueError: `name` is not a store file name (no paths: a line cannot point
                outside the store), or the file is missing.
        """
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"not an image store file name: {str(name)[:80]!r}")
        try:
            return (self.dir / name).read_bytes()
        except FileNotFoundError:
            raise ValueError(f"image file {name} is missing from {self.dir}") from None
