"""Sandboxed code gets no kernel keyring: `add_key`, `keyctl` and `request_key` are refused.

A uid's keyrings belong to the uid, not to a run's namespaces, and outlive the run, the pool
and the episode: through them one sample could leave its solution for the next (reward hacking
between GRPO samples and epochs). The seccomp filter refuses the three calls, as Docker's
default profile does.
"""

from __future__ import annotations

import errno
import json
import platform

import pytest
from _bpf import run_filter

from toolenv_code.sandbox import SandboxLimits, SandboxPool

#: `uname -m` → the numbers of add_key, request_key and keyctl.
KEY_CALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}
NEEDS_FILTER = pytest.mark.skipif(
    platform.machine() not in KEY_CALLS, reason="the sandbox filters system calls on x86_64 and aarch64 only"
)

ALLOW, EPERM = 0x7FFF0000, 0x50000 | errno.EPERM


_KEYS = r"""
import ctypes, json, platform
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[platform.machine()]
USER_KEYRING, SESSION_KEYRING, USER_SESSION_KEYRING = -4, -3, -5
GET_KEYRING_ID, UNLINK, SEARCH, READ, JOIN_SESSION = 0, 9, 10, 11, 1
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ret = libc.syscall(nr, *args)
    return [ret, ctypes.get_errno() if ret < 0 else 0]
out = {}
if STORE:
    out["add_key"] = call(ADD_KEY, b"user", DESC, b"stashed answer", 14, USER_KEYRING)
    out["add_key_session"] = call(ADD_KEY, b"user", DESC, b"stashed answer", 14, SESSION_KEYRING)
    out["join_session"] = call(KEYCTL, JOIN_SESSION, None)
    out["get_keyring"] = call(KEYCTL, GET_KEYRING_ID, USER_KEYRING, 0)
    out["request_key"] = call(REQUEST_KEY, b"user", DESC, None, 0)
else:  # a later run: what is left, then clean up whatever an unfiltered kernel kept
    for name, ring in (("search", USER_KEYRING), ("search_user_session", USER_SESSION_KEYRING)):
        found = out[name] = call(KEYCTL, SEARCH, ring, b"user", DESC, 0)
        if found[0] > 0:
            buf = ctypes.create_string_buffer(64)
            size = libc.syscall(KEYCTL, READ, found[0], buf, 64)
            out[name + "_read"] = buf.raw[:max(size, 0)].decode()
            call(KEYCTL, UNLINK, found[0], ring)
print(json.dumps(out))
"""


def _run(pool: SandboxPool, store: bool) -> dict[str, list[int]]:
    code = f"DESC, STORE = {b'toolenv-test-keyring'!r}, {store!r}\n" + _KEYS
    result = pool.run(code, SandboxLimits(timeout=10, cpu_seconds=5))
    assert result.ok, result.stderr[-2000:]
    out: dict[str, list[int]] = json.loads(result.stdout)
    return out


@NEEDS_FILTER
def test_keyring_calls_fail_and_nothing_persists_between_runs() -> None:
    pool = SandboxPool(size=1)  # one server: both runs share its uid, and so its user keyring
    try:
        isolation = pool.stats()[0]["isolation"]
        if not isolation["unix_socket_filter"]:
            pytest.skip("no seccomp filter could be installed here")
        stored = _run(pool, store=True)
        later = _run(pool, store=False)  # reads and removes what an unfiltered run left
    finally:
        pool.close()
    assert all(value == [-1, errno.EPERM] for value in stored.values()), stored
    assert later == {"search": [-1, errno.EPERM], "search_user_session": [-1, errno.EPERM]}, later


@pytest.mark.parametrize("machine", sorted(KEY_CALLS))
def test_the_filter_refuses_the_keyring_calls_on_each_architecture(machine: str) -> None:
    from toolenv_code._linux import _SECCOMP_ARCHES, socket_filter_program

    program = socket_filter_program(machine)
    arch = _SECCOMP_ARCHES[machine][0]
    for nr in KEY_CALLS[machine]:
        assert run_filter(program, arch, nr, 0, 0) == EPERM, (machine, nr)
    assert run_filter(program, arch, KEY_CALLS[machine][0] - 1, 0, 0) == ALLOW  # the call just before stays
