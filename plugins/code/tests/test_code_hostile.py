"""Hostile code fails with an error observation and leaves the host unchanged."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolenv_code.sandbox import SandboxLimits, get_pool, run_code

FAST = SandboxLimits(timeout=2.0, cpu_seconds=2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def loopback_server() -> Iterator[int]:
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"secret")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    assert hits == []  # the sandbox never reached it


@pytest.fixture
def outside_dir(tmp_path: Path) -> Iterator[Path]:
    """A host directory outside /tmp (the sandbox lays its own tmpfs over /tmp)."""
    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else tmp_path
    path = Path(tempfile.mkdtemp(prefix="toolenv-code-test-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("where", ["outside", "tmp"])
def test_write_outside_workdir_fails(where: str, outside_dir: Path, tmp_path: Path) -> None:
    folder = outside_dir if where == "outside" else tmp_path
    target = folder / "victim.txt"
    target.write_text("original")
    folder.chmod(0o777)  # permissions allow it: only the sandbox's read-only mounts stop the writes
    target.chmod(0o666)
    fresh = folder / "created.txt"
    for code in (
        f"open({str(target)!r}, 'w').write('pwned')",
        f"open({str(fresh)!r}, 'w').write('x')",
        f"import os; os.remove({str(target)!r})",
        f"import shutil; shutil.rmtree({str(folder)!r})",
    ):
        r = run_code(code)
        assert not r.ok, code
        assert "Error" in r.stderr
    assert target.read_text() == "original" and not fresh.exists()
    if where == "outside" and os.geteuid() == 0:
        # Hidden (an empty tmpfs lies over the host's folders outside the system) or read-only.
        stderr = run_code(f"open({str(target)!r}, 'a')").stderr
        assert "Read-only file system" in stderr or "No such file or directory" in stderr


def test_network_to_loopback_server_fails(loopback_server: int) -> None:
    code = (
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://127.0.0.1:{loopback_server}/x', timeout=1).read())\n"
    )
    r = run_code(code, FAST)
    assert not r.ok and "secret" not in r.stdout
    assert "URLError" in r.stderr or "unreachable" in r.stderr or "refused" in r.stderr


@pytest.mark.skipif(not os.access("/run", os.W_OK), reason="needs to make a socket in the host's /run")
def test_a_host_service_s_unix_socket_under_run_is_not_reachable() -> None:
    """Local services listen on unix sockets under /run (/var/run): PostgreSQL's, D-Bus's, Docker's,
    a user's agents under /run/user. A read-only mount does not stop a connect to one (nor does
    the empty network namespace), so the sandbox must not see them at all."""
    from toolenv_code.sandbox import SandboxPool

    path = f"/run/toolenv-test-{os.getpid()}.sock"
    server = socket.socket(socket.AF_UNIX)
    got: list[bytes] = []
    try:
        server.bind(path)
        os.chmod(path, 0o777)  # as PostgreSQL's is: anyone may connect
        server.listen(1)
        server.settimeout(3)

        def accept() -> None:
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                got.append(conn.recv(100))
                conn.close()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        pool = SandboxPool(size=1)  # servers started now: the socket is there when they mount
        try:
            code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\ns.sendall(b'escaped')\n"
            r = pool.run(code, FAST)
            assert pool.run("import os\nprint(os.path.isdir('/var/run'))", FAST).ok  # the directory is there
            # The file itself is hidden (where no seccomp filter refuses the socket, that is all that stops it).
            seen = pool.run(f"import os\nprint(os.path.exists({path!r}))", FAST)
        finally:
            pool.close()
        thread.join(4)
        assert got == [] and not r.ok and seen.stdout == "False\n", r.stdout + r.stderr + seen.stderr
        assert "FileNotFoundError" in r.stderr or "PermissionError" in r.stderr, r.stderr
    finally:
        server.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


def test_fork_bomb_is_contained() -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_code(code, SandboxLimits(timeout=1.0, cpu_seconds=2, max_processes=16))
    assert not r.ok
    assert run_code("print('still fine')").stdout == "still fine\n"


def test_memory_bomb_fails() -> None:
    r = run_code("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))\n", FAST)
    assert not r.ok and ("MemoryError" in r.stderr or r.signal is not None)
    r2 = run_code("x = bytearray(8 * 1024 ** 3)")
    assert "MemoryError" in r2.stderr


def test_cpu_spin_times_out() -> None:
    start = time.monotonic()
    r = run_code("while True:\n    pass\n", SandboxLimits(timeout=0.5, cpu_seconds=30))
    assert r.timed_out and time.monotonic() - start < 5


def test_killing_the_parent_does_not_work() -> None:
    pool = get_pool()
    before = {s["pid"] for s in pool.stats()}
    r = run_code("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('survived')")
    assert "survived" in r.stdout or not r.ok
    for pid in before:  # try the real server pids too: invisible from the sandbox's PID namespace
        r = run_code(f"import os, signal\nos.kill({pid}, signal.SIGKILL)")
        assert not r.ok and ("ProcessLookupError" in r.stderr or "PermissionError" in r.stderr)
    assert {s["pid"] for s in pool.stats()} == before
    assert all(_alive(pid) for pid in before) and _alive(os.getpid())


def test_filling_the_disk_hits_fsize_limit() -> None:
    code = "with open('big.bin', 'wb') as f:\n    for _ in range(200):\n        f.write(b'x' * 1024 * 1024)\n"
    r = run_code(code, SandboxLimits(file_size_mb=4))
    assert not r.ok and "File too large" in r.stderr


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.append(int(entry))
    return found


def test_background_processes_are_killed() -> None:
    marker = "4242.123"
    code = (
        "import os, subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'])\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"  # escape the process group: the PID namespace still catches it
        f"    os.execvp('sleep', ['sleep', '{marker}1'])\n"
        "print('spawned')\n"
    )
    r = run_code(code)
    assert r.stdout == "spawned\n"
    deadline = time.monotonic() + 3
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(marker) == []


def test_protocol_pipes_are_not_reachable() -> None:
    r = run_code("import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))")
    assert r.ok and r.stdout.strip() in ("[0, 1, 2]", "[0, 1, 2, 3]")  # 3 = the listdir handle itself


def test_a_live_session_s_dev_shm_is_not_shared_with_a_concurrent_run() -> None:
    """A session (one episode) and a run on the same server (another) cannot pass files through /dev/shm."""
    from toolenv_code.sandbox import SandboxPool

    leave = "import os\nopen('/dev/shm/toolenv-live', 'w').write('answer')\nos.chmod('/dev/shm/toolenv-live', 0o666)\n"
    look = "import os\nprint(os.listdir('/dev/shm'))"
    pool = SandboxPool(size=1)  # one server: the session and the run are its children together
    try:
        assert pool.run(leave, session="live").ok
        assert pool.run(look, session="live").stdout == "['toolenv-live']\n"
        assert pool.run(look).stdout == "[]\n"
    finally:
        pool.close()


def _host_ipc_ids(key: int) -> dict[str, int]:
    """The host's System V IPC objects with `key` ("shm"/"msg"/"sem" → id)."""
    found = {}
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}", encoding="ascii") as fh:
            for line in fh.read().splitlines()[1:]:
                fields = line.split()
                if int(fields[0]) == key:
                    found[kind] = int(fields[1])
    return found


