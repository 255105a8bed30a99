"""The seccomp filter every bwrap sandbox runs under: a deny list compiled to classic BPF here.

bwrap's `--seccomp FD` loads the compiled program (an array of `struct sock_filter`) just before it
executes the command, so it binds the command and everything it starts, and nothing in the sandbox
can remove it (filters only stack; bwrap sets `no_new_privs`). A deny list, not an allow list: the
sandbox runs interpreters, compilers and test runners whose syscall needs are broad and version
dependent, and an allow list that misses one turns honest code into a mysterious failure. Denied:
the kernel attack surface and the escape tools a test never needs (tracing and cross-process
memory, namespaces and mounts, bpf/keyrings/perf/userfaultfd/io_uring and similar subsystems,
POSIX message queues, which a batch cannot clean, terminal injection, host administration; the
list is `DENIED` below and the table in docs/design/sandbox.md). Denied calls fail with EPERM
(clone3: ENOSYS, so libc falls back to clone, whose flags a filter can read); a call of another
ABI (x32) or architecture kills the process. Tables for x86_64 and aarch64; elsewhere
`build_filter` returns None and bwrap.py runs without a filter, saying so in `detail`.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000

# struct seccomp_data offsets: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little endian).
OFFSET_NR = 0
OFFSET_ARCH = 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (and CLONE_NEWTIME, 0x80)
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
X32_SYSCALL_BIT = 0x40000000

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "fanotify_init",
    "open_by_handle_at", "name_to_handle_at",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog", "lookup_dcookie", "nfsservctl",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "vhangup", "uselib", "iopl", "ioperm",
    "mq_open",  # POSIX message queues outlive a process and nothing in a batch could see or clean them
)


class Arch:
    """One architecture's audit id and syscall numbers (from the kernel's unistd headers)."""

    def __init__(self, audit: int, numbers: dict[str, int], x32: bool = False) -> None:
        self.audit, self.numbers, self.x32 = audit, numbers, x32


ARCHES = {
    "x86_64": Arch(0xC000003E, {
        "ioctl": 16, "clone": 56, "clone3": 435, "ptrace": 101, "syslog": 103, "uselib": 134,
        "vhangup": 153, "pivot_root": 155, "adjtimex": 159, "chroot": 161, "acct": 163,
        "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
        "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
        "nfsservctl": 180, "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246, "add_key": 248,
        "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298, "fanotify_init": 300,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
        "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "pidfd_getfd": 438, "mount_setattr": 442, "mq_open": 240,
    }, x32=True),
    "aarch64": Arch(0xC00000B7, {
        "ioctl": 29, "clone": 220, "clone3": 435, "ptrace": 117, "syslog": 116, "vhangup": 58,
        "pivot_root": 41, "adjtimex": 171, "chroot": 51, "acct": 89, "settimeofday": 170, "mount": 40,
        "umount2": 39, "swapon": 224, "swapoff": 225, "reboot": 142, "init_module": 105,
        "delete_module": 106, "quotactl": 60, "nfsservctl": 42, "lookup_dcookie": 18, "clock_settime": 112,
        "kexec_load": 104, "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97,
        "perf_event_open": 241, "fanotify_init": 262, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "finit_module": 273, "kexec_file_load": 294, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_getfd": 438, "mount_setattr": 442, "mq_open": 180,
    }),
}


class _Program:
    """A forward-only cBPF program with symbolic jump targets, resolved by `assemble`."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def op(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.code.append((code, jt, jf, k))

    def assemble(self) -> bytes:
        out = bytearray()
        for at, (code, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                if isinstance(target, str):
                    offset = self.labels[target] - at - 1
                    if not 0 <= offset <= 255:
                        raise ValueError(f"seccomp jump to {target} out of range ({offset})")
                    offsets.append(offset)
                else:
                    offsets.append(target)
            out += struct.pack("=HBBI", code, offsets[0], offsets[1], k)
        return bytes(out)


def build_filter(machine: str | None = None) -> bytes | None:
    """The compiled filter for `machine` (default: this host's), or None for an unknown one."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    nr = arch.numbers
    p = _Program()
    p.op(LD_W_ABS, OFFSET_ARCH)
    p.op(JEQ_K, arch.audit, 0, "kill")
    p.op(LD_W_ABS, OFFSET_NR)
    if arch.x32:
        p.op(JGE_K, X32_SYSCALL_BIT, "kill", 0)
    for name in DENIED:
        if name in nr:
            p.op(JEQ_K, nr[name], "eperm", 0)
    p.op(JEQ_K, nr["clone3"], "enosys", 0)
    p.op(JEQ_K, nr["clone"], "clone", 0)
    p.op(JEQ_K, nr["ioctl"], "ioctl", 0)
    p.op(RET_K, RET_ALLOW)
    p.label("clone")  # flags are the first argument on both architectures
    p.op(LD_W_ABS, _arg_low(0))
    p.op(JSET_K, CLONE_NAMESPACE_FLAGS, "eperm", 0)
    p.op(RET_K, RET_ALLOW)
    p.label("ioctl")  # the request is a 32-bit value in the second argument
    p.op(LD_W_ABS, _arg_low(1))
    p.op(JEQ_K, TIOCSTI, "eperm", 0)
    p.op(JEQ_K, TIOCLINUX, "eperm", 0)
    p.op(RET_K, RET_ALLOW)
    p.label("eperm")
    p.op(RET_K, RET_ERRNO | errno.EPERM)
    p.label("enosys")
    p.op(RET_K, RET_ERRNO | errno.ENOSYS)
    p.label("kill")
    p.op(RET_K, RET_KILL_PROCESS)
    return p.assemble()


def filter_fd(program: bytes) -> int:
    """A readable fd holding `program` (for `bwrap --seccomp FD`): an unlinked memfd, rewound."""
    fd = os.memfd_create("tidal-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
