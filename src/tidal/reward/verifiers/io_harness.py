"""What `compile`, `program_io`, `efficiency` and `static` share: reading their task arguments,
taking the program out of the answer, finding the compilers, and running the in-sandbox harness
(io_runner.py) with its report checked against a per-run nonce.

Bad verifier arguments raise `TaskFormatError` naming the task id and the field (`[id]
verifier.cases[2].input: ...`); each verifier turns it into `task_problem` (an infra error the
gate drops, never a training 0), the same path `tidal tasks validate` could call.
"""

from __future__ import annotations

import json
import secrets
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.errors import SandboxUnavailableError, TaskFormatError
from tidal.reward.base import ScoringContext, check_answer, failed, format_failed, task_problem
from tidal.reward.verifiers.python_tests import FENCE, Report
from tidal.sandbox.base import SandboxResult
from tidal.types import Outcome, Score, Task

HARNESS_MODULE = "tidal_io_runner"
HARNESS_SOURCE = (Path(__file__).parent / "io_runner.py").read_text(encoding="utf-8")
HARNESS_FILES: dict[str, str | bytes] = {f"{HARNESS_MODULE}.py": HARNESS_SOURCE}
# The harness runs with -I (no script folder or workspace on sys.path, PYTHON* ignored), so a
# workspace file cannot shadow a module it imports; it finds itself through $TIDAL_HARNESS.
BOOT = ("import os, runpy; runpy.run_path(os.path.join(os.environ['TIDAL_HARNESS'], "
        f"'{HARNESS_MODULE}.py'), run_name='__main__')")

LANGUAGES = ("python", "c", "cpp")
FENCE_LANGUAGES = {"python": "python", "py": "python", "python3": "python", "c": "c", "h": "c",
                   "cpp": "cpp", "c++": "cpp", "cc": "cpp", "cxx": "cpp", "hpp": "cpp"}
SOURCE_FILES = {"python": "solution.py", "c": "solution.c", "cpp": "solution.cpp"}
COMPILERS = {"c": "gcc", "cpp": "g++"}
# Folders bwrap binds into the sandbox read-only: a compiler elsewhere would not be found there.
SANDBOX_VISIBLE = ("/usr/", "/bin/", "/sbin/", "/lib")
MAX_CASES = 1000
MAX_CASE_BYTES = 8 * 1024 * 1024  # inputs and outputs of all cases together
DIAGNOSTICS_CHARS = 2000


# ----------------------------------------------------------------------------- arguments


def bad_arg(task: Task, field: str, message: str) -> TaskFormatError:
    return TaskFormatError([f"[{task.id}] verifier.{field}: {message}"])


def number_arg(task: Task, name: str, default: float | None, low: float, high: float, *,
               closed: bool = False) -> float | None:
    """A number argument in (low, high] ([low, high] when `closed`); `default` when absent."""
    value = task.verifier.args.get(name, default)
    if value is None:
        return None
    inside = isinstance(value, (int, float)) and (low <= value if closed else low < value) and value <= high
    if isinstance(value, bool) or not inside:
        raise bad_arg(task, name, f"must be a number in {'[' if closed else '('}{low:g}, {high:g}], not {value!r}")
    return float(value)


def int_arg(task: Task, name: str, default: int, low: int, high: int) -> int:
    value = task.verifier.args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_arg(task, name, f"must be an integer in [{low}, {high}], not {value!r}")
    return value


def bool_arg(task: Task, name: str, default: bool) -> bool:
    value = task.verifier.args.get(name, default)
    if not isinstance(value, bool):
        raise bad_arg(task, name, f"must be true or false, not {value!r}")
    return value


def strings_arg(task: Task, name: str, default: list[str]) -> list[str]:
    value = task.verifier.args.get(name, default)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_arg(task, name, f"must be a list of strings, not {value!r}")
    return list(value)


def language_arg(task: Task, allowed: tuple[str, ...] = LANGUAGES) -> str | None:
    """The `language` argument (python, c, cpp, or a fence alias such as c++), or None."""
    value = task.verifier.args.get("language")
    if value is None:
        return None
    language = FENCE_LANGUAGES.get(str(value).lower())
    if language not in allowed:
        raise bad_arg(task, "language", f"must be one of {', '.join(allowed)}, not {value!r}")
    return language


@dataclass(frozen=True)
class Case:
    input: str
    output: str | None


def cases_arg(task: Task, require_output: bool) -> list[Case]:
    """The `cases` argument: a non-empty list of {input, output} (output optional when a reference
    program supplies it)."""
    raw = task.verifier.args.get("cases")
    if not isinstance(raw, list) or not raw:
        raise bad_arg(task, "cases", "must be a non-empty list of {input, output}")
    if len(raw) > MAX_CASES:
        raise bad_arg(task, "cases", f"has {len(raw)} cases, over the {MAX_CASES} cap")
    cases, size = [], 0
    for index, item in enumerate(raw):
        where = f"cases[{index}]"
        if not isinstance(item, dict) or set(item) - {"input", "output"}:
            raise bad_arg(task, where, "must be a mapping with `input` and `output` only")
        stdin, stdout = item.get("input", ""), item.get("output")
        if not isinstance(stdin, str):
            raise bad_arg(task, f"{where}.input", "must be a string")
        if stdout is None and require_output:
            raise bad_arg(task, f"{where}.output", "is required")
        if stdout is not None and not isinstance(stdout, str):
            raise bad_arg(task, f"{where}.output", "must be a string")
        size += len(stdin.encode("utf-8")) + len((stdout or "").encode("utf-8"))
        cases.append(Case(stdin, stdout))
    if size > MAX_CASE_BYTES:
        raise bad_arg(task, "cases", f"hold {size} bytes, over the {MAX_CASE_BYTES // 2**20} MiB cap")
    return cases


