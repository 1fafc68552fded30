"""Confinement of a fork server: namespaces and a read-only view of the host.

The server calls `setup_isolation` once at start. It moves into new mount and
network namespaces (as root; through a user namespace otherwise; not at all if
the kernel refuses both), lays a private tmpfs over /tmp (binding back, read-only,
the interpreter's own paths there, if it lives under /tmp), an empty one over /run
(local services' unix sockets: see `HIDDEN_RUN`), empty ones over the host's own folders
(every top-level folder of / outside the system, and the checkout the package is imported
from: see `host_covers`), binding back there only the interpreter's paths, and another over
the datasets shipped with this package (`data_dir`), and remounts every other mount read-only
and nosuid, so sandboxed code sees the system and the interpreter, not the host's files, and
can write only in its work directory.
It also sets no_new_privs (no program it executes gains privileges), then installs a
seccomp filter that keeps it and all it forks from making unix sockets, but connected pairs:
neither the read-only mounts nor the network namespace stop a `connect` to a host daemon's
socket file outside /run (see `_linux.socket_filter_program`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from toolenv_code import _linux

__all__ = [
    "BOUND",
    "PRIVATE_SHM",
    "PRIVATE_TMP",
    "SHM_OPTIONS",
    "SYSTEM_DIRS",
    "Isolation",
    "bind_back",
    "data_dir",
    "host_covers",
    "host_top_files",
    "open_hidden",
    "setup_isolation",
]

#: Mount points replaced inside the server's own mount namespace (never the host's).
PRIVATE_TMP = "/tmp"  # noqa: S108
PRIVATE_SHM = "/dev/shm"  # noqa: S108
#: The tmpfs on /dev/shm: the server's, and each child's own.
SHM_OPTIONS = "size=16m,mode=1777"
#: Where local services listen on unix sockets (PostgreSQL, D-Bus, Docker, a user's agents under
#: /run/user; /var/run links here): covered by an empty read-only tmpfs. Neither a read-only mount
#: nor the empty network namespace stops a `connect` to a socket file the code can reach by path.
HIDDEN_RUN = "/run"
#: The top-level folders of / that are the system, kept in view (read-only): programs, libraries
#: (the Nix and Guix stores hold them on those systems), /etc (locale, time zone, passwd), /dev,
#: /proc, /sys, and the private /tmp and covered /run. Every other top-level folder (/home, /root,
#: /work, /opt, /srv, /mnt, /media, /var, /boot...) is the host's own: covered (`host_covers`).
SYSTEM_DIRS = frozenset(
    {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sys", "tmp", "run", "nix", "gnu"}
)
#: In the fork server (and so in every child it forks): the interpreter's paths bound back over
#: the host covers, /tmp or /dev/shm by `setup_isolation`. `isolation_report`'s probe reads it
#: to tell a path the server meant to show from a host file left in view.
BOUND: list[str] = []
_MS_FLAGS = {"nosuid": _linux.MS_NOSUID, "nodev": _linux.MS_NODEV, "noexec": _linux.MS_NOEXEC}
_MS_ATIME = {"noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}


@dataclass
class Isolation:
    """What the server managed to set up at start (the client verifies it with a probe run)."""

    mount_ns: bool = False
    net_ns: bool = False
    user_ns: bool = False
    pid_ns: bool = False
    readonly_mounts: int = 0
    readonly_failures: list[str] = field(default_factory=list)
    uid_drop: bool = False
    workroot: str = ""
    private_tmp: bool = False
    #: A private tmpfs lies over /dev/shm (and each child lays one of its own over that, in a
    #: mount namespace of its own: see `_child._own_mounts`).
    private_shm: bool = False
    #: Each child gets an IPC namespace of its own (System V IPC objects die with it).
    child_ipc_ns: bool = False
    #: `execve` grants no privileges (set-uid bits, file capabilities) to the server and its children.
    no_new_privs: bool = False
    #: Each child is put in a Landlock domain of its own that cannot reach abstract unix
    #: sockets from outside it (the children share the server's network namespace).
    child_socket_scope: bool = False
    #: A seccomp filter refuses `socket(AF_UNIX)` (and AF_VSOCK, datagram socketpairs, io_uring)
    #: to the server and everything it forks: see `_linux.socket_filter_program`.
    unix_socket_filter: bool = False
    #: In a user namespace: a nested one (an open fd) every child joins, so that being root
    #: there gives no power over our mounts and namespaces; -1 if it could not be made.
    child_user_ns: int | None = None
    #: The interpreter's own paths under /tmp or /dev/shm (a venv made in `mktemp -d`), bound
    #: back read-only over the private tmpfs (and again by each child: see `bind_back`).
    exposed: list[str] = field(default_factory=list)
    #: The host folders covered by an empty tmpfs (see `host_covers`), and the files at the top
    #: of / covered by an empty file; the interpreter's paths below them are bound back (`bound_back`).
    host_covers: list[str] = field(default_factory=list)
    #: Every path bound back over a cover (/tmp, /dev/shm, /run or a host folder): the
    #: interpreter's own. `exposed` are those under /tmp and /dev/shm, which each child binds again.
    bound_back: list[str] = field(default_factory=list)
    #: No path of the server's reaches the datasets shipped with this package (`data_dir`) and
    #: with the other toolenv plugins (`plugin_data_dirs`): an empty read-only tmpfs lies over
    #: them, or a private one over a folder above them. Each child's mount namespace is a copy
    #: of the server's, so it is covered there too.
    hidden_data: bool = False


def _remount_readonly(iso: Isolation, skip: set[str], covered: Iterable[str] = ()) -> None:
    """Every mount read-only and nosuid but those in `skip`; those below `covered` (a tmpfs now
    lies over them, so no path reaches them) are left alone, but for the binds made back there
    (and the mounts inside those, which a recursive bind copies)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    seen: set[str] = set()
    for line in lines:
        parts = line.split()
        target = parts[4].encode().decode("unicode_escape")
        shown = target in iso.bound_back or _below(target, iso.bound_back)
        if target in skip or target in seen or (_below(target, covered) and not shown):
            continue
        seen.add(target)
        # nosuid too: no_new_privs already voids set-uid bits for the children; this is a second lock.
        flags = _linux.MS_REMOUNT | _linux.MS_BIND | _linux.MS_RDONLY | _linux.MS_NOSUID
        for opt in parts[5].split(","):
            flags |= _MS_FLAGS.get(opt, 0) | _MS_ATIME.get(opt, 0)
        try:
            _linux.mount(None, target, None, flags)
            iso.readonly_mounts += 1
        except OSError:
            iso.readonly_failures.append(target)


