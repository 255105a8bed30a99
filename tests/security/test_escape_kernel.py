"""Escape probes: the kernel's attack surface, through raw syscalls (x86_64 numbers).

Without capabilities, mount, raw namespaces without a user namespace, bpf and kernel modules are
refused by the kernel. What a capability-less process may still do (a nested user namespace,
ptrace of its own children, keyrings, perf events on itself, userfaultfd, io_uring, TIOCSTI on its
own terminal) is refused by the seccomp filter (src/tidal/sandbox/seccomp.py) with EPERM (clone3:
ENOSYS, so libc falls back to clone). docs/security.md says which layer stops each probe.
"""

from __future__ import annotations

import platform

import pytest
from escape_probes import ProbeRunner, probe_output

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the probes use x86_64 syscall numbers")

CLONE_NEWUSER = 0x10000000
SIGCHLD = 17


def test_mount_and_root_changes_are_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        os.mkdir("m")
        _libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        def libc_call(function, *args):
            ctypes.set_errno(0)
            return "ok" if function(*args) == 0 else errname(ctypes.get_errno())
        report(mount=libc_call(_libc.mount, b"none", b"/workspace/m", b"tmpfs", 0, None),
               bind=libc_call(_libc.mount, b"/", b"/workspace/m", None, 0x1000, None),  # MS_BIND
               remount=libc_call(_libc.mount, None, b"/usr", None, 0x20 | 0x1000, None),  # MS_REMOUNT|MS_BIND, rw
               umount=libc_call(_libc.umount2, b"/usr", 2), chroot=attempt(os.chroot, "/workspace"))
    """)
    out = probe_output(result)
    assert out == {"mount": "EPERM", "bind": "EPERM", "remount": "EPERM", "umount": "EPERM", "chroot": "EPERM"}


def test_namespaces_without_a_user_namespace_are_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        flags = {"mnt": 0x20000, "uts": 0x04000000, "ipc": 0x08000000, "net": 0x40000000,
                 "pid": 0x20000000, "cgroup": 0x02000000}
        outcomes = {name: syscall("unshare", flag) for name, flag in flags.items()}
        own_net = os.open("/proc/self/ns/net", os.O_RDONLY)
        outcomes["setns"] = syscall("setns", own_net, 0)
        report(**outcomes)
    """)
    out = probe_output(result)
    assert set(out.values()) == {"EPERM"}, out


def test_nested_user_namespace_is_denied(probe: ProbeRunner) -> None:
    # A user namespace gives a full capability set inside it: mount, netfilter, more kernel surface.
    result = probe.run(f"""
        unshared = syscall("unshare", {CLONE_NEWUSER})
        report(unshare=unshared, mount_ns=syscall("unshare", 0x20000) if unshared == 0 else None)
    """)
    assert probe_output(result)["unshare"] == "EPERM"


def test_clone_with_namespace_flags_is_denied(probe: ProbeRunner) -> None:
    result = probe.run(f"""
        child = syscall("clone", {CLONE_NEWUSER | SIGCHLD}, 0, 0, 0, 0)
        if child == 0:
            os._exit(0)  # the child, in a new user namespace
        if isinstance(child, int):
            os.waitpid(child, 0)
        report(clone=child if isinstance(child, str) else "created")
    """)
    assert probe_output(result) == {"clone": "EPERM"}


def test_clone3_is_enosys(probe: ProbeRunner) -> None:
    # clone3's flags live in memory a filter cannot read: the whole call is refused, with ENOSYS so
    # that libc falls back to clone (checked above).
    result = probe.run("""
        report(clone3=syscall("clone3", 0, 0), fork=attempt(lambda: os.waitpid(os.fork() or os._exit(0), 0)))
    """)
    assert probe_output(result) == {"clone3": "ENOSYS", "fork": "ok"}


def test_ptrace_of_a_child_is_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        import signal, time
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        attach = syscall("ptrace", 16, child, 0, 0)  # PTRACE_ATTACH
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        reader, writer = os.pipe()
        traced = os.fork()
        if traced == 0:
            os.write(writer, str(syscall("ptrace", 0, 0, 0, 0)).encode())  # PTRACE_TRACEME
            os._exit(0)
        os.waitpid(traced, 0)
        report(attach=attach, traceme=os.read(reader, 100).decode())
    """)
    assert probe_output(result) == {"attach": "EPERM", "traceme": "EPERM"}


def test_process_vm_readv_of_a_child_is_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        import signal, time
        secret = ctypes.create_string_buffer(b"child memory")
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        out = ctypes.create_string_buffer(12)
        local = (ctypes.c_void_p * 2)(ctypes.addressof(out), 12)
        remote = (ctypes.c_void_p * 2)(ctypes.addressof(secret), 12)
        outcome = syscall("process_vm_readv", child, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
        os.kill(child, signal.SIGKILL)
        report(readv=outcome)
    """)
    assert probe_output(result) == {"readv": "EPERM"}


