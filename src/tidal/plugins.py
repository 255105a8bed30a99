"""Plugins: users' verifiers, task families, advantage estimators and losses, without editing tidal.

Three ways in, all feeding the same registries (the `@verifier`, `@reward_function`, `@family`,
`@advantage` and `@loss` decorators register on import):

- `imports:` in a config and `--import MODULE_OR_FILE` on any `tidal` command: a dotted module
  name (importable from `sys.path`) or a `.py` file (a relative file in a config is looked for
  beside the config first). Imported before the config is validated, so the names they register
  are known when the config's verifiers, estimator and loss are checked.
- entry points of installed packages, in the groups of `ENTRY_POINT_GROUPS`: loaded on the first
  lookup in the matching registry. An entry point may name a module (its decorators register) or
  an object, which the registry registers under the entry point's name (see each registry).
- `TIDAL_IMPORTS` in the environment: what this process imported, so the processes it starts
  (scoring workers, a resumed run) import the same plugins on their first registry lookup.

A plugin that fails to import is a `PluginError` naming the file and line where it failed.
This module sits below the registries (it imports nothing of tidal but `errors`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import threading
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from tidal.errors import TidalError

ENTRY_POINT_GROUPS = ("tidal.verifiers", "tidal.families", "tidal.advantages", "tidal.losses")
ENV_VAR = "TIDAL_IMPORTS"  # os.pathsep-separated plugin specs this process imported

_lock = threading.RLock()
_imported: dict[str, ModuleType] = {}  # resolved spec -> module
_entry_points: dict[str, list[tuple[str, Any]]] = {}  # group -> [(entry point name, loaded object)]


class PluginError(TidalError):
    """A plugin that cannot be found or fails on import; says which, and the file and line."""


def where(error: BaseException, prefer: str | None = None) -> str:
    """`file:line` of the frame an error comes from: the innermost frame in `prefer` (a file)
    when one is on the traceback, else the innermost frame outside tidal and the import machinery;
    a SyntaxError's own position."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    if prefer is not None:
        mine = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(prefer)]
        if mine:
            return f"{mine[-1].filename}:{mine[-1].lineno}"
    tidal_root = str(Path(__file__).resolve().parent)
    outside = [f for f in frames if not f.filename.startswith(tidal_root) and "<frozen" not in f.filename]
    frame = (outside or frames or [None])[-1]
    return f"{frame.filename}:{frame.lineno}" if frame is not None else "?"


def defined_at(function: Any) -> str:
    """`file:line` where `function` is defined (its `def`), '?' when Python cannot tell."""
    function = inspect.unwrap(function)
    try:
        source = inspect.getsourcefile(function) or inspect.getfile(function)
        lines, first = inspect.getsourcelines(function)
    except (OSError, TypeError):
        code = getattr(function, "__code__", None)
        return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else "?"
    # The source starts at the first decorator; name the `def` line under them.
    skip = next((i for i, text in enumerate(lines) if text.lstrip().startswith(("def ", "async def "))), 0)
    return f"{source}:{first + skip}"


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def resolve_spec(spec: str, base: Path | None = None) -> str:
    """A file spec as an absolute path (relative ones beside `base` first, when found there, then
    from the working directory); a module name as it is."""
    spec = spec.strip()
    if not spec:
        raise PluginError("an empty plugin name (imports: / --import take a module name or a .py file)")
    if not _is_file_spec(spec):
        if not all(part.isidentifier() for part in spec.split(".")):
            raise PluginError(f"plugin {spec!r} is neither a dotted module name nor a .py file")
        return spec
    path = Path(spec).expanduser()
    if not path.is_absolute() and base is not None and (base / path).is_file():
        path = base / path
    return str(path.resolve())


def import_plugin(spec: str, base: Path | None = None) -> ModuleType:
    """Import the plugin `spec` (a module name or a .py file) once; later calls return the module.
    Raises `PluginError` with the file and line of the failure."""
    resolved = resolve_spec(spec, base)
    with _lock:
        if resolved in _imported:
            return _imported[resolved]
        module = _import_file(resolved) if _is_file_spec(resolved) else _import_module(resolved)
        _imported[resolved] = module
        _remember(resolved)
        return module


