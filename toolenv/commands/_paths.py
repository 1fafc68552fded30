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


def check_file(flag: str, out: Path, example: str) -> None:
    """Refuse an `out` that is a folder (`--out out/`, meaning "put it there"): opening it would say
    only `[Errno 21] Is a directory`, and only once the work is done.

    Raises:
        ValueError: `FLAG OUT is a folder: name the file to write, e.g. OUT/EXAMPLE`.
    """
    if out.is_dir():
        raise ValueError(f"{flag} {out} is a folder: name the file to write, e.g. {out / example}")