def test_keyrings_are_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        user, name, payload = (ctypes.create_string_buffer(b) for b in (b"user", b"tidal-probe", b"x"))
        report(keyctl=syscall("keyctl", 0, -3, 1),  # KEYCTL_GET_KEYRING_ID, session keyring, create
               join=syscall("keyctl", 1, 0),  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
               add_key=syscall("add_key", ctypes.addressof(user), ctypes.addressof(name), ctypes.addressof(payload), 1, -2),
               request_key=syscall("request_key", ctypes.addressof(user), ctypes.addressof(name), 0, 0))
    """)
    out = probe_output(result)
    assert out == {"keyctl": "EPERM", "join": "EPERM", "add_key": "EPERM", "request_key": "EPERM"}


def test_bpf_is_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        import struct
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("IIII", attr, 0, 2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY, key 4, value 4, 1 entry
        map_create = syscall("bpf", 0, ctypes.addressof(attr), 128)
        program = ctypes.create_string_buffer(struct.pack("BBhi", 0xB7, 0, 0, 0) + struct.pack("BBhi", 0x95, 0, 0, 0))
        license = ctypes.create_string_buffer(b"GPL")
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("IIQQ", attr, 0, 1, 2, ctypes.addressof(program), ctypes.addressof(license))  # socket filter
        report(map_create=map_create, prog_load=syscall("bpf", 5, ctypes.addressof(attr), 128))
    """)
    assert probe_output(result) == {"map_create": "EPERM", "prog_load": "EPERM"}


def test_perf_event_open_is_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        import struct
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("IIQ", attr, 0, 1, 128, 0)  # PERF_TYPE_SOFTWARE, size, PERF_COUNT_SW_CPU_CLOCK
        struct.pack_into("Q", attr, 40, 1 | 1 << 5 | 1 << 6)  # disabled, exclude_kernel, exclude_hv
        report(self=syscall("perf_event_open", ctypes.addressof(attr), 0, -1, -1, 0),
               all_cpus=syscall("perf_event_open", ctypes.addressof(attr), -1, 0, -1, 0))
    """)
    assert probe_output(result) == {"self": "EPERM", "all_cpus": "EPERM"}


def test_userfaultfd_is_denied(probe: ProbeRunner) -> None:
    # UFFD_USER_MODE_ONLY is allowed to anyone by the kernel: a tool to win races in the kernel.
    result = probe.run("""
        report(user_mode=syscall("userfaultfd", 1 | os.O_CLOEXEC), any_mode=syscall("userfaultfd", os.O_CLOEXEC))
    """)
    assert probe_output(result) == {"user_mode": "EPERM", "any_mode": "EPERM"}


def test_io_uring_is_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        params = ctypes.create_string_buffer(120)
        report(setup=syscall("io_uring_setup", 4, ctypes.addressof(params)))
    """)
    assert probe_output(result) == {"setup": "EPERM"}


def test_no_controlling_terminal_to_inject_into(probe: ProbeRunner) -> None:
    # --new-session and a /dev/null stdin: nothing typed into the sandbox reaches the caller's tty.
    result = probe.run("""
        import fcntl, termios
        report(dev_tty=attempt(os.open, "/dev/tty", os.O_RDWR), sid_is_own=os.getsid(0) != 0,
               **{f"tiocsti_{fd}": attempt(fcntl.ioctl, fd, termios.TIOCSTI, b"x") for fd in (0, 1, 2)})
    """)
    out = probe_output(result)
    assert out["dev_tty"] == "ENXIO", out
    assert all(out[f"tiocsti_{fd}"] in ("ENOTTY", "EPERM", "EIO") for fd in (0, 1, 2)), out


def test_tiocsti_is_denied_even_on_its_own_terminal(probe: ProbeRunner) -> None:
    result = probe.run("""
        import fcntl, termios
        master, slave = os.openpty()
        reader, writer = os.pipe()
        child = os.fork()
        if child == 0:
            os.setsid()
            outcome = attempt(fcntl.ioctl, slave, termios.TIOCSCTTY, 0)
            if outcome == "ok":
                outcome = attempt(fcntl.ioctl, slave, termios.TIOCSTI, b"x")
            os.write(writer, outcome.encode())
            os._exit(0)
        os.waitpid(child, 0)
        report(tiocsti=os.read(reader, 100).decode())
    """)
    assert probe_output(result) == {"tiocsti": "EPERM"}


def test_kexec_and_kernel_modules_are_denied(probe: ProbeRunner) -> None:
    result = probe.run("""
        image = ctypes.create_string_buffer(b"\\0" * 64)
        empty = ctypes.create_string_buffer(b"")
        report(kexec_load=syscall("kexec_load", 0, 0, 0, 0),
               kexec_file_load=syscall("kexec_file_load", -1, -1, 0, 0, 0),
               init_module=syscall("init_module", ctypes.addressof(image), 64, ctypes.addressof(empty)),
               finit_module=syscall("finit_module", 0, ctypes.addressof(empty), 0))
    """)
    out = probe_output(result)
    # EPERM without CAP_SYS_BOOT/CAP_SYS_MODULE, or ENOSYS on a kernel built without them.
    assert all(outcome in ("EPERM", "ENOSYS") for outcome in out.values()), out
