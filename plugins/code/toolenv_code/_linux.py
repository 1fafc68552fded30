"""The few Linux syscalls the sandbox needs that Python 3.11's `os` lacks.

`unshare`/`setns` arrived in `os` only in 3.12, and `mount`/`prctl` are not in the
standard library at all. The PyPI wrappers (python-prctl, pyroute2's netns helpers,
"unshare" packages) each cover one call, need a C toolchain or are unmaintained, so
a few ctypes calls into libc are the smaller, dependency-free choice.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
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
    "install_socket_filter",
    "landlock_abi",
    "landlock_scope_abstract_sockets",
    "mount",
    "mount_bytes",
    "putenv_buffer",
    "set_child_subreaper",
    "set_no_new_privs",
    "setns",
    "socket_filter_program",
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


# -- seccomp: unix and vsock sockets
#
# A minimal BPF program through `prctl(PR_SET_SECCOMP)`: the PyPI bindings need libseccomp
# (pyseccomp: ctypes over it, unreleased since 2021; libseccomp's own: a C extension built
# against the system library), while this filter is a dozen instructions on two numbers.
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_LD_ABS_W, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, ALU|AND|K
_AF_UNIX, _AF_VSOCK = 1, 40
_SOCK_STREAM, _SOCK_SEQPACKET, _SOCK_TYPE_MASK = 1, 5, 0xF
_X32_SYSCALL_BIT = 0x40000000
_SYS_IO_URING_SETUP = 425  # the same number on every architecture
#: `uname -m` → (AUDIT_ARCH_*, socket, socketpair, (add_key, request_key, keyctl)): the filter must
#: check the architecture first, as the same number names another call in another ABI (32-bit calls
#: on a 64-bit kernel).
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 41, 53, (248, 249, 250)),
    "aarch64": (0xC00000B7, 198, 199, (217, 218, 219)),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _arg_low(index: int) -> int:
    """Offset in `struct seccomp_data` of the low 32 bits of argument `index` (an `int` argument)."""
    return 16 + 8 * index + (4 if sys.byteorder == "big" else 0)


#: An instruction: (code, where to go if true, where if false, k). A target is a label's name,
#: or None for the next instruction; a label is a bare string before the instruction it names.
_Insn = tuple[int, str | None, str | None, int]


def _assemble(program: list[_Insn | str]) -> list[tuple[int, int, int, int]]:
    """Resolve labels into BPF's forward jump counts (from the instruction after the jump)."""
    labels: dict[str, int] = {}
    insns: list[_Insn] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)

    def offset(target: str | None, at: int) -> int:
        return 0 if target is None else labels[target] - at - 1

    return [(code, offset(jt, at), offset(jf, at), k) for at, (code, jt, jf, k) in enumerate(insns)]


def socket_filter_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions, for `uname -m` = `machine`.

    Refused, with EACCES (as socket(2) documents a denied type): `socket(AF_UNIX)` and
    `socket(AF_VSOCK)`, whose addresses the network namespace does not confine, and a
    `socketpair` of a datagram type (SOCK_RAW is one for AF_UNIX): its ends may be connected,
    or sent from, to any socket file. Stream and seqpacket pairs stay (already connected,
    they cannot be pointed elsewhere): `multiprocessing.Pipe` and asyncio's loop use them.
    With EPERM: `io_uring_setup`, as a ring makes and connects sockets without these calls;
    the kernel keyring calls (`add_key`, `request_key`, `keyctl`, as Docker's default profile
    does): a uid's keyrings are not confined by any namespace and outlive the run, so one run
    could leave data there for a later one (another episode's sample); on x86_64, the x32 ABI's
    calls. A call of another ABI (32-bit code) kills the process.
    """
    arch, nr_socket, nr_socketpair, (nr_add_key, nr_request_key, nr_keyctl) = _SECCOMP_ARCHES[machine]
    x32: list[_Insn | str] = [(_JGE, "refuse", None, _X32_SYSCALL_BIT)] if machine == "x86_64" else []
    return _assemble([
        (_LD_ABS_W, None, None, 4),  # struct seccomp_data.arch
        (_JEQ, None, "kill", arch),
        (_LD_ABS_W, None, None, 0),  # .nr
        *x32,
        (_JEQ, "family", None, nr_socket),
        (_JEQ, "type", None, nr_socketpair),
        (_JEQ, "refuse", None, _SYS_IO_URING_SETUP),
        (_JEQ, "refuse", None, nr_add_key),
        (_JEQ, "refuse", None, nr_request_key),
        (_JEQ, "refuse", "allow", nr_keyctl),
        "family",  # socket(family, type, protocol)
        (_LD_ABS_W, None, None, _arg_low(0)),
        (_JEQ, "deny", None, _AF_UNIX),
        (_JEQ, "deny", "allow", _AF_VSOCK),
        "type",  # socketpair(family, type, protocol, sv)
        (_LD_ABS_W, None, None, _arg_low(1)),
        (_AND, None, None, _SOCK_TYPE_MASK),  # without SOCK_NONBLOCK and SOCK_CLOEXEC
        (_JEQ, "allow", None, _SOCK_STREAM),
        (_JEQ, "allow", "deny", _SOCK_SEQPACKET),
        "allow",
        (_RET, None, None, _RET_ALLOW),
        "deny",
        (_RET, None, None, _RET_ERRNO | errno.EACCES),
        "refuse",
        (_RET, None, None, _RET_ERRNO | errno.EPERM),
        "kill",
        (_RET, None, None, _RET_KILL_PROCESS),
    ])  # fmt: skip


def install_socket_filter() -> bool:
    """Install `socket_filter_program` for this process and all it forks, for good.

    Returns False, changing nothing, on an architecture it does not know. Needs no_new_privs
    (see `set_no_new_privs`) or CAP_SYS_ADMIN; raises OSError where the kernel refuses.
    """
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCHES:
        return False
    insns = socket_filter_program(machine)
    array = (_SockFilter * len(insns))(*(_SockFilter(*insn) for insn in insns))
    prog = _SockFprog(len(insns), array)
    zero = ctypes.c_ulong(0)
    _check(_libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog), zero, zero),
           "prctl(PR_SET_SECCOMP)")  # fmt: skip
    return True
