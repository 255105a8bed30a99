"""The report plugin's template mode (pytest_report.py): a pytest session that collects a task's
tests once and is forked, at the start of its test loop, into one process per answer.

PYTEST_DONT_REWRITE

Not imported by tidal: shipped as the harness file `tidal_pytest_template.py`, imported by the
report plugin in a template. Standard library, pytest and tidal_zygote_forks only. The template
(`serve`) stops pytest's capture, keeps the tests' source for tracebacks, finds which names of the
test modules came from `_Stub` (the stand-in for the answer's module at collection), then calls
the zygote's `fork_point`. Each answer's process (`bind`) takes its own channel and nonce, starts
watching as a session does and, in process, imports the answer and rebinds those names module by
module, as collection would have (an import that fails is that module's collection error, as
pytest reports it). `serve` refuses (`fork_point(problem)`) when the stand-in was called or reached
from outside the collected test modules: every answer then runs a session of its own.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import linecache
import os
import sys
import types
from typing import Any

import pytest

_BINDINGS: list[tuple[Any, types.ModuleType, list[tuple[str, str | None]]]] = []


class _Placeholder:
    """A name a test module imported from the stand-in: pytest's collection may probe its
    attributes (it has none); anything else it is used for marks the template unusable."""

    __slots__ = ("attribute", "used")

    def __init__(self, attribute: str, used: list[str]) -> None:
        self.attribute, self.used = attribute, used

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.used.append(self.attribute)
        raise RuntimeError(f"the tests called {self.attribute}() while being collected")


class _Stub(types.ModuleType):
    """The answer's module while a template collects the tests."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "the answer's module, bound in each answer's process")
        self.__dict__["_used"] = []

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        return _Placeholder(attribute, self.__dict__["_used"])


def stub(name: str) -> types.ModuleType:
    return _Stub(name)


def _bindings(session: Any, module: str) -> tuple[list[tuple[Any, types.ModuleType, list[tuple[str, str | None]]]], str | None]:
    """In process: for each collected test module (in collection order) that took names from the
    stand-in, its collector, the module and the (name, attribute or None for the module) pairs;
    or why the template cannot stand in for a session."""
    stand_in = sys.modules.get(module)
    if not isinstance(stand_in, _Stub):
        return [], f"the answer's module {module} was replaced while the tests were collected"
    if stand_in.__dict__["_used"]:
        return [], f"the tests used {', '.join(stand_in.__dict__['_used'][:3])} while being collected"

    def refs(namespace: dict[str, Any]) -> list[tuple[str, str | None]]:
        return [(name, None if value is stand_in else value.attribute) for name, value in namespace.items()
                if value is stand_in or isinstance(value, _Placeholder)]

    found, seen = [], set()
    for item in session.items:
        node = item.getparent(pytest.Module)
        if node is not None and node not in seen:
            seen.add(node)
            names = refs(vars(node.obj))
            if names:
                found.append((node, node.obj, names))
    modules = {id(mod) for _, mod, _ in found}
    workspace = os.getcwd().rstrip("/") + "/"
    for name, mod in list(sys.modules.items()):
        where = str(getattr(mod, "__file__", None) or "")
        if id(mod) not in modules and where.startswith(workspace) and refs(dict(vars(mod))):
            return [], f"{name} takes names from the answer but is not a collected test module with tests"
    del sys.modules[module]  # each answer's process imports the real one
    return found, None


def serve(session: Any, reporter: Any) -> None:
    """In the template: get ready, then hand over to the zygote's fork point; returns in each
    answer's process."""
    import tidal_zygote_forks

    problem = None
    if reporter.settings.get("mode") != "out_of_process":
        _BINDINGS[:], problem = _bindings(session, str(reporter.settings.get("module")))
    capture = session.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()
    _warm(session)
    for path in reporter.settings.get("tests", []):
        path = os.path.abspath(str(path))
        try:
            with open(path, encoding="utf-8") as file:
                lines = file.readlines()
            linecache.cache[path] = (sum(map(len, lines)), None, lines, path)  # None: never rechecked
        except OSError:
            pass
    tidal_zygote_forks.fork_point(problem)


