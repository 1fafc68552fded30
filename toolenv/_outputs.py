"""Where an output file may be replaced whole, and where it must be written into.

An output is written beside itself and renamed over its name, so that a failed or killed write
leaves the previous file whole. That is wrong for what is not a regular file: renaming over
`/dev/null` or `/dev/stdout` (as root, in a container) replaces the device with a file, over a
FIFO leaves its reader waiting, and a descriptor the shell opened (`/dev/fd/1` onto `>> f`)
would lose what it appends to. Those are written into instead, as a shell's `>` does.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["in_system_folder", "is_stdout", "open_output", "written_in_place"]


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


@contextlib.contextmanager
def open_output(target: Path) -> Iterator[IO[str]]:
    """A text file to write `target` through, whole or not at all.

    A regular file (or a new one; its folders are made) is written under a hidden name beside
    it and renamed over it when the block ends without an error, through a symlink to the file
    it points to: a write that fails or is interrupted (a full disk, Ctrl-C) leaves the previous
    file as it was, and no temporary file behind; the new file has the old one's permissions.
    What `written_in_place` names is written into, in append mode, so that what a shell's `>>`
    opened keeps what it held.
    """
    if written_in_place(target):
        with target.open("a", encoding="utf-8") as fh:
            yield fh
        return
    real = Path(os.path.realpath(target))  # a symlink stays one: its file is replaced
    real.parent.mkdir(parents=True, exist_ok=True)
    try:  # the file replaced keeps its permissions (a `chmod 600` export stays private)
        mode = stat.S_IMODE(real.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666  # a new file: as `open` makes it, less the umask
    tmp = real.with_name(f".{real.name}.{uuid.uuid4().hex}.tmp")  # same folder: an atomic rename
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)  # private from its first byte
        if mode != 0o666:
            os.fchmod(fd, mode)  # exactly the old file's, whatever the umask
        with open(fd, "w", encoding="utf-8") as fh:
            yield fh
        tmp.replace(real)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def is_stdout(path: Path) -> bool:
    """Whether `path` is this process's stdout (`/dev/stdout`, `/dev/fd/1`): a command writing
    its output there prints what it says about it to stderr, not into the data."""
    try:
        return os.path.samestat(path.stat(), os.fstat(sys.stdout.fileno()))
    except (AttributeError, OSError, ValueError):  # no such file, or stdout is not a file
        return False
