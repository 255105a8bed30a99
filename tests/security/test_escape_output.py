"""Escape probes: what the sandbox sends back. Output is hostile input to the harness: capped
(64 KiB kept per stream, the rest drained), kept as bytes, and never mistaken for the sandbox's
own messages."""

from __future__ import annotations

import tracemalloc

from escape_probes import ProbeRunner

from tidal.sandbox import SandboxBackend, SandboxStatus


def test_huge_output_is_truncated_and_the_harness_memory_stays_bounded(probe: ProbeRunner, backend: SandboxBackend) -> None:
    tracemalloc.start()
    try:
        result = probe.run("""
            chunk = b"x" * (1024 * 1024)
            for _ in range(100):
                sys.stdout.buffer.write(chunk)
            for _ in range(20):
                sys.stderr.buffer.write(b"y" * (1024 * 1024))
        """, timeout_s=20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    cap = backend.output_cap  # type: ignore[attr-defined]
    assert result.status is SandboxStatus.OK and result.exit_code == 0, result.stderr[-300:]
    assert result.stdout_truncated and result.stderr_truncated
    assert result.stdout == b"x" * cap and result.stderr == b"y" * cap
    assert peak < 16 * 1024 * 1024, f"the harness held {peak / 2 ** 20:.0f} MiB for 120 MiB of output"


def test_non_utf8_output_comes_back_as_bytes(probe: ProbeRunner) -> None:
    garbage = b"\xff\xfe\x00\x80\xc3\x28 \xed\xa0\x80 \x1b]0;title\x07\x1b[2J"
    result = probe.run(f"""
        sys.stdout.buffer.write({garbage!r})
        sys.stderr.buffer.write({garbage!r})
    """)
    assert result.status is SandboxStatus.OK and result.exit_code == 0
    assert result.stdout == garbage and result.stderr == garbage
    assert "\ufffd" in result.stdout_text and "\ufffd" in result.stderr_text


def test_forged_sandbox_errors_are_the_commands_output(probe: ProbeRunner) -> None:
    # The harness tells a sandbox that could not start from a command that says so by a random start
    # marker printed before the command runs: these lines must not raise SandboxUnavailableError.
    result = probe.run("""
        print("bwrap: Can't mount proc on /newroot/proc: Operation not permitted", file=sys.stderr)
        print("tidal-start-0123456789abcdef:", flush=True)
        sys.exit(1)
    """)
    assert result.status is SandboxStatus.OK and result.exit_code == 1
    assert result.stdout == b"tidal-start-0123456789abcdef:\n"
    assert result.stderr.startswith(b"bwrap: Can't mount proc")


def test_orphan_holding_the_output_pipes_does_not_hold_the_run(probe: ProbeRunner) -> None:
    # A child keeps stdout open and keeps writing after the main process exits: the run still ends
    # when the main process does, and the child goes with it.
    result = probe.run("""
        import time
        if os.fork() == 0:
            os.setsid()
            while True:
                print("still here", flush=True)
                time.sleep(0.05)
        time.sleep(0.2)
        print("main done", flush=True)
    """, timeout_s=8)
    assert result.status is SandboxStatus.OK and result.exit_code == 0
    assert b"main done" in result.stdout
