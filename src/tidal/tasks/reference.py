"""The text a correct model response would be, for warm starts and reference checks."""

from __future__ import annotations

from tidal.errors import TaskFormatError
from tidal.types import Task


def reference_answer(task: Task) -> str:
    """The task's reference as a model should answer it: code tasks get it as the fenced block the
    code verifier extracts; every other task answers with the reference text itself."""
    if task.reference is None:
        raise TaskFormatError([f"[{task.id}] reference: the task has no reference answer"])
    if task.verifier.name == "python_tests":
        code = task.reference if task.reference.endswith("\n") else task.reference + "\n"
        return f"```python\n{code}```"
    return task.reference