def _blocked_parents(paths: list[str]) -> dict[str, set[str]]:
    """Directories others may not traverse (e.g. /root, mode 0700) → their children on `paths`."""
    found: dict[str, set[str]] = {}
    for path in paths:
        parts = os.path.realpath(path).split(os.sep)[1:]
        parent = "/"
        for name in parts:
            if not name:
                break
            child = os.path.join(parent, name)
            with contextlib.suppress(OSError):
                if not os.stat(parent).st_mode & 0o001:
                    found.setdefault(parent, set()).add(child)
                    break
            parent = child
    return found


def _expose_interpreter(stash_root: str) -> list[str]:
    """Make the interpreter's own files reachable by the lower sandbox uid.

    When Python lives under a private directory (pyenv in /root), a tmpfs is laid over
    that directory in our mount namespace and only the needed subtrees are bound back,
    so the sandbox can import the standard library but sees nothing else there.
    """
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable), *sys.path]
    failures: list[str] = []
    for index, (parent, children) in enumerate(sorted(_blocked_parents([p for p in paths if p]).items())):
        try:
            stashes = []
            for j, child in enumerate(sorted(children)):
                stash = os.path.join(stash_root, f".expose-{index}-{j}")
                os.mkdir(stash, 0o700)
                _linux.mount(child, stash, None, _linux.MS_BIND | _linux.MS_REC)
                stashes.append((stash, child))
            _linux.mount("tmpfs", parent, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, "size=1m,mode=0755")
            for stash, child in stashes:
                os.mkdir(child, 0o755)
                _linux.mount(stash, child, None, _linux.MS_BIND | _linux.MS_REC)
        except OSError:
            failures.append(parent)
    return failures


