"""What the sandbox really enforces, measured from inside a sandboxed run.

`isolation_report()` does not trust the setup code's intentions: it runs a probe
through the pool and reports what the probe observed (network interfaces it can see,
whether / is writable, whether it has a PID namespace of its own, its uid, whether it
may make a unix socket, whether it can list the datasets shipped with this package, whether
it sees the host's own files, the rlimits in force). `toolenv doctor` prints it.
"""

from __future__ import annotations

import json
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from toolenv_code.sandbox import SandboxPool, get_pool

__all__ = ["IsolationReport", "isolation_report"]

_PROBE = r"""
import json, os, resource
out = {}
try:
    with open("/proc/net/dev") as fh:
        out["interfaces"] = sorted(l.split(":")[0].strip() for l in fh.read().splitlines()[2:])
except OSError:
    out["interfaces"] = None
out["root_readonly"] = bool(os.statvfs("/").f_flag & os.ST_RDONLY)
with open("/proc/self/status") as fh:
    nspid = [l.split()[1:] for l in fh if l.startswith("NSpid:")]
# A PID namespace of the run's own: the code is PID 2 there (under an init), or /proc (the
# host's, where a private one could not be mounted) shows it with pids in more than one.
out["pid_ns"] = os.getpid() <= 2 or bool(nspid and len(nspid[0]) > 1)
out["uid"] = os.getuid()
import socket
try:  # a host daemon's socket file outside /run is reachable by path unless this is refused
    socket.socket(socket.AF_UNIX).close()
    out["unix_sockets"] = "open"
except PermissionError:
    out["unix_sockets"] = "socketpair-only"
try:  # `DATA`: the bundled datasets' folder (see `_probe`); an empty one is the sandbox's cover
    out["datasets"] = "visible" if os.listdir(DATA) else "hidden"
except OSError:
    out["datasets"] = "hidden"
# `HOST`: the host folders the server should have covered, and `GIT` the package's checkout
# (see `_probe`). Only the interpreter's paths the server bound back there (`_confine.BOUND`, in
# its memory, which this child shares) and the folders leading to them may show.
import sys
confine = sys.modules.get("toolenv_code._confine")
bound = list(getattr(confine, "BOUND", []))
def _left_in_view(folder, depth=0):
    if os.path.isfile(folder):  # a file at the top of /: covered by an empty one
        return [folder] if os.path.getsize(folder) else []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    left = []
    for name in names:
        path = os.path.join(folder, name)
        if path in bound:
            continue
        if depth < 16 and any(b.startswith(path + "/") for b in bound):
            left += _left_in_view(path, depth + 1)
        else:
            left.append(path)
    return left
seen_host = [path for folder in HOST for path in _left_in_view(folder)]
seen_host += [GIT] if GIT and os.path.lexists(GIT) else []
out["host_files"] = "visible" if seen_host else "hidden"
out["host_seen"] = seen_host[:20]
out["limits"] = {}
for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE"):
    soft = resource.getrlimit(getattr(resource, name))[0]
    out["limits"][name] = None if soft == resource.RLIM_INFINITY else soft
print(json.dumps(out))
"""


def _probe() -> str:
    """`_PROBE`, given the path of the bundled datasets as this process resolves it (the
    fork servers import the same package: see `sandbox._Server`), the host folders they
    should cover and the `.git` of the checkout the package is imported from, if any."""
    from toolenv_code import _confine  # here: `_linux` loads libc, which other platforms lack

    checkout = _confine._checkout_root()
    git = os.path.join(checkout, ".git") if checkout and os.path.lexists(os.path.join(checkout, ".git")) else ""
    host = _confine.host_covers() + _confine.host_top_files()
    return f"DATA, HOST, GIT = {_confine.data_dir()!r}, {host!r}, {git!r}\n{_PROBE}"


