"""Where an output file may be replaced whole, and where it must be written into.

An output is written beside itself and renamed over its name, so that a failed or killed write
leaves the previous file whole. That is wrong for what is not a regular file: renaming over
`/dev/null` or `/dev/stdout` (as root, in a container) replaces the device with a file, over a
FIFO leaves its reader waiting, and a descriptor the shell opened (`/dev/fd/1` onto `>> f`)
would lose what it appends to. Those are written into instead, as a shell's `>` does.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["in_system_folder", "written_in_place"]


def in_system_folder(target: Path) -> bool:
    """Whether `target` is a device or a descriptor (/dev/null, /dev/stdout, /dev/fd/N, /proc/self/fd/N)."""
    return Path(os.path.realpath(target.parent)).parts[1:2] in (("dev",), ("proc",))


def written_in_place(target: Path) -> bool:
    """Whether `target` is written into rather than replaced: it exists and is not a regular file
    (a FIFO, /dev/null; a directory too, whose opening is then the error), or it is a descriptor
    the shell opened (/dev/stdout, /dev/fd/N), even onto a regular file."""
    try:
        if not stat.S_ISREG(target.stat().st_mode):
            return True
    except OSError:  # not there yet
        return False
    return in_system_folder(target)
