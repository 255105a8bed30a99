"""Templates, bases and companions (zygote_forks.py): jobs forked from a process that ran their
common start once, templates forked from a base that ran what many tasks share, and second
processes forked from a nursery that never held anything of a job. Each
probe fails if a job could see another's workspace or report channel, if a template or nursery a
job changed went on serving, or if the isolation a plain job gets is not the same here."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tidal.sandbox
from tidal.sandbox import SandboxBackend, SandboxResult
from tidal.sandbox.base import BatchBackend
from tidal.sandbox.batch import (
    FORKS_FILE,
    FORKS_SOURCE,
    Base,
    Companion,
    Template,
    ZygoteJob,
)
from tidal.types import Limits

# Runs up to the fork point once (in the template), then once per job; without a template (its
# report channel does not say "template") all of it runs in each job.
TEMPLATED = """\
import json, os, socket, sys, time


def read(fd):
    channel = socket.socket(fileno=fd)
    data = b""
    while chunk := channel.recv(4096):
        data += chunk
    channel.detach()
    return data.decode()


BASE = {"pid": None, "paths": None}
SETUP = {"pid": os.getpid(), "at": time.time()}
given = read(3)
if given == '{"template": "base"}':  # a base: forked here into each task's template
    import tidal_zygote_forks

    if os.path.exists("broken-base"):
        raise SystemExit(6)
    BASE = {"pid": os.getpid(), "paths": tidal_zygote_forks.base_point()["paths"]}
    SETUP = {"pid": os.getpid(), "at": time.time(), "parent": os.getppid()}
    given = read(3)
if given == "template":
    if os.path.exists("broken-template"):
        raise SystemExit(5)
    import tidal_zygote_forks

    tidal_zygote_forks.fork_point()
    given = read(3)
print(json.dumps({"template": SETUP["pid"], "at": SETUP["at"], "me": os.getpid(), "parent": os.getppid(),
                  "base": BASE["pid"], "paths": BASE["paths"], "template_parent": SETUP.get("parent"),
                  "cwd": os.getcwd(), "files": sorted(os.listdir(".")), "report": given,
                  "fds": sorted(os.listdir("/proc/self/fd"))}))
sys.stdout.flush()
exec(os.environ.get("THEN", ""))
"""
COMPANION = """\
import json, os, socket, sys, time


def serve(fd):
    channel = socket.socket(fileno=fd)
    asked = channel.recv(100)
    if asked == b"daemon" and os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(30)
        os._exit(0)
    channel.sendall(json.dumps({
        "pid": os.getpid(), "parent": os.getppid(), "cwd": os.getcwd(),
        "env": sorted(name for name in os.environ if name.startswith(("TIDAL_", "DROP_", "KEEP_"))),
        "preloaded": "pytest" in sys.modules, "path": [p for p in sys.path if "harness" in p],
    }).encode())
    return 3
"""
# Talks to its companion, then waits for the zygote to say how the companion ended.
WITH_COMPANION = """\
import json, os, select, socket
sock, status, pid = map(int, os.environ["TIDAL_COMPANION"].split(","))
channel = socket.socket(fileno=sock)
channel.sendall(os.environ.get("ASK", "hello").encode())
seen = json.loads(channel.recv(65536))
select.select([status], [], [], 10)
ended = json.loads(os.read(status, 65536))
print(json.dumps({"seen": seen, "pid": pid, "me": os.getpid(), "parent": os.getppid(),
                  "exit": os.waitstatus_to_exitcode(ended["status"]), "left": ended["left"]}))