def _below(path: str, roots: Iterable[str]) -> bool:
    return any(path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _as_written_and_resolved(paths: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        if path and os.path.isabs(path) and os.path.exists(path):
            found.update((os.path.normpath(path), os.path.realpath(path)))
    return found


def _interpreter_paths() -> set[str]:
    """The interpreter's paths, as written and as resolved: its prefixes and executable's
    directory, whole, and what can be imported from each `sys.path` entry outside them.

    An entry outside the prefixes may be a source checkout (a legacy editable install, or the
    folder above this package, which the fork server puts first on its path): shown whole, it
    would bring the checkout's `.git`, logs and data back in view (see `_importable_parts`).
    """
    exe = sys.executable
    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    prefixes += [os.path.dirname(exe), os.path.dirname(os.path.realpath(exe))] if exe else []
    found = _as_written_and_resolved(prefixes)
    whole = set(found)
    for entry in _as_written_and_resolved(sys.path):
        if entry in whole or _below(entry, whole):  # comes with its prefix (the stdlib, site-packages)
            found.add(entry)
        else:
            found.update(_importable_parts(entry))
    return found


def _is_module(folder: str, name: str) -> bool:
    """Whether `folder/name` is a module or a regular package (a folder with an `__init__`)."""
    path = os.path.join(folder, name)
    if not os.path.isdir(path):
        return _module_stem(name).isidentifier()
    try:
        inside = os.listdir(path) if name.isidentifier() else []
    except OSError:
        return False
    return any(_module_stem(child) == "__init__" for child in inside)


def _module_stem(name: str) -> str:
    """`name` without the longest import suffix it ends with (`.py`, `.cpython-311-...so`); "" if none."""
    import importlib.machinery  # loaded with the interpreter: no file is read

    for suffix in sorted(importlib.machinery.all_suffixes(), key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return ""


def _importable_parts(entry: str) -> list[str]:
    """What `import` can reach in the `sys.path` entry `entry`: the entry itself when it holds
    nothing else (bytecode caches aside), else its modules and regular packages, one by one.

    So a checkout root on `sys.path` comes back without its `.git`, logs, data or tests.
    Namespace packages (folders without `__init__`) there are left out: they cannot be told
    from a data folder. Another environment's site-packages (a `.pth` line) comes back whole:
    an install location, not a checkout, whose hundreds of packages would otherwise be as many
    mounts, each copied into every child's mount namespace.
    """
    if not os.path.isdir(entry) or os.path.basename(entry) in ("site-packages", "dist-packages"):  # or a zip file
        return [entry]
    try:
        names = sorted(os.listdir(entry))
    except OSError:
        return []
    modules = [name for name in names if _is_module(entry, name)]
    if len(modules) == len([name for name in names if name != "__pycache__"]):
        return [entry]
    return [os.path.join(entry, name) for name in modules]


def _interpreter_paths_hidden(hidden: tuple[str, ...]) -> list[str]:
    """The interpreter's paths (see `_interpreter_paths`) that lie strictly below a mount
    point in `hidden`, without those inside another one."""
    found = {path for path in _interpreter_paths() if _below(path, hidden)}
    kept: list[str] = []
    for path in sorted(found):  # a parent sorts before everything below it
        if not _below(path, kept):
            kept.append(path)
    return kept


def open_hidden(paths: list[str]) -> list[tuple[str, int]]:
    """`O_PATH` descriptors of `paths`, taken before a tmpfs covers them (see `bind_back`).

    A path that cannot be opened is left out (it stays hidden, as before).
    """
    opened = []
    for path in paths:
        with contextlib.suppress(OSError):
            opened.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
    return opened


def _make_parents(path: str) -> None:
    """Create the missing directories above `path`, mode 0755 whatever the umask (a lower uid walks them)."""
    parent = os.path.dirname(path)
    if os.path.isdir(parent):
        return
    _make_parents(parent)
    os.mkdir(parent)
    os.chmod(parent, 0o755)  # noqa: S103 - read-only (the tmpfs is remounted so), to be walked through


def bind_back(opened: list[tuple[str, int]]) -> list[str]:
    """Bind each `(path, O_PATH descriptor)` back at `path` over the tmpfs now covering it;
    close the descriptors. Returns the paths bound.

    A venv under /tmp (a CI clone in `mktemp -d`) would otherwise vanish, and with it the
    packages the code imports. Only these paths come back, none of their siblings; a
    bind made by the server is then remounted read-only (`_remount_readonly`), and a
    child's bind of it copies that flag.
    """
    bound = []
    for path, fd in opened:
        try:
            _make_parents(path)
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.mkdir(path)  # its mode does not matter: the bind covers it
            else:  # a zip file on `sys.path`
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
            _linux.mount(f"/proc/self/fd/{fd}", path, None, _linux.MS_BIND | _linux.MS_REC)
            bound.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return bound


def _enter_user_ns() -> None:
    uid, gid = os.getuid(), os.getgid()
    _linux.unshare(_linux.CLONE_NEWUSER | _linux.CLONE_NEWNS | _linux.CLONE_NEWNET)
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                       ("/proc/self/gid_map", f"0 {gid} 1")):  # fmt: skip
        with open(path, "w", encoding="ascii") as fh:
            fh.write(text)


def _nested_user_ns() -> int:
    """A user namespace inside ours, mapping its root to ours; an fd to join it with `setns`.

    The code runs as root of our user namespace otherwise, with every capability over the
    mount and network namespaces we confine it with: it could remount the host tree
    read-write or unmount the private /tmp. Root of a *nested* namespace owns none of them,
    and a mount namespace it makes itself gets our mounts locked as they are. Made while
    /proc is still writable (the maps are written through it).
    """
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(hold_w)
            _linux.unshare(_linux.CLONE_NEWUSER)
            os.write(ready_w, b"1")
            os.read(hold_r, 1)  # stay until the parent has the namespace
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("could not create a nested user namespace")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as fh:
                fh.write("0 0 1")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(hold_w)
        os.waitpid(pid, 0)


def _cover_run() -> bool:
    """Lay an empty tmpfs over `HIDDEN_RUN` (read-only once `_remount_readonly` has run).

    Not when it is missing or a link, nor when /tmp or /dev/shm lie below it (old systems
    link /dev/shm to /run/shm): those must stay reachable.
    """
    if not os.path.isdir(HIDDEN_RUN) or os.path.islink(HIDDEN_RUN):
        return False
    if _below(os.path.realpath(PRIVATE_TMP), [HIDDEN_RUN]) or _below(os.path.realpath(PRIVATE_SHM), [HIDDEN_RUN]):
        return False
    flags = _linux.MS_NOSUID | _linux.MS_NODEV | _linux.MS_NOEXEC
    try:
        _linux.mount("tmpfs", HIDDEN_RUN, "tmpfs", flags, "size=64k,mode=0755")
    except OSError:
        return False
    return True


def data_dir() -> str:
    """The datasets shipped with this package (HumanEval, MBPP: reference solutions and tests), resolved.

    Where the package is imported from: a checkout's `plugins/code/toolenv_code/data` for an
    editable install, site-packages' otherwise. Copies elsewhere on the host are not covered.
    """
    return os.path.join(os.path.dirname(os.path.realpath(__file__)), "data")


#: The entry-point groups of toolenv's plugins (`toolenv.registry.GROUPS`, not imported here:
#: the fork server stays free of the core's imports).
PLUGIN_GROUPS = ("toolenv.tools", "toolenv.envs", "toolenv.agents", "toolenv.oracles")


def plugin_data_dirs() -> list[str]:
    """The `data` folders of the packages that provide toolenv plugins, resolved, this
    package's aside (`data_dir`): their tasks' gold answers (Spider's queries, NQ's answers)
    are as much a reward hack as HumanEval's solutions where an env offers the python tool
    beside them. Found from the entry points' modules without importing them; a package
    installed in site-packages is otherwise bound back whole. Run by the client, which passes
    them to each fork server (`setup_isolation`'s `other_data`)."""
    import importlib.util
    from importlib import metadata

    own, found = data_dir(), []
    for group in PLUGIN_GROUPS:
        for ep in metadata.entry_points(group=group):
            top = ep.value.split(":")[0].split(".")[0].strip()
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                continue
            for folder in (spec.submodule_search_locations or []) if spec else []:
                path = os.path.join(os.path.realpath(folder), "data")
                if path != own and path not in found and os.path.isdir(path):
                    found.append(path)
    return found


def _checkout_root() -> str | None:
    """The version-controlled checkout this package is imported from (an editable install), if any."""
    folder = os.path.dirname(os.path.realpath(__file__))
    while folder != os.sep:
        if any(os.path.lexists(os.path.join(folder, name)) for name in (".git", ".hg", ".svn")):
            return folder
        folder = os.path.dirname(folder)
    return None


def _top_level() -> list[str]:
    """The entries of / outside `SYSTEM_DIRS`, but links: folders and files."""
    found = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(os.sep)):
            path = os.path.join(os.sep, name)
            if name not in SYSTEM_DIRS and not os.path.islink(path) and (os.path.isdir(path) or os.path.isfile(path)):
                found.append(path)
    return found


def host_top_files() -> list[str]:
    """The regular files at the top of / (a container's description of itself, an installer):
    each is covered by an empty file, as the folders there are by an empty tmpfs."""
    return [path for path in _top_level() if not os.path.isdir(path)]


def host_covers() -> list[str]:
    """The host folders to lay an empty tmpfs over: every top-level folder of / outside
    `SYSTEM_DIRS`, and the checkout the package is imported from where it lies in view
    otherwise (in /usr/src, say), resolved while the host's tree is in view.

    They hold what no code in the sandbox needs and much a policy could cheat with: homes and
    their caches, project checkouts with their `.git`, rollout logs (`runs/*/trajectories.jsonl`
    hold every task's answer), training data. A top-level link is left alone (its target is
    covered where it is a top-level folder). Not a folder that holds the private /tmp or
    /dev/shm (/tmp linked to /var/tmp), nor one that is itself an interpreter's path: those
    must stay reachable.
    """
    found = [path for path in _top_level() if os.path.isdir(path)]
    checkout = _checkout_root()
    if checkout and not _below(checkout, found) and checkout not in found:
        found.append(checkout)
    work = {os.path.realpath(PRIVATE_TMP), os.path.realpath(PRIVATE_SHM), os.path.realpath(HIDDEN_RUN)}
    interpreter = _interpreter_paths()
    return [path for path in found if not any(w == path or _below(w, [path]) for w in work) and path not in interpreter]


def _cover_host(paths: list[str]) -> tuple[list[str], list[str]]:
    """Lay an empty tmpfs (read-only once `_remount_readonly` has run) over each of `paths`;
    the ones covered, and those the kernel refused."""
    covered, failed = [], []
    for path in paths:
        try:
            _linux.mount("tmpfs", path, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, "size=1m,mode=0755")
            covered.append(path)
        except OSError:
            failed.append(path)
    return covered, failed


def _cover_files(paths: list[str]) -> tuple[list[str], list[str]]:
    """Bind an empty file (read-only once `_remount_readonly` has run) over each of `paths`;
    the ones covered, and those the kernel refused. The empty file is made on the private /tmp
    (already mounted) and unlinked at once: the binds keep it."""
    if not paths:
        return [], []
    empty = os.path.join(PRIVATE_TMP, ".toolenv-empty")
    os.close(os.open(empty, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o444))
    covered, failed = [], []
    try:
        for path in paths:
            try:
                _linux.mount(empty, path, None, _linux.MS_BIND)
                covered.append(path)
            except OSError:
                failed.append(path)
    finally:
        os.unlink(empty)
    return covered, failed


def _holds_kept_path(path: str) -> bool:
    """Whether `path` is, or lies above, one that must stay reachable: /tmp, /dev/shm (the
    work dirs) or one of the interpreter's paths (the code imports from them)."""
    kept = {os.path.realpath(PRIVATE_TMP), os.path.realpath(PRIVATE_SHM), *_interpreter_paths()}
    return any(k == path or _below(k, [path]) for k in kept)


def _cover_data(path: str) -> bool:
    """Lay an empty read-only tmpfs over the datasets at `path` (from `data_dir`, resolved while
    the host's tree was in view); whether no path reaches them now.

    Code that could read them would pass any task by running its reference solution (reward
    hacking). Called once /tmp, /dev/shm, /run and the host's folders are covered and the
    interpreter's paths bound back: the package (in a checkout, a CI clone under /tmp or
    site-packages) is then either hidden already or back in one of those binds, which this
    covers in turn (a child's recursive bind of it copies the cover).
    Made read-only at once, as `_remount_readonly` leaves alone a mount below /run.
    A symlink leading to `path` reaches the tmpfs; another mount of the same folder elsewhere
    (a second bind of the checkout) would not, nor would a hard link.
    """
    if not os.path.exists(path):  # below a private tmpfs now (or never shipped): nothing to read
        return True
    if not os.path.isdir(path) or _holds_kept_path(path):
        return False
    flags = _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV | _linux.MS_NOEXEC
    try:
        _linux.mount("tmpfs", path, "tmpfs", flags, "size=4k,mode=0755")
    except OSError:
        return False
    return not os.listdir(path)


def _mkdtemp() -> str:
    import tempfile  # only on this fallback path (see `_server._rmtree`)

    return tempfile.mkdtemp(prefix="toolenv-code-")


def setup_isolation(tmpfs_mb: int, uid_base: int, other_data: Iterable[str] = ()) -> Isolation:
    """Enter namespaces where the kernel allows it; fall back step by step where not.
    `other_data`: the other plugins' data folders to cover too (`plugin_data_dirs`, which the
    client finds: reading entry points would import `importlib.metadata`, `csv` and more into
    the server, and so into every run's interpreter)."""
    iso = Isolation()
    with contextlib.suppress(OSError):  # inherited by every child; nothing here needs exec's privileges
        _linux.set_no_new_privs()
        iso.no_new_privs = True
        iso.child_socket_scope = _linux.landlock_abi() >= _linux.LANDLOCK_SCOPED_ABI
    if iso.no_new_privs:  # seccomp asks for it (or CAP_SYS_ADMIN, which the children lack)
        with contextlib.suppress(OSError):
            iso.unix_socket_filter = _linux.install_socket_filter()
    try:
        _linux.unshare(_linux.CLONE_NEWNS | _linux.CLONE_NEWNET)
    except OSError:
        try:
            _enter_user_ns()
            iso.user_ns = True
        except OSError:
            iso.workroot = _mkdtemp()
            return iso
    iso.mount_ns = iso.net_ns = iso.child_ipc_ns = True
    if iso.user_ns:
        try:
            iso.child_user_ns = _nested_user_ns()
        except OSError:
            iso.child_user_ns = -1  # children refuse to run rather than run as our root
    data = data_dir()  # resolved while the host's tree is in view
    others = [path for path in other_data if path != data and os.path.isdir(path)]
    covers = host_covers()
    # Opened before they are covered.
    hidden = open_hidden(_interpreter_paths_hidden((PRIVATE_TMP, PRIVATE_SHM, HIDDEN_RUN, *covers)))
    try:
        _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
        _linux.mount("tmpfs", PRIVATE_TMP, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, f"size={tmpfs_mb}m,mode=0711")
        skip = {PRIVATE_TMP}
        if os.path.isdir(PRIVATE_SHM):
            with contextlib.suppress(OSError):
                _linux.mount("tmpfs", PRIVATE_SHM, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, SHM_OPTIONS)
                skip.add(PRIVATE_SHM)
                iso.private_shm = True
        iso.host_covers, failed = _cover_host(covers)
        files, failed_files = _cover_files(host_top_files())
        iso.host_covers += files
        iso.readonly_failures.extend(failed + failed_files)
        roots = skip | ({HIDDEN_RUN} if _cover_run() else set()) | set(iso.host_covers)
        covered = [pair for pair in hidden if _below(pair[0], roots)]
        hidden = [pair for pair in hidden if not _below(pair[0], roots)]
        iso.bound_back = bind_back(covered)
        iso.exposed = [path for path in iso.bound_back if _below(path, skip)]  # each child covers these again
        BOUND[:] = iso.bound_back
        if os.geteuid() == 0 and not iso.user_ns:
            iso.readonly_failures.extend(_expose_interpreter(PRIVATE_TMP))
        iso.hidden_data = all([_cover_data(path) for path in (data, *others)])  # over the binds just made
        _remount_readonly(iso, skip, roots - skip)
        iso.workroot = PRIVATE_TMP
        iso.private_tmp = True
        # Its working directory (the client's: a checkout, say) would still lead under the covers,
        # through /proc/<pid>/cwd and to every child until it changes directory.
        os.chdir(os.sep)
    except OSError:
        iso.workroot = _mkdtemp()
    finally:
        for _, fd in hidden:  # not covered after all
            os.close(fd)
    iso.uid_drop = uid_base > 0 and os.geteuid() == 0 and not iso.user_ns
    return iso
