"""SandboxPool: warm zygotes reused across batches, at most `size` at once, replaced when broken,
closed when idle or when the pool closes, with no process left behind."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tidal.sandbox import SandboxBackend, SandboxStatus, get_backend
from tidal.sandbox.base import BatchJob
from tidal.sandbox.pool import SandboxPool
from tidal.types import Limits

WHERE = "import os\nprint(os.getcwd())\n"


def job(backend: SandboxBackend, code: str, flags: tuple[str, ...] = ("-s", "-B"), **limits: float) -> BatchJob:
    """`python [flags] -m main` with `code` as main.py."""
    return BatchJob([backend.python, *flags, "-m", "main"], {"main.py": code}, Limits(**{"timeout_s": 20, **limits}))


def tree(pid: int) -> set[int]:
    """`pid` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as file:
                    data = file.read()
            except OSError:
                continue
            children.setdefault(int(data[data.rindex(b")") + 2:].split()[1]), []).append(int(entry))
    found, pending = set(), [pid]
    while pending:
        current = pending.pop()
        if os.path.exists(f"/proc/{current}"):
            found.add(current)
        pending.extend(children.get(current, []))
    return found


def running(pids: set[int], wait_s: float = 10.0) -> list[int]:
    """Those of `pids` still running (not exited: a zombie has), after waiting up to `wait_s` for
    the kernel to finish killing them (a pid namespace is torn down asynchronously)."""
    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat", "rb") as file:
                data = file.read()
        except OSError:
            return False
        return data[data.rindex(b")") + 2:].split()[0] != b"Z"

    deadline = time.monotonic() + wait_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(pid for pid in pids if alive(pid))


def test_a_zygote_stays_warm_across_batches(bwrap: SandboxBackend) -> None:
    with SandboxPool(bwrap, size=1) as pool:
        first = pool.run_batch([job(bwrap, WHERE), job(bwrap, WHERE)])
        pids = pool.zygote_pids()
        second = pool.run_batch([job(bwrap, "print('another task')\n" + WHERE)])
        assert [r.stdout_text.splitlines()[-1] if r else None for r in first + second] == \
            ["/workspace/0", "/workspace/1", "/workspace/2"]  # the third job's zygote ran two before it
        assert pool.stats.started == 1 and pool.zygote_pids() == pids and len(pids) == 1


def test_at_most_size_jobs_and_zygotes_at_once(bwrap: SandboxBackend) -> None:
    slow = "import time\ntime.sleep(0.3)\nprint('done')\n"
    seen: list[int] = []
    stop = threading.Event()

    def watch(pool: SandboxPool) -> None:  # independent of the pool's own counters: live sandboxes
        while not stop.is_set():
            seen.append(sum(1 for pid in pool.zygote_pids() if os.path.exists(f"/proc/{pid}")))
            time.sleep(0.01)

    with SandboxPool(bwrap, size=2) as pool:
        watcher = threading.Thread(target=watch, args=(pool,))
        watcher.start()
        results: list[list] = []
        callers = [threading.Thread(target=lambda: results.append(pool.run_batch([job(bwrap, slow)] * 3)))
                   for _ in range(3)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        stop.set()
        watcher.join()
        assert [r.stdout_text if r else None for batch in results for r in batch] == ["done\n"] * 9
        assert pool.stats.peak_busy == 2 and pool.stats.started == 2 and pool.stats.jobs == 9
        assert max(seen) <= 2


def test_a_zygote_killed_by_a_job_is_replaced(bwrap: SandboxBackend) -> None:
    killer = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    with SandboxPool(bwrap, size=1) as pool:
        pool.run_batch([job(bwrap, WHERE)])
        (old,) = pool.zygote_pids()
        processes = tree(old)
        before, attacked, after = pool.run_batch([job(bwrap, WHERE), job(bwrap, killer, timeout_s=3), job(bwrap, WHERE)])
        assert before is not None and before.stdout_text == "/workspace/1\n"
        assert attacked is None  # no zygote can say how it ended: the caller runs it alone
        assert after is not None and after.stdout_text == "/workspace/0\n"  # a fresh zygote
        assert pool.stats.started == 2 and pool.stats.unvouched == 1
        assert pool.zygote_pids() != [old] and running(processes) == []


def test_a_job_that_changes_its_zygote_has_it_replaced_without_losing_a_job(bwrap: SandboxBackend) -> None:
    renice = "import os\nos.setpriority(os.PRIO_PROCESS, os.getppid(), 19)\nprint('reniced')\n"
    with SandboxPool(bwrap, size=1) as pool:
        results = pool.run_batch([job(bwrap, WHERE), job(bwrap, renice), job(bwrap, WHERE)])
        assert [r.stdout_text if r else None for r in results] == ["/workspace/0\n", "reniced\n", "/workspace/0\n"]
        assert pool.stats.started == 2 and pool.stats.replaced == 1


def test_close_waits_and_leaves_no_process(bwrap: SandboxBackend) -> None:
    pool = SandboxPool(bwrap, size=2)
    results = pool.run_batch([job(bwrap, "import subprocess, sys\n"
                                        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n")] * 2)
    assert all(r is not None and r.status is SandboxStatus.OK for r in results)
    pids = pool.zygote_pids()
    processes = set().union(*(tree(pid) for pid in pids))
    assert len(pids) == 2 and len(processes) >= 2 * 3  # bwrap, the sandbox's init, the zygote (at least)
    pool.close()
    assert pool.alive == 0 and pool.zygote_pids() == []
    assert running(processes) == []
    with pytest.raises(RuntimeError, match="closed"):
        pool.run_batch([job(bwrap, WHERE)])


def test_idle_zygotes_are_closed(bwrap: SandboxBackend) -> None:
    with SandboxPool(bwrap, size=1, idle_s=0.2) as pool:
        pool.run_batch([job(bwrap, WHERE)])
        (pid,) = pool.zygote_pids()
        processes = tree(pid)
        deadline = time.monotonic() + 30
        while pool.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.alive == 0 and pool.stats.expired == 1 and running(processes) == []
        assert pool.run_batch([job(bwrap, WHERE)])[0] is not None and pool.stats.started == 2


def test_a_full_pool_makes_room_for_another_kind_of_job(bwrap: SandboxBackend) -> None:
    with SandboxPool(bwrap, size=1, memory_mb=256) as pool:
        first = pool.run_batch([job(bwrap, WHERE)])
        other_flags = pool.run_batch([job(bwrap, WHERE, flags=("-B",))])  # another key
        bigger = pool.run_batch([job(bwrap, WHERE, flags=("-B",), memory_mb=1024)])  # over that zygote's limits
        assert [r.stdout_text if r else None for r in first + other_flags + bigger] == ["/workspace/0\n"] * 3
        assert pool.stats.started == 3 and pool.stats.evicted == 2 and pool.alive == 1


def test_a_backend_without_zygotes_runs_each_job_alone() -> None:
    local = get_backend("unsafe_local")
    with SandboxPool(local, size=2) as pool:
        assert pool.run_batch([job(local, WHERE)]) == [None]
        result = pool.run([local.python, "-c", "print('alone')"], {}, Limits(timeout_s=20))
        assert result.stdout_text == "alone\n" and pool.stats.started == 0
