"""Checks of the paths a command writes, made before any work so that a mistake is one clear line."""

from __future__ import annotations

from pathlib import Path


def check_folder(flag: str, out: Path, folder: Path) -> None:
    """Refuse `folder` (to be made if missing) when it, or the nearest of its parents that exists,
    is a file: `mkdir` would say only `[Errno 17] File exists` or `[Errno 20] Not a directory`.

    Raises:
        ValueError: `FLAG OUT: FILE is a file, not a folder`.
    """
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                raise ValueError(f"{flag} {out}: {path} is a file, not a folder")
            return