def test_system_v_ipc_objects_die_with_the_run() -> None:
    """Shared memory, message queues and semaphores are the run's own: not the host's, not the next run's."""
    import ctypes

    key = 0x7E570000 + os.getpid() % 0xFFFF
    make = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"print(libc.shmget({key}, 1 << 20, 0o1666) >= 0, libc.msgget({key}, 0o1666) >= 0,"
        f" libc.semget({key}, 1, 0o1666) >= 0)\n"
    )
    look = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"print(libc.shmget({key}, 0, 0), libc.msgget({key}, 0), libc.semget({key}, 0, 0))\n"
    )
    made = run_code(make)
    leaked = _host_ipc_ids(key)
    later = run_code(look)
    libc = ctypes.CDLL(None, use_errno=True)
    remove = {"shm": libc.shmctl, "msg": libc.msgctl, "sem": libc.semctl}
    for kind, ident in leaked.items():  # IPC_RMID what the old code left on this host
        remove[kind](ident, 0, None)
    assert made.stdout == "True True True\n", made.stderr
    assert leaked == {}, "the run's IPC objects outlived it in the host's IPC namespace"
    assert later.stdout == "-1 -1 -1\n", "the next run saw the previous run's IPC objects"


def test_dev_shm_keeps_nothing_from_an_earlier_run_or_session() -> None:
    """/dev/shm is writable (POSIX shared memory needs it) but holds nothing a run or session left."""
    pool = get_pool()
    leave = (
        "import os\n"
        "open(f'/dev/shm/toolenv-leak-{tag}', 'w').write('answer')\n"
        "os.mkdir(f'/dev/shm/toolenv-leakdir-{tag}')\n"
        "open(f'/dev/shm/toolenv-leakdir-{tag}/f', 'w').write('answer')\n"
    )
    look = "import os\nprint(sorted(n for n in os.listdir('/dev/shm') if n.startswith('toolenv-leak')))"
    assert run_code(leave.replace("{tag}", "run")).ok
    assert pool.run(leave.replace("{tag}", "session"), session="shm-leak").ok
    pool.close_session("shm-leak")
    for _ in range(pool.size):  # every server (the session's carries its close out on its next request)
        seen = run_code(look)
        assert seen.ok and seen.stdout == "[]\n", seen.stdout


