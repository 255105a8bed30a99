"""The seccomp filter and per-run cgroups of the bwrap backend: the program, and what it stops."""

from __future__ import annotations

import json
import platform
import struct
import subprocess
import time
from pathlib import Path

import pytest

from tidal.sandbox import SandboxBackend, SandboxStatus, get_backend
from tidal.sandbox.cgroup import EXTRA_TASKS, Cgroups, _mounts, _own_paths
from tidal.sandbox.seccomp import ARCHES, DENIED, RET_ALLOW, RET_KILL_PROCESS, build_filter
from tidal.types import Limits

SYSCALLS = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
numbers = json.loads(os.environ["NUMBERS"])
out = {}
for name, args in [("ptrace", (16, 1, 0, 0)), ("unshare", (0x10000000,)), ("bpf", (0, 0, 0)),
                   ("io_uring_setup", (1, 0)), ("clone3", (0, 0)), ("keyctl", (0, 0)),
                   ("perf_event_open", (0, 0, -1, -1, 0)), ("userfaultfd", (0,)), ("mount", (0, 0, 0, 0, 0)),
                   ("mq_open", (b"/tidal-q", 0o102, 0o600, 0))]:
    ctypes.set_errno(0)
    result = libc.syscall(numbers[name], *args)
    out[name] = [result, ctypes.get_errno()]
out["getpid"] = os.getpid()
print(json.dumps(out))
"""


def test_filter_is_a_valid_program_for_every_known_arch() -> None:
    for machine, arch in ARCHES.items():
        program = build_filter(machine)
        assert program is not None and len(program) % 8 == 0
        instructions = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
        assert len(instructions) < 256
        assert instructions[0] == (0x20, 0, 0, 4)  # load the arch first
        assert instructions[1][3] == arch.audit
        returns = {k for code, _, _, k in instructions if code == 0x06}
        assert RET_ALLOW in returns and RET_KILL_PROCESS in returns
        compared = {k for code, _, _, k in instructions if code == 0x15}
        for name in DENIED:
            if name in arch.numbers:
                assert arch.numbers[name] in compared, (machine, name)
    assert build_filter("sparc") is None


@pytest.mark.skipif(platform.machine() not in ARCHES, reason="no syscall table for this machine")
def test_denied_syscalls_fail_and_ordinary_ones_work(bwrap: SandboxBackend) -> None:
    numbers = ARCHES[platform.machine()].numbers | {"getpid": 39}
    result = bwrap.run([bwrap.python, "-c", SYSCALLS], {}, Limits(timeout_s=20), env={"NUMBERS": json.dumps(numbers)})
    assert result.status == SandboxStatus.OK, result.stderr
    out = json.loads(result.stdout)
    for name in ("ptrace", "unshare", "bpf", "io_uring_setup", "keyctl", "perf_event_open", "userfaultfd", "mount", "mq_open"):
        assert out[name] == [-1, 1], name  # EPERM
    assert out["clone3"] == [-1, 38]  # ENOSYS: libc falls back to clone
    assert out["getpid"] >= 1
    # Forking and threads (clone without namespace flags) still work.
    result = bwrap.run([bwrap.python, "-c", "import subprocess,threading;t=threading.Thread(target=print);t.start();"
                        "t.join();print(subprocess.run(['/bin/echo','hi'],capture_output=True).stdout)"], {}, Limits(timeout_s=20))
    assert result.status == SandboxStatus.OK and b"hi" in result.stdout, result.stderr


@pytest.mark.skipif(platform.machine() not in ARCHES, reason="no syscall table for this machine")
def test_without_the_filter_a_nested_namespace_can_be_made() -> None:
    """The contrast that shows the filter is what stops `unshare` (bwrap alone allows it)."""
    open_backend = get_backend("bwrap", seccomp=False)
    code = "import ctypes;l=ctypes.CDLL(None,use_errno=True);print(l.syscall(272,0x10000000),ctypes.get_errno())"
    result = open_backend.run([open_backend.python, "-c", code], {}, Limits(timeout_s=20))
    assert result.stdout.split() == [b"0", b"0"]
    assert "no seccomp filter" in result.detail


MOUNTINFO = """\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
33 30 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 30 0:31 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
"""


def test_mount_and_membership_parsing() -> None:
    v1, v2 = _mounts(MOUNTINFO)
    assert v1 == {"memory": Path("/sys/fs/cgroup/memory"), "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
                  "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"), "pids": Path("/sys/fs/cgroup/pids")}
    assert v2 == Path("/sys/fs/cgroup/unified")
    own, unified = _own_paths("4:memory:/job/7\n3:cpu,cpuacct:/\n0::/user.slice\n")
    assert own == {"memory": "/job/7", "cpu": "/", "cpuacct": "/"} and unified == "/user.slice"


def test_v2_limits_are_written_where_the_controllers_are(tmp_path: Path) -> None:
    """A cgroup2 tree laid out in a folder: the files a kernel would create are plain files."""
    parent = tmp_path / "app.slice"
    parent.mkdir()
    (parent / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (parent / "cgroup.subtree_control").write_text("")
    mountinfo = f"36 30 0:32 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    groups = Cgroups(mountinfo=mountinfo, proc_cgroup="0::/app.slice\n")
    assert groups.version == 2 and set(groups.parents) == {"memory", "pids", "cpu"}
    group = groups.create(memory_mb=300, pids=20, cpus=1.5)
    assert group is not None
    folder = group.folders["memory"]
    assert folder.parent == parent
    assert (folder / "memory.max").read_text() == str(300 * 1024 * 1024)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "pids.max").read_text() == str(20 + EXTRA_TASKS)
    assert (folder / "cpu.max").read_text() == "150000 100000"
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (folder / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (folder / "memory.peak").write_text(str(50 * 1024 * 1024))
    assert group.oom_killed() and group.cpu_s() == 2.5 and group.peak_mb() == 50


@pytest.fixture(scope="module")
def cgrouped() -> SandboxBackend:
    backend = get_backend("bwrap")
    if getattr(backend, "cgroups", None) is None:
        pytest.skip("no writable cgroup hierarchy on this host (needs root)")
    return backend


FORK_AND_FILL = """
import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(90 * 1024 * 1024)
        for at in range(0, len(block), 4096):
            block[at] = 1
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
print([os.waitpid(kid, 0)[1] for kid in kids])
"""


def test_memory_is_bounded_for_the_whole_tree(cgrouped: SandboxBackend) -> None:
    # Each child stays under the 200 MiB address-space limit; together they do not fit.
    result = cgrouped.run([cgrouped.python, "-c", FORK_AND_FILL], {}, Limits(timeout_s=20, memory_mb=200))
    statuses = json.loads(result.stdout)
    assert 9 in statuses, statuses  # SIGKILL from the kernel's OOM killer
    assert "cgroup memory limit" in result.detail
    assert result.max_rss_mb is not None and result.max_rss_mb <= 200.5


def test_threads_count_against_the_task_limit(cgrouped: SandboxBackend) -> None:
    code = ("import threading,time\nn=0\ntry:\n for _ in range(200):\n  threading.Thread(target=time.sleep,args=(1,),daemon=True).start();n+=1\n"
            "except RuntimeError:\n pass\nprint(n)")
    result = cgrouped.run([cgrouped.python, "-c", code], {}, Limits(timeout_s=20, pids=16))
    assert result.status == SandboxStatus.OK, result.stderr
    assert int(result.stdout) < 16 + EXTRA_TASKS


def test_cpu_time_is_measured(cgrouped: SandboxBackend) -> None:
    code = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass"
    result = cgrouped.run([cgrouped.python, "-c", code], {}, Limits(timeout_s=20))
    assert result.status == SandboxStatus.OK
    assert result.cpu_s is not None and result.cpu_s >= 0.3


def test_busy_cgroups_are_removed_in_the_background(cgrouped: SandboxBackend) -> None:
    group = cgrouped.cgroups.create(memory_mb=64, pids=4, cpus=1.0)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        group.add(sleeper.pid)
        group.remove()  # kills the sleeper (v1: by pid) and leaves the folders to the reaper
        sleeper.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(folder.exists() for folder in group.folders.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(folder.exists() for folder in group.folders.values())
    finally:
        sleeper.kill()
        sleeper.wait()


def test_workspace_is_bounded_as_a_whole(cgrouped: SandboxBackend, tmp_path: Path) -> None:
    """Many files each under the per-file limit cannot fill the host's disk: the workspace is a
    tmpfs of `disk_mb`, and its inode count is capped too."""
    code = ("import errno\nwritten = 0\ntry:\n for i in range(100):\n  open(f'f{i}', 'wb').write(b'x' * 2**20); written += 1\n"
            "except OSError as e:\n print(written, errno.errorcode[e.errno])\n"
            "import os\nn = 0\ntry:\n os.mkdir('many')\n for i in range(100000):\n  open(f'many/{i}', 'w').close(); n += 1\n"
            "except OSError as e:\n print(n < 100000, errno.errorcode[e.errno])")
    backend = get_backend("bwrap", workdir=str(tmp_path))
    result = backend.run([backend.python, "-c", code], {}, Limits(timeout_s=30, disk_mb=8, memory_mb=256))
    lines = result.stdout.decode().splitlines()
    assert lines[0].split()[1] == "ENOSPC" and int(lines[0].split()[0]) <= 8
    assert lines[1] == "True ENOSPC"
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()  # unmounted after the run
    assert not list(tmp_path.iterdir())  # and the run folder deleted


def test_root_is_read_only_and_scratch_is_writable(bwrap: SandboxBackend) -> None:
    """Only the workspace, /tmp and /dev/shm take writes (multiprocessing needs the last)."""
    code = """
