"""tidal's import graph has no cycles and points downward (ARCHITECTURE: a folder is a layer).

The graph is read from the source with `ast`, nothing is imported. Every import statement counts:
module level, inside functions (lazy) and under `if TYPE_CHECKING:`, because each one is a real
dependency a reader has to follow. `from a.b import c` is an edge to the module a.b.c when that
exists, else to a.b; importing a.b.c adds no edge to its parents a and a.b.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src"
ROOT = "tidal"

Graph = dict[str, set[str]]


# ----------------------------------------------------------------------------- building the graph


def module_files(source: Path = SOURCE) -> dict[str, Path]:
    """Every module under src/tidal by dotted name; a package is its `__init__.py`."""
    modules = {}
    for path in sorted((source / ROOT).rglob("*.py")):
        parts = list(path.relative_to(source).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imported_names(tree: ast.AST, module: str, package: bool) -> Iterator[str]:
    """The dotted names each import statement of `tree` may refer to (relative ones resolved)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_base(node, module, package)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def resolve_base(node: ast.ImportFrom, module: str, package: bool) -> str:
    """The absolute module a `from ... import` reads from."""
    if not node.level:
        return node.module or ""
    # A package's own name is its anchor for `from . import`; a module's is its parent.
    anchor = module.split(".") if package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def target(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is a tidal module: `a.b.c` names a.b.c or an attribute of a.b."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def build_graph(source: Path = SOURCE) -> Graph:
    """module -> the tidal modules it imports (self-imports left out)."""
    modules = module_files(source)
    graph: Graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = {target(name, modules) for name in imported_names(tree, module, is_package(path))}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


# ----------------------------------------------------------------------------- finding cycles


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    components.append(pop_component(node, stack, on_stack))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [sorted(c) for c in components if len(c) > 1]


def pop_component(node: str, stack: list[str], on_stack: set[str]) -> list[str]:
    component = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
            return component


def shortest_cycle(graph: Graph, start: str, within: set[str]) -> list[str]:
    """The shortest path start -> ... -> start inside the component `within` (breadth first)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & within):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start] if node != start else [start, start]
            if child not in parent:
                parent[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in a component but on no cycle")


def cycles(graph: Graph) -> list[str]:
    """One shortest cycle through each module that is on a cycle, as `a -> b -> a`, deduplicated."""
    found: dict[frozenset[tuple[str, str]], list[str]] = {}
    for component in strongly_connected(graph):
        for module in component:
            path = shortest_cycle(graph, module, set(component))
            found.setdefault(frozenset(pairwise(path)), path)
    return [" -> ".join(path) for path in found.values()]


# ----------------------------------------------------------------------------- layering


def layering_violations(graph: Graph) -> list[str]:
    """Imports that point up: into the pipeline from a part it wires, or from eval/audit into the trainer."""
    rules = [
        # The command line (cli.py and its cli_<command>.py modules) is the top layer.
        (lambda m: not in_package(m, "tidal.pipeline", "tidal.cli") and not m.startswith("tidal.cli_"), "tidal.pipeline"),
        (lambda m: in_package(m, "tidal.eval", "tidal.audit"), "tidal.trainer"),
    ]
    return [
        f"{module} -> {imported}"
        for module in sorted(graph)
        for imported in sorted(graph[module])
        for applies, forbidden in rules
        if applies(module) and in_package(imported, forbidden)
    ]


def in_package(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# ----------------------------------------------------------------------------- tests


def test_cycle_finder_finds_a_hand_made_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(cycles(graph)) == ["a -> b -> c -> a", "e -> e2 -> e"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_relative_imports_resolve() -> None:
    tree = ast.parse("from . import x\nfrom ..y import z\nimport tidal.q")
    assert list(imported_names(tree, "tidal.p.m", package=False)) == ["tidal.p.x", "tidal.y.z", "tidal.q"]
    assert list(imported_names(tree, "tidal.p", package=True)) == ["tidal.p.x", "tidal.y.z", "tidal.q"]


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    graph = build_graph()
    assert len(graph) > 100, "the source tree was not found"
    assert "tidal.config.schema" in graph["tidal.reward.scorer"]  # module level
    assert "tidal.sandbox" in graph["tidal.reward.base"]  # inside a function
    assert "tidal.sandbox.base" in graph["tidal.reward.base"]  # under TYPE_CHECKING


def test_no_import_cycles() -> None:
    found = cycles(build_graph())
    assert not found, "import cycles in src/tidal:\n  " + "\n  ".join(found)


def test_imports_point_down() -> None:
    found = layering_violations(build_graph())
    assert not found, "upward imports in src/tidal:\n  " + "\n  ".join(found)
