"""A seccomp filter for the sandbox: system calls no test program needs, refused with EPERM.

Namespaces and rlimits already contain a program; this removes kernel surface it could
attack from inside: mounting, tracing other processes, new namespaces (``unshare``,
``setns``, namespace flags on ``clone``), keyrings, eBPF, perf events, userfaultfd,
io_uring, module loading, reboot/kexec, raw process-memory access. ``clone3`` answers
ENOSYS (its flags sit in memory a filter cannot read), so the C library falls back to
``clone``, whose flags are checked. Calls of another ABI (32-bit ``int 0x80``, x32) kill
the process: they would bypass the syscall numbers below.

Written as classic BPF for x86-64 (bubblewrap loads it with ``--seccomp FD``); on other
architectures :func:`filter_program` returns None and the sandbox runs without a filter.
"""

from __future__ import annotations

import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
EPERM, ENOSYS = 1, 38
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
CLONE_NEW_FLAGS = 0x10000000 | 0x00020000 | 0x40000000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x02000000 | 0x00000080
"""CLONE_NEWUSER | NEWNS | NEWNET | NEWUTS | NEWIPC | NEWPID | NEWCGROUP | NEWTIME."""

X86_64_DENIED = {
    "ptrace": 101,
    "syslog": 103,
    "uselib": 134,
    "modify_ldt": 154,
    "vhangup": 153,
    "pivot_root": 155,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
X86_64_CLONE, X86_64_CLONE3 = 56, 435


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter as ``struct sock_filter[]`` bytes, or None on an architecture without one."""
    if (machine or platform.machine()) not in ("x86_64", "AMD64"):
        return None
    prog = [
        _ins(LD_W_ABS, 4),  # seccomp_data.arch
        _ins(JEQ_K, AUDIT_ARCH_X86_64, jt=1),
        _ins(RET_K, RET_KILL_PROCESS),
        _ins(LD_W_ABS, 0),  # seccomp_data.nr
        _ins(JGE_K, X32_SYSCALL_BIT, jf=1),
        _ins(RET_K, RET_KILL_PROCESS),
        _ins(JEQ_K, X86_64_CLONE3, jf=1),
        _ins(RET_K, RET_ERRNO | ENOSYS),
    ]
    for nr in sorted(X86_64_DENIED.values()):
        prog += [_ins(JEQ_K, nr, jf=1), _ins(RET_K, RET_ERRNO | EPERM)]
    prog += [
        _ins(JEQ_K, X86_64_CLONE, jf=3),
        _ins(LD_W_ABS, 16),  # seccomp_data.args[0], low 32 bits: the clone flags
        _ins(JSET_K, CLONE_NEW_FLAGS, jf=1),
        _ins(RET_K, RET_ERRNO | EPERM),
        _ins(RET_K, RET_ALLOW),
    ]
    return b"".join(prog)
