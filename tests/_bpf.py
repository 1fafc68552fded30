"""A classic-BPF interpreter for the sandbox's seccomp filter (`_linux.socket_filter_program`):
what the kernel would return for one system call, without installing the filter."""

from __future__ import annotations

__all__ = ["run_filter"]


def run_filter(program: list[tuple[int, int, int, int]], arch: int, nr: int, *args: int) -> int:
    """What the kernel would return for one call: a classic-BPF interpreter for the few
    instructions the filter uses, over a little-endian `struct seccomp_data`."""
    data = nr.to_bytes(4, "little") + arch.to_bytes(4, "little") + bytes(8)
    data += b"".join(a.to_bytes(8, "little") for a in (*args, *[0] * (6 - len(args))))
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        pc += 1
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = int.from_bytes(data[k : k + 4], "little")
        elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            acc &= k
        elif code in (0x15, 0x35, 0x25):  # BPF_JMP | BPF_JEQ / BPF_JGE / BPF_JGT | BPF_K
            taken = acc == k if code == 0x15 else acc >= k if code == 0x35 else acc > k
            pc += jt if taken else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