def load_imports(specs: list[str] | tuple[str, ...], base: Path | None = None) -> list[ModuleType]:
    """Import every plugin of `specs` in order (see `import_plugin`)."""
    return [import_plugin(spec, base) for spec in specs]


def imported_specs() -> list[str]:
    """The resolved specs imported so far in this process, in order."""
    with _lock:
        return list(_imported)


def _import_file(path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise PluginError(f"plugin file {path} does not exist")
    digest = hashlib.sha256(path.encode("utf-8")).hexdigest()[:10]
    name = f"tidal_plugin_{Path(path).stem if Path(path).stem.isidentifier() else 'file'}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin file {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(name, None)
        raise PluginError(f"plugin {path} failed to import at {where(error, path)}: "
                          f"{type(error).__name__}: {error}") from error
    return module


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            raise PluginError(f"plugin module {name!r} is not importable (not on sys.path; "
                              "give a .py file, or install the package)") from error
        raise PluginError(f"plugin {name} failed to import at {where(error)}: {error}") from error
    except Exception as error:
        raise PluginError(f"plugin {name} failed to import at {where(error)}: "
                          f"{type(error).__name__}: {error}") from error


def _remember(resolved: str) -> None:
    current = [s for s in os.environ.get(ENV_VAR, "").split(os.pathsep) if s]
    if resolved not in current:
        os.environ[ENV_VAR] = os.pathsep.join([*current, resolved])


def load_inherited() -> None:
    """Import the plugins `TIDAL_IMPORTS` names (those of the process that started this one)."""
    for spec in [s for s in os.environ.get(ENV_VAR, "").split(os.pathsep) if s]:
        if spec not in _imported:
            import_plugin(spec)


def entry_point_objects(group: str) -> list[tuple[str, Any]]:
    """The loaded objects of the installed entry points of `group` (one of
    `ENTRY_POINT_GROUPS`), as (entry point name, object); loaded once per process. Also imports
    the inherited plugins (`load_inherited`) first, so a registry lookup sees them."""
    if group not in ENTRY_POINT_GROUPS:
        raise PluginError(f"unknown plugin group {group!r}; known: {', '.join(ENTRY_POINT_GROUPS)}")
    with _lock:
        load_inherited()
        if group not in _entry_points:
            _entry_points[group] = []  # set first: a plugin that looks itself up does not recurse
            loaded = []
            for point in sorted(importlib.metadata.entry_points(group=group), key=lambda p: p.name):
                loaded.append((point.name, _load_entry_point(group, point)))
            _entry_points[group] = loaded
        return list(_entry_points[group])


def _load_entry_point(group: str, point: importlib.metadata.EntryPoint) -> Any:
    dist = getattr(point, "dist", None)
    origin = f"{dist.name} " if dist is not None else ""
    try:
        return point.load()
    except Exception as error:
        raise PluginError(f"entry point {point.name} = {point.value} ({origin}group {group}) failed to load "
                          f"at {where(error)}: {type(error).__name__}: {error}") from error


def reset_entry_points() -> None:
    """Forget the loaded entry points, so the next lookup reads the installed ones again (after a
    package was installed while this process runs)."""
    with _lock:
        _entry_points.clear()


IMPORT_OPTION = "--import"


def take_import_options(args: list[str]) -> tuple[list[str], list[str]]:
    """Split a command line into (the arguments without `--import X` / `--import=X`, the X's), in
    order; everything after a `--` is left alone. `--import` with nothing after it is an error."""
    rest: list[str] = []
    specs: list[str] = []
    items = iter(range(len(args)))
    for i in items:
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg == IMPORT_OPTION:
            if i + 1 >= len(args):
                raise PluginError("--import needs a module name or a .py file")
            specs.append(args[i + 1])
            next(items, None)
        elif arg.startswith(IMPORT_OPTION + "="):
            specs.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return rest, specs
