"""`tidal sandbox run` and `tidal image build|list`, through the real command line (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TIDAL = [sys.executable, "-m", "tidal.cli"]


def tidal(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TIDAL, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module", autouse=True)
def _bwrap_works() -> None:
    done = tidal("sandbox", "run", "--", "/bin/true")
    if done.returncode != 0:
        pytest.skip(f"bwrap sandbox unavailable: {done.stderr.strip()}")


def test_run_prints_the_result_as_json_and_passes_files(tmp_path: Path) -> None:
    source = tmp_path / "data.txt"
    source.write_bytes(b"payload\n")
    folder = tmp_path / "pkg"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "m.py").write_text("X = 41\n")
    code = "import sys;sys.path.insert(0,'lib');from sub.m import X;print(open('in/d.txt').read().strip(),X+1);sys.exit(3)"
    done = tidal("sandbox", "run", "--json", "--file", f"{source}:in/d.txt", "--file", f"{folder}:lib", "--",
                 "python3", "-c", code)
    assert done.returncode == 3, done.stderr
    record = json.loads(done.stdout)
    assert record["outcome"] == "ok" and record["exit_code"] == 3
    assert record["stdout"] == "payload 42\n"
    assert record["cpu_s"] is not None and record["cpu_s"] > 0
    assert record["max_rss_mb"] is not None and record["max_rss_mb"] > 1
    assert set(record) >= {"stderr", "wall_s", "stdout_truncated", "stderr_truncated", "signal", "detail"}


def test_limits_are_typed_outcomes() -> None:
    done = tidal("sandbox", "run", "--json", "--timeout-s", "1", "--", "python3", "-c", "while True: pass")
    assert done.returncode == 124
    assert json.loads(done.stdout)["outcome"] == "timeout"
    done = tidal("sandbox", "run", "--json", "--memory-mb", "64", "--", "python3", "-c", "x = bytearray(200 * 2**20)")
    assert json.loads(done.stdout)["outcome"] == "memory_limit"
    done = tidal("sandbox", "run", "--json", "--", "python3", "-c", "import sys; sys.stdout.buffer.write(b'\\xff' * 200000)")
    record = json.loads(done.stdout)
    assert record["stdout_truncated"] is True and len(record["stdout"]) == 64 * 1024  # replacement chars, capped


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    done = tidal("sandbox", "run", "--file", str(tmp_path / "missing.txt"), "--", "/bin/true")
    assert done.returncode == 2 and "missing.txt does not exist" in done.stderr
    (tmp_path / "f.txt").write_text("x")
    done = tidal("sandbox", "run", "--file", f"{tmp_path / 'f.txt'}:../up", "--", "/bin/true")
    assert done.returncode == 2 and "without '..'" in done.stderr
    done = tidal("sandbox", "run", "--image", "no-such-image", "--", "/bin/true")
    assert done.returncode == 2 and "tidal image build" in done.stderr


def test_image_build_and_list(tmp_path: Path) -> None:
    root = tmp_path / "images"
    done = tidal("image", "build", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("python3 ") and "pytest==" in done.stdout
    listed = tidal("image", "list", "--root", str(root))
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1 and listed.stdout.startswith("python3 ")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npackages: [numpy]\n")
    done = tidal("image", "build", str(bad), "--root", str(root))
    assert done.returncode == 2 and "not an exact pin" in done.stderr


def test_sweep_removes_the_run_folders_of_a_process_that_is_gone(tmp_path: Path) -> None:
    code = "import sys; from tidal.sandbox.leftovers import make_run_dir; print(make_run_dir('tidal-batch-', sys.argv[1]))"
    made = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          check=True)
    left = Path(made.stdout.strip())  # its process has exited without deleting it
    (left / "workspace").mkdir()
    (left / "workspace" / "answer.py").write_text("x = 1\n")
    kept = tmp_path / "tidal-batch-notours"  # no owner file: not known to be a run's, left alone
    kept.mkdir()
    done = tidal("sandbox", "sweep", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "removed 1 run folder(s), 0 mount(s), 0 process(es)"
    assert not left.exists() and kept.exists()