"""
HARNESS = {FORKS_FILE: FORKS_SOURCE, "templated.py": TEMPLATED, "comp.py": COMPANION}


def templated(backend: SandboxBackend, answer: str, *, then: str = "", broken: bool = False, key: str = "key-1",
              base: Base | None = None, **limits: float) -> ZygoteJob:
    files: dict[str, str | bytes] = {"shared.txt": "of the template"}
    if broken:
        files["broken-template"] = ""
    return ZygoteJob([backend.python, "-s", "-B", "-m", "templated"], {"answer.txt": answer},
                     Limits(**{"timeout_s": 20, **limits}), env={"THEN": then}, report_input=f"nonce {answer}".encode(),
                     template=Template(key, files, b"template", base=base))


def batch(backend: SandboxBackend, jobs: list[ZygoteJob], preload: tuple[str, ...] = ()) -> list[SandboxResult | None]:
    assert isinstance(backend, BatchBackend)
    return backend.run_batch(jobs, harness_files=HARNESS, preload=preload)


def seen(result: SandboxResult | None) -> dict[str, Any]:
    assert result is not None and result.exit_code == 0, result
    return json.loads(result.stdout_text.splitlines()[0])


def test_jobs_of_a_template_are_forks_of_it_in_their_own_workspace(bwrap: SandboxBackend) -> None:
    results = batch(bwrap, [templated(bwrap, f"answer {n}") for n in range(3)])
    runs = [seen(result) for result in results]
    assert len({one["template"] for one in runs}) == 1  # one template...
    assert len({one["at"] for one in runs}) == 1  # ...whose start ran once
    assert all(one["me"] != one["template"] for one in runs)
    assert len({one["parent"] for one in runs}) == 1 and runs[0]["parent"] != runs[0]["template"]  # the zygote's
    assert len({one["cwd"] for one in runs}) == 1  # where the template started, written afresh for each
    for n, one in enumerate(runs):
        assert one["files"] == ["answer.txt"]  # its own files, not the template's or another job's
        assert one["report"] == f"nonce answer {n}"
        assert one["fds"] == ["0", "1", "2", "3", "4"]  # std streams, its channel, listdir's own


def test_a_template_that_does_not_start_leaves_its_jobs_to_run_whole(bwrap: SandboxBackend) -> None:
    runs = [seen(result) for result in batch(bwrap, [templated(bwrap, f"a{n}", broken=True) for n in range(2)])]
    assert [one["template"] for one in runs] == [one["me"] for one in runs]  # each ran from the start
    assert [one["report"] for one in runs] == ["nonce a0", "nonce a1"]


@pytest.mark.parametrize("attack", [
    "os.setpriority(os.PRIO_PROCESS, SETUP['pid'], 19)",
    "import resource; resource.prlimit(SETUP['pid'], resource.RLIMIT_NOFILE, (16, 16))",
    "import signal; os.kill(SETUP['pid'], signal.SIGSTOP)",
    "import signal; os.kill(SETUP['pid'], signal.SIGKILL)",
])
def test_a_template_a_job_changed_serves_no_other_job(bwrap: SandboxBackend, attack: str) -> None:
    jobs = [templated(bwrap, "first"), templated(bwrap, "attacker", then=attack), templated(bwrap, "third")]
    first, attacker, third = (seen(result) for result in batch(bwrap, jobs))
    assert first["template"] == attacker["template"]  # the attacker's own result stands
    assert third["template"] != first["template"]  # a fresh template, started after the attack
    assert third["report"] == "nonce third"


def test_templates_of_many_tasks_are_forks_of_one_base(bwrap: SandboxBackend) -> None:
    # One base per zygote; each task's template is forked from it with the task's paths, in the
    # folder the base started in, as the zygote's child; a template's jobs are forks of it.
    jobs = [templated(bwrap, f"{key} {n}", key=key, base=Base("base-1", [], [f"{key}.py"]))
            for key in ("task-a", "task-b") for n in range(2)]
    runs = [seen(result) for result in batch(bwrap, jobs)]
    assert len({one["base"] for one in runs}) == 1 and runs[0]["base"] is not None
    assert [one["paths"] for one in runs] == [["task-a.py"]] * 2 + [["task-b.py"]] * 2
    assert runs[0]["template"] == runs[1]["template"] != runs[2]["template"] == runs[3]["template"]
    assert all(one["template"] != one["base"] and one["template_parent"] == one["parent"] for one in runs)
    assert len({one["cwd"] for one in runs}) == 1
    for n, one in enumerate(runs):
        assert one["files"] == ["answer.txt"] and one["report"] == f"nonce {jobs[n].files['answer.txt']}"
        assert one["fds"] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("attack", [
    "import resource; resource.prlimit(BASE['pid'], resource.RLIMIT_NOFILE, (16, 16))",
    "import signal; os.kill(BASE['pid'], signal.SIGKILL)",
])
def test_a_base_a_job_changed_serves_no_other_template(bwrap: SandboxBackend, attack: str) -> None:
    jobs = [templated(bwrap, "first", key="task-a", base=Base("base-1", [], ["a.py"])),
            templated(bwrap, "attacker", key="task-a", base=Base("base-1", [], ["a.py"]), then=attack),
            templated(bwrap, "third", key="task-b", base=Base("base-1", [], ["b.py"]))]
    first, attacker, third = (seen(result) for result in batch(bwrap, jobs))
    assert first["base"] == attacker["base"] != third["base"]  # a fresh base, started after the attack
    assert third["paths"] == ["b.py"] and third["report"] == "nonce third"


def test_a_base_that_does_not_start_leaves_its_templates_to_start_alone(bwrap: SandboxBackend) -> None:
    job = templated(bwrap, "a0", key="task-a", base=Base("base-1", [], ["a.py"]))
    assert job.template is not None
    job.template.files["broken-base"] = ""
    runs = [seen(result) for result in batch(bwrap, [job, templated(bwrap, "b0", key="task-b", base=Base(
        "base-1", [], ["b.py"]))])]
    assert [one["base"] for one in runs] == [None, None]  # not tried again for the second task
    assert all(one["template"] != one["me"] for one in runs)  # templates still, started alone


def test_a_templated_job_gets_the_limits_and_clock_of_a_plain_one(bwrap: SandboxBackend) -> None:
    loop = templated(bwrap, "loop", then="while True:\n    pass", timeout_s=1.5)
    memory = templated(bwrap, "memory", then="x = bytearray(4 * 1024 ** 3)", memory_mb=256)
    results = batch(bwrap, [loop, memory, templated(bwrap, "fine")])
    assert results[0] is not None and results[0].status.value == "timeout"
    assert results[1] is not None and results[1].status.value == "memory_limit"
    assert seen(results[2])["report"] == "nonce fine"


def with_companion(backend: SandboxBackend, ask: str = "hello") -> ZygoteJob:
    return ZygoteJob([backend.python, "-s", "-B", "-m", "main"], {"main.py": WITH_COMPANION}, Limits(timeout_s=20),
                     env={"ASK": ask, "DROP_ME": "1", "KEEP_ME": "1"},
                     companion=Companion("comp:serve", env_drop=("DROP_",)))


def test_a_companion_is_a_fresh_process_beside_its_job(bwrap: SandboxBackend) -> None:
    results = batch(bwrap, [with_companion(bwrap), with_companion(bwrap)], preload=("pytest", "companion:comp"))
    for result in results:
        one = seen(result)
        companion = one["seen"]
        assert companion["pid"] == one["pid"] != one["me"]
        assert companion["parent"] == one["parent"]  # the zygote's child, as its job
        assert companion["cwd"].startswith("/workspace/")
        assert companion["env"] == ["KEEP_ME"]  # no harness variables, none the job dropped
        assert companion["preloaded"] is False and companion["path"] == []  # nothing the zygote preloaded
        assert one["exit"] == 3 and one["left"] == []


def test_what_a_companion_leaves_running_is_reported_to_its_job(bwrap: SandboxBackend) -> None:
    (result,) = batch(bwrap, [with_companion(bwrap, ask="daemon")], preload=("companion:comp",))
    # The detached grandchild, found when the zygote reaped the companion; its parent exits right
    # after forking it, so a scan that runs first sees that one too (seen in CI): one or both.
    left = seen(result)["left"]
    assert 1 <= len(left) <= 2 and all(name.startswith("python") for _, name in left)


def test_a_job_that_changes_the_nursery_retires_its_zygote(bwrap: SandboxBackend) -> None:
    renice_siblings = (  # the zygote's other children: the nursery (and a template, if any)
        "import os\n"
        "for entry in os.listdir('/proc'):\n"
        "    if entry.isdigit() and int(entry) != os.getpid():\n"
        "        try:\n"
        "            stat = open(f'/proc/{entry}/stat').read()\n"
        "        except OSError:\n"
        "            continue\n"
        "        if int(stat.rsplit(')', 1)[1].split()[1]) == os.getppid():\n"
        "            os.setpriority(os.PRIO_PROCESS, int(entry), 19)\n"
        "print('done')\n"
    )
    attacker = ZygoteJob([bwrap.python, "-s", "-B", "-m", "main"], {"main.py": renice_siblings}, Limits(timeout_s=20))
    first, second, third = batch(bwrap, [with_companion(bwrap), attacker, with_companion(bwrap)],
                               preload=("companion:comp",))
    assert seen(first)["exit"] == 3
    assert second is not None and second.stdout_text == "done\n"  # its own result stands
    assert third is None  # the caller runs it alone


@pytest.mark.parametrize("base", [None, Base("base-1", [], ["a.py"])], ids=["alone", "from a base"])
def test_a_templated_job_may_use_all_of_its_processes_beside_the_helpers(bwrap: SandboxBackend,
                                                                          base: Base | None) -> None:
    """The zygote, the nursery, the base and the template live in the sandbox beside a job; the
    process limits leave room for them, so a job still gets its whole `pids` (itself and 5 children)."""
    then = (
        "import os, time\nkids = []\nfor _ in range(5):\n    pid = os.fork()\n    if pid == 0:\n"
        "        time.sleep(1)\n        os._exit(0)\n    kids.append(pid)\nprint('forked', len(kids))\n"
        "for kid in kids:\n    os.waitpid(kid, 0)\n"
    )
    [result] = batch(bwrap, [templated(bwrap, "six", then=then, pids=6, base=base)])
    seen(result)
    assert result is not None and result.stdout_text.splitlines()[1] == "forked 5"


SIBLING = """
import os, random, sys
sys.path.insert(0, sys.argv[1])
import zygote_clean
sys.modules["tidal_zygote_clean"] = zygote_clean
import zygote
sys.modules["tidal_zygote"] = zygote
import zygote_forks

