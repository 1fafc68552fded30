"""Sandboxed code cannot reach host daemons over unix sockets, but keeps `socketpair`.

A read-only mount does not stop a `connect` (or a datagram `sendto`) to a socket file the
code can reach by path, and the network namespace only separates abstract sockets. So a
server on the host listening on a world-writable socket outside /run (a database's under
/var/lib, an X server's, a project's under the work dir) would otherwise hear from model code.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _bpf import run_filter

from toolenv_code import isolation_report
from toolenv_code.sandbox import SandboxLimits, get_pool, run_code

FAST = SandboxLimits(timeout=5.0, cpu_seconds=5)
_SYS_IO_URING_SETUP = 425  # the same number on every architecture


def _seccomp_reason() -> str:
    """Why this kernel cannot filter system calls ('' if it can): the fix relies on seccomp."""
    if platform.machine() not in ("x86_64", "aarch64"):
        return f"the sandbox filters system calls on x86_64 and aarch64 only, not {platform.machine()}"
    with open("/proc/self/status", encoding="ascii") as fh:
        if not any(line.startswith("Seccomp:") for line in fh):
            return "this kernel has no seccomp (CONFIG_SECCOMP)"
    return ""


pytestmark = pytest.mark.skipif(bool(_seccomp_reason()), reason=_seccomp_reason() or "-")


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A world-accessible host directory the sandbox sees (not /tmp, /dev/shm or /run, nor a host
    folder outside the system: it covers those; the interpreter's prefix is bound back, read-only,
    and a socket file there is still reachable by path)."""
    for base in (sys.prefix, "/var/tmp", os.getcwd()):
        if os.access(base, os.W_OK | os.X_OK):
            path = Path(tempfile.mkdtemp(prefix="unix-", dir=base))
            break
    else:
        pytest.skip("no writable host directory outside /tmp to make a socket in")
    path.chmod(0o777)  # the sandbox's uid may walk it and connect: only the sandbox must stop it
    seen = run_code(f"import os\nprint(os.path.isdir({str(path)!r}))", FAST)
    if seen.stdout.strip() != "True":
        shutil.rmtree(path, ignore_errors=True)
        reason = f"the sandbox cannot see {path} ({seen.stdout.strip() or seen.stderr.strip()[-200:]})"
        print(reason)
        pytest.skip(reason)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class _Listener:
    """A unix stream server on the host, in a thread, recording every connection and what it sent."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)  # as PostgreSQL's or an X server's is: anyone may connect
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.got: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    self.got.append(conn.recv(100) or b"(connected)")

    def close(self) -> list[bytes]:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        return self.got


@contextlib.contextmanager
def _listening(address: str) -> Iterator[_Listener]:
    listener = _Listener(address)
    try:
        yield listener
    finally:
        listener.close()


def _datagrams(sock: socket.socket) -> list[bytes]:
    got = []
    sock.settimeout(0.5)
    with contextlib.suppress(OSError):
        while True:
            got.append(sock.recv(100))
    return got


_CONNECT = (
    "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({address!r})\ns.sendall(b'escaped')\nprint('sent')\n"
)


@pytest.mark.parametrize("where", ["run", "session"])
def test_a_host_unix_socket_outside_run_is_not_reachable(host_dir: Path, where: str) -> None:
    """A world-writable stream socket of a host daemon, in a host directory the sandbox sees."""
    path = str(host_dir / "daemon.sock")
    pool = get_pool()
    session = "unix-sockets" if where == "session" else None
    try:
        with _listening(path) as listener:
            r = pool.run(_CONNECT.format(address=path), FAST, session=session)
            got = listener.close()
    finally:
        if session:
            pool.close_session(session)
    assert got == [], f"the host's unix socket heard from sandboxed code: {got}"
    assert not r.ok and "sent" not in r.stdout
    assert "PermissionError" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "send",
    [
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ns.sendto(b'escaped', {path!r})",
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ns.connect({path!r})\ns.send(b'escaped')",
        # a datagram socketpair's end may be re-connected, or sent from, to any address
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.sendto(b'escaped', {path!r})",
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.connect({path!r})\na.send(b'escaped')",
        # SOCK_RAW is a datagram socket for AF_UNIX
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_RAW)\ns.sendto(b'escaped', {path!r})",
    ],
    ids=["sendto", "connect", "socketpair-sendto", "socketpair-connect", "raw"],
)
def test_a_host_datagram_socket_outside_run_gets_nothing(host_dir: Path, send: str) -> None:
    """A world-writable datagram socket (a syslog daemon's) takes no message from sandboxed code."""
    path = str(host_dir / "log.sock")
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        daemon.bind(path)
        os.chmod(path, 0o777)
        r = run_code("import socket\n" + send.format(path=path) + "\nprint('sent')\n", FAST)
        got = _datagrams(daemon)
    finally:
        daemon.close()
    assert got == [], f"the host's datagram socket got messages from sandboxed code: {got}"
    assert not r.ok and "sent" not in r.stdout
    assert "PermissionError" in r.stderr, r.stderr


def test_a_host_abstract_socket_is_not_reachable() -> None:
    """Abstract sockets live in the host's network namespace: sandboxed code must not reach one."""
    name = f"\0toolenv-host-{os.getpid()}"
    with _listening(name) as listener:
        r = run_code(_CONNECT.format(address=name), FAST)
        got = listener.close()
    assert got == [], f"the host's abstract socket heard from sandboxed code: {got}"
    assert not r.ok and "sent" not in r.stdout, r.stdout + r.stderr


_SOCKETPAIR = r"""
import asyncio, multiprocessing, os, socket
a, b = socket.socketpair()
a.sendall(b'stream')
print(b.recv(10).decode())
c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
c.send(b'packet')
print(d.recv(10).decode())
ours, theirs = multiprocessing.Pipe()  # a socketpair, used across a fork

def echo(conn):
    conn.send(conn.recv() * 2)

p = multiprocessing.Process(target=echo, args=(theirs,))
p.start()
ours.send(21)
print(ours.recv())
p.join()

async def main():  # the event loop wakes itself through a socketpair
    proc = await asyncio.create_subprocess_exec('echo', 'asyncio', stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode().strip()

print(asyncio.run(main()))
"""


@pytest.mark.parametrize("where", ["run", "session"])
def test_socketpair_multiprocessing_and_asyncio_keep_working(where: str) -> None:
    pool = get_pool()
    session = "socketpair" if where == "session" else None
    try:
        r = pool.run(_SOCKETPAIR, SandboxLimits(timeout=20.0, cpu_seconds=20), session=session)
    finally:
        if session:
            pool.close_session(session)
    assert r.ok, r.stderr
    assert r.stdout.split() == ["stream", "packet", "42", "asyncio"]


def _io_uring_setup_errno() -> int:
    """0 if `io_uring_setup` works in this process (the ring is closed at once), else its errno."""
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    fd = ctypes.CDLL(None, use_errno=True).syscall(_SYS_IO_URING_SETUP, ctypes.c_uint32(4), params)
    if fd < 0:
        return ctypes.get_errno()
    os.close(fd)
    return 0


def test_io_uring_is_refused() -> None:
    """io_uring makes sockets and connects them without the system calls a filter sees."""
    if _io_uring_setup_errno():
        pytest.skip(f"io_uring is off on this host: {os.strerror(_io_uring_setup_errno())}")
    probe = (
        "import ctypes, errno\n"
        "params = ctypes.create_string_buffer(120)\n"
        f"fd = ctypes.CDLL(None, use_errno=True).syscall({_SYS_IO_URING_SETUP}, ctypes.c_uint32(4), params)\n"
        "print(fd, errno.errorcode.get(ctypes.get_errno(), '') if fd < 0 else '')\n"
    )
    r = run_code(probe, FAST)
    assert r.ok, r.stderr
    fd, name = [*r.stdout.split(), ""][:2]
    assert int(fd) < 0 and name in ("EPERM", "EACCES"), r.stdout


def test_vsock_sockets_are_refused() -> None:
    """AF_VSOCK reaches the hypervisor and local vsock services, whatever the network namespace."""
    try:
        socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
    except (OSError, AttributeError) as exc:
        pytest.skip(f"this host cannot make vsock sockets: {exc}")
    r = run_code("import socket\nsocket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\nprint('made')", FAST)
    assert not r.ok and "made" not in r.stdout
    assert "PermissionError" in r.stderr, r.stderr


def test_the_isolation_report_says_unix_sockets_are_filtered() -> None:
    report = isolation_report()
    assert report.unix_sockets == "socketpair-only", report
    assert "unix_sockets=socketpair-only" in report.summary()
    assert json.loads(report.model_dump_json())["unix_sockets"] == "socketpair-only"
    assert get_pool().stats()[0]["isolation"]["unix_socket_filter"] is True


def test_a_refused_socket_is_a_permission_error_with_eacces() -> None:
    """The refusal reads like a permission problem (as socket(2) documents EACCES), not a crash."""
    code = "import socket\ntry:\n    socket.socket(socket.AF_UNIX)\nexcept OSError as e:\n    print(e.errno)"
    r = run_code(code, FAST)
    assert r.ok, r.stderr
    assert r.stdout.strip() == str(errno.EACCES)


_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_EACCES, _EPERM = 0x50000 | errno.EACCES, 0x50000 | errno.EPERM


@pytest.mark.parametrize(
    ("machine", "arch", "nr_socket", "nr_socketpair", "other_arch"),
    [("x86_64", 0xC000003E, 41, 53, 0x40000003), ("aarch64", 0xC00000B7, 198, 199, 0x40000028)],
)
def test_the_filter_decides_by_architecture_and_arguments(
    machine: str, arch: int, nr_socket: int, nr_socketpair: int, other_arch: int
) -> None:
    """Each architecture's program, run call by call (this host runs only its own in the kernel)."""
    from toolenv_code._linux import socket_filter_program

    program = socket_filter_program(machine)
    jumps = [(i, jt, jf) for i, (code, jt, jf, _) in enumerate(program) if code & 0x07 == 0x05]  # BPF_JMP
    assert jumps and all(i + 1 + max(jt, jf) < len(program) for i, jt, jf in jumps)  # each lands inside

    def verdict(nr: int, *args: int, audit_arch: int = arch) -> int:
        return run_filter(program, audit_arch, nr, *args)

    af_unix, af_inet, af_vsock = 1, 2, 40
    stream, dgram, raw, seqpacket, cloexec, nonblock = 1, 2, 3, 5, 0o2000000, 0o4000
    assert verdict(nr_socket, af_unix, stream) == _EACCES
    assert verdict(nr_socket, af_unix | 0xFFFF_FFFF_0000_0000, stream) == _EACCES  # an int: the kernel drops the top
    assert verdict(nr_socket, af_vsock, stream) == _EACCES
    assert verdict(nr_socket, af_inet, stream) == _ALLOW
    assert verdict(nr_socketpair, af_unix, stream | cloexec) == _ALLOW
    assert verdict(nr_socketpair, af_unix, seqpacket | nonblock) == _ALLOW
    assert verdict(nr_socketpair, af_unix, dgram) == _EACCES
    assert verdict(nr_socketpair, af_unix, raw | cloexec) == _EACCES
    assert verdict(425, 8, 0) == _EPERM  # io_uring_setup
    assert verdict(0) == _ALLOW and verdict(60) == _ALLOW  # read, and exit (x86_64) / others
    assert verdict(nr_socket, af_unix, audit_arch=other_arch) == _KILL  # 32-bit calls: i386 / arm
    other = 198 if machine == "x86_64" else 41  # the other architecture's socket number is another call here
    assert verdict(other, af_unix, stream) == _ALLOW
    if machine == "x86_64":
        assert verdict(0x40000000 | 41, af_unix, stream) == _EPERM  # the x32 ABI
