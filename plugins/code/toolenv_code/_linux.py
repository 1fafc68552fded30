"""The few Linux syscalls the sandbox needs that Python 3.11's `os` lacks.

`unshare`/`setns` arrived in `os` only in 3.12, and `mount`/`prctl` are not in the
standard library at all. The PyPI wrappers (python-prctl, pyroute2's netns helpers,
"unshare" packages) each cover one call, need a C toolchain or are unmaintained, so
a few ctypes calls into libc are the smaller, dependency-free choice.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any

__all__ = [
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "LANDLOCK_SCOPED_ABI",
    "MS_BIND",
    "MS_MOVE",
    "MS_NODEV",
    "MS_NOEXEC",
    "MS_NOSUID",
    "MS_PRIVATE",
    "MS_RDONLY",
    "MS_REC",
    "MS_REMOUNT",
    "clone_sibling",
    "fork_bare",
    "landlock_abi",
    "landlock_scope_abstract_sockets",
    "mount",
    "mount_bytes",
    "putenv_buffer",
    "set_child_subreaper",
    "set_no_new_privs",
    "setns",
    "unshare",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18

_PR_SET_NO_NEW_PRIVS = 38
_SYS_LANDLOCK_CREATE_RULESET = 444  # the same numbers on every architecture
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1
#: The first Landlock ABI with `scoped` (Linux 6.12).
LANDLOCK_SCOPED_ABI = 6
_PR_SET_CHILD_SUBREAPER = 36
_CLONE_PARENT = 0x00008000
_SYS_CLONE3 = 435  # the same number on every architecture

# The interpreter's own symbols include libc's. `ctypes.util.find_library` would import
# `subprocess` (and with it `threading`, whose at-fork hook then runs in every child).
_libc = ctypes.CDLL(None, use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
# Typed, so a call converts plain bytes, None and ints in C: no ctypes objects made per call
# (each object a forked child makes or touches costs it a page copy).
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_mount = _libc.mount


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """Move the calling process into new namespaces (`unshare(2)`)."""
    if hasattr(os, "unshare"):  # Python 3.12+
        os.unshare(flags)
        return
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    """Join the namespace open at `fd` (`setns(2)`)."""
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, nstype)
        return
    _check(_libc.setns(fd, nstype), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """`mount(2)`; raises OSError on failure."""
    mount_bytes(
        None if source is None else os.fsencode(source),
        os.fsencode(target),
        None if fstype is None else os.fsencode(fstype),
        flags,
        None if data is None else os.fsencode(data),
    )


def mount_bytes(source: bytes | None, target: bytes, fstype: bytes | None, flags: int, data: bytes | None) -> None:
    """`mount` with arguments already encoded: the lean form, for the children's hot path."""
    if _mount(source, target, fstype, flags, data) != 0:
        _check(-1, f"mount {os.fsdecode(target)}")


def putenv_buffer(buffer: ctypes.Array[ctypes.c_char]) -> None:
    """`putenv(3)` of a `NAME=value` buffer: the environment then points at `buffer` itself.

    Unlike `os.putenv` (`setenv`), nothing is copied, so rewriting the buffer in place
    changes the variable, and nothing accumulates in libc however often that is done
    (`setenv` keeps every value it was ever given). The caller keeps `buffer` alive.
    """
    _check(_libc.putenv(buffer), "putenv")


def set_child_subreaper() -> None:
    """Make orphaned descendants reparent to this process, so it can reap them."""
    _check(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")


def set_no_new_privs() -> None:
    """Make `execve` grant no privileges to this process and its descendants, for good.

    Set-uid/set-gid bits and file capabilities of executed programs are then ignored,
    so code running as an unprivileged uid cannot regain root through the host's `su`.
    """
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)  # the kernel wants the unused arguments 0, all 64 bits
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, one, zero, zero, zero), "prctl(PR_SET_NO_NEW_PRIVS)")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("handled_access_fs", "handled_access_net", "scoped")]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (disabled, or before Linux 5.13)."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))  # fmt: skip
    return max(int(abi), 0)


def landlock_scope_abstract_sockets() -> None:
    """Put this process in a Landlock domain of its own, scoped for abstract unix sockets.

    It and its descendants can then connect only to abstract sockets made inside the
    domain, not to those of processes outside it (other sandboxed runs, the host),
    which a shared network namespace would otherwise let them reach. Nothing else is
    restricted. Needs Landlock ABI 6 (Linux 6.12, see `landlock_abi`) and no_new_privs.
    """
    fd = _syscall(_SYS_LANDLOCK_CREATE_RULESET, *_LANDLOCK_RULESET)
    if fd < 0:
        _check(fd, "landlock_create_ruleset")
    try:
        _check(_syscall(_SYS_LANDLOCK_RESTRICT_SELF, fd, _UINT32_ZERO), "landlock_restrict_self")
    finally:
        os.close(fd)


_syscall = _libc.syscall
_UINT32_ZERO = ctypes.c_uint32(0)
_RULESET_ATTR = _RulesetAttr(scoped=_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET)
#: `landlock_create_ruleset`'s arguments, built once: every child makes the same call.
_LANDLOCK_RULESET = (ctypes.byref(_RULESET_ATTR), ctypes.c_size_t(ctypes.sizeof(_RULESET_ATTR)), _UINT32_ZERO)


class _CloneArgs(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls")
    ]


# PyDLL keeps the GIL held across the call, so the new process starts out owning it.
_clone3 = ctypes.PyDLL(None, use_errno=True).syscall


#: The arguments of each kind of clone, built once: the clones are on a hot path, and every
#: object touched after one (in a process whose memory is now shared with the new one) costs a page copy.
_CLONE_ARGS: dict[tuple[int, int], tuple[Any, ctypes.c_size_t]] = {}


def _clone(flags: int, exit_signal: int = 0) -> int:
    key = (flags, exit_signal)
    prepared = _CLONE_ARGS.get(key)
    if prepared is None:
        args = _CloneArgs(flags=flags, exit_signal=exit_signal)
        prepared = _CLONE_ARGS[key] = (ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    pid = int(_clone3(_SYS_CLONE3, *prepared))
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone3: {os.strerror(err)}")
    return pid


def clone_sibling(new_pid_ns: bool, namespaces: int = 0) -> int:
    """`clone3(CLONE_PARENT [| CLONE_NEWPID] | namespaces)`: fork a *sibling* (a child of our parent).

    Returns 0 in the new process and its pid in the caller, like `fork`. Unlike
    `os.fork`, no at-fork hooks run in the new process (it must reseed `random` itself).
    This lets a pristine helper process fork children that belong to the fork server,
    so the server itself never forks and its memory is never shared copy-on-write again.
    The new process starts in new namespaces of the `namespaces` kinds (`CLONE_NEWIPC`...).
    """
    return _clone(_CLONE_PARENT | (CLONE_NEWPID if new_pid_ns else 0) | namespaces)


def fork_bare() -> int:
    """`fork` as a bare `clone3`: like `clone_sibling`, no at-fork hooks run (in either process).

    For a single-threaded process that forks on a hot path and needs none of them.
    """
    return _clone(0, signal.SIGCHLD)
