"""Which way `python_tests` runs a task's tests against an answer: `in_process` (the answer's module
imported into the pytest process, as plain pytest does) or `out_of_process` (the tests call the
answer's functions in a separate process and get data back; see function_proxy.py).

`mode: auto` (the default) picks out_of_process whenever the tests allow it, checked here with
`ast` on the host. They allow it when they use the answer only as a library of functions called
with data, after collection:

- the entrypoint is a top-level module (`solution.py`, not `lib/core.py`);
- every test file is a test module, a `conftest.py` or an `__init__.py` (the plugin deletes them
  all once collected, so a helper module or data file among the tests would be lost);
- the tests reach the answer only through `import solution [as s]` and `from solution import f
  [as g]` (no `*`), and use what they import only as the callee of a call (`f(x)`,
  `s.f(x)`): no attribute reads, `isinstance`, subclassing or passing the function around;
- those calls happen inside functions (test bodies, fixtures), never while a module is imported
  (module level, class bodies, decorators, default values), because the answer's process starts
  only after collection;
- no string in the tests names the module (`monkeypatch.setattr("solution.f", ...)`,
  `importlib.import_module("solution")`), and no task file imports it.

The arguments' types are checked at run time: a test that passes something other than data
(a callback, a class instance) is reported and the score is an infra error for the task, never a
0 for the answer.
"""

from __future__ import annotations

import ast
from pathlib import PurePosixPath

MODES = ("auto", "in_process", "out_of_process")


def _module_name(entrypoint: str) -> str | None:
    path = PurePosixPath(entrypoint)
    if len(path.parts) != 1 or path.suffix != ".py" or not path.stem.isidentifier():
        return None
    return path.stem


class _Uses(ast.NodeVisitor):
    """Why a test file cannot run out of process ('' when it can)."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.functions: set[str] = set()  # names bound to the answer's functions
        self.modules: set[str] = set()  # names bound to the answer's module
        self.problems: list[str] = []
        self.depth = 0
        self.callees: set[int] = set()

    def problem(self, node: ast.AST, what: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == self.module:
                self.modules.add(alias.asname or alias.name)
            elif alias.name.startswith(self.module + "."):
                self.problem(node, f"imports {alias.name} (a submodule)")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module == self.module:
            for alias in node.names:
                if alias.name == "*":
                    self.problem(node, f"uses 'from {self.module} import *'")
                self.functions.add(alias.asname or alias.name)
        elif node.module and node.module.startswith(self.module + "."):
            self.problem(node, f"imports from {node.module} (a submodule)")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        self.depth += 1
        for statement in node.body:
            self.visit(statement)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)
        self.depth += 1
        self.visit(node.body)
        self.depth -= 1

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in self.functions or (
                isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.modules):
            self.callees.add(id(func))
            if isinstance(func, ast.Attribute):
                self.callees.add(id(func.value))
            if self.depth == 0:
                self.problem(node, "calls the answer while the module is imported (before collection ends)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and (node.id in self.functions or node.id in self.modules) \
                and id(node) not in self.callees:
            self.problem(node, f"uses {node.id} as a value, not only as a function to call")

    def visit_Constant(self, node: ast.Constant) -> None:
        text = node.value
        if isinstance(text, str) and (text == self.module or (
                text.startswith(self.module + ".") and text != self.module + ".py"
                and all(part.isidentifier() for part in text.split(".")))):
            self.problem(node, f"names the module {text!r} in a string")


def out_of_process_problems(entrypoint: str, tests: dict[str, str], files: dict[str, str | bytes],
                            test_modules: list[str]) -> list[str]:
    """Why these tests cannot call the answer out of process; [] when they can."""
    module = _module_name(entrypoint)
    if module is None:
        return [f"the entrypoint {entrypoint} is not a top-level module"]
    problems = []
    for name, source in sorted(tests.items()):
        base = PurePosixPath(name).name
        if name not in test_modules and base not in ("conftest.py", "__init__.py"):
            problems.append(f"{name}: not a test module, conftest.py or __init__.py")
            continue
        try:
            tree = ast.parse(source, filename=name)
        except SyntaxError as error:
            problems.append(f"{name}: does not parse (line {error.lineno})")
            continue
        uses = _Uses(module)
        # Collect the bindings first, so a use before the import is judged like one after it.
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                uses.visit(node)
        uses.visit(tree)
        problems += [f"{name}: {p}" for p in dict.fromkeys(uses.problems)]
    for name, content in sorted(files.items()):
        if name.endswith(".py") and name != entrypoint and isinstance(content, str):
            try:
                imported = any(
                    (isinstance(n, ast.Import) and any(a.name.split(".")[0] == module for a in n.names))
                    or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == module)
                    for n in ast.walk(ast.parse(content)))
            except SyntaxError:
                imported = False
            if imported:
                problems.append(f"{name}: a task file imports {module}")
    return problems


def choose_mode(requested: str, problems: list[str]) -> tuple[str, str]:
    """(mode, why): the mode to run in, or ('', reason) for a task that asks for a mode its tests
    do not allow."""
    if requested == "in_process":
        return "in_process", "asked for by the task"
    if not problems:
        return "out_of_process", "the tests only call the answer's functions with data"
    if requested == "out_of_process":
        return "", "verifier mode out_of_process, but the tests do not allow it: " + "; ".join(problems[:3])
    return "in_process", "the tests need the answer in their process: " + "; ".join(problems[:3])