def compare_arg(task: Task) -> dict[str, float | None]:
    """`abs_tol` / `rel_tol`: numbers in printed output may differ by this much (off when absent)."""
    return {"abs_tol": number_arg(task, "abs_tol", None, 0, 1e9), "rel_tol": number_arg(task, "rel_tol", None, 0, 1)}


# ----------------------------------------------------------------------------- the program


def extract_program(answer: str, language: str | None, require_fence: bool) -> tuple[str, str] | Score:
    """(language, code) of the answer's program, or a failed Score saying why there is none.

    The last fenced block in `language` (its fence aliases, or a plain fence); with no `language`,
    the last block whose fence names a known language, else the last plain block (python). Without
    any block, the whole answer is the program unless `require_fence`."""
    problem = check_answer(answer)
    if problem is not None:
        return problem
    blocks = [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(answer)]
    if language is not None:
        chosen = [code for fence, code in blocks if FENCE_LANGUAGES.get(fence) == language or fence == ""]
    else:
        known = [(FENCE_LANGUAGES[f], code) for f, code in blocks if f in FENCE_LANGUAGES]
        plain = [("python", code) for f, code in blocks if f == ""]
        picked = (known or plain)[-1:] if known or plain else []
        language = picked[0][0] if picked else "python"
        chosen = [code for _, code in picked]
    if chosen:
        code = chosen[-1]
    elif blocks:
        return format_failed(f"the answer has no {language} code block (fences: {', '.join(f or 'plain' for f, _ in blocks[:5])})")
    elif require_fence:
        return format_failed("the answer holds no fenced code block")
    else:
        code = answer
    if not code.strip():
        return format_failed("the answer's code block is empty")
    return language, code


def find_compiler(language: str) -> str | Score:
    """The host path of gcc/g++ (visible in the sandbox through the /usr bind), or an infra error."""
    name = COMPILERS[language]
    path = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
    if path is None or not path.startswith(SANDBOX_VISIBLE):
        return Score(0.0, Outcome.INFRA_ERROR, {}, f"no {name} on this host (under /usr) to compile {language}; "
                     f"install it (apt-get install {'g++' if language == 'cpp' else 'gcc'})")
    return path


def compiler_argv(language: str, compiler: str, flags: list[str]) -> list[str]:
    """The compiler command before `<source> -o <output>`: no colour, no temporary files (-pipe)."""
    extra = ["-lm"] if language == "c" else []
    return [compiler, "-fdiagnostics-color=never", "-pipe", *flags, *extra]


def reference_program(task: Task, default_language: str) -> tuple[str, str]:
    """(language, code) of the task's `reference`; TaskFormatError when it has none or it is empty."""
    if not task.reference or not task.reference.strip():
        raise bad_arg(task, "reference", "the task needs a `reference` solution (a field of the task)")
    program = extract_program(task.reference, None, require_fence=False)
    if isinstance(program, Score):
        raise TaskFormatError([f"[{task.id}] reference: {program.detail}"])
    language, code = program
    has_fence = any(FENCE_LANGUAGES.get(m.group(1).lower()) for m in FENCE.finditer(task.reference))
    return (language if has_fence else default_language), code


def clip(text: str, limit: int = DIAGNOSTICS_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2:]


# ----------------------------------------------------------------------------- the harness


@dataclass
class HarnessRun:
    """The harness's event stream for one run, with the sandbox's own result."""

    report: Report
    result: SandboxResult

    def of(self, kind: str, program: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.report.of(kind) if program is None or e.get("program") == program]

    @property
    def started(self) -> bool:
        return bool(self.report.of("start"))

    @property
    def finished(self) -> bool:
        return bool(self.report.of("finish"))

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"sandbox": self.result.status.value, "wall_s": round(self.result.wall_s, 3)}
        if self.result.cpu_s is not None:
            info["sandbox_cpu_s"] = round(self.result.cpu_s, 4)
        if self.result.max_rss_mb is not None:
            info["sandbox_max_rss_mb"] = round(self.result.max_rss_mb, 2)
        problems = [p for e in self.report.of("start") for p in e.get("problems", [])]
        if problems:
            info["harness_problems"] = problems
        return info

    def broken(self, task: Task) -> Score | None:
        """Tampered (lines without the nonce) or infra error (the harness never started), else None."""
        if self.report.forged:
            return Score(0.0, Outcome.TAMPERED, {}, f"{self.report.forged} report line(s) without the harness nonce",
                         self.info())
        errors = self.report.of("error")
        if errors:
            return Score(0.0, Outcome.INFRA_ERROR, {}, f"task {task.id}: the harness failed: "
                         f"{str(errors[0].get('traceback', '')).strip()[-1000:]}", self.info())
        if not self.started:
            result = self.result
            return Score(0.0, Outcome.INFRA_ERROR, {}, f"task {task.id}: the harness did not start in the sandbox "
                         f"({result.status.value}{', ' + result.detail if result.detail else ''}): "
                         f"{result.stderr_text[-1000:].strip()}", self.info())
        return None