after_fork = []
os.register_at_fork(after_in_child=lambda: after_fork.append(os.getpid()))
read, write = os.pipe()
top = os.getpid()
helper = os.fork()
if helper == 0:  # a helper (single-threaded), as a template or the nursery is
    random.seed(0)
    child = zygote_forks._sibling()
    if child == 0:
        os.write(write, f"{os.getpid()} {os.getppid()} {after_fork[-1] == os.getpid()} {random.random()}\\n".encode())
        os._exit(7)
    os.write(write, f"{child}\\n".encode())
    os._exit(0)
os.waitpid(helper, 0)
os.close(write)
made, reported = sorted(open(read).read().split("\\n")[:2], key=len)
pid, status = os.wait()  # the helper's child is this process's own
print(made, reported, pid, os.waitstatus_to_exitcode(status), top, random.Random(0).random() != float(reported.split()[3]))
"""


def test_a_helper_forks_its_processes_as_the_zygotes_children() -> None:
    # zygote_forks._sibling: clone(2) with CLONE_PARENT instead of a middle process that exits.
    # The new process is the caller's parent's child (reaped by it, with its exit status), and
    # took the interpreter's after-fork steps (the fork hooks ran, random was reseeded).
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("zygote_forks knows clone(2)'s number on x86_64 and aarch64 only")
    folder = str(Path(tidal.sandbox.__file__).parent)
    done = subprocess.run([sys.executable, "-c", SIBLING, folder], capture_output=True, text=True, timeout=60,
                          check=True)
    made, pid, parent, after_hook, _, reaped, status, top, reseeded = done.stdout.split()
    assert made == pid == reaped and parent == top and status == "7"
    assert after_hook == "True" and reseeded == "True"
