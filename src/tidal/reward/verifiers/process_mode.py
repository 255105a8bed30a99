"""Which way `python_tests` runs a task's tests against an answer: `in_process` (the answer's module
imported into the pytest process, as plain pytest does) or `out_of_process` (the tests call the
answer's functions in a separate process and get data back; see function_proxy.py).

`mode: auto` (the default) picks out_of_process whenever the tests allow it, checked here with
`ast` on the host: they must use the answer only as a library of functions called with data, after
collection (the answer's process starts only then, and the plugin deletes every test file once
collected). So the entrypoint is a top-level module; every test file is a test module, conftest.py
or __init__.py; the tests reach the answer only through `import solution [as s]` / `from solution
import f [as g]` and use those names only as callees (`f(x)`, `s.f(x)`), inside functions; no
string names the module and no task file imports it. Arguments are checked at run time: a test
that passes something other than data is an infra error for the task, never a 0 for the answer.
`template_problems` says, likewise, whether a task's answers may share a template (zygote.py).
"""

from __future__ import annotations

import ast
from pathlib import PurePosixPath

from tidal import pyast

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
            tree = pyast.parse(source, filename=name)
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
                    for n in ast.walk(pyast.parse(content)))
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


# ----------------------------------------------------------------------------- templates

PYTEST_CONFIG_FILES = ("pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")


def _hooks(tree: ast.Module) -> list[str]:
    """pytest hooks and plugin lists a module defines at its top level."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("pytest_"):
            found.append(f"line {node.lineno}: defines the hook {node.name}")
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(target, ast.Name) and target.id == "pytest_plugins" for target in targets):
            found.append(f"line {node.lineno}: sets pytest_plugins")
    return found


def _at_import(node: ast.AST) -> list[ast.AST]:
    """The nodes of a module-level statement that run when the module is imported: everything but
    the bodies of functions and lambdas (decorators, defaults, annotations and class bodies run)."""
    found, pending = [], [node]
    while pending:
        current = pending.pop()
        found.append(current)
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pending += [*current.decorator_list, current.args, *([current.returns] if current.returns else [])]
        elif isinstance(current, ast.Lambda):
            pending.append(current.args)
        else:
            pending += list(ast.iter_child_nodes(current))
    return found


def _imports_module(node: ast.AST, module: str) -> bool:
    return (isinstance(node, ast.Import) and any(a.name.split(".")[0] == module for a in node.names)) or (
        isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == module)


def template_problems(mode: str, entrypoint: str, tests: dict[str, str], files: dict[str, str | bytes],
                      test_modules: list[str]) -> list[str]:
    """Why one pytest template (collected once, forked per answer; pytest_template.py) cannot stand
    in for a session of each answer's own; [] when it can.

    Both modes: no test or task file defines pytest hooks or `pytest_plugins` (a hook that runs at
    configuration or collection would run once, in the template, not once per answer). In process
    also: the answer's module is imported only by collected test modules, only by top-level
    `import m [as n]` / `from m import a [as b]` statements (not under `if`/`try`/`with` or in a
    class) or inside functions; what those statements bind is used only inside functions (so
    nothing of the answer is needed while the tests are imported, and rebinding the module's
    globals afterwards is what importing it would have done); no name it imports looks like a test
    to pytest (`test*`, `Test*`); no string names the module at import time; no pytest
    configuration file among the task's files (it could change what looks like a test). Out of
    process, `out_of_process_problems` already holds the tests to more than that."""
    module = _module_name(entrypoint)
    if module is None:
        return [f"the entrypoint {entrypoint} is not a top-level module"]
    problems = []
    sources = {**{name: content for name, content in files.items() if name != entrypoint}, **tests}
    for name, content in sorted(sources.items()):
        if not name.endswith(".py") or not isinstance(content, str):
            continue
        try:
            tree = pyast.parse(content, filename=name)
        except SyntaxError:
            continue  # a broken test module fails the same way in a template
        assert isinstance(tree, ast.Module)
        problems += [f"{name}: {p}" for p in _hooks(tree)]
        if mode != "out_of_process":
            problems += [f"{name}: {p}" for p in _module_level_uses(tree, module, collected=name in test_modules)]
    if mode != "out_of_process":
        problems += [f"{name}: a pytest configuration file" for name in files
                     if PurePosixPath(name).name in PYTEST_CONFIG_FILES]
    return problems


def _module_level_uses(tree: ast.Module, module: str, collected: bool) -> list[str]:
    """In process: what in a module needs the answer while it is imported (see `template_problems`)."""
    problems, bound = [], set()
    for statement in tree.body:
        if not _imports_module(statement, module):
            continue
        if not collected:
            problems.append(f"line {statement.lineno}: imports {module} but pytest does not collect it")
        elif isinstance(statement, ast.ImportFrom):
            if statement.module != module:
                problems.append(f"line {statement.lineno}: imports from a submodule of {module}")
            for alias in statement.names:
                bound.add(alias.asname or alias.name)
                if alias.name == "*" or (alias.asname or alias.name).startswith(("test", "Test")):
                    problems.append(f"line {statement.lineno}: imports {alias.name} from {module}")
        else:
            for alias in statement.names:  # type: ignore[attr-defined]
                if alias.name != module:
                    problems.append(f"line {statement.lineno}: imports the submodule {alias.name}")
                bound.add(alias.asname or alias.name)
    for statement in tree.body:
        if _imports_module(statement, module):
            continue
        for node in _at_import(statement):
            if _imports_module(node, module):
                problems.append(f"line {node.lineno}: imports {module} under a statement or in a class")
            elif isinstance(node, ast.Name) and node.id in bound and not isinstance(node.ctx, ast.Store):
                problems.append(f"line {node.lineno}: uses {node.id} while the module is imported")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value == module or node.value.startswith(module + ".")):
                problems.append(f"line {node.lineno}: names the module {node.value!r} while the module is imported")
    return list(dict.fromkeys(problems))
