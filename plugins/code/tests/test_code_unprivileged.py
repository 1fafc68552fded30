"""The sandbox run by an ordinary user, as on a laptop: no root, maybe a user namespace.

CI runs as root, where the fork server enters namespaces directly; this starts a
whole pool as uid 65534 instead. There the server may `unshare` a PID namespace but
not `setns` back, so it must notice that before forking, and the zygote gives every
run its own PID namespace with `clone3` instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _procs import NOBODY, as_nobody, skip_unless_nobody_can_run_us

MARK = "29.4217"  # `sleep 29.4217`: a background process of this test, findable in /proc
SESSION_MARK = "29.4218"  # the same, left behind by a stateful session

_SCRIPT = f"""
import json
from toolenv_code.sandbox import SandboxLimits, SandboxPool

pool = SandboxPool(size=1)
out = {{"prints": [pool.run(f"print({{i}})").stdout for i in range(6)]}}
out["pid"] = int(pool.run("import os; print(os.getpid())").stdout)
escape = (
    "import os, subprocess\\n"
    "if os.fork() == 0:\\n"
    "    os.setsid()\\n"
    "    subprocess.Popen(['sleep', '{MARK}'])\\n"
    "    os._exit(0)\\n"
    "print('left')\\n"
)
out["escape"] = pool.run(escape, SandboxLimits(timeout=5)).stdout
spin = pool.run("while True: pass", SandboxLimits(timeout=1, cpu_seconds=5))
out["spin"] = [spin.timed_out, spin.duration]
out["session"] = [pool.run(c, session="s").stdout for c in ("import os; x = os.getpid()", "print(x, os.getpid())")]
pool.run(escape.replace("{MARK}", "{SESSION_MARK}"), session="s")
pool.close_session("s")
out["after_close"] = pool.run("print('next')").stdout  # the close is carried out on this request
# Hostile: take the read-only host tree back (remount / read-write: MS_BIND | MS_REMOUNT),
# uncover the host's /tmp (MNT_DETACH).
remount = (
    "import ctypes, os\\n"
    "libc = ctypes.CDLL(None, use_errno=True)\\n"
    "os.chdir('/')\\n"
    "print(libc.mount(None, b'/', None, 4096 | 32, None), libc.umount2(b'/tmp', 2), libc.umount2(b'/dev/shm', 2))\\n"
)
out["remount"] = [pool.run(remount).stdout, pool.run(remount, session="t").stdout]
# /dev/shm: writable, but what a run or a session leaves there is gone for the next run.
leave = "open('/dev/shm/toolenv-leak-{{tag}}', 'w').write('answer'); print(os.listdir('/dev/shm'))"
out["shm_left"] = [
    pool.run("import os; " + leave.replace("{{tag}}", "run")).stdout,
    pool.run("import os; " + leave.replace("{{tag}}", "session"), session="shm").stdout,
]
out["shm_seen"] = [pool.run("import os; print(os.listdir('/dev/shm'))").stdout for _ in range(2)]
# /tmp: a run sees its own work dir there and nothing else (not a live session's), and cannot add to it;
# an interpreter that lives under /tmp (a CI clone's venv) is bound back there too.
tops = sorted({{p.split("/")[2] for p in pool.stats()[0]["isolation"]["exposed"] if p.startswith("/tmp/")}})
tmp = (
    "import os\\n"
    "try:\\n"
    "    open('/tmp/toolenv-leak', 'w')\\n"
    "except OSError:\\n"
    "    pass\\n"
    f"print(sorted(os.listdir('/tmp')) == sorted([os.path.basename(os.getcwd()), *{{tops!r}}]))\\n"
)
out["tmp"] = [pool.run(tmp, session="shm").stdout, pool.run(tmp).stdout]
pool.close_session("shm")
out["proc"] = pool.run("import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))").stdout
out["no_new_privs"] = pool.run("print([l.split()[1] for l in open('/proc/self/status') if 'NoNewPrivs' in l])").stdout
out["isolation"] = pool.stats()[0]["isolation"]
pool.close()
print(json.dumps(out))
"""


def _marked_sleeps(mark: str = MARK) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline == f"sleep\0{mark}\0".encode():
                found.append(int(entry.name))
    return found


def _proc_is_masked() -> bool:
    """Whether parts of /proc are mounted over (as in a container), which bars new /proc mounts in a user namespace."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return any(line.split()[4].startswith("/proc/") for line in mounts)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="starting the pool as another user needs root (CI runs as root)",
)
def test_the_sandbox_works_and_confines_for_an_unprivileged_user(tmp_path: Path) -> None:
    skip_unless_nobody_can_run_us(tmp_path)
    done = as_nobody([sys.executable, "-c", _SCRIPT], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["prints"] == [f"{i}\n" for i in range(6)]
    assert out["escape"] == "left\n"
    timed_out, duration = out["spin"]
    assert timed_out and duration >= 1.0  # the 1 s wall limit stopped it (the CPU limit would not say timed_out)
    assert out["session"][0] == "" and out["after_close"] == "next\n"
    if out["isolation"]["user_ns"]:  # the kernel let an ordinary user have namespaces
        assert out["pid"] == 1, "each run should be PID 1 of its own PID namespace"
        assert out["session"][1] == "2 2\n", "a session should be PID 2 of its own PID namespace"
        assert out["shm_left"] == ["['toolenv-leak-run']\n", "['toolenv-leak-session']\n"]
        assert out["shm_seen"] == ["[]\n", "[]\n"], "a run saw what an earlier run or a live session left in /dev/shm"
        assert out["tmp"] == ["True\n", "True\n"], "a run saw another's work dir in /tmp, or left a file there"
        if not _proc_is_masked():  # else the kernel refuses a user namespace a /proc of its own
            assert out["proc"] == "[1]\n", "a run saw processes outside its PID namespace in /proc"
    assert out["no_new_privs"] == "['1']\n", "set-uid programs could give the code privileges"
    # Root of its user namespace must not mean root over the mounts the fork server confined it with.
    assert out["remount"] == ["-1 -1 -1\n"] * 2, "sandboxed code could remount the host tree or unmount /tmp"
    for mark, what in ((MARK, "call"), (SESSION_MARK, "session")):
        deadline = time.monotonic() + 5
        while _marked_sleeps(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _marked_sleeps(mark), f"a background process outlived its {what}"


#: As root: a pool started by uid NOBODY in a user namespace that may create no other, so the
#: fork servers get no namespace at all (as for an ordinary user where the kernel refuses them).
_NO_NAMESPACES = f"""
import os, sys
from toolenv_code import _linux

program = sys.argv[1]
unshared_r, unshared_w = os.pipe()
mapped_r, mapped_w = os.pipe()
pid = os.fork()
if pid == 0:
    _linux.unshare(_linux.CLONE_NEWUSER)
    os.write(unshared_w, b"1")
    os.read(mapped_r, 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as fh:
        fh.write("0")
    os.setgroups([])
    os.setgid({NOBODY})
    os.setuid({NOBODY})
    os.execv(sys.executable, [sys.executable, "-c", program])
os.read(unshared_r, 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{{pid}}/{{name}}", "w") as fh:
        fh.write("0 0 1\\n{NOBODY} {NOBODY} 1\\n")
os.write(mapped_w, b"1")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


_REPORT = "import json, toolenv_code; print(json.dumps(toolenv_code.isolation_report().model_dump()))"


def _without_namespaces(program: str, tmp_path: Path) -> Any:
    """What `program` prints last (JSON), run by uid NOBODY where no namespace can be made."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("making a user namespace that allows no other needs root (CI runs as root)")
    skip_unless_nobody_can_run_us(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _NO_NAMESPACES, program], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_namespaces_the_report_says_the_code_runs_as_the_host_user(tmp_path: Path) -> None:
    """No namespace and no uid drop: the code runs as the user who started the pool, and can
    signal that user's processes (the trainer). The report must say `same-as-host`."""
    report = _without_namespaces(_REPORT, tmp_path)
    assert (report["network"], report["filesystem"], report["processes"]) == ("none", "none", "process-group")
    assert report["user"] == "same-as-host"


_LOCKED = """
import json, os
from toolenv_code.sandbox import SandboxPool

os.mkdir("outside", 0o755)
pool = SandboxPool(1)
code = (
    "import os\\n"
    "os.makedirs('d/e')\\n"
    "open('d/e/f', 'w').write('x')\\n"
    "os.chmod('d/e', 0o500)\\n"
    "os.chmod('d', 0)\\n"
    f"os.symlink({os.path.abspath('outside')!r}, 'link')\\n"
    "print(os.getcwd())\\n"
)
workdir = pool.run(code).stdout.strip()
pool.run("pass")  # the last run's work dir is removed before the next starts
after_run = os.path.exists(workdir)
pool.close()
out = [after_run, os.path.exists(os.path.dirname(workdir)), oct(os.stat("outside").st_mode & 0o777)]
print(json.dumps(out))
"""


def test_without_namespaces_a_work_dir_the_code_locked_is_removed_all_the_same(tmp_path: Path) -> None:
    """There the work dirs lie in the host's /tmp, owned by the user the code runs as: a
    directory it made unreadable (`chmod 0`) must not stay behind, run after run."""
    assert _without_namespaces(_LOCKED, tmp_path) == [False, False, "0o755"]