import multiprocessing as mp, os
for path in ("/x", "/opt/x", "/opt/tidal/site/x", "/usr/x", "/tmp/x", "/dev/shm/x", "/workspace/x"):
    try:
        open(path, "w").close()
        print(path, "written")
    except OSError as error:
        print(path, error.errno)
lock = mp.Lock()
print("lock", lock.acquire(timeout=1))
"""
    result = bwrap.run([bwrap.python, "-c", code], {}, Limits(timeout_s=20))
    lines = result.stdout.decode().splitlines()
    assert lines == ["/x 30", "/opt/x 30", "/opt/tidal/site/x 30", "/usr/x 30", "/tmp/x written",
                     "/dev/shm/x written", "/workspace/x written", "lock True"], result.stderr


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def test_a_zygote_sandbox_is_in_one_cgroup_with_a_tmpfs_workspace(cgrouped: SandboxBackend) -> None:
    zygote = cgrouped.open_zygote([], Limits(timeout_s=10, memory_mb=256, disk_mb=32))
    try:
        inside = _descendants(zygote.pid)
        assert inside
        memberships = {Path(f"/proc/{pid}/cgroup").read_text() for pid in inside}
        assert all("tidal-" in text for text in memberships)
        assert len(memberships) == 1  # one cgroup for the whole sandbox
        mounts = Path("/proc/self/mounts").read_text()
        assert "tidal-workspace" in mounts and "size=32768k" in mounts
    finally:
        zygote.close()
