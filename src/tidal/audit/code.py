"""What the checks need to know about a task's code: the reference as the verifier would extract
it, its functions, the names the tests import, and fencing an answer the way a model writes it."""

from __future__ import annotations

import ast
from pathlib import PurePosixPath

from tidal import pyast
from tidal.reward.verifiers.python_tests import extract_code, pytest_targets
from tidal.types import Task

# Verifiers whose answer is a program (the reference is code the audit can parse and mutate).
PROGRAM_VERIFIERS = frozenset({"python_tests", "program_io", "efficiency"})


def is_python_program(task: Task) -> bool:
    """The task's answer is a Python program: python_tests, or an I/O task in Python."""
    if task.verifier.name == "python_tests":
        return True
    if task.verifier.name in ("program_io", "efficiency"):
        return str(task.verifier.args.get("language", "python")).lower() in ("python", "py", "python3")
    return False


def reference_code(task: Task) -> str | None:
    """The reference's code as the verifier extracts it from an answer, None without one or when
    it does not parse as Python."""
    if task.reference is None or not is_python_program(task):
        return None
    code = extract_code(task.reference)
    try:
        pyast.parse(code)
    except SyntaxError:
        return None
    return code


def fenced(code: str) -> str:
    """An answer holding `code` as its one ```python block."""
    return f"```python\n{code if code.endswith(chr(10)) else code + chr(10)}```"


def functions(code: str) -> list[tuple[str, int]]:
    """(name, positional parameter count) of every top-level function in `code`."""
    try:
        tree = pyast.parse(code)
    except SyntaxError:
        return []
    return [(node.name, len(node.args.posonlyargs) + len(node.args.args))
            for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def answer_module(task: Task) -> str:
    """The module name the tests import the answer as (`solution` for solution.py)."""
    return PurePosixPath(str(task.verifier.args.get("entrypoint", "solution.py"))).stem


def imported_names(task: Task) -> list[str]:
    """Names the test files import from the answer's module (`from solution import f, g`)."""
    module, names = answer_module(task), []
    for name in pytest_targets(task.tests):
        try:
            tree = pyast.parse(task.tests[name])
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                names += [alias.name for alias in node.names if alias.name != "*"]
    return list(dict.fromkeys(names))


def callable_names(task: Task) -> list[str]:
    """The functions an answer must define: the reference's and the ones the tests import."""
    code = reference_code(task)
    names = [name for name, _ in functions(code)] if code else []
    return list(dict.fromkeys([*names, *imported_names(task)]))


def test_sources(task: Task) -> dict[str, str]:
    """The test modules pytest runs, by file name."""
    return {name: task.tests[name] for name in pytest_targets(task.tests)}


# Calls that read a file: open(), pathlib's readers, and the loaders of json, csv, numpy, pandas.
FILE_READERS = frozenset({"open", "read_text", "read_bytes", "load", "loads", "reader", "DictReader", "loadtxt",
                          "genfromtxt", "read_csv", "read_json", "Path", "listdir", "scandir", "walk", "glob"})


def reads_files(code: str, names: set[str]) -> bool:
    """Whether `code` reads files: it calls a file reader (`FILE_READERS`) or names one of `names`."""
    try:
        tree = pyast.parse(code)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called in FILE_READERS:
                return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            return True
    return False
