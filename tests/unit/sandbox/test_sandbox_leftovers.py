"""What a killed run leaves (leftovers.py): its run folders, their workspace mounts and stray bwrap
processes go with the next sweep; nothing of a live process, or of an unknown one, does."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.sandbox import SandboxBackend, leftovers
from tidal.sandbox.leftovers import OWNER_FILE, Owner, make_run_dir, me, sweep

KILLED_RUN = """
import os, signal, sys
from tidal.sandbox import get_backend
from tidal.sandbox.base import BatchJob
from tidal.sandbox.pool import SandboxPool
from tidal.sandbox.session import open_session
from tidal.types import Limits

backend = get_backend("bwrap", workdir=sys.argv[1])
pool = SandboxPool(backend, size=1)
job = BatchJob([backend.python, "-s", "-B", "-m", "main"], {"main.py": "print('ok')"}, Limits(timeout_s=20))
assert pool.run_batch([job])[0].stdout_text.strip() == "ok"  # a zygote is up, its workspace mounted
session = open_session(backend, {"a.txt": "one"}, Limits(timeout_s=20))
os.kill(os.getpid(), signal.SIGKILL)
"""


def mounts_under(folder: Path) -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(str(folder) + "/")]


def run_folders(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir() if entry.name.startswith(leftovers.PREFIXES))


def test_a_killed_runs_folders_and_mounts_go_with_the_next_sweep(bwrap: SandboxBackend, tmp_path: Path) -> None:
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-c", KILLED_RUN, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    left = run_folders(tmp_path)
    assert any(name.startswith("tidal-batch-") for name in left), left  # the zygote's
    assert any(name.startswith("tidal-sessions-") for name in left), left  # the session's store
    mounted = mounts_under(tmp_path)
    if os.geteuid() == 0:
        assert len(mounted) >= 2  # both workspaces are still mounted tmpfs
    swept = sweep(tmp_path)
    assert swept.folders == len(left) and run_folders(tmp_path) == []
    assert mounts_under(tmp_path) == [] and swept.mounts == len(mounted)
    assert sweep(tmp_path).folders == 0  # nothing left the second time


def test_live_and_unknown_owners_are_left_alone(tmp_path: Path) -> None:
    mine = make_run_dir("tidal-batch-", tmp_path)  # this process: alive
    unowned = tmp_path / "tidal-sandbox-unowned"  # no owner file: made before them, or half-made
    unowned.mkdir()
    other_container = tmp_path / "tidal-sandbox-container"  # same boot, another pid namespace
    other_container.mkdir()
    here = me()
    (other_container / OWNER_FILE).write_text(Owner(1, 1, here.pid_namespace + 1, here.boot).line())
    garbled = tmp_path / "tidal-unsafe-garbled"
    garbled.mkdir()
    (garbled / OWNER_FILE).write_text("not an owner\n")
    rebooted = tmp_path / "tidal-sessions-rebooted"  # an owner from an earlier boot: gone
    rebooted.mkdir()
    (rebooted / OWNER_FILE).write_text(Owner(here.pid, here.start, here.pid_namespace, "0" * 32).line())
    reused = tmp_path / "tidal-sandbox-reused"  # this pid, another start time: a reused pid
    reused.mkdir()
    (reused / OWNER_FILE).write_text(Owner(here.pid, here.start + 1, here.pid_namespace, here.boot).line())
    unrelated = tmp_path / "something-else"
    unrelated.mkdir()
    (unrelated / OWNER_FILE).write_text(Owner(1, 1, here.pid_namespace, "0" * 32).line())

    assert sweep(tmp_path).folders == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [mine.name, unowned.name, other_container.name, garbled.name, unrelated.name])


def test_a_stray_bwrap_of_a_dead_owner_is_killed(tmp_path: Path) -> None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bwrap is not installed")
    code = "import sys; from tidal.sandbox.leftovers import make_run_dir; print(make_run_dir('tidal-batch-', sys.argv[1]))"
    made = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          check=True)
    run_dir = Path(made.stdout.strip())  # its owner has exited
    (run_dir / "workspace").mkdir()
    stray = subprocess.Popen([bwrap, "--ro-bind", "/", "/", "--bind", str(run_dir / "workspace"), "/mnt",
                              "--unshare-pid", "--", "sleep", "60"])
    try:
        time.sleep(0.3)
        assert stray.poll() is None
        swept = sweep(tmp_path)
        assert swept.processes >= 1 and swept.folders == 1  # bwrap, and its own child in the new pid namespace
        assert stray.wait(timeout=10) == -signal.SIGKILL
        assert not run_dir.exists()
    finally:
        stray.kill()
        stray.wait()


def test_the_first_run_folder_a_process_makes_sweeps_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = me()
    dead = tmp_path / "tidal-sandbox-dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(Owner(here.pid, here.start, here.pid_namespace, "0" * 32).line())
    monkeypatch.setattr(leftovers, "_SWEPT", set())
    first = make_run_dir("tidal-sandbox-", tmp_path)
    assert not dead.exists() and (first / OWNER_FILE).read_text() == here.line()
    dead.mkdir()
    (dead / OWNER_FILE).write_text(Owner(here.pid, here.start, here.pid_namespace, "0" * 32).line())
    make_run_dir("tidal-sandbox-", tmp_path)
    assert dead.exists()  # swept once per folder and process