class IsolationReport(BaseModel):
    """The isolation in force for sandboxed code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    network: Literal["namespace", "none"] = Field(
        description="`namespace`: an empty network namespace (no interface up); `none`: the host network."
    )
    filesystem: Literal["readonly-root", "none"] = Field(
        description="`readonly-root`: the host tree is mounted read-only, writes go to a private tmpfs."
    )
    processes: Literal["pid-namespace", "process-group"] = Field(
        description="How leftover processes are killed: with their own PID namespace, or by process group."
    )
    user: Literal["unprivileged-uid", "user-namespace", "same-as-host"] = Field(
        description="The identity the code runs as: a uid of its own, root of a user namespace (your uid "
        "outside), or the uid that started the pool (which can signal your processes)."
    )
    unix_sockets: Literal["socketpair-only", "open"] = Field(
        description="`socketpair-only`: the code cannot make a unix socket (a seccomp filter refuses it; "
        "connected pairs stay), so it cannot connect to a host daemon's socket file; `open`: it can, "
        "to any socket file it can see that its uid may write."
    )
    datasets: Literal["hidden", "visible"] = Field(
        description="`hidden`: the code cannot list the datasets shipped with toolenv_code (HumanEval, MBPP, "
        "with their reference solutions); `visible`: it can, and so could pass any of their tasks by running "
        "the reference solution (no mount namespace to hide them in)."
    )
    host_files: Literal["hidden", "visible"] = Field(
        description="`hidden`: the code sees the system (/usr, /etc...) and the interpreter's own paths, "
        "not the host's own folders (homes, checkouts and their `.git`, rollout logs, training data: "
        "every top-level folder outside the system); `visible`: it sees some of them (no mount namespace)."
    )
    rlimits: list[str] = Field(description="Resource limits in force (names of `resource.RLIMIT_*`).")
    limits: dict[str, int | None] = Field(description="The rlimit values seen by the probe (soft limits).")
    fork_servers: int = Field(description="Warm fork servers in the pool.")

    def summary(self) -> str:
        """One line for `toolenv doctor`."""
        return (
            f"network={self.network} filesystem={self.filesystem} processes={self.processes} "
            f"user={self.user} unix_sockets={self.unix_sockets} datasets={self.datasets} host_files={self.host_files} "
            f"rlimits={','.join(r.removeprefix('RLIMIT_') for r in self.rlimits)}"
        )


def isolation_report(pool: SandboxPool | None = None) -> IsolationReport:
    """Run a probe in the sandbox and report what it could and could not do.

    Raises:
        RuntimeError: the probe itself failed (the message carries its stderr).
    """
    pool = pool or get_pool()
    result = pool.run(_probe())
    if not result.ok:
        raise RuntimeError(f"isolation probe failed: {result.error or result.stderr.strip()[-500:]}")
    seen = json.loads(result.stdout)
    setup = pool.stats()[0].get("isolation", {})
    # Only a loopback interface visible means a network namespace of our own: nothing routes out.
    isolated_net = seen["interfaces"] is not None and set(seen["interfaces"]) <= {"lo"}
    # The servers run as this process's uid: code seen with it (root, or an ordinary user
    # without namespaces) can signal the host's processes, whatever that uid is.
    user: Literal["unprivileged-uid", "user-namespace", "same-as-host"] = "unprivileged-uid"
    if seen["uid"] == 0 and setup.get("user_ns"):
        user = "user-namespace"
    elif seen["uid"] == os.getuid():
        user = "same-as-host"
    limits = seen["limits"]
    return IsolationReport(
        network="namespace" if isolated_net else "none",
        filesystem="readonly-root" if seen["root_readonly"] else "none",
        processes="pid-namespace" if seen["pid_ns"] else "process-group",
        user=user,
        unix_sockets=seen["unix_sockets"],
        datasets=seen["datasets"],
        host_files=seen["host_files"],
        rlimits=[k for k, v in limits.items() if v is not None],
        limits=limits,
        fork_servers=pool.size,
    )


def doctor_report() -> dict[str, object]:
    """`toolenv doctor`'s section for the sandbox: the isolation level actually in force."""
    report = isolation_report()
    return {"isolation": report.summary(), **report.model_dump()}