def run_cases(task: Task, ctx: ScoringContext, files: dict[str, str | bytes], spec: dict[str, Any]) -> HarnessRun | Score:
    """Run the `cases` harness on `spec` (programs, cases, limits) in one sandbox; the job and the
    nonce travel over the report channel, so neither is ever a file the candidate could read."""
    limits = ctx.limits(task)
    nonce = secrets.token_hex(16)
    try:
        backend = ctx.sandbox(task.image)
        job = {**spec, "nonce": nonce, "python": backend.python, "sweep": backend.name == "bwrap",
               "budget_s": max(0.5, limits.timeout_s - 1.0)}
        result = backend.run([backend.python, "-I", "-c", BOOT, "cases"], files, limits,
                             harness_files=dict(HARNESS_FILES), report_input=json.dumps(job).encode("utf-8"))
    except SandboxUnavailableError as error:
        return Score(0.0, Outcome.INFRA_ERROR, {}, f"sandbox unavailable: {error}")
    return HarnessRun(Report.parse(result.report, nonce, result.report_truncated), result)


def elf_interpreter(data: bytes) -> str:
    """The program interpreter (PT_INTERP) of an ELF executable, '' for a static one or non-ELF.
    Harness files are not executable, so a binary shipped as one is started through its loader."""
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2):
        return ""
    end = "<" if data[5] == 1 else ">"
    wide = data[4] == 2
    phoff, phentsize, phnum = (struct.unpack_from(end + "Q", data, 0x20)[0], *struct.unpack_from(end + "HH", data, 0x36)) \
        if wide else (struct.unpack_from(end + "I", data, 0x1C)[0], *struct.unpack_from(end + "HH", data, 0x2A))
    for index in range(phnum):
        at = phoff + index * phentsize
        if struct.unpack_from(end + "I", data, at)[0] != 3:  # PT_INTERP
            continue
        offset, size = (struct.unpack_from(end + "Q", data, at + 8)[0], struct.unpack_from(end + "Q", data, at + 32)[0]) \
            if wide else (struct.unpack_from(end + "I", data, at + 4)[0], struct.unpack_from(end + "I", data, at + 16)[0])
        return data[offset:offset + size].rstrip(b"\0").decode("ascii", errors="replace")
    return ""


def problem_score(task: Task, error: TaskFormatError) -> Score:
    """A bad task definition as the infra error every verifier returns for one."""
    return task_problem(task, "; ".join(error.problems))


def program_spec(task: Task, language: str, code: str, file: str, flags: list[str],
                 compilers: dict[str, list[str]]) -> dict[str, Any] | Score:
    """The harness's description of one program (adding its compiler to `compilers`), or an infra
    error when the compiler it needs is missing."""
    if language != "python" and language not in compilers:
        compiler = find_compiler(language)
        if isinstance(compiler, Score):
            return compiler
        compilers[language] = compiler_argv(language, compiler, flags)
    return {"language": language, "file": file, "source": code}


def program_args(task: Task) -> dict[str, Any]:
    """The arguments `program_io` and `efficiency` share (TaskFormatError when one is wrong)."""
    return {
        "language": language_arg(task),
        "flags": strings_arg(task, "flags", []),
        "require_fence": bool_arg(task, "require_fence", False),
        "compare": compare_arg(task),
        "case_timeout_s": number_arg(task, "case_timeout_s", 2.0, 0, 600),
        "compile_timeout_s": number_arg(task, "compile_timeout_s", 30.0, 0, 600),
        "max_output_bytes": int_arg(task, "max_output_bytes", 1 << 20, 1, 16 << 20),
    }


def case_evidence(event: dict[str, Any], case: Case | None, timeout_s: float) -> str:
    """One line of evidence for a case that did not pass."""
    verdict = str(event.get("verdict", "not_reported"))
    if verdict == "wrong_answer":
        expected = (case.output or "")[:120] if case is not None else "?"
        return f"wrong answer: got {str(event.get('got', ''))[:120]!r}, expected {expected!r}"
    if verdict == "timeout":
        return f"no exit within {timeout_s:g}s"
    if verdict in ("runtime_error", "crashed", "memory_limit"):
        how = f"exit code {event.get('exit_code')}" if event.get("signal") is None else f"signal {event.get('signal')}"
        return f"{verdict.replace('_', ' ')} ({how}): {str(event.get('stderr', '')).strip()[-300:]}"
    if verdict == "output_limit":
        return "printed more than max_output_bytes"
    return verdict.replace("_", " ")