def from_base(session: Any, reporter: Any) -> None:
    """In a base (a session of the tasks' shared options, at the start of its collection, which
    has read nothing of any task): hand over to the zygote's base point; returns in each template
    forked from it, which takes its own report channel and settings, and the task's test paths as
    the session's arguments, and collects them as a template started alone would."""
    import tidal_zygote_forks

    capture = session.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()  # its files and saved descriptors are the base's own
    _index_modules()  # what the session's start imported: indexed once for all the base's templates
    request = tidal_zygote_forks.base_point()
    reporter.rebase()
    session.config.args = [str(path) for path in request["paths"]]
    if capture is not None:
        capture.start_global_capturing()


def _probe() -> None:
    raise AssertionError("the template's warm-up")  # a visible frame: its report is the whole warm-up


_INDEXED: list[str] = []  # the last name in `sys.modules` when inspect's index was last made whole


def _index_modules() -> None:
    """Bring inspect's index of module files up to date with `sys.modules`. `inspect.getmodule`
    (which pytest calls for each frame of a traceback it reports) rescans every module it has not
    indexed yet whenever a file is not in the index, as a frozen module's is (an import's frames):
    a `realpath` call per module in each answer's process unless the index it inherits is current
    (much of the report of an answer that does not import).

    Where an index was made whole before (in the zygote, or in the base a template was forked
    from), only the modules imported since are indexed, as the rescan would index them: the
    rescan reads every module object, and in a forked process each read of an object copies the
    page it is on."""
    if not _index_new_modules():
        inspect.getmodule(None, "<tidal: the module index>")  # no module has that file: a full rescan
    _INDEXED[:] = [next(reversed(sys.modules), "")]


def _index_new_modules() -> bool:
    """Index the modules added to `sys.modules` after `_INDEXED` (a dict keeps the order names
    were added in); False when that cannot be done here (no earlier index, the name is gone, or
    inspect keeps its index otherwise), and a full rescan must."""
    by_name, by_file = getattr(inspect, "_filesbymodname", None), getattr(inspect, "modulesbyfile", None)
    if not _INDEXED or not isinstance(by_name, dict) or not isinstance(by_file, dict):
        return False
    new = []
    for name in reversed(sys.modules):
        if name == _INDEXED[0]:
            break
        new.append(name)
    else:
        return False
    for name in reversed(new):  # in import order, as the rescan goes
        module = sys.modules.get(name)
        if not inspect.ismodule(module) or not hasattr(module, "__file__"):
            continue
        file = module.__file__
        if file == by_name.get(name):
            continue
        by_name[name] = file
        try:
            file = inspect.getabsfile(module)
        except TypeError:  # a module whose __file__ is None: the rescan fails on it too
            return False
        by_file[file] = by_file[os.path.realpath(file)] = module.__name__
    return True


def _warm(session: Any) -> None:
    """Report a failure once, here, and throw the report away: what pytest builds on a process's
    first failure (inspect's index of module files, compiled regular expressions) each answer's
    process then inherits instead of building it again."""
    _index_modules()
    if not session.items:
        return
    for item in session.items:
        item.location  # noqa: B018 - a cached property every report reads: computed once, here
    try:
        _probe()
    except AssertionError as error:
        from _pytest._code import ExceptionInfo

        str(session.items[0].repr_failure(ExceptionInfo.from_exception(error)))


def _warm_zygote() -> None:
    """`_warm`'s share that needs no session, once in the zygote for all its templates (most of it:
    inspect's index of the modules the zygote preloaded, and the regular expressions `tokenize`
    compiles the first time pytest quotes the source of a traceback entry, which the report of an
    answer that does not import does for each frame of the import)."""
    try:
        _probe()
    except AssertionError as error:
        from _pytest._code import ExceptionInfo

        info = ExceptionInfo.from_exception(error)
        str(info.getrepr(style="line"))
        str(info.getrepr(style="short"))
    _index_modules()


