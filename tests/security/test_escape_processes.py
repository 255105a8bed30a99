"""Escape probes: processes and identity. The sandbox has its own pid namespace (it sees only its
own processes), runs as uid 65534 without capabilities, and its whole tree dies with the run; the
host checks its own processes are untouched and none of the sandbox's are left."""

from __future__ import annotations

import os
import time
from pathlib import Path

from escape_probes import HostSleeper, ProbeRunner, marked_processes, probe_output

from tidal.sandbox import SandboxBackend, SandboxStatus
from tidal.types import Limits

DAEMON = """
import signal, time
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGXCPU):
    signal.signal(sig, signal.SIG_IGN)
pid_ns = os.readlink("/proc/self/ns/pid")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        time.sleep(1.0)
        open("/workspace/late", "w").write("the daemon outlived the run")
        time.sleep(60)
        os._exit(0)
    os._exit(0)
time.sleep(0.2)
report(pid_ns=pid_ns)
"""


def test_sees_only_its_own_processes(probe: ProbeRunner, host_nobody_process: HostSleeper) -> None:
    host_pid = host_nobody_process.process.pid
    result = probe.run(f"""
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        cmdlines = []
        for pid in pids:
            try:
                cmdlines.append(open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0")[0].decode())
            except OSError:
                pass
        report(pid=os.getpid(), pids=pids, cmdlines=cmdlines, signal_host=attempt(os.kill, {host_pid}, 0),
               host_tag_seen=any({host_nobody_process.tag!r} in c for c in cmdlines))
    """)
    out = probe_output(result)
    # pid 1 is bwrap's init; the probe (after setpriv, sh and prlimit exec'd into it) is pid 2.
    assert out["pids"] == [1, out["pid"]] and out["pid"] <= 3, out
    assert os.path.basename(out["cmdlines"][0]) == "bwrap", out
    assert out["signal_host"] == "ESRCH" and out["host_tag_seen"] is False, out


def test_kill_minus_one_and_the_supervisor_leave_the_host_alone(
    probe: ProbeRunner, backend: SandboxBackend, host_nobody_process: HostSleeper
) -> None:
    # kill(-1) reaches every process the sender may signal: in its pid namespace only. The host
    # process of the very same uid must survive, and so must the harness and its parent.
    harness_parent = os.getppid()  # 1 already when pytest runs detached (nohup, setsid): compare, not `> 1`
    result = probe.run("""
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        parent = os.getppid()
        outcomes = dict(parent=parent, kill_parent=attempt(os.kill, parent, signal.SIGKILL),
                        kill_all_term=attempt(os.kill, -1, signal.SIGTERM), kill_all=attempt(os.kill, -1, signal.SIGKILL),
                        kill_group=attempt(os.killpg, os.getpgrp(), signal.SIGTERM))
        report(**outcomes)
    """)
    out = probe_output(result)
    assert out["parent"] == 1 and out["kill_parent"] in ("ok", "EPERM"), out  # pid-ns init ignores it
    assert result.status is SandboxStatus.OK and result.exit_code == 0, result.stderr_text
    assert host_nobody_process.process.poll() is None, "a host process of uid 65534 was killed from the sandbox"
    assert os.getppid() == harness_parent  # the harness was not killed or orphaned
    assert backend.run(["/bin/true"], {}, Limits(timeout_s=5)).exit_code == 0  # and still works


def test_daemon_does_not_outlive_the_run(probe: ProbeRunner) -> None:
    # A double-forked, setsid, signal-ignoring daemon: the host keeps the workspace for 1.5 s after
    # the run (`after` runs once the sandbox is gone) and looks for its file and its process.
    def after(workspace: Path) -> tuple[bool, list[int]]:
        time.sleep(1.5)
        return (workspace / "late").exists(), [p.pid for p in marked_processes(probe.marker, probe.since_ticks)]

    result = probe.run(DAEMON, timeout_s=5, after=after)
    out = probe_output(result)
    assert out["pid_ns"].startswith("pid:[")
    assert result.status is SandboxStatus.OK and result.wall_s < 4.5  # the daemon did not hold the run open
    assert result.after_value == (False, []), result.after_value


