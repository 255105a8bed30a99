"""Harness that runs INSIDE the sandbox for `program_io`, `efficiency` and `static`.

Not imported by tidal at run time except for `outputs_match`, which the host's tests share: the
verifiers ship this file as the harness file `tidal_io_runner.py` and run it under `python -I`
(`io_harness.BOOT`) as `cases` or `ruff ...`. Standard library only. `cases`: the job (programs,
cases, expected outputs, limits, a nonce) arrives over the report channel, never through the
workspace, so candidate code cannot read the expected outputs; the harness makes itself
non-dumpable and the child subreaper, runs each program per case as a subprocess of its own
session (`close_fds`, a wall clock, an output cap), then kills everything the run left, reaps it
and sums its rusage, compares the output itself and reports one JSON line per event with the
nonce, on a channel the candidate never holds. A hidden reference (efficiency) exists on disk only
while it runs, with no candidate process alive. `ruff`: runs the shipped ruff binary through the
ELF loader (harness files are not executable) and prints a bounded summary; ruff never executes
the code. Step by step: docs/design/verifiers.md, "What they share".
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any

EXCERPT_CHARS = 300
STDERR_TAIL = 1500
MEMORY_SIGNATURES = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory")
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
REAP_S = 0.5  # how long killed descendants are waited for before they are given up on


# ----------------------------------------------------------------------------- comparison


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _token_close(got: str, expected: str, abs_tol: float, rel_tol: float) -> bool:
    if got == expected:
        return True
    try:
        a, b = float(got), float(expected)
    except ValueError:
        return False
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= max(abs_tol, rel_tol * abs(b))


def outputs_match(got: str, expected: str, abs_tol: float | None = None, rel_tol: float | None = None) -> bool:
    """Whether `got` equals `expected` after trailing whitespace (per line and at the end) is
    dropped; with a tolerance, whitespace-separated tokens that are both finite numbers may
    differ by max(abs_tol, rel_tol * |expected|)."""
    got_lines, expected_lines = _lines(got), _lines(expected)
    if got_lines == expected_lines:
        return True
    if abs_tol is None and rel_tol is None or len(got_lines) != len(expected_lines):
        return False
    for got_line, expected_line in zip(got_lines, expected_lines):
        got_tokens, expected_tokens = got_line.split(), expected_line.split()
        if len(got_tokens) != len(expected_tokens):
            return False
        if not all(_token_close(g, e, abs_tol or 0.0, rel_tol or 0.0) for g, e in zip(got_tokens, expected_tokens)):
            return False
    return True


# ----------------------------------------------------------------------------- processes


def _exited(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _ancestors() -> set[int]:
    found, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.add(pid)
    return found


class Runner:
    """Runs programs as subprocesses of this harness and measures everything they started."""

    def __init__(self, python: str, env: dict[str, str], sweep: bool) -> None:
        self.python, self.env, self.sweep = python, env, sweep
        self.keep = _ancestors() | {1} if sweep else set()

    def _kill_all(self, group: int) -> None:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if not self.sweep:
            return
        # Alone in a pid namespace: whatever is not us or our ancestors was started by a run
        # (a daemon that left the process group with setsid included).
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in self.keep:
                try:
                    os.kill(int(name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _reap(self, pid: int) -> tuple[int, float, float]:
        """The exit status of `pid`, and CPU seconds and peak RSS (MiB) of it and every other
        descendant reaped here (orphans come to this subreaper)."""
        _, status, usage = os.wait4(pid, 0)
        cpu, rss = usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
        until = time.monotonic() + REAP_S
        while True:
            try:
                other, _, more = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if other == 0:
                if time.monotonic() > until:
                    break
                time.sleep(0.005)
                continue
            cpu += more.ru_utime + more.ru_stime
            rss = max(rss, more.ru_maxrss / 1024)
        return status, cpu, rss

    def execute(self, argv: list[str], data: bytes, timeout_s: float, cap: int) -> dict[str, Any]:
        """Run `argv` with `data` on stdin; what it printed (up to `cap` bytes) and how it ended."""
        started = time.monotonic()
        try:
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env=self.env, close_fds=True, start_new_session=True)
        except OSError as error:
            return {"verdict": "runtime_error", "stdout": b"", "stderr": str(error).encode(), "exit_code": None,
                    "signal": None, "cpu_s": 0.0, "max_rss_mb": 0.0, "wall_s": 0.0}
        stdout, stderr = bytearray(), bytearray()
        timed_out, exceeded = _pump(process, data, stdout, stderr, started + timeout_s, cap)
        self._kill_all(process.pid)
        status, cpu, rss = self._reap(process.pid)
        process.returncode = os.waitstatus_to_exitcode(status)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        code = process.returncode
        sig = -code if code < 0 else None
        return {"verdict": _verdict(code, sig, timed_out, exceeded, stderr), "stdout": bytes(stdout[:cap]),
                "stderr": bytes(stderr), "exit_code": code if sig is None else None,
                "signal": sig, "cpu_s": cpu, "max_rss_mb": rss, "wall_s": time.monotonic() - started}


def _pump(process: subprocess.Popen[bytes], data: bytes, stdout: bytearray, stderr: bytearray, deadline: float,
          cap: int) -> tuple[bool, bool]:
    """Feed `data` to the process's stdin and read its stdout and stderr (only the last STDERR_TAIL
    bytes kept) until they close, the deadline passes or stdout exceeds `cap`; (timed out, exceeded)."""
    assert process.stdin and process.stdout and process.stderr
    pending = memoryview(data)
    selector = selectors.DefaultSelector()
    for stream in (process.stdin, process.stdout, process.stderr):
        os.set_blocking(stream.fileno(), False)
    if pending:
        selector.register(process.stdin.fileno(), selectors.EVENT_WRITE)
    else:
        process.stdin.close()
    selector.register(process.stdout.fileno(), selectors.EVENT_READ, stdout)
    selector.register(process.stderr.fileno(), selectors.EVENT_READ, stderr)
    exited_at: float | None = None
    try:
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                return True, False
            if exited_at is None and _exited(process.pid):
                exited_at = now
            if exited_at is not None and now > exited_at + 0.2:
                break  # a descendant holds the pipes open
            for key, _ in selector.select(timeout=min(0.05, deadline - now)):
                if key.events & selectors.EVENT_WRITE:
                    pending = _write_some(key.fd, pending, selector, process.stdin)
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                key.data.extend(chunk)
                if key.data is stderr and len(stderr) > STDERR_TAIL:
                    del stderr[:-STDERR_TAIL]
                if len(stdout) > cap:
                    return False, True
    finally:
        selector.close()
    return False, False


def _write_some(fd: int, pending: memoryview, selector: selectors.BaseSelector, stdin: Any) -> memoryview:
    """Write what stdin takes now of `pending`; what is left (nothing once it is gone: stdin closed)."""
    try:
        written = os.write(fd, pending[:65536])
        pending = pending[written:]
    except BlockingIOError:
        return pending
    except OSError:
        pending = pending[:0]
    if not pending:
        selector.unregister(fd)
        stdin.close()
    return pending


def _verdict(code: int, sig: int | None, timed_out: bool, exceeded: bool, stderr: bytearray) -> str:
    """How a run ended, first that applies."""
    if timed_out or sig == signal.SIGXCPU:
        return "timeout"
    if exceeded:
        return "output_limit"
    if code != 0 and any(s in stderr for s in MEMORY_SIGNATURES):
        return "memory_limit"
    if sig is not None:
        return "crashed"
    if code != 0:
        return "runtime_error"
    return "ok"


# ----------------------------------------------------------------------------- the cases job


def _open_channel() -> tuple[socket.socket, dict[str, Any]]:
    fd = int(os.environ.pop("TIDAL_REPORT_FD"))
    os.set_inheritable(fd, False)
    channel = socket.socket(fileno=fd)
    chunks = []
    while True:
        chunk = channel.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    return channel, json.loads(b"".join(chunks))


def _harden() -> list[str]:
    """Non-dumpable (the same-uid candidate cannot read this process's memory or fds) and child
    subreaper (orphans of a run are reaped, and measured, here). What failed, if anything."""
    problems = []
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for option, value, name in ((PR_SET_DUMPABLE, 0, "dumpable"), (PR_SET_CHILD_SUBREAPER, 1, "subreaper")):
            if libc.prctl(option, value, 0, 0, 0) != 0:
                problems.append(f"prctl {name}: errno {ctypes.get_errno()}")
    except OSError as error:
        problems.append(f"prctl: {error}")
    return problems


class Job:
    """One `cases` job: prepare the programs, run the cases, report each verdict."""

    def __init__(self, channel: socket.socket, spec: dict[str, Any]) -> None:
        self.channel, self.spec, self.nonce = channel, spec, str(spec["nonce"])
        self.deadline = time.monotonic() + float(spec["budget_s"])
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TIDAL_HARNESS")}
        env["TMPDIR"] = os.getcwd()  # gcc's temporary files; /tmp may not be writable
        self.runner = Runner(str(spec["python"]), env, bool(spec["sweep"]))
        self.argv: dict[str, list[str]] = {}
        self.hidden: dict[str, tuple[str, bytes]] = {}  # reference: file name, content (source or binary)

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"nonce": self.nonce, "event": event, **fields}) + "\n"
        self.channel.sendall(line.encode("utf-8"))

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _compile(self, name: str, program: dict[str, Any], path: str, output: str) -> bool:
        language = program["language"]
        if language == "python":
            argv = [self.runner.python, "-I", "-c",
                    "import sys; compile(open(sys.argv[1], 'rb').read(), sys.argv[1], 'exec', dont_inherit=True)", path]
        else:
            argv = [*self.spec["compilers"][language], path, "-o", output]
        timeout = min(float(self.spec["compile_timeout_s"]), max(0.1, self.remaining()))
        result = self.runner.execute(argv, b"", timeout, 64 * 1024)
        ok = result["verdict"] == "ok"
        diagnostics = (result["stdout"] + result["stderr"]).decode("utf-8", errors="replace")[-STDERR_TAIL:]
        self.emit("compile", program=name, ok=ok, verdict=result["verdict"], diagnostics=diagnostics)
        return ok

    def prepare(self, name: str) -> bool:
        program = self.spec["programs"][name]
        language, source = program["language"], program["source"]
        if name == "candidate":  # its file is in the workspace already
            path = program["file"]
            output = os.path.join(os.getcwd(), "candidate.bin")
            if not self._compile(name, program, path, output):
                return False
            self.argv[name] = [self.runner.python, "-I", path] if language == "python" else [output]
            return True
        folder = os.path.join(os.getcwd(), f".ref-{secrets.token_hex(8)}")
        os.mkdir(folder, 0o700)
        try:
            path = os.path.join(folder, program["file"])
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(source)
            if language == "python":
                self.hidden[name] = (program["file"], source.encode("utf-8"))
                return self._compile(name, program, path, "")
            output = os.path.join(folder, "reference.bin")
            if not self._compile(name, program, path, output):
                return False
            with open(output, "rb") as handle:
                self.hidden[name] = ("reference.bin", handle.read())
            return True
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def run_once(self, name: str, data: bytes, timeout: float) -> dict[str, Any]:
        cap = int(self.spec["max_output_bytes"])
        if name not in self.hidden:
            return self.runner.execute(self.argv[name], data, timeout, cap)
        file, content = self.hidden[name]
        folder = os.path.join(os.getcwd(), f".ref-{secrets.token_hex(8)}")
        try:
            os.mkdir(folder, 0o700)
            path = os.path.join(folder, file)
            with open(path, "wb") as handle:
                handle.write(content)
            os.chmod(path, 0o700)
        except OSError as error:
            shutil.rmtree(folder, ignore_errors=True)
            return {"verdict": "runtime_error", "stdout": b"", "stderr": f"harness: {error}".encode(), "exit_code": None,
                    "signal": None, "cpu_s": 0.0, "max_rss_mb": 0.0, "wall_s": 0.0}
        try:
            argv = [self.runner.python, "-I", path] if file.endswith(".py") else [path]
            return self.runner.execute(argv, data, timeout, cap)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def case(self, name: str, index: int, repeat: int, expected: str | None) -> tuple[str, str]:
        """Run program `name` on case `index`; its verdict and decoded output, after emitting them."""
        case = self.spec["cases"][index]
        timeout = min(float(self.spec["case_timeout_s"]), self.remaining())
        if timeout <= 0:
            self.emit("case", program=name, index=index, repeat=repeat, verdict="not_run")
            return "not_run", ""
        result = self.run_once(name, case["input"].encode("utf-8"), timeout)
        got = result["stdout"].decode("utf-8", errors="surrogateescape")
        verdict = result["verdict"]
        if verdict == "ok" and expected is not None:
            compare = self.spec["compare"]
            verdict = "passed" if outputs_match(got, expected, compare.get("abs_tol"), compare.get("rel_tol")) else "wrong_answer"
        evidence: dict[str, Any] = {}
        if verdict not in ("passed", "ok") or repeat < 0:  # keeps the report small: evidence only where used
            evidence["got"] = got[:EXCERPT_CHARS].encode("utf-8", errors="replace").decode("utf-8", errors="replace")
            evidence["stderr"] = result["stderr"].decode("utf-8", errors="replace")[-STDERR_TAIL:]
        self.emit("case", program=name, index=index, repeat=repeat, verdict=verdict,
                  cpu_s=round(result["cpu_s"], 6), max_rss_mb=round(result["max_rss_mb"], 3),
                  wall_s=round(result["wall_s"], 4), exit_code=result["exit_code"], signal=result["signal"], **evidence)
        return verdict, got

    def run(self) -> None:
        cases = self.spec["cases"]
        expected: list[str | None] = [case.get("output") for case in cases]
        stop = bool(self.spec["stop_on_failure"])
        if "reference" in self.spec["programs"]:
            # Before any candidate code runs: the reference must work, and gives missing outputs.
            if not self.prepare("reference"):
                return
            for index in range(len(cases)):
                verdict, got = self.case("reference", index, -1, expected[index])
                if verdict not in ("passed", "ok"):
                    return
                expected[index] = got if expected[index] is None else expected[index]
        if not self.prepare("candidate"):
            return
        order = ["candidate", "reference"] if "reference" in self.spec["programs"] else ["candidate"]
        for repeat in range(int(self.spec["repeats"])):
            for index in range(len(cases)):
                for name in order if repeat % 2 == 0 else order[::-1]:
                    verdict, _ = self.case(name, index, repeat, expected[index])
                    if verdict != "passed" and stop:
                        return


def cases_main() -> int:
    channel, spec = _open_channel()
    job = Job(channel, spec)
    problems = _harden()
    # What a process that uses almost nothing reads as peak RSS: it inherits the harness's mark.
    floor = job.runner.execute(["/bin/true"], b"", 5.0, 1024)["max_rss_mb"]
    job.emit("start", problems=problems, rss_floor_mb=round(floor, 3))
    try:
        job.run()
    except Exception:  # a harness bug, not the candidate's doing: the host reports an infra error
        job.emit("error", traceback=traceback.format_exc()[-STDERR_TAIL:])
        raise
    job.emit("finish")
    return 0


# ----------------------------------------------------------------------------- ruff


def ruff_main(loader: str, ruff: str, args: list[str]) -> int:
    """Run ruff; print {"count", "by_code", "diagnostics" (first 20), "syntax_errors"} or {"error"}."""
    argv = ([loader] if loader else []) + [ruff, *args]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["RAYON_NUM_THREADS"] = "1"  # threads count against the sandbox's process limit
    try:
        done = subprocess.run(argv, check=False, capture_output=True, env=env, timeout=float(os.environ.get("TIDAL_RUFF_TIMEOUT", "20")))
    except (OSError, subprocess.TimeoutExpired) as error:
        print(json.dumps({"error": f"ruff did not run: {error}"}))
        return 0
    try:
        diagnostics = json.loads(done.stdout)
    except ValueError:
        print(json.dumps({"error": f"ruff exited {done.returncode}: {done.stderr.decode(errors='replace')[-STDERR_TAIL:]}"}))
        return 0
    by_code: dict[str, int] = {}
    lines = []
    syntax = 0
    for item in diagnostics:
        code = str(item.get("code") or "invalid-syntax")  # older ruff: code null, "SyntaxError: ..."
        syntax += code == "invalid-syntax" or str(item.get("message", "")).startswith("SyntaxError")
        by_code[code] = by_code.get(code, 0) + 1
        if len(lines) < 20:
            location = item.get("location") or {}
            lines.append(f"{location.get('row')}:{location.get('column')} {code} {str(item.get('message'))[:200]}")
    print(json.dumps({"count": len(diagnostics), "by_code": by_code, "diagnostics": lines, "syntax_errors": syntax}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["ruff"]:
        sys.exit(ruff_main(sys.argv[2], os.path.join(os.environ.get("TIDAL_HARNESS", ""), sys.argv[3]), sys.argv[4:]))
    sys.exit(cases_main())