_SCANNED: dict[int, tuple[types.ModuleType, int, list[str]]] = {}  # id -> (module, size of its namespace, names)
# A plugin object's class -> (the sizes of its classes' namespaces, the names the scan acts on for
# its instances): the scan reads each name from the class (`_lookup_in_type_dict`,
# `safe_getattr(type(holder), name)`), never from the instance.
_SCANNED_TYPES: dict[type, tuple[tuple[int, ...], list[str]]] = {}


def _scan_names(holder: object) -> list[str]:
    """`dir` as pytest's fixture scan (`FixtureManager.parsefactories`) sees it once a zygote has
    indexed the plugin modules: for an indexed module whose namespace has not changed size, or an
    object of an indexed class whose classes' namespaces have not, only the names the scan acts
    on; for anything else, `dir` itself."""
    entry = _SCANNED.get(id(holder))
    if entry is not None and entry[0] is holder and len(vars(holder)) == entry[1]:
        return list(entry[2])
    kind = type(holder)
    indexed = _SCANNED_TYPES.get(kind) if not isinstance(holder, type) else None
    if indexed is not None and indexed[0] == tuple(len(vars(base)) for base in kind.__mro__):
        return list(indexed[1])
    return dir(holder)


def _index_plugins() -> None:
    """In a zygote: index the modules pytest registers as plugins (pytest's own, the harness's) for
    the fixture scan every session starts with. The scan looks at every name of every plugin (in
    the thousands) to find the few fixtures and warn about fixtures hidden behind decorators: a
    large part of a template's start-up. It acts only on a name whose value is a fixture or wraps
    something (`__wrapped__`), so a module's other names are left out of what it is shown: the
    same fixtures, registered in the same order (`dir`'s, sorted)."""
    from _pytest import fixtures

    definition = getattr(fixtures, "FixtureFunctionDefinition", None)
    if definition is None or "dir" in vars(fixtures):
        return  # not the pytest this was written against, or already done

    def acts_on(value: object) -> bool:
        try:
            return type(value) is definition or hasattr(value, "__wrapped__")
        except Exception:  # noqa: BLE001 - an object that fails on attribute access: let the scan see it
            return True

    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType) and (name.split(".")[0] in ("pytest", "_pytest", "pluggy")
                                                     or name.startswith("tidal_")):
            namespace = vars(module)
            if "__dir__" not in namespace:
                names = sorted(key for key, value in namespace.items() if acts_on(value))
                _SCANNED[id(module)] = (module, len(namespace), names)
            for value in list(namespace.values()):
                if isinstance(value, type) and value.__module__ == name and value not in _SCANNED_TYPES:
                    _index_type(value, acts_on)
    fixtures.dir = _scan_names  # type: ignore[attr-defined]  # the module's own `dir` from now on


def _index_type(kind: type, acts_on: Any) -> None:
    """Index the instances of a plugin class (see `_index_plugins`): the names of its classes'
    namespaces whose value, raw or read from the class, the scan acts on. Not for a class with its
    own `__dir__`, `__getattr__` or `__getattribute__`, or a metaclass of its own."""
    if type(kind) is not type or any(
            hook in vars(base) for base in kind.__mro__[:-1] for hook in ("__dir__", "__getattr__", "__getattribute__")):
        return
    names = set()
    for base in kind.__mro__:
        for key, raw in vars(base).items():
            try:
                read = getattr(kind, key, None)
            except Exception:  # noqa: BLE001 - a descriptor that fails on the class: let the scan see it
                read = raw
            if acts_on(raw) or acts_on(read):
                names.add(key)
    _SCANNED_TYPES[kind] = (tuple(len(vars(base)) for base in kind.__mro__), sorted(names))


if "tidal_zygote" in sys.modules:  # imported by a zygote, which preloads this module
    _warm_zygote()
    _index_plugins()