def test_daemon_is_killed_at_the_deadline_too(probe: ProbeRunner) -> None:
    # The same daemon, but the main process hangs until the wall clock kills the sandbox.
    def after(workspace: Path) -> tuple[bool, list[int]]:
        time.sleep(1.5)
        return (workspace / "late").exists(), [p.pid for p in marked_processes(probe.marker, probe.since_ticks)]

    result = probe.run(DAEMON.replace("report(pid_ns=pid_ns)", "report(pid_ns=pid_ns)\nwhile True:\n    time.sleep(1)"),
                       timeout_s=0.8, after=after)
    assert result.status is SandboxStatus.TIMEOUT
    assert result.after_value == (False, []), result.after_value


def test_runs_as_nobody_without_capabilities(probe: ProbeRunner) -> None:
    result = probe.run("""
        status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
        import socket
        report(ids=[os.getuid(), os.geteuid(), os.getgid(), os.getegid()], groups=os.getgroups(),
               caps={k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
               no_new_privs=status["NoNewPrivs"].strip(), hostname=socket.gethostname(),
               setuid_root=attempt(os.setuid, 0), setgroups=attempt(os.setgroups, [0]))
    """)
    out = probe_output(result)
    assert out["ids"] == [65534] * 4 and out["groups"] in ([], [65534]), out
    assert set(out["caps"].values()) == {"0000000000000000"}, out["caps"]
    assert out["no_new_privs"] == "1" and out["hostname"] == "sandbox"
    assert out["setuid_root"] == "EPERM" and out["setgroups"] == "EPERM", out


def test_setuid_binaries_do_not_escalate(probe: ProbeRunner) -> None:
    # no_new_privs and nosuid mounts: su, mount and friends run, but never as root.
    result = probe.run("""
        import subprocess
        runs = {}
        for argv in (["/usr/bin/su", "root", "-c", "touch /workspace/pwned-su"],
                     ["/usr/bin/mount", "-t", "tmpfs", "none", "/workspace"],
                     ["/usr/bin/newgrp", "root"],
                     ["/usr/bin/sudo", "-n", "touch", "/workspace/pwned-sudo"]):
            if not os.path.exists(argv[0]):
                continue
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=3)
            runs[os.path.basename(argv[0])] = done.returncode
        mounts = [line.split() for line in open("/proc/self/mounts")]
        report(runs=runs, suid_mounts=[m[1] for m in mounts if m[1] in ("/usr", "/workspace") and "nosuid" not in m[3]],
               workspace=sorted(os.listdir("/workspace")))
    """, after=lambda workspace: sorted(p.name for p in workspace.iterdir()))
    out = probe_output(result)
    assert out["runs"] and all(code != 0 for code in out["runs"].values()), out
    assert out["suid_mounts"] == [], out
    assert result.after_value == ["probe.py"], result.after_value


def test_rlimits_cannot_be_raised(probe: ProbeRunner) -> None:
    result = probe.run("""
        import resource, subprocess
        outcomes, limits = {}, {}
        for name in ("RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE"):
            resource_id = getattr(resource, name)
            soft, hard = resource.getrlimit(resource_id)
            limits[name] = [soft, hard]
            try:
                resource.setrlimit(resource_id, (hard + 1, hard + 1))
                outcomes[name] = "raised"
            except (ValueError, OSError):
                outcomes[name] = "refused"
        prlimit = subprocess.run(["prlimit", f"--pid={os.getpid()}", "--nproc=100000:100000"], capture_output=True)
        report(outcomes=outcomes, limits=limits, prlimit=prlimit.returncode,
               nproc_after=list(resource.getrlimit(resource.RLIMIT_NPROC)))
    """, memory_mb=256, pids=16)
    out = probe_output(result)
    assert set(out["outcomes"].values()) == {"refused"}, out
    assert out["limits"]["RLIMIT_AS"] == [256 * 1024 * 1024] * 2 and out["limits"]["RLIMIT_NPROC"] == [16, 16]
    assert out["prlimit"] != 0 and out["nproc_after"] == [16, 16], out