def _set_uid_root_program() -> str | None:
    """A set-uid-root program of the host that prompts for a password (so it stays alive), if any."""
    for path in ("/usr/bin/su", "/bin/su"):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if st.st_mode & stat.S_ISUID and st.st_uid == 0:
                return path
    return None


def test_set_uid_programs_give_no_privileges() -> None:
    """The code can exec the host's set-uid programs, but they run with the code's own uid, not root's."""
    r = run_code("print([l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')])")
    assert r.stdout == "['1']\n", r.stdout + r.stderr
    program = _set_uid_root_program()
    if program is None or os.geteuid() != 0:  # run as root, the code has a uid of its own to lose
        return
    code = (
        "import os, subprocess\n"
        f"p = subprocess.Popen([{program!r}, '-c', 'true'], stdin=subprocess.PIPE,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
        "p.stderr.read(9)\n"  # its password prompt: it runs, with whatever identity exec gave it
        "me = os.readlink('/proc/self')\n"
        "kid = open(f'/proc/{me}/task/{me}/children').read().split()[0]\n"
        "print(*[l.split()[1:3] for l in open(f'/proc/{kid}/status') if l.startswith('Uid')][0])\n"
        "p.kill()\n"
    )
    r = run_code(code, FAST)
    assert r.ok, r.stderr  # the program was still waiting for a password when its identity was read
    real, effective = r.stdout.split()
    assert real != "0" and effective == real, f"{program} ran with euid {effective} in the sandbox"


def _landlock_scopes_sockets() -> bool:
    """Whether the kernel's Landlock can scope abstract unix sockets (ABI 6, Linux 6.12)."""
    import ctypes

    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION): the ABI version (444 on every arch)
    abi = ctypes.CDLL(None, use_errno=True).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return bool(abi >= 6)


@pytest.mark.skipif(not _landlock_scopes_sockets(), reason="needs Landlock ABI 6 (Linux 6.12) for socket scopes")
def test_a_session_and_a_concurrent_run_cannot_talk_over_an_abstract_socket() -> None:
    """Children of one fork server share its network namespace, where abstract unix sockets live:
    a session (one episode) must not serve data to a run of another episode on the same server."""
    from toolenv_code.sandbox import SandboxPool

    name = f"\0toolenv-leak-{os.getpid()}"
    listen = (
        "import socket, threading\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.bind({name!r})\n"
        "s.listen()\n"
        "def serve():\n"
        "    while True:\n"
        "        c, _ = s.accept()\n"
        "        c.sendall(b'from episode A')\n"
        "        c.close()\n"
        "threading.Thread(target=serve, daemon=True).start()\n"
    )
    connect = f"import socket\nc = socket.socket(socket.AF_UNIX)\nc.connect({name!r})\nprint(c.recv(100))\n"
    pool = SandboxPool(size=1)  # one server: the session and the run are its children together
    try:
        if pool.stats()[0]["isolation"].get("unix_socket_filter"):
            # No unix socket can be made at all (see test_code_unix_sockets.py): the channel is closed that way.
            for r in (pool.run(listen, session="A"), pool.run(connect)):
                assert not r.ok and "PermissionError" in r.stderr, r.stdout + r.stderr
            return
        assert pool.run(listen, session="A").ok
        assert pool.run(connect, session="A").stdout == "b'from episode A'\n"  # the session itself may
        r = pool.run(connect)
        assert "from episode A" not in r.stdout and "PermissionError" in r.stderr, r.stdout + r.stderr
        # A run keeps abstract sockets between its own processes.
        own = (
            "import socket, os\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.bind('\\0own')\n"
            "s.listen()\n"
            "if os.fork() == 0:\n"
            "    c = socket.socket(socket.AF_UNIX)\n"
            "    c.connect('\\0own')\n"
            "    c.sendall(b'mine')\n"
            "    os._exit(0)\n"
            "print(s.accept()[0].recv(10))\n"
        )
        assert pool.run(own).stdout == "b'mine'\n"
    finally:
        pool.close()


def test_proc_shows_the_run_s_own_processes_not_the_host_s() -> None:
    """/proc belongs to the run's PID namespace: no host command lines (which can carry secrets),
    no other run's, and `/proc/<os.getpid()>` is the code's own process."""
    code = (
        "import os\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(pids, os.readlink('/proc/self') == str(os.getpid()))\n"
    )
    pool = get_pool()
    assert run_code(code).stdout == "[1] True\n"  # a one-shot run's code is PID 1
    try:
        assert pool.run(code, session="proc").stdout == "[1, 2] True\n"  # a session's init and code
    finally:
        pool.close_session("proc")