def bind(session: Any, reporter: Any, watch: Any) -> None:
    """In an answer's process: its channel, nonce and watch (`watch`: the plugin's session start),
    the held events, its own output capture; in process, the answer bound into the test modules."""
    held = reporter.bind()
    watch()
    reporter.emit_all(held)
    config = session.config
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key

        handler_fd = config.stash.get(fault_handler_stderr_fd_key, None)
    except ImportError:
        handler_fd = None
    if handler_fd is not None:
        os.dup2(2, handler_fd)  # faulthandler writes to the template's copy of stderr: make it this job's
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.start_global_capturing()  # as the session's start does, on this process's descriptors
        capture.suspend_global_capture()
    if _BINDINGS:
        _rebind(session, str(reporter.settings["module"]))


def _rebind(session: Any, module: str) -> None:
    from _pytest.runner import pytest_make_collect_report

    _invalidate_workspace_finders()  # the workspace was written after the template looked at it
    dropped = set()
    for node, mod, names in _BINDINGS:
        node.collect = functools.partial(_import_answer, node, mod, names, module)
        try:
            report = pytest_make_collect_report(node)
        finally:
            del node.collect
        if not report.passed:
            node.ihook.pytest_collectreport(report=report)
            dropped.add(node)
    if dropped:
        session.items[:] = [item for item in session.items if item.getparent(pytest.Module) not in dropped]
        session.testscollected = len(session.items)


def _invalidate_workspace_finders() -> None:
    """What `importlib.invalidate_caches` does for the path finders of the workspace's folders
    (forget a folder that had none, make the others read their folder again): the answer, a
    top-level module (`process_mode.template_problems`), is the only file written since the
    template collected, and nothing outside the workspace changed. The other finders are left
    alone, so that each answer's process does not touch every finder the template holds."""
    workspace = os.getcwd().rstrip("/") + "/"
    for path in [name for name in sys.path_importer_cache
                 if not os.path.isabs(name) or (name.rstrip("/") + "/").startswith(workspace)]:
        finder = sys.path_importer_cache[path]
        if finder is None or not os.path.isabs(path):
            del sys.path_importer_cache[path]
        elif hasattr(finder, "invalidate_caches"):
            finder.invalidate_caches()
    namespace_path = getattr(getattr(importlib, "_bootstrap_external", None), "_NamespacePath", None)
    if isinstance(getattr(namespace_path, "_epoch", None), int):
        namespace_path._epoch += 1  # type: ignore[union-attr]  # namespace packages look again, as there


def _import_answer(node: Any, mod: types.ModuleType, names: list[tuple[str, str | None]], module: str) -> list[Any]:
    """What importing the test module would have done with the answer, failing as
    `_pytest.python.importtestmodule` fails."""
    __tracebackhide__ = True  # the report of a failed import shows the answer's frames, not these
    from _pytest._code import ExceptionInfo, filter_traceback
    from _pytest.outcomes import skip

    try:
        answer = importlib.import_module(module)
        values = {}
        for name, attribute in names:
            if attribute is None:
                values[name] = answer
                continue
            try:
                values[name] = getattr(answer, attribute)
            except AttributeError:
                where = getattr(answer, "__file__", None) or "unknown location"
                raise ImportError(f"cannot import name {attribute!r} from {module!r} ({where})",
                                  name=module) from None
    except SyntaxError as error:
        raise node.CollectError(ExceptionInfo.from_current().getrepr(style="short")) from error
    except ImportError as error:
        info = ExceptionInfo.from_current()
        if node.config.get_verbosity() < 2:
            info.traceback = info.traceback.filter(filter_traceback)
        text = str(info.getrepr(style="short") if info.traceback else info.exconly())
        raise node.CollectError(
            f"ImportError while importing test module '{node.path}'.\n"
            "Hint: make sure your test modules/packages have valid Python names.\n"
            f"Traceback:\n{text}") from error
    except skip.Exception as error:
        if error.allow_module_level:
            raise
        raise node.CollectError("Using pytest.skip outside of a test will skip the entire module. "
                                "If that's your intention, pass `allow_module_level=True`.") from error
    vars(mod).update(values)
    return []
