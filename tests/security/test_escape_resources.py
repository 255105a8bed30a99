"""Escape probes: resource exhaustion. rlimits (processes, address space, file size, CPU) and the
wall clock bound what one run can take from the host; the host samples the sandbox's processes
while it runs and checks what is left afterwards. Memory held outside the address space (memfd,
tmpfs) and CPU spread over many processes are bounded by the run's cgroup (docs/security.md)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from escape_probes import ProbeRunner, probe_output

from tidal.sandbox import SandboxBackend, SandboxStatus, get_backend
from tidal.types import Limits

MB = 1024 * 1024


def host_gives_cgroups() -> bool:
    """Root with a writable cgroup hierarchy (v2, or v1's memory controller): where the bwrap backend
    puts each run in its own cgroup. Elsewhere it runs on rlimits alone and says so in a warning."""
    if os.geteuid() != 0:
        return False
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers") and os.access("/sys/fs/cgroup", os.W_OK)
    return v2 or os.access("/sys/fs/cgroup/memory", os.W_OK)


NEEDS_CGROUPS = pytest.mark.skipif(not host_gives_cgroups(), reason="this host gives the sandbox no cgroups (not root, "
                                   "or no writable cgroup hierarchy): memory and CPU are bounded by rlimits only")


def test_fork_bomb_stays_within_the_pids_limit(probe: ProbeRunner) -> None:
    with probe.sampler() as sampler:
        result = probe.run("""
            import time
            while True:
                try:
                    os.fork()
                except OSError:
                    time.sleep(0.01)
        """, timeout_s=2, pids=12)
    assert result.status is SandboxStatus.TIMEOUT
    assert 2 <= sampler.max_count <= 12, sampler.max_count  # the bomb ran, and never past the limit


def test_memory_bomb_in_one_allocation(probe: ProbeRunner) -> None:
    result = probe.run("x = bytearray(8 * 1024 ** 3)", memory_mb=256)
    assert result.status is SandboxStatus.MEMORY_LIMIT and b"MemoryError" in result.stderr


def test_memory_bomb_growing_stays_under_the_limit(probe: ProbeRunner) -> None:
    with probe.sampler() as sampler:
        result = probe.run("""
            chunks = []
            while True:
                chunks.append(b"x" * (8 * 1024 * 1024))  # touched, so resident
        """, memory_mb=256, timeout_s=4)
    assert result.status is SandboxStatus.MEMORY_LIMIT, (result.status, result.stderr_text[-500:])
    assert 64 * 1024 <= sampler.max_rss_kb <= 256 * 1024, sampler.max_rss_kb


@NEEDS_CGROUPS
def test_memfd_bomb_is_bounded_by_the_memory_limit(probe: ProbeRunner) -> None:
    # memfd (and tmpfs) pages count against no rlimit until mapped: 256 fds x 64 MiB (RLIMIT_NOFILE x
    # RLIMIT_FSIZE) would be 16 GiB of host memory. This probe stops at 1 GiB, 4x its memory limit.
    result = probe.run("""
        held = 0
        chunk = b"x" * (16 * 1024 * 1024)
        try:
            for _ in range(16):
                fd = os.memfd_create("bomb")
                for _ in range(4):
                    os.write(fd, chunk)
                    held += len(chunk)
                print("HELD", held, flush=True)
        except OSError as error:
            print("STOPPED", errname(error.errno), flush=True)
        report(held=held)
    """, memory_mb=256, timeout_s=4)
    held = max([int(line.split()[1]) for line in result.stdout_text.splitlines() if line.startswith("HELD")] or [0])
    assert held >= 64 * MB, (result.status, result.stderr_text[-500:])  # the bomb ran
    assert held <= (256 + 64) * MB, f"{held / MB:.0f} MiB held in memfds with memory_mb=256 ({result.status.value})"


@pytest.mark.parametrize("folder", ["/tmp", "/dev/shm"])
def test_scratch_tmpfs_is_small(probe: ProbeRunner, folder: str) -> None:
    # /tmp and /dev/shm are memory, not disk: 64 MiB each at most, however many files.
    result = probe.run(f"""
        written, stopped = 0, None
        chunk = b"x" * (4 * 1024 * 1024)
        try:
            for i in range(40):
                with open(f"{folder}/fill-{{i}}", "wb") as file:
                    for _ in range(4):
                        file.write(chunk)
                        written += len(chunk)
        except OSError as error:
            stopped = errname(error.errno)
        report(written=written, stopped=stopped)
    """, memory_mb=256)
    out = probe_output(result)
    assert out["stopped"] in ("ENOSPC", "EACCES") and out["written"] <= 64 * MB, out


def test_disk_bomb_of_many_files_is_cleaned_up(probe: ProbeRunner, backend: SandboxBackend) -> None:
    # Files until the wall clock or the workspace's size/inode limit (a tmpfs of `disk_mb` on root
    # hosts) stops it, in folders made hard to delete; the host must remove every one of them.
    workdir = Path(tempfile.mkdtemp(prefix="tidal-security-"))
    own = get_backend("bwrap", workdir=str(workdir))
    try:
        result = own.run([backend.python, "-c", (
            "import os\n"
            "i = 0\n"
            "while True:\n"
            "    os.makedirs(f'd{i // 500}', exist_ok=True)\n"
            "    open(f'd{i // 500}/f{i}', 'w').close()\n"
            "    if i % 500 == 499:\n"
            "        os.chmod(f'd{i // 500}', 0)\n"
            "    i += 1\n"
        )], {}, Limits(timeout_s=1.5, memory_mb=256),
            env={"TIDAL_PROBE_MARKER": probe.marker},
            after=lambda workspace: sum(1 for _ in workspace.iterdir()))
        bounded = result.status is SandboxStatus.TIMEOUT or (
            result.exit_code == 1 and b"No space left on device" in result.stderr
        )
        assert bounded, (result.status, result.stderr[-300:])
        assert result.after_value >= 2  # it did make a mess
        assert list(workdir.iterdir()) == []  # and nothing of it is left
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_huge_and_sparse_files_hit_the_file_size_limit(probe: ProbeRunner, backend: SandboxBackend) -> None:
    def sizes(workspace: Path) -> dict[str, tuple[int, int]]:
        return {p.name: (p.stat().st_size, p.stat().st_blocks * 512) for p in workspace.iterdir() if p.name != "probe.py"}

    result = probe.run("""
        def fill():
            with open("big", "wb") as file:
                chunk = b"x" * (8 * 1024 * 1024)
                for _ in range(12):
                    file.write(chunk)
        def sparse():
            with open("sparse", "wb") as file:
                file.seek(1 << 40)
                file.write(b"x")
        report(fill=attempt(fill), sparse=attempt(sparse), truncate=attempt(os.truncate, "big", 1 << 40))
    """, memory_mb=256, after=sizes)
    out = probe_output(result)
    assert out == {"fill": "EFBIG", "sparse": "EFBIG", "truncate": "EFBIG"}
    limit = backend.file_size_mb * MB  # type: ignore[attr-defined]
    assert all(size <= limit and used <= limit for size, used in result.after_value.values()), result.after_value


def test_cpu_spin_ignoring_signals_is_killed(probe: ProbeRunner) -> None:
    result = probe.run("""
        import signal
        for sig in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
            signal.signal(sig, signal.SIG_IGN)
        while True:
            pass
    """, timeout_s=1.5)
    assert result.status is SandboxStatus.TIMEOUT and result.signal == 9
    assert result.wall_s < 10  # a hang detector, not a timing check


def test_sleep_forever_is_killed(probe: ProbeRunner) -> None:
    result = probe.run("""
        import signal, time
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
            signal.signal(sig, signal.SIG_IGN)
        os.setsid()
        time.sleep(10 ** 6)
    """, timeout_s=1)
    assert result.status is SandboxStatus.TIMEOUT
    assert result.wall_s < 10


@NEEDS_CGROUPS
def test_cpu_spread_over_processes_is_bounded(probe: ProbeRunner) -> None:
    # Four spinning processes: without a cgroup each has its own RLIMIT_CPU and together they take
    # every core until the wall clock. With cpu.max at `cpus` cores they get at most that. A small
    # `cpus` keeps the bound far below what they take without it, even on a loaded host.
    cpus = 0.2
    extra = {"cpus": cpus} if "cpus" in Limits.model_fields else {}
    with probe.sampler() as sampler:
        result = probe.run("""
            for _ in range(3):
                if os.fork() == 0:
                    break
            while True:
                pass
        """, limits=Limits(timeout_s=3, memory_mb=256, pids=16, **extra))
    assert result.status is SandboxStatus.TIMEOUT and sampler.max_count >= 4, (result.status, sampler.max_count)
    assert sampler.max_cpu_s <= 3 * cpus * 1.25 + 0.3, f"{sampler.max_cpu_s:.2f} CPU-s in 3 s at {cpus} cores"
