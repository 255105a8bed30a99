"""The `compile` verifier: the answer's code compiles (Python to bytecode, C/C++ to an object file).

Compilation happens inside the sandbox, never on the host: `python -I -m py_compile` for Python,
`gcc`/`g++ -pipe -c` for C/C++ (the compilers come from the host's /usr, which the sandbox binds
read-only; `-pipe` and `TMPDIR=.` keep their temporary files in the workspace, since the sandbox's
/tmp may not be writable by its user). Nothing the answer defines is run: a Python module's
top-level code is compiled, not executed.

value 1 when the compiler exits 0, else 0 with its diagnostics (capped) as the detail.
Outcomes: infra_error (sandbox unavailable, no compiler, a broken task), timeout and memory_limit
(the compiler hit the task's limits: `#include "/dev/zero"`, template bombs), crashed (the compiler
was killed by another signal), passed, failed (it does not compile, or the answer holds no code).
"""

from __future__ import annotations

from tidal.errors import SandboxUnavailableError, TaskFormatError
from tidal.reward.base import ScoringContext, verifier
from tidal.reward.verifiers.io_harness import (
    SOURCE_FILES,
    bool_arg,
    clip,
    compiler_argv,
    extract_program,
    find_compiler,
    language_arg,
    problem_score,
    strings_arg,
)
from tidal.sandbox.base import SandboxStatus
from tidal.types import Outcome, Score, Task

STATUS_OUTCOMES = {SandboxStatus.TIMEOUT: Outcome.TIMEOUT, SandboxStatus.MEMORY_LIMIT: Outcome.MEMORY_LIMIT,
                   SandboxStatus.CRASHED: Outcome.CRASHED}


@verifier("compile", sandbox=True)
def compile_code(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """The answer's code block compiles: Python (py_compile), C (gcc) or C++ (g++), in the sandbox."""
    try:
        language = language_arg(task)
        flags = strings_arg(task, "flags", [])
        require_fence = bool_arg(task, "require_fence", True)
    except TaskFormatError as error:
        return problem_score(task, error)
    program = extract_program(answer, language, require_fence)
    if isinstance(program, Score):
        program.components["compiles"] = 0.0
        return program
    language, code = program
    source = SOURCE_FILES[language]
    try:
        backend = ctx.sandbox(task.image)
        if language == "python":
            argv = [backend.python, "-I", "-m", "py_compile", source]
        else:
            compiler = find_compiler(language)
            if isinstance(compiler, Score):
                return compiler
            argv = [*compiler_argv(language, compiler, flags), "-c", source, "-o", "solution.o"]
        result = backend.run(argv, {source: code}, ctx.limits(task), env={"TMPDIR": "."})
    except SandboxUnavailableError as error:
        return Score(0.0, Outcome.INFRA_ERROR, {}, f"sandbox unavailable: {error}")
    diagnostics = clip((result.stdout_text + "\n" + result.stderr_text).strip())
    info = {"language": language, "exit_code": result.exit_code, "wall_s": round(result.wall_s, 3),
            "diagnostics": diagnostics}
    if result.status is not SandboxStatus.OK:
        outcome = STATUS_OUTCOMES[result.status]
        return Score(0.0, outcome, {"compiles": 0.0}, f"the {language} compiler did not finish: {result.detail}", info)
    if result.exit_code == 0:
        return Score(1.0, Outcome.PASSED, {"compiles": 1.0}, f"compiles as {language}", info)
    return Score(0.0, Outcome.FAILED, {"compiles": 0.0}, f"does not compile as {language}: {diagnostics}", info)
